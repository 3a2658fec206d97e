"""crossfuse_julia: the Julia package CrossFuse, called from Python through juliacall.

Every Julia variant is an entry of crossfuse's registry (side ``"julia"``), added by the plugin hook
:func:`crossfuse_julia.registry.register` (entry point group ``crossfuse.implementations``). Julia starts
lazily, on the first call of a Julia entry; ``import crossfuse_julia`` imports neither juliacall nor
torch.

Public API:

* :func:`available` / :func:`unavailable_reason`: can Julia be used here, and if not, why. Answered from
  cheap checks within 5 seconds and cached for the process (see :mod:`crossfuse_julia._detect`);
  never starts Julia. :func:`detect` gives the details (executable, version, where it was found).
* :class:`JuliaUnavailable`: raised by every Julia entry when Julia cannot be used; names the reason
  and how to get Julia. :class:`JuliaError`: a Julia exception, with Julia's message.
* :func:`start`: the started Julia (juliacall's ``Main`` and the ``CrossFuseBridge`` module).
* :func:`install`: resolve (install) Julia and the packages now, with network.
* :mod:`crossfuse_julia.arrays`: the layout mapping (torch ``(M, N)`` = Julia ``N×M``, features on
  ``dims=1``) and the zero-copy crossings.

Environment: ``CROSSFUSE_JULIA=0`` turns the Julia side off; ``CROSSFUSE_JULIA_CUDA=1`` asks for the GPU
path (adds CUDA.jl to the Julia environment); ``CROSSFUSE_JULIA_SETUP_TIMEOUT`` bounds the package
resolution at start (seconds, default 1800); juliacall's and juliapkg's own variables
(``PYTHON_JULIAPKG_EXE``, ``PYTHON_JULIAPKG_OFFLINE``, ``PYTHON_JULIACALL_THREADS``, …) apply.
"""

from __future__ import annotations

from . import _detect
from . import session as _session
from ._detect import Detection, detect
from .errors import HOW_TO_GET_JULIA, JuliaError, JuliaUnavailable

__all__ = [
    "HOW_TO_GET_JULIA",
    "Detection",
    "JuliaError",
    "JuliaUnavailable",
    "available",
    "detect",
    "install",
    "start",
    "unavailable_reason",
]


def unavailable_reason() -> str | None:
    """Why Julia cannot be used in this process, or ``None``: the cached detection, or the cached
    failure of an earlier start. Never starts Julia; within 5 seconds on the first call."""
    return _detect.detect().reason or _session.failure()


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
