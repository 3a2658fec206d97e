"""The Julia session: started lazily, once per process, on the first call of a Julia entry.

Start-up, in order:

1. :func:`crossfuse_julia._detect.detect` must have found a Julia executable (else
   :class:`JuliaUnavailable` with its reason, at once).
2. With ``CROSSFUSE_JULIA_CUDA=1`` the GPU path is asked for: CUDA.jl is added to the environment's
   own juliapkg file with ``juliapkg.add`` (``juliapkg.json`` does not declare it, so CPU-only users
   never install it). It stays there; ``juliapkg.rm("CUDA")`` takes it out again.
3. ``juliapkg.resolve()`` runs in a child Python process with a timeout
   (``CROSSFUSE_JULIA_SETUP_TIMEOUT`` seconds, default 1800): it installs Julia packages on first use
   and needs network then; when nothing changed it returns in about a second. Run in a child, a
   resolution that hangs (no network) is killed instead of blocking this process.
4. ``import juliacall`` here: it finds the packages resolved and starts Julia. juliacall warns when
   torch was imported first (PythonCall issue 215 / pytorch issue 78829: a crash at start on some
   systems): ``import crossfuse_julia.early`` before torch runs steps 1 to 4 then (the test-suite's
   conftest does).
5. ``CrossFuseBridge.jl`` (next to this file) is included into ``Main``; with the GPU path, ``import
   CUDA`` first (which also loads the CUDA extensions of DLPack and CrossFuse).

A failure at any step is cached: later calls raise the same :class:`JuliaUnavailable` at once, and
:func:`crossfuse_julia.unavailable_reason` reports it. Julia was found by then, so such a failure is
"broken" (``JuliaUnavailable.broken``): the cross-language suite fails on it, naming the cause.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from . import _detect
from .errors import JuliaError, JuliaMethodError, JuliaUnavailable

log = logging.getLogger("crossfuse_julia")

GLUE = Path(__file__).resolve().parent / "CrossFuseBridge.jl"
CUDA_UUID = "052768ef-5323-5732-b1bb-66c8b64840ba"
CUDA_COMPAT = "5, 6"  # as julia/Project.toml's [compat] for its CUDA extension
DEFAULT_SETUP_TIMEOUT_S = 1800.0


@dataclass
class Session:
    """A started Julia: ``main`` is juliacall's ``Main``, ``bridge`` the ``CrossFuseBridge`` module."""

    main: object
    bridge: object
    cuda: bool  # CUDA.jl loaded and functional
    cuda_reason: str | None  # why the GPU path is off, when it is


_SESSION: Session | None = None
_FAILED: str | None = None
_JULIACALL: object | None = None  # the juliacall module, once imported by _import_juliacall


def cuda_requested() -> bool:
    """Whether ``CROSSFUSE_JULIA_CUDA`` asks for the GPU path; a value that is no flag is false here, and
    :func:`cuda_flag_problem` says why."""
    try:
        return bool(_detect.env_flag("CROSSFUSE_JULIA_CUDA"))
    except ValueError:
        return False


def cuda_flag_problem() -> str | None:
    """What is wrong with ``CROSSFUSE_JULIA_CUDA``'s value, or ``None``."""
    try:
        _detect.env_flag("CROSSFUSE_JULIA_CUDA")
    except ValueError as exc:
        return str(exc)
    return None


def failure() -> str | None:
    """Why starting Julia failed in this process, or ``None`` (not tried yet, or started)."""
    return _FAILED


def started() -> bool:
    return _SESSION is not None


def get() -> Session:
    """The Julia session, started on first use; raises :class:`JuliaUnavailable` with the reason."""
    global _SESSION
    if _SESSION is not None:
        return _SESSION
    _SESSION = _guarded(_start)
    return _SESSION


def start_juliacall() -> None:
    """Steps 1 to 4 of the start (resolve the packages, import juliacall), not the bridge: what
    ``crossfuse_julia.early`` runs before torch is imported. Raises :class:`JuliaUnavailable` as
    :func:`get` does, and caches a failure the same way."""
    if _SESSION is None and _JULIACALL is None:
        _guarded(_import_juliacall)


def _guarded(step):
    """``step()``, with Julia's availability checked first and any failure cached as broken."""
    global _FAILED
    if _FAILED is not None:
        raise JuliaUnavailable(_FAILED, broken=True)
    d = _detect.detect()
    if d.reason:
        raise JuliaUnavailable(d.reason, broken=d.broken)
    try:
        return step()
    except JuliaUnavailable as exc:
        _FAILED = exc.reason
        raise JuliaUnavailable(exc.reason, broken=True) from exc
    except Exception as exc:  # anything else at start: the same for every later call, said once, kept
        _FAILED = f"starting Julia failed ({type(exc).__name__}: {exc})"
        raise JuliaUnavailable(_FAILED, broken=True) from exc


def _import_juliacall():
    """Resolve the packages (in a child, with a timeout), then import juliacall, which starts Julia."""
    global _JULIACALL
    if _JULIACALL is not None:
        return _JULIACALL
    if cuda_requested():
        _declare_cuda()
    if not (os.environ.get("PYTHON_JULIACALL_EXE") and os.environ.get("PYTHON_JULIACALL_PROJECT")):
        resolve_packages()  # (with both set, juliacall skips juliapkg: that project is the user's to set up)
    try:
        import juliacall
    except Exception as exc:  # juliacall raises plain Exceptions when Julia cannot start
        raise JuliaUnavailable(f"juliacall could not start Julia ({type(exc).__name__}: {exc})") from exc
    _JULIACALL = juliacall
    return juliacall


def _start() -> Session:
    juliacall = _import_juliacall()
    main = juliacall.Main
    cuda, cuda_reason = False, "the GPU path is off (set CROSSFUSE_JULIA_CUDA=1 before the first Julia call)"
    if problem := cuda_flag_problem():
        cuda_reason = f"the GPU path is off: {problem}"
    try:
        if cuda_requested():
            main.seval("import CUDA")
            cuda = bool(main.seval("CUDA.functional()"))
            cuda_reason = None if cuda else "CUDA.jl is loaded but CUDA.functional() is false"
        bridge = main.include(str(GLUE))
        if cuda:
            bridge.use_cuda(main.CUDA)
    except Exception as exc:  # a JuliaError, or a MethodError that PythonCall raises as a TypeError
        raise JuliaUnavailable(f"loading CrossFuse into Julia failed ({type(exc).__name__}: {exc})") from exc
    return Session(main, bridge, cuda, cuda_reason)


def _declare_cuda() -> None:
    """Add CUDA.jl to the environment's juliapkg file (what ``juliapkg.add`` edits), once."""
    import juliapkg

    try:
        deps = juliapkg.deps.load_cur_deps()
        if "CUDA" in deps.get("packages", {}):
            return
    except Exception:  # an internal helper of juliapkg: if it moved, add unconditionally
        pass
    log.warning("crossfuse_julia: adding CUDA.jl to the Julia environment (CROSSFUSE_JULIA_CUDA=1)")
    juliapkg.add("CUDA", CUDA_UUID, version=CUDA_COMPAT)


def setup_timeout() -> float:
    value = os.environ.get("CROSSFUSE_JULIA_SETUP_TIMEOUT", "")
    if not value.strip():
        return DEFAULT_SETUP_TIMEOUT_S
    return checked_timeout(value, "CROSSFUSE_JULIA_SETUP_TIMEOUT=")


def checked_timeout(value, origin: str) -> float:
    """``value`` as a finite number of seconds > 0, else :class:`JuliaUnavailable` naming ``origin``."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not (0 < seconds < float("inf")):
        raise JuliaUnavailable(f"{origin}{value!r} is not a number of seconds > 0")
    return seconds


RESOLVE_CMD = (sys.executable, "-c", "import juliapkg; juliapkg.resolve()")


def resolve_packages(timeout: float | None = None, quiet: bool = True, cmd=RESOLVE_CMD) -> None:
    """``juliapkg.resolve()`` in a child process, killed after ``timeout`` seconds.

    ``quiet=False`` lets juliapkg's progress through to this process's stdout/stderr (used by
    ``python -m crossfuse_julia install``).
    """
    timeout = setup_timeout() if timeout is None else checked_timeout(timeout, "timeout ")
    log.info("crossfuse_julia: resolving Julia packages (first use installs them, which takes minutes)")
    cmd = list(cmd)
    out_to, err_to = (subprocess.PIPE, subprocess.STDOUT) if quiet else (None, None)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out_to, stderr=err_to, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except BaseException as exc:  # the time limit, Ctrl-C or anything else: the child goes too
        _detect._kill_group(proc)
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        raise JuliaUnavailable(
            f"resolving the Julia packages (juliapkg.resolve) did not finish within {timeout:g} s: no "
            "network to install them? (CROSSFUSE_JULIA_SETUP_TIMEOUT sets the limit)"
        ) from None
    if proc.returncode != 0:
        tail = "\n".join((out or "").strip().splitlines()[-15:])
        raise JuliaUnavailable(f"resolving the Julia packages (juliapkg.resolve) failed with status "
                               f"{proc.returncode}:\n{tail}")


def call(where: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with a Julia exception turned into :class:`JuliaError`, Julia's message
    kept: a ``juliacall.JuliaError``, and the ``TypeError`` that PythonCall raises for a ``MethodError``
    of the Julia function ``fn`` itself (:class:`JuliaMethodError`, still a ``TypeError``). Never imports
    juliacall itself (that would start Julia)."""
    jc = sys.modules.get("juliacall")
    julia_error = getattr(jc, "JuliaError", None)
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        if julia_error is not None and isinstance(exc, julia_error):
            raise JuliaError(where, exc) from exc
        if isinstance(exc, TypeError) and is_julia_value(fn):
            raise JuliaMethodError(where, exc) from exc
        raise


def is_julia_value(obj) -> bool:
    """Whether ``obj`` is a Julia value wrapped by juliacall (its type is defined in juliacall): a
    ``TypeError`` from calling one comes from Julia (PythonCall ``src/JlWrap/any.jl``: a
    ``MethodError`` of the called function becomes a Python ``TypeError``)."""
    return type(obj).__module__.split(".")[0] == "juliacall"


def synchronize() -> None:
    """Wait for Julia's GPU work (``CUDA.synchronize()``); nothing without the GPU path."""
    s = get()
    if s.cuda:
        call("CUDA.synchronize", s.bridge.synchronize)
