"""crossfuse_julia: the Julia package CrossFuse, called from Python through juliacall.

Every Julia variant is an entry of crossfuse's registry (side ``"julia"``), added by the plugin hook
:func:`crossfuse_julia.registry.register` (entry point group ``crossfuse.implementations``). Julia starts
lazily, on the first call of a Julia entry; ``import crossfuse_julia`` imports neither juliacall nor
torch.

Public API:

* :func:`available` / :func:`unavailable_reason`: can Julia be used here, and if not, why. Answered from
  cheap checks within 5 seconds and cached for the process (see :mod:`crossfuse_julia._detect`);
  never starts Julia. :func:`detect` gives the details (executable, version, where it was found).
* :func:`problem`: the reason with its kind, :class:`Problem` ``(reason, broken)``: ``broken`` when
  Julia is here (or required with ``CROSSFUSE_JULIA=1``) and cannot be used, a failure for a test
  suite; otherwise there is no Julia here, a skip.
* :class:`JuliaUnavailable`: raised by every Julia entry when Julia cannot be used; names the reason
  and how to get Julia (``broken`` as above). :class:`JuliaError`: a Julia exception, with Julia's
  message; :class:`JuliaMethodError` (also a ``TypeError``) for a Julia ``MethodError``, which
  PythonCall raises as a ``TypeError``.
* :func:`start`: the started Julia (juliacall's ``Main`` and the ``CrossFuseBridge`` module).
* :func:`install`: resolve (install) Julia and the packages now, with network.
* :mod:`crossfuse_julia.arrays`: the layout mapping (torch ``(M, N)`` = Julia ``N×M``, features on
  ``dims=1``) and the zero-copy crossings.

Environment: ``CROSSFUSE_JULIA=0`` turns the Julia side off (its entries are not registered: said once,
on stderr); ``CROSSFUSE_JULIA=1`` requires it (any reason it cannot be used is a failure of the
cross-language suite, not a skip); ``CROSSFUSE_JULIA_CUDA=1`` asks for the GPU
path (adds CUDA.jl to the Julia environment); ``CROSSFUSE_JULIA_SETUP_TIMEOUT`` bounds the package
resolution at start (seconds, default 1800); juliacall's and juliapkg's own variables
(``PYTHON_JULIAPKG_EXE``, ``PYTHON_JULIAPKG_OFFLINE``, ``PYTHON_JULIACALL_THREADS``, …) apply.
"""

from __future__ import annotations

from . import _detect
from . import session as _session
from ._detect import Detection, detect
from .errors import HOW_TO_GET_JULIA, JuliaError, JuliaMethodError, JuliaUnavailable, Problem

__all__ = [
    "HOW_TO_GET_JULIA",
    "Detection",
    "JuliaError",
    "JuliaMethodError",
    "JuliaUnavailable",
    "Problem",
    "available",
    "detect",
    "install",
    "problem",
    "start",
    "unavailable_reason",
]


def unavailable_reason() -> str | None:
    """Why Julia cannot be used in this process, or ``None``: the cached detection, or the cached
    failure of an earlier start. Never starts Julia; within 5 seconds on the first call."""
    return _detect.detect().reason or _session.failure()


def problem() -> Problem | None:
    """Why Julia cannot be used here, with whether that is a failure (``broken``) or an absence, or
    ``None``; from the same cheap checks as :func:`unavailable_reason`."""
    d = _detect.detect()
    if d.reason:
        return Problem(d.reason, d.broken)
    failed = _session.failure()
    return None if failed is None else Problem(failed, True)


def available() -> bool:
    """Whether Julia looks usable here (see :func:`unavailable_reason` for why not)."""
    return unavailable_reason() is None


def start() -> _session.Session:
    """The Julia session, started on first use; raises :class:`JuliaUnavailable` with the reason."""
    return _session.get()


def install(timeout: float | None = None) -> None:
    """Install Julia (if juliapkg finds none) and the Julia packages now: ``juliapkg.resolve()`` in a
    child process, with its progress shown. Needs juliacall and, the first time, network."""
    import importlib.util

    if importlib.util.find_spec("juliapkg") is None:
        raise JuliaUnavailable(_detect.JULIACALL_MISSING)
    if _session.cuda_requested():
        _session._declare_cuda()
    _session.resolve_packages(timeout, quiet=False)
    _detect.detect(refresh=True)
