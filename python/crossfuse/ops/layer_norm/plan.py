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

MAX_PLANS = 1024  # plans kept at most (a table that starts afresh: every key holds ints by value)


class Launch:
    """One kernel launch: the kernel, its grid and keyword arguments (constexprs and launch options) fixed,
    the positional arguments given per call."""

    __slots__ = ("grid", "kernel", "options", "slot")

    def __init__(self, kernel, grid: tuple, **options):
        self.kernel = kernel
        self.grid = grid
        self.options = options
        self.slot = None  # the compiled kernel's key in _direct, once it was launched through the dispatch

    def __call__(self, *args) -> None:
        slot = self.slot
        if slot is not None and _direct.launch(slot, self.grid, args):
            return
        self.dispatch(args)

    def dispatch(self, args: tuple) -> None:
        """``kernel[grid](*args, **options)`` (Triton's dispatch), keeping the compiled kernel for the next
        call where :mod:`._runtime.direct` can launch it."""
        slot = _direct.key(self.kernel, args, self.options)
        compiled = self.kernel[self.grid](*args, **self.options)
        _direct.remember(slot, self.kernel, args, self.options, compiled)
        self.slot = slot if slot is not None and _direct.remembered(slot) else None


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
        if index is not None and index != torch.cuda.current_device():
            with torch.cuda.device(index):
                return self.run(*args)
        if self.interpreted:
            with np.errstate(all="ignore"):
                return self.run(*args)
        return self.run(*args)

    def run(self, *args):
        raise NotImplementedError
