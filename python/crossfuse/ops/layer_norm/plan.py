"""Launch plans: what a call of the layer norm launches, decided once per key and kept.

A launcher's decisions (configuration, kernel, grid, constexprs, scratch layout, whether descriptors can
be used) depend only on the shapes, strides, dtypes, 16-byte alignment and device of its tensors and on
its flags. A plan holds them for one such key, with one :class:`Launch` per kernel launch; a call then
allocates its outputs and makes the launches. A :class:`Launch` goes through Triton's dispatch
(``kernel[grid]``) the first time and keeps the compiled kernel that returns, then launches it directly
(:mod:`crossfuse.ops._runtime.direct`): on the GPU the dispatch costs 10-27 µs a launch, the direct
launch a few. Under Triton's interpreter nothing is compiled: every launch goes through the dispatch,
which runs the kernel.
"""

from __future__ import annotations

import numpy as np
import torch

from .._runtime import direct as _direct

# torch.cuda.current_device() without its Python layer (its lazy initialisation: a plan of a CUDA tensor
# exists only once CUDA is)
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)

MAX_PLANS = 1024  # plans kept at most (a table that starts afresh: every key holds ints by value)


class Launch:
    """One kernel launch: the kernel, its grid and keyword arguments (constexprs and launch options) fixed,
    the positional arguments given per call. Once launched through Triton's dispatch, ``go`` launches the
    compiled kernel (:func:`crossfuse.ops._runtime.direct.launcher`): it also takes pointers as addresses
    (ints), which a plan passes for the parts of its scratch memory instead of making views. ``descs``
    (``{position: spec}``, see :func:`crossfuse.ops._runtime.direct.build_descriptor`): where the kernel
    takes a tensor descriptor, the call passes its base tensor, and the descriptor is made here (its
    tensor map kept per address, where the launch goes straight to the compiled kernel)."""

    __slots__ = ("compiled", "descs", "go", "grid", "kernel", "options", "tail")

    def __init__(self, kernel, grid: tuple, descs: dict | None = None, **options):
        self.kernel = kernel
        self.grid = grid
        self.descs = descs
        self.options = options
        self.go = None  # the compiled kernel's launcher, once it was launched through the dispatch
        self.compiled = self.tail = None  # that kernel, and the values of its parameters after the positional

    def __call__(self, *args) -> None:
        go = self.go
        if go is not None:
            go(*args)
        else:
            self.dispatch(args)

    def dispatch(self, args: tuple) -> None:
        """``kernel[grid](*args, **options)`` (Triton's dispatch), keeping the compiled kernel's launcher for
        the next call where :mod:`._runtime.direct` can launch it."""
        if self.descs:
            args = _direct.with_descriptors(args, self.descs)
        slot = _direct.key(self.kernel, args, self.options)
        compiled = self.kernel[self.grid](*args, **self.options)
        _direct.remember(slot, self.kernel, args, self.options, compiled)
        hit = _direct.kept(slot) if slot is not None else None
        if hit is not None:
            self.go = _direct.launcher(hit[0], self.grid, hit[1], slot[1], self.descs)
            self.compiled, self.tail = hit


class Zeroing:
    """A plan's zeroing of part of its scratch (a kernel's counters and flags) before a launch, as a step
    of its own: ``go(view)`` zeroes the contiguous ``view``. A step like a :class:`Launch` for recording
    (:func:`crossfuse.ops._runtime.native.recorded`), so that the C++ module's program zeroes the same
    bytes in stream order (:func:`crossfuse.ops._runtime.native.program`)."""

    __slots__ = ("go",)
    zeroes = True  # what native.program looks for

    def __init__(self):
        self.go = _zero

    def __call__(self, view: torch.Tensor) -> None:
        self.go(view)


def _zero(view: torch.Tensor) -> None:
    view.zero_()


class PlanCache:
    """Plans by key, built by ``build(*args)`` on a miss; at most MAX_PLANS, then it starts afresh."""

    __slots__ = ("build", "plans")

    def __init__(self, build):
        self.plans: dict = {}
        self.build = build

    def get(self, key, *args):
        plan = self.plans.get(key)
        if plan is None:
            plan = self.build(*args)
            if len(self.plans) >= MAX_PLANS:
                self.plans.clear()
            self.plans[key] = plan
        return plan

    def clear(self) -> None:
        self.plans.clear()


class Plan:
    """A plan's call: on the device of its tensors (made current where another one is, as torch's own
    operators do: Triton launches on the current device whatever device the arguments live on), with
    numpy's floating-point warnings off under the interpreter (numpy warns where a GPU silently gives
    inf or NaN, e.g. ``1 / sqrt(var + eps)`` of a masked padding row with ``eps = 0``, never stored)."""

    __slots__ = ("cuda_index", "interpreted")

    def __init__(self, device, interpreted: bool):
        self.cuda_index = device.index if device.type == "cuda" else None
        self.interpreted = interpreted

    def __call__(self, *args):
        index = self.cuda_index
        if index is not None and index != _current_device():
            with torch.cuda.device(index):
                return self.run(*args)
        if self.interpreted:
            with np.errstate(all="ignore"):
                return self.run(*args)
        return self.run(*args)

    def run(self, *args):
        raise NotImplementedError
