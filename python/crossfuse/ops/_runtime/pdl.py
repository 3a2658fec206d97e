"""Grid dependency control: the kernels of one op chained by programmatic dependent launch.

A kernel launched with ``launch_pdl=True`` may start once every program of the kernel before it in the
stream has started and called :func:`launch_dependents` (or finished): its programs take the SMs the
earlier kernel's programs leave, so its launch overlaps that kernel's end instead of following it. Such
a kernel must call :func:`wait_for_previous` before it reads what the earlier kernel wrote or writes what
it reads, and at least once in every program (so that it does not complete before the earlier kernel).
Compute capability 9+ (``griddepcontrol``), Triton 3.4+; off under the interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .device import compute_capability_major

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # Triton before 3.4
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def launch_dependents(GDC: tl.constexpr):
    """Where GDC, let the next kernel of the stream (if it is a programmatic dependent launch) start once
    every program of this one has called this."""
    if GDC:
        gdc_launch_dependents()


@triton.jit
def wait_for_previous(GDC: tl.constexpr):
    """Where GDC, wait until the previous kernel of the stream has completed and its writes are visible
    (returns at once in a kernel that was not launched as a programmatic dependent launch)."""
    if GDC:
        gdc_wait()


def usable(t: torch.Tensor, interpreted: bool) -> bool:
    """Whether kernels on ``t``'s device can chain by programmatic dependent launch."""
    return (
        gdc_wait is not None
        and not interpreted
        and t.device.type == "cuda"
        and compute_capability_major(t) >= 9
    )
