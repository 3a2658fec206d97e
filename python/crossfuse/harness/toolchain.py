"""Which ptxas builds a run's Triton kernels.

Triton turns each kernel's PTX into machine code with a ptxas: its own (in the Triton wheel) unless an
environment variable names another, read at each compile: ``TRITON_PTXAS_PATH`` (Triton 3.6: every GPU up
to sm_90; Triton 3.9: those before sm_90) or ``TRITON_PTXAS_BLACKWELL_PATH`` (the others). torch.compile's
first compile in a process sets ``TRITON_PTXAS_PATH`` to torch's bundled ptxas where it is unset
(``torch/bin/ptxas`` in torch 2.11), so with Triton 3.6 on an H200 every Triton kernel compiled after it in
the process (ours, a peer's) is built by torch's ptxas. The two builds of one kernel can differ by a few
% (on an H200, our float32 4096×2048 layer-norm forward measured 1–3% slower built by torch's ptxas
than by Triton 3.6's; Liger's the same under both). Triton's on-disk cache key holds the
ptxas version of the process's first compile (the backend's hash is computed once), so builds made after
such a switch are stored under the first one's key, where a later run may load them.

A measurement that compares kernels therefore pins the ptxas for the whole process before anything
compiles, with a kernel cache of its own (:func:`pin_ptxas`), and every row says which ptxas builds the
kernels (:func:`ptxas_in_use`).
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
BLACKWELL_ENV = "TRITON_PTXAS_BLACKWELL_PATH"
CACHE_ENV = "TRITON_CACHE_DIR"
CHOICES = ("torch", "triton", "unpinned")


def _package_dir(name: str) -> Path | None:
    """The folder of an installed top-level package, without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def bundled_ptxas() -> dict[str, str]:
    """``{"torch": path, "triton": path}`` of the ptxas binaries the torch and Triton installs ship, for those
    present: torch's where torch.compile looks for it (``torch/bin`` in torch 2.11, ``torch/_inductor/bin``
    in 2.13; a CPU build of torch has none), Triton's own (``triton/backends/nvidia/bin``)."""
    out = {}
    torch_dir, triton_dir = _package_dir("torch"), _package_dir("triton")
    if torch_dir is not None:
        places = (torch_dir / "bin" / "ptxas", torch_dir / "_inductor" / "bin" / "ptxas")
        found = [p for p in places if _executable(p)]
        if found:
            out["torch"] = str(found[0])
    if triton_dir is not None:
        own = triton_dir / "backends" / "nvidia" / "bin" / "ptxas"
        if _executable(own):
            out["triton"] = str(own)
    return out


def default_choice() -> str:
    """``"torch"`` where torch ships a ptxas (what a process that uses torch.compile ends up with, and what
    built most kernels of the sessions before the pin), else ``"triton"`` where Triton ships one, else
    ``"unpinned"``."""
    found = bundled_ptxas()
    return "torch" if "torch" in found else "triton" if "triton" in found else "unpinned"


def _whose(path: str, found: dict[str, str]) -> str | None:
    return next((k for k, v in found.items() if os.path.realpath(v) == os.path.realpath(path)), None)


def pin_ptxas(choice: str | None = None) -> str | None:
    """Pins the ptxas for the rest of the process (``None``: :func:`default_choice`):

    * ``"torch"`` or ``"triton"``: ``TRITON_PTXAS_PATH`` set to that install's ptxas, as torch.compile would
      set it (for ``"torch"``), but from the start, and so that torch.compile leaves it alone;
    * a path to an executable: both ``TRITON_PTXAS_PATH`` and ``TRITON_PTXAS_BLACKWELL_PATH`` set to it;
    * ``"unpinned"``: nothing changes (torch.compile may then switch the ptxas mid-run).

    Where ``TRITON_CACHE_DIR`` is unset it also points Triton's kernel cache at a folder of that ptxas's own
    (``$TRITON_HOME`` or ``~``, then ``.triton/cache-ptxas-<version>-<whose>``), so that no build of another
    ptxas stored under the same key is loaded. Call it before anything compiles. Returns the path pinned
    (None for ``"unpinned"``)."""
    choice = choice or default_choice()
    if choice == "unpinned":
        return None
    found = bundled_ptxas()
    if choice in ("torch", "triton"):
        if choice not in found:
            have = ", ".join(found) or "none"
            raise ValueError(f"this {choice} install ships no ptxas (bundled ones found: {have})")
        path = found[choice]
        os.environ[ENV] = path
    else:
        path = choice
        if not _executable(Path(path)):
            raise ValueError(f"ptxas must be one of {', '.join(CHOICES)} or an executable, got {choice!r}")
        os.environ[ENV] = os.environ[BLACKWELL_ENV] = path
    if not os.environ.get(CACHE_ENV):
        tag = _whose(path, found) or "path-" + hashlib.sha1(os.path.realpath(path).encode()).hexdigest()[:10]
        home = Path(os.environ.get("TRITON_HOME") or Path.home())
        os.environ[CACHE_ENV] = str(home / ".triton" / f"cache-ptxas-{ptxas_version(path)}-{tag}")
    return path


def add_argument(parser, when: str = "") -> None:
    """The ``--ptxas`` option of the commands and scripts that measure (argparse); ``when`` starts its help
    (for example ``"on cuda, "``)."""
    parser.add_argument(
        "--ptxas",
        default=None,
        help=f"{when}the ptxas that builds every Triton kernel of the run, ours and the peers': torch "
        "(torch's bundled one, the default where torch ships it), triton (Triton's own), a path, or unpinned "
        "(torch.compile may then switch it to torch's at its first compile, mid-run); "
        "see crossfuse.harness.toolchain",
    )


def pin_for(parser, choice: str | None) -> str | None:
    """:func:`pin_ptxas` of the ``--ptxas`` given; a bad one is ``parser``'s usage error."""
    try:
        return pin_ptxas(choice)
    except ValueError as exc:
        parser.error(f"--ptxas: {exc}")


@contextlib.contextmanager
def pinned(choice: str | None = None):
    """:func:`pin_ptxas` for the duration of a ``with`` block, the variables as they were afterwards (a
    command run inside a process that goes on). Kernels compiled inside keep their builds; Triton's cache
    key in that process keeps the ptxas version of its first compile, so kernels compiled after the block
    by another ptxas are stored under the key of the first."""
    saved = {name: os.environ.get(name) for name in (ENV, BLACKWELL_ENV, CACHE_ENV)}
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


def _triton_choice(arch: int) -> str | None:
    """The ptxas path Triton itself would use now for GPUs of ``arch`` (e.g. 90), where this Triton says so
    (``triton.backends.nvidia.compiler.get_ptxas(arch)``, as Triton 3.9 has it); None where it has no such
    function or no CUDA backend."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        return str(get_ptxas(arch).path)
    except Exception:  # another Triton, no CUDA backend: the environment variables tell
        return None


def ptxas_in_use(arch: int | None = None) -> str:
    """``<version>(<whose>)`` of the ptxas that builds Triton kernels now for GPUs of ``arch`` (that of the
    current GPU when None and one is present): Triton's own answer where it gives one, else the one
    ``TRITON_PTXAS_PATH`` names, else Triton's bundled one; ``<whose>`` is torch or triton for their bundled
    binaries, else the path. ``""`` where there is none."""
    found = bundled_ptxas()
    path = None
    if arch is None:
        import torch

        try:
            major, minor = torch.cuda.get_device_capability()
            arch = 10 * major + minor
        except (AssertionError, RuntimeError):  # no GPU here: the environment variables tell
            pass
    if arch is not None:
        path = _triton_choice(arch)
    path = path or os.environ.get(ENV) or found.get("triton")
    if not path:
        return ""
    return f"{ptxas_version(path)}({_whose(path, found) or path})"


__all__ = [
    "BLACKWELL_ENV",
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
