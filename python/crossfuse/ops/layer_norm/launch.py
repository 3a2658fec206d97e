"""The forward's launch plan and launcher, and what the forward and backward plans share.

A plan is built from a call's (M, N) views and flags and holds every decision for them
(:mod:`.plan`); :func:`layer_norm_fwd` is the launcher on (M, N) views that the tuning sweep, the tests
and the custom operator call, with a configuration of their own where given.
"""

from __future__ import annotations

import torch
import triton

from ..._backend import is_interpreted
from .._library import stats_dtype
from .._runtime.device import Card, card_of, compute_capability_major, device_parallelism
from .config import LaunchConfig, interpreter_config, launch_config, shifted_max_ratio
from .kernels_fwd import _ln_fwd_chunked_kernel, _ln_fwd_kernel, _ln_fwd_shifted_kernel, _ln_fwd_tma_kernel
from .plan import Launch, Plan, PlanCache

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton before 3.4: the pointer kernels only
    TensorDescriptor = None

# whether the kernels were built for Triton's interpreter (TRITON_INTERPRET=1 when Triton was imported)
INTERPRETED = is_interpreted(_ln_fwd_kernel)


def tma_usable(*tensors: torch.Tensor) -> bool:
    """Whether the descriptor kernels can read these (M, N) views: on a GPU with a copy engine for
    tensors (compute capability 9+), 2- or 4-byte types, 16-byte aligned base and row stride, unit
    column stride (under the interpreter, any such layout)."""
    if TensorDescriptor is None:
        return False
    t0 = tensors[0]
    if not INTERPRETED:
        if t0.device.type != "cuda" or compute_capability_major(t0) < 9:
            return False
    if t0.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    esize = t0.element_size()
    return all(
        t.stride(1) == 1 and t.data_ptr() % 16 == 0 and t.stride(0) > 0 and t.stride(0) * esize % 16 == 0
        for t in tensors
    )


def row_desc(t: torch.Tensor, cfg: LaunchConfig) -> tuple:
    """``(shape, strides, block_shape)`` of a tensor descriptor over (M, N) rows ``t``, boxes of one row
    tile: what a :class:`.plan.Launch` makes a descriptor of (``descs``)."""
    return list(t.shape), [t.stride(0), 1], [cfg.block_m, cfg.block_n]


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def default_config(n: int, dtype: torch.dtype, kind: str, m: int, card: Card | None = None) -> LaunchConfig:
    """The configuration of a call without one of its own: the measured tables of ``card`` on a GPU, few
    programs with large tiles under the interpreter (:func:`.config.interpreter_config`)."""
    return interpreter_config(n, kind, m) if INTERPRETED else launch_config(n, dtype, kind, m, card)


class FwdPlan(Plan):
    """The forward on (M, N) rows ``x`` into rows of y with row stride ``y_stride``, with or without weight
    and bias, for one eps and configuration: the statistics' allocation and one launch."""

    __slots__ = ("acc", "device", "launch", "m", "m_pad", "tail")

    def __init__(self, x: torch.Tensor, y_stride: int, weight, bias, eps: float, config: LaunchConfig | None):
        super().__init__(x.device, INTERPRETED)
        M, N = x.shape
        self.m, self.acc, self.device = M, stats_dtype(x.dtype), x.device
        # rstd's offset in a joint statistics tensor: 16-byte aligned whatever M, as Triton's kernels
        # specialise on the alignment of their pointers (one compiled kernel for every row count)
        per16 = 16 // self.acc.itemsize
        self.m_pad = -(-M // per16) * per16
        self.launch = None
        if M == 0:
            return
        cfg = config or default_config(N, x.dtype, "fwd", M, card_of(x))
        common = dict(HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
                      IS_FP64=x.dtype == torch.float64, num_warps=cfg.num_warps)  # fmt: skip
        if N <= cfg.block_n and cfg.tma_stages and cfg.programs_per_sm > 0 and tma_usable(x):
            programs = min(triton.cdiv(M, cfg.block_m), cfg.programs_per_sm * device_parallelism(x))
            self.launch = Launch(
                _ln_fwd_tma_kernel, (programs,), {0: row_desc(x, cfg)}, BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n, KEEP_PARAMS=cfg.keep_params, EVEN_N=N == cfg.block_n, POW2_N=is_pow2(N),
                STAGES=cfg.tma_stages, **common,
            )  # fmt: skip
            self.tail = (y_stride, M, N, 1.0 / N, eps)
        elif N <= cfg.block_n:  # the whole row in one tile
            shifted_tile = cfg.shifted and x.element_size() == 2  # see _ln_fwd_tile
            tiles = triton.cdiv(M, cfg.block_m)
            if cfg.programs_per_sm > 0:  # a persistent grid
                tiles = min(tiles, cfg.programs_per_sm * device_parallelism(x))
            self.launch = Launch(
                _ln_fwd_kernel, (tiles,), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, UNROLL=cfg.unroll,
                PREFETCH=cfg.prefetch, KEEP_PARAMS=cfg.keep_params, EVEN_N=N == cfg.block_n,
                POW2_N=is_pow2(N), ONE_TILE=cfg.programs_per_sm == 0, SHIFTED=shifted_tile,
                MAX_R=shifted_max_ratio(x.dtype) if shifted_tile else 0.0, **common,
            )  # fmt: skip
            self.tail = (x.stride(0), y_stride, M, N, 1.0 / N, eps)
        else:
            if cfg.shifted:
                kernel, extra = _ln_fwd_shifted_kernel, dict(MAX_R=shifted_max_ratio(x.dtype))
            else:
                kernel, extra = _ln_fwd_chunked_kernel, {}
            self.launch = Launch(kernel, (M,), BLOCK_N=cfg.block_n, UNROLL=cfg.unroll, **extra, **common)
            self.tail = (x.stride(0), y_stride, M, N, eps)

    def split(self, stats: torch.Tensor, addresses: bool) -> tuple:
        """``(mean, rstd)`` of a joint statistics tensor (see :meth:`run`): their addresses (ints, for
        launches that go straight to their compiled kernels) or views."""
        if addresses:
            mean = stats.data_ptr()
            return mean, mean + self.m_pad * stats.element_size()
        return stats[: self.m], stats[self.m_pad : self.m_pad + self.m]

    def run(self, x, y, weight, bias, joint: bool = False):
        """``(mean, rstd)`` of the rows ``x`` (this plan's layout), ``y`` written; with ``joint``, the
        statistics in one tensor, mean from element 0 and rstd from element ``m_pad`` (one allocation, and
        addresses instead of views once the launch goes straight to its compiled kernel)."""
        if joint:
            stats = torch.empty(2 * self.m_pad, dtype=self.acc, device=self.device)
            if self.launch is None:
                return stats
            mean, rstd = self.split(stats, self.launch.go is not None)
        else:
            mean = torch.empty((self.m,), dtype=self.acc, device=self.device)
            rstd = torch.empty((self.m,), dtype=self.acc, device=self.device)
            stats = (mean, rstd)
        launch = self.launch
        if launch is not None:
            w = weight if weight is not None else x
            b = bias if bias is not None else x
            if launch.go is not None:
                # straight to the compiled kernel: addresses, which its C launcher takes as they are (a
                # tensor costs it a call of data_ptr and the driver's look-up of the pointer's device);
                # a descriptor's base stays a tensor (the launcher makes the descriptor)
                rows = x if launch.descs else x.data_ptr()
                launch.go(rows, y.data_ptr(), w.data_ptr(), b.data_ptr(), mean, rstd, *self.tail)
            else:
                launch(x, y, w, b, mean, rstd, *self.tail)
        return stats


def tensor_key(t) -> tuple | None:
    """What a plan reads of a tensor: shape, strides, dtype, device and 16-byte alignment."""
    if t is None:
        return None
    return t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0


FWD_PLANS = PlanCache(FwdPlan)


def layer_norm_fwd(x: torch.Tensor, weight, bias, eps: float, config: LaunchConfig | None = None,
                   out: torch.Tensor | None = None):  # fmt: skip
    """Forward on a 2-D ``x`` with unit column stride. Returns ``(y, mean, rstd)``; ``y`` contiguous, or
    ``out`` where given (an (M, N) tensor with unit column stride). ``config`` overrides the tables (for
    tuning and tests)."""
    M, N = x.shape
    y = torch.empty((M, N), dtype=x.dtype, device=x.device) if out is None else out
    weight = None if weight is None else weight.contiguous()
    bias = None if bias is None else bias.contiguous()
    y_key = (y.stride(), y.data_ptr() % 16 == 0)
    key = (tensor_key(x), y_key, tensor_key(weight), tensor_key(bias), eps, config)
    plan = FWD_PLANS.get(key, x, y.stride(0), weight, bias, eps, config)
    mean, rstd = plan(x, y, weight, bias)
    return y, mean, rstd
