"""Which ptxas builds a run's Triton kernels.

Triton turns each kernel's PTX into machine code with a ptxas: its own (in the Triton wheel) unless
``TRITON_PTXAS_PATH`` names another, read at each compile. torch.compile's first compile in a process sets
that variable to torch's bundled ptxas where it is unset, so every Triton kernel compiled after it in the
process (ours, a peer's) is built by torch's ptxas. The two builds of one kernel can differ by several %
(bench/results/h200/NOTES.md, runs 197–203: Liger's float32 4096×2048 layer-norm forward ~7% faster built
by torch's ptxas than by Triton 3.6's, ours 2–3% slower). Triton's on-disk cache key holds the ptxas
version of the process's first compile (the backend's hash is computed once), so builds made after such a
switch are stored under the first one's key, where a later run may load them.

A measurement that compares kernels therefore pins one ptxas for the whole process before anything
compiles, with a kernel cache of its own for that ptxas (:func:`pin_ptxas`), and every row says which
ptxas was in use (:func:`ptxas_in_use`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import re
import subprocess
from pathlib import Path

ENV = "TRITON_PTXAS_PATH"
CACHE_ENV = "TRITON_CACHE_DIR"
CHOICES = ("torch", "triton", "unpinned")


def bundled_ptxas() -> dict[str, str]:
    """``{"torch": path, "triton": path}`` of the ptxas binaries the torch and Triton installs ship, for those
    present (a CPU build of torch has none; Triton's is found without importing Triton)."""
    out = {}
    torch_spec = importlib.util.find_spec("torch")
    if torch_spec is not None and torch_spec.origin:
        out["torch"] = str(Path(torch_spec.origin).parent / "bin" / "ptxas")
    triton_spec = importlib.util.find_spec("triton")
    if triton_spec is not None and triton_spec.submodule_search_locations:
        root = Path(next(iter(triton_spec.submodule_search_locations)))
        out["triton"] = str(root / "backends" / "nvidia" / "bin" / "ptxas")
    return {k: v for k, v in out.items() if os.path.isfile(v) and os.access(v, os.X_OK)}


def default_choice() -> str:
    """``"torch"`` where torch ships a ptxas (the one a process that uses torch.compile ends up with, and
    what the sessions before the pin built most kernels with), else ``"triton"``."""
    return "torch" if "torch" in bundled_ptxas() else "triton"


def pin_ptxas(choice: str) -> str | None:
    """Points ``TRITON_PTXAS_PATH`` at one ptxas for the rest of the process: ``"torch"`` or ``"triton"``
    (their bundled binaries), or a path to an executable; ``"unpinned"`` leaves the variables as they are
    (and torch.compile may then change the ptxas mid-run). Where ``TRITON_CACHE_DIR`` is unset it also points
    Triton's kernel cache at a folder of that ptxas's own (``~/.triton/cache-ptxas-<version>-<whose>``), so
    no build of another ptxas stored under the same key is loaded. Call it before anything compiles. Returns
    the path pinned (None for ``"unpinned"``)."""
    if choice == "unpinned":
        return None
    found = bundled_ptxas()
    if choice in ("torch", "triton"):
        if choice not in found:
            have = ", ".join(found) or "none"
            raise ValueError(f"ptxas: this {choice} install ships no ptxas (bundled ones found: {have})")
        path = found[choice]
    else:
        path = choice
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise ValueError(f"ptxas must be one of {', '.join(CHOICES)} or an executable, got {choice!r}")
    os.environ[ENV] = path
    if not os.environ.get(CACHE_ENV):
        tag = choice if choice in found else hashlib.sha1(os.path.realpath(path).encode()).hexdigest()[:10]
        os.environ[CACHE_ENV] = str(Path.home() / ".triton" / f"cache-ptxas-{ptxas_version(path)}-{tag}")
    return path


def add_argument(parser, when: str = "") -> None:
    """The ``--ptxas`` option of the commands and scripts that measure (argparse); ``when`` starts its help
    (for example ``"on cuda, "``)."""
    parser.add_argument(
        "--ptxas",
        default=None,
        help=f"{when}the ptxas that builds every Triton kernel of the run, ours and the peers': torch "
        "(torch's bundled one, the default where torch ships it), triton (Triton's own), a path, or unpinned "
        "(torch.compile then switches it to torch's at its first compile, mid-run); "
        "see crossfuse.harness.toolchain",
    )


def pin_for(parser, choice: str | None) -> str | None:
    """:func:`pin_ptxas` of the ``--ptxas`` given (or :func:`default_choice`); a bad one is ``parser``'s
    usage error."""
    try:
        return pin_ptxas(choice or default_choice())
    except ValueError as exc:
        parser.error(str(exc))


@contextlib.contextmanager
def pinned(choice: str):
    """:func:`pin_ptxas` for the duration of a ``with`` block, ``TRITON_PTXAS_PATH`` and ``TRITON_CACHE_DIR``
    as they were afterwards (a command run inside a process that goes on). Kernels compiled inside keep their
    builds."""
    saved = {name: os.environ.get(name) for name in (ENV, CACHE_ENV)}
    try:
        yield pin_ptxas(choice)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@functools.cache
def ptxas_version(path: str) -> str:
    """The ``X.Y.Z`` release of the ptxas at ``path`` (from ``--version``), or ``"unknown"``."""
    try:
        text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    m = re.search(r"V(\d+\.\d+\.\d+)", text) or re.search(r"release (\d+\.\d+)", text)
    return m.group(1) if m else "unknown"


def ptxas_in_use() -> str:
    """``<version>(<whose>)`` of the ptxas Triton would use now: the one ``TRITON_PTXAS_PATH`` names (torch's,
    Triton's, or else its path), else Triton's own; ``""`` where there is none."""
    found = bundled_ptxas()
    path = os.environ.get(ENV) or found.get("triton")
    if not path:
        return ""
    whose = next((k for k, v in found.items() if os.path.realpath(v) == os.path.realpath(path)), path)
    return f"{ptxas_version(path)}({whose})"


__all__ = [
    "CACHE_ENV",
    "CHOICES",
    "ENV",
    "add_argument",
    "bundled_ptxas",
    "default_choice",
    "pin_for",
    "pin_ptxas",
    "pinned",
    "ptxas_in_use",
    "ptxas_version",
]
