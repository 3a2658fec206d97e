"""Where crossfuse's Triton kernels can run, detected once.

Triton kernels run on CUDA tensors, or on CPU tensors under Triton's interpreter. The interpreter is
chosen by the environment variable ``TRITON_INTERPRET=1``, which Triton reads when a kernel is
decorated, i.e. when :mod:`crossfuse.ops` is first imported. :func:`enable_interpreter_if_no_gpu` is
what the CLI and the test-suite call before that import; the library itself never switches it on
behind a user's back.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import threading

import torch

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def switched_off(name: str) -> bool:
    """Whether the environment variable ``name`` (a switch that is on by default) is set to off."""
    return os.environ.get(name, "1").strip().lower() in _FALSE


def triton_missing_reason() -> str | None:
    """Why Triton cannot be used here, or ``None`` when it can be imported."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install triton; wheels exist for Linux only)"
    return None


HAS_TRITON = triton_missing_reason() is None


def interpreter_requested() -> bool:
    """Whether the environment asks Triton for its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


def quiet_interpreter(launcher):
    """Decorate a launcher: under Triton's interpreter, numpy's floating-point warnings are off while it
    runs. The interpreter computes with numpy, which warns where a GPU silently gives inf or NaN (e.g.
    ``1 / sqrt(var + eps)`` of a masked padding row with ``eps = 0``, whose result is never stored);
    the values are the same either way, and inf or NaN in an output stays there to be seen."""

    @functools.wraps(launcher)
    def wrapper(*args, **kwargs):
        if not interpreter_requested():
            return launcher(*args, **kwargs)
        import numpy as np

        with np.errstate(all="ignore"):
            return launcher(*args, **kwargs)

    return wrapper


def on_input_device(launcher):
    """Decorate a launcher: on CUDA, it runs with the device of its first tensor argument (``None``
    placeholders skipped) as the current one, as torch's own operators do. Triton launches on the current
    device (its context and stream) whatever device the arguments live on, so a launch on tensors of
    cuda:1 while cuda:0 is current would run on the wrong GPU, reading the other's memory. The check costs
    about a microsecond where the devices already agree."""

    @functools.wraps(launcher)
    def wrapper(*args, **kwargs):
        t = next((a for a in args if isinstance(a, torch.Tensor)), None)
        device = t.device if t is not None else None
        if device is not None and device.type == "cuda" and device.index is not None:
            if device.index != torch.cuda.current_device():
                with torch.cuda.device(device.index):
                    return launcher(*args, **kwargs)
        return launcher(*args, **kwargs)

    return wrapper


def enable_interpreter_if_no_gpu() -> bool:
    """Switch Triton to its interpreter when no CUDA device is present.

    Must run before Triton is first imported in this process; afterwards it only reports.
    Returns whether the interpreter is (or will be) active.
    """
    import sys

    if not torch.cuda.is_available() and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    return interpreter_requested()


def is_interpreted(kernel) -> bool:
    """Whether a ``@triton.jit`` kernel object was built for the interpreter."""
    return type(kernel).__name__ == "InterpretedFunction"


# the oldest Triton whose interpreter runs the kernels (3.2 to 3.6 fail on a tl.range over program ids)
MIN_INTERPRETER_TRITON = (3, 7)


def triton_version(version: str | None = None) -> tuple[int, ...]:
    """Triton's (major, minor) from ``version`` (default: the installed one's), e.g. ``(3, 6)`` for
    ``"3.6.0+git1234"``."""
    if version is None:
        import triton

        version = triton.__version__
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def interpreter_problem(version: str | None = None) -> str | None:
    """Why Triton ``version`` (default: the installed one)'s interpreter cannot run crossfuse's kernels,
    or ``None`` when it can."""
    if version is None:
        import triton

        version = triton.__version__
    if triton_version(version) >= MIN_INTERPRETER_TRITON:
        return None
    need = ".".join(map(str, MIN_INTERPRETER_TRITON))
    return (f"Triton's interpreter runs crossfuse's kernels from Triton {need} on (installed: {version}); "
            f"pip install -U 'triton>={need}'")  # fmt: skip


def check_runnable(t: torch.Tensor, name: str, interpreted: bool, problem: str | None = None) -> None:
    """Raise a ``ValueError`` naming ``name`` when the kernels (``interpreted``: built for the interpreter,
    see :func:`is_interpreted`; ``problem``: :func:`interpreter_problem`'s answer for them) cannot run on
    ``t``'s device. Takes flags rather than a kernel, so that torch.compile can trace it (it models
    Triton kernels as objects without a type)."""
    dev = t.device.type
    if dev == "cuda":
        if interpreted:
            raise ValueError(
                f"{name} is a CUDA tensor but Triton was imported in interpreter mode "
                "(TRITON_INTERPRET=1); unset it to run the compiled kernels on the GPU"
            )
        return
    if dev == "cpu":
        if not interpreted:
            raise ValueError(
                f"{name} is a CPU tensor: crossfuse's Triton kernels run on CUDA tensors, or on CPU "
                "tensors under Triton's interpreter (set TRITON_INTERPRET=1 before triton is imported)"
            )
        if problem:
            raise ValueError(f"{name} is a CPU tensor, for Triton's interpreter: {problem}")
        return
    raise ValueError(
        f"{name} is on device {t.device}; crossfuse's Triton kernels support cuda (and cpu "
        "under the Triton interpreter)"
    )


def require_cuda(script: str) -> None:
    """For the GPU-only scripts under bench/: exit with one line (status 1) where torch sees no CUDA GPU,
    before anything is measured or written."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{script}: needs a CUDA GPU (torch {torch.__version__} sees none); nothing was run")


@functools.cache
def num_sms(device_index: int) -> int:
    """Streaming multiprocessors of a CUDA device (cached: the query costs microseconds)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.cache
def _capability_major(device_index: int) -> int:
    return torch.cuda.get_device_capability(device_index)[0]


def _cuda_index(device: torch.device) -> int:
    """The index of a CUDA ``device`` (the current device's where it names none)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def compute_capability_major(t: torch.Tensor) -> int:
    """The major compute capability of the CUDA device holding ``t`` (cached: the query cost 2.4–4.7 µs
    of CPU per call, and the launchers ask on every call)."""
    return _capability_major(_cuda_index(t.device))


_THREAD = threading.local()


def bind_cuda_context(t: torch.Tensor) -> None:
    """Make the primary CUDA context of ``t``'s device current on the calling thread (once per thread and
    device; nothing for a tensor not on CUDA). Call it before building a tensor descriptor for a launch.

    Triton encodes a descriptor's tensor map (``cuTensorMapEncodeTiled``, a driver call that needs a
    current context) before its launcher makes the primary context current, so on a thread whose first
    CUDA work is such a launch the call fails with "invalid device context". The autograd engine's worker
    thread is one: torch binds no context to it when the device needs no change, and the caching
    allocator hands out cached blocks without a CUDA call, so a backward made only of crossfuse's kernels
    may be the first CUDA work there. A runtime call binds the primary context as the runtime
    does on first use: ``cudaStreamQuery`` of the current stream, which neither waits nor launches."""
    device = t.device
    if device.type != "cuda":
        return
    index = _cuda_index(device)
    bound = getattr(_THREAD, "devices", None)
    if bound is None:
        bound = _THREAD.devices = set()
    if index not in bound:
        torch.cuda.current_stream(index).query()
        bound.add(index)


def device_parallelism(t: torch.Tensor) -> int:
    """How many programs fill the device: SM count on CUDA, a small number under the interpreter."""
    if t.device.type == "cuda":
        return num_sms(_cuda_index(t.device))
    return 4
