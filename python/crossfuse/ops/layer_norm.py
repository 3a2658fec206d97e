"""Fused layer norm in Triton: forward, and backward for dx, dw and db.

Formula (torch's ``layer_norm``, normalising over the last dim of a (M, N) view of the input)::

    mean = sum(x) / N
    var  = sum((x - mean)^2) / N                    (biased; corrected two-pass: no cancellation,
                                                     and the mean's rounding is corrected too)
    rstd = 1 / sqrt(var + eps)                      (eps inside the square root)
    y    = (x - mean) * rstd * w + b                (w, b each optional)

    xhat = (x - mean) * rstd,   g = dy * w
    dx   = rstd * (g - xhat * mean(g * xhat) - mean(g))
    dw   = sum over rows of dy * xhat,   db = sum over rows of dy

Design:

* Forward, N <= FUSED_MAX_N: each program normalises a tile of BLOCK_M rows x BLOCK_N columns held in
  registers (small N gets several rows per program so every program moves enough bytes). It stores
  the float32 mean and rstd of each row for the backward. A config may make the grid persistent
  (``programs_per_sm > 0``: programs loop over tiles), and may have each iteration load the next tile
  before it reduces its own (``prefetch``: two tiles' loads in flight per program); the measured table
  (``TUNED``) uses both kinds of grid. Where the table says ``shifted`` (16-bit inputs), a tile's
  statistics take one block reduction about each row's first element instead of two (``_ln_fwd_tile``).
* Backward, N <= FUSED_MAX_N: a persistent grid of about ``programs_per_sm`` programs per SM; each
  walks row tiles with a stride of the grid size (loading the next tile before reducing the current
  one, where the table says ``prefetch``), writes dx, and keeps its partial sums of dw and db in
  float32 registers; it writes them once to a (programs, N) float32 buffer that a second small kernel
  reduces and casts (fewer programs when M is small, so the partials stay under an eighth of the
  traffic). That reduction runs on 128 or more programs of a few columns each, so that each makes one or
  two L2 round trips (``reduce_tile``). No locks, no atomics: the result does not depend on scheduling.
* The backward allocates what torch's does (dx, dw, db) and nothing more: the partials (and the split
  backward's row sums) are kept in the bytes of the last R rows of dx, whose dx the main kernels do not
  store (they still add those rows to dw and db); after the reduction a last launch writes those rows'
  dx over the partials (``layer_norm_bwd``): after the grouped kernel, from the row sums it posted
  (``_ln_bwd_finish_kernel``), else by a second pass over each row. Only where R would exceed a quarter
  of the rows (few rows) do the partials get a buffer of their own.
* On compute capability 9+ a persistent config may read x (and dy) through tensor descriptors instead
  (``tma_stages``: the copy engine fills shared-memory buffers that Triton pipelines over the tile
  loop, so the tiles in flight cost no registers), where the rows are 16-byte aligned.
* N > FUSED_MAX_N (up to MAX_N): the row does not fit in registers. Forward ("chunked") loops over
  the row three times, each thread summing its own elements of every chunk (one reduction per pass):
  the mean, the centred sums of the corrected two-pass variance, then normalise and write (the second
  and third reads hit L2: the first two passes load with ``evict_last``, the output streams past L2);
  or, where the table says ``shifted``, twice (``_ln_fwd_shifted_kernel``): sums about the row's first
  element, taken again about the mean they give where that element lies more than 4 standard deviations
  from it (1 in float32 and float64: ``shifted_max_ratio``), so that their cancellation stays bounded for
  any row, then normalise. N is a compile-time constant
  of these kernels, so their chunk loops have known trip counts (the compiler unrolls them and folds the
  masks; they compile once per N): with it, the chunked kernel became the fastest forward at most N
  from 4096 to 16384 (run 77).
  Backward ("split") computes the two row sums in one kernel, then a 2-D grid over (column chunks,
  row groups) writes dx and partial dw/db; or ("coop", where the table says so) one kernel whose
  programs hold column slabs of a row group, exchange their shares of the row sums and wait for each
  other, reading x and dy once (GPU only with more than one slab: the interpreter runs one program at a
  time, so there the split backward stands in). The tuning table picks these for long rows below
  FUSED_MAX_N too, where one whole row per program leaves too little in flight. In 16 bits with
  N = 4096 to 16384 (a power of 2) the table picks ("smem_rows") a Gluon kernel instead,
  ``crossfuse.ops._ln_bwd_rows``: one program per SM brings each row into shared memory with the copy
  engine and reads it from there twice, its float32 dw/db sums in registers, so x and dy are read once
  (compute capability 9+; elsewhere, and under the interpreter, SMEM_ROWS_FALLBACK's Triton kernels).
  For N = 16384, in 16 bits and float32, the entries split each row between a group of ``slices``
  programs (the grouped Gluon kernel of the same module): each keeps a slice's dw and db only, so the
  float32 partials in dx's last rows, and the rows computed again over them, shrink ``slices`` times;
  the programs of a group exchange their shares of the row sums through L2. In 16 bits the groups are
  of 8 programs of 2 warps, 6 an SM: independent programs that do not wait at each other's barriers;
  and two groups add their partials into one row (``paired``: the second of the two to end adds the
  first's, a + b being b + a, so the result still does not depend on scheduling), halving them again.
* On compute capability 9+ the backward's kernels after the first are programmatic dependent launches:
  each starts while the one before it ends (every kernel signals its dependents when it starts) and
  waits for it (``griddepcontrol.wait``) just before it reads that kernel's results or writes what it
  reads, so no launch gap sits between them; the results are those of plain launches, bit for bit.
* Statistics and accumulation are float32 for float32/float16/bfloat16 inputs, and float64 for
  float64 inputs (so ``torch.autograd.gradcheck`` can check the kernels).
* Under torch.compile the autograd function calls the launchers through custom operators
  (``torch.ops.crossfuse.layer_norm_fwd_shaped``/``layer_norm_bwd``, see ``_library``), which the
  tracer does not enter.
* The number of rows M is never a compile-time constant or specialised on (``do_not_specialize``),
  so a new batch size reuses the compiled kernels; tile shapes depend on N, the dtype and the row
  regime (few or many rows, ``MANY_ROWS``), so a kernel compiles at most once per regime (and N).

Limits: last dim 1 <= N <= MAX_N; float32, float16, bfloat16 (float64 for checking); rows may be
strided (any row stride, unit column stride) and are read without a copy when ``reshape`` gives a view.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton before 3.4: the pointer kernels only
    TensorDescriptor = None

from .. import _tuning
from .._backend import check_runnable, interpreter_problem, is_interpreted, quiet_interpreter
from .._validate import KERNEL_DTYPES, check_positive_float, check_same_device, check_tensor
from . import _library, _ln_bwd_rows
from ._library import stats_dtype as _stats_dtype
from ._runtime import pdl as _gdc
from ._runtime.device import bind_cuda_context, compute_capability_major, device_parallelism, on_input_device
from ._runtime.pdl import launch_dependents as _launch_dependents
from ._runtime.pdl import wait_for_previous as _wait_for_previous

FUSED_MAX_N = 16384  # largest row kept whole in registers
# the split backward's row-sums kernel: columns per chunk (8 warps, N a compile-time constant up to
# FUSED_MAX_N; bench/probe_ln_rowsums.py, run 78: 3713 GB/s at bf16 4096x16384 against 3539 for the
# table's 2048-column chunks with a runtime N)
ROWSUMS_BLOCK_N = 1024
MAX_N = 1 << 18  # largest supported row (chunked kernels above FUSED_MAX_N)
SUPPORTED_DTYPES = (*KERNEL_DTYPES, torch.float64)


# ----------------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _div(x, n, IS_FP64: tl.constexpr):
    """``x / n``, correctly rounded (a plain float32 division on GPUs may be an ulp off, which a zero
    variance multiplies by 1/sqrt(eps))."""
    if IS_FP64:
        return x / n
    else:
        return tl.math.div_rn(x, n * 1.0)  # n may be a constexpr (Triton specialises N == 1)


@triton.jit
def _div_n(x, N, inv_n, POW2_N: tl.constexpr, IS_FP64: tl.constexpr):
    """``x / N`` correctly rounded: where N is a power of 2, a product by ``inv_n`` (= 1/N, then exact:
    the same result for one instruction instead of a division's dozen), else ``_div``."""
    if POW2_N:
        return x * inv_n
    else:
        return _div(x, N, IS_FP64)


@triton.jit
def _add_pairs(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _sum2(a, b, axis: tl.constexpr):
    """``(tl.sum(a, axis), tl.sum(b, axis))`` in one reduction: one trip through shared memory and its
    barriers where two separate sums would take two."""
    return tl.reduce((a, b), axis, _add_pairs)


@triton.jit
def _load_rows(P, stride, rows, M, cols, col_ok):
    """The [rows, cols] tile of a (M, N) array with row stride ``stride``, in its own dtype; rows past M
    and columns past N read as 0 (and move no bytes)."""
    mask = (rows < M)[:, None] & col_ok[None, :]
    return tl.load(P + rows.to(tl.int64)[:, None] * stride + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _load_bwd_tile(X, DY, Mean, Rstd, stride_xm, stride_dym, rows, M, cols, col_ok):
    """What the backward reads for the row tile ``rows``: x and dy in their own dtype, mean and rstd."""
    x = _load_rows(X, stride_xm, rows, M, cols, col_ok)
    dy = _load_rows(DY, stride_dym, rows, M, cols, col_ok)
    mean = tl.load(Mean + rows, mask=rows < M, other=0.0)
    rstd = tl.load(Rstd + rows, mask=rows < M, other=0.0)
    return x, dy, mean, rstd


@triton.jit
def _columns(N, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr):
    """The tile's column offsets and which are inside the row (known true when N == BLOCK_N, so that the
    compiler drops the column predicates)."""
    cols = tl.arange(0, BLOCK_N)
    if EVEN_N:
        return cols, cols < BLOCK_N
    else:
        return cols, cols < N


@triton.jit
def _kept_params(W, B, cols, col_ok, acc_ty: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                 KEEP_PARAMS: tl.constexpr):  # fmt: skip
    """Weight and bias loaded once per program where KEEP_PARAMS (a program walking many tiles then needs
    no re-read, an L1/L2 round trip, before each store); placeholders where they are loaded per tile."""
    weight = cols
    bias = cols
    if KEEP_PARAMS:
        if HAS_WEIGHT:
            weight = tl.load(W + cols, mask=col_ok, other=0.0).to(acc_ty)
        if HAS_BIAS:
            bias = tl.load(B + cols, mask=col_ok, other=0.0).to(acc_ty)
    return weight, bias


@triton.jit
def _centred_moments(xc, col_ok, N, inv_n, EVEN_N: tl.constexpr, POW2_N: tl.constexpr, IS_FP64: tl.constexpr):
    """``(xc, corr, var)`` of a tile ``xc`` of rows each centred on a value near its mean: the mean is that
    value + corr (masked columns set to 0 in the returned ``xc``, out of the sums)."""
    if not EVEN_N:  # masked columns read as 0: out of the centred sums (masked rows: x = mean = 0)
        xc = tl.where(col_ok[None, :], xc, 0.0)
    sum_xc, sum_xc2 = _sum2(xc, xc * xc, 1)
    corr = _div_n(sum_xc, N, inv_n, POW2_N, IS_FP64)
    return xc, corr, tl.maximum(_div_n(sum_xc2, N, inv_n, POW2_N, IS_FP64) - corr * corr, 0.0)


@triton.jit
def _ln_fwd_tile(
    x, Y, W, B, Mean, Rstd, weight, bias, shift, rows, row_ok, cols, col_ok, stride_ym, N, inv_n, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, IS_FP64: tl.constexpr, KEEP_PARAMS: tl.constexpr,
    EVEN_N: tl.constexpr, POW2_N: tl.constexpr, SHIFTED: tl.constexpr = False, MAX_R: tl.constexpr = 0.0,
):  # fmt: skip
    """Normalise one row tile ``x`` (float32/float64, masked elements 0) and store y, mean and rstd;
    ``weight`` and ``bias`` are the loaded parameters where KEEP_PARAMS, else unused (loaded here).

    The statistics are the corrected two-pass ones: the mean, then the sums of x - mean, whose residual
    fixes the first mean's rounding (exact for equal rows). Where SHIFTED (16-bit inputs only), the
    first of those two block reductions goes: the sums are taken about ``shift`` (each row's first
    element, a load of its own), and a second time about the mean they give, as in the corrected
    two-pass, only in a tile where some row's (mean - shift)^2 exceeds MAX_R times its variance (see
    _ln_fwd_shifted_kernel) or its sum of squares overflowed. That second time re-centres x - shift as
    computed the first time, which is exact in float32 for 16-bit x unless x and shift lie more than 2^16
    apart (and then x's own rounding is the larger error); for float32 x it would keep the first
    rounding, up to about sqrt(R) float32 ulps of the row's spread, so float32 takes the two reductions."""
    if SHIFTED:
        xc, corr, var = _centred_moments(x - shift[:, None], col_ok, N, inv_n, EVEN_N, POW2_N, IS_FP64)
        mean = shift
        far = (corr * corr > MAX_R * var) | (var > 3.0e38)  # or sums of squares past float32's range
        if tl.max(far.to(tl.int32), axis=0) > 0:
            mean += corr
            xc, corr, var = _centred_moments(xc - corr[:, None], col_ok, N, inv_n, EVEN_N, POW2_N, IS_FP64)
    else:
        mean = _div_n(tl.sum(x, axis=1), N, inv_n, POW2_N, IS_FP64)
        # x is not needed after this: fewer live registers
        xc, corr, var = _centred_moments(x - mean[:, None], col_ok, N, inv_n, EVEN_N, POW2_N, IS_FP64)
    mean += corr
    if IS_FP64:
        rstd = 1.0 / tl.sqrt(var + eps)
    else:  # one instruction (rsqrt.approx, ~1 ulp as CUDA's rsqrtf, which torch's kernel uses) for ~12
        rstd = tl.math.rsqrt(var + eps)
    y = (xc - corr[:, None]) * rstd[:, None]
    if HAS_WEIGHT:
        if not KEEP_PARAMS:
            weight = tl.load(W + cols, mask=col_ok, other=0.0).to(x.dtype)
        y = y * weight[None, :]
    if HAS_BIAS:
        if not KEEP_PARAMS:
            bias = tl.load(B + cols, mask=col_ok, other=0.0).to(x.dtype)
        y = y + bias[None, :]
    rows = rows.to(tl.int64)
    mask = row_ok[:, None] & col_ok[None, :]
    tl.store(Y + rows[:, None] * stride_ym + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(Mean + rows, mean, mask=row_ok)
    tl.store(Rstd + rows, rstd, mask=row_ok)


@triton.jit
def _row_heads(X, stride, rows, M, acc_ty: tl.constexpr, SHIFTED: tl.constexpr):
    """Each row's first element where SHIFTED (rows past M read as 0), else a placeholder."""
    if SHIFTED:
        return tl.load(X + rows.to(tl.int64) * stride, mask=rows < M, other=0.0).to(acc_ty)
    else:
        return rows


@triton.jit(do_not_specialize=["M"])
def _ln_fwd_kernel(
    X,  # input, (M, N), row stride stride_xm, unit column stride
    Y,  # output, (M, N), row stride stride_ym
    W,  # weight, (N,); unused unless HAS_WEIGHT
    B,  # bias, (N,); unused unless HAS_BIAS
    Mean,  # saved mean, (M,), float32 (float64 when IS_FP64)
    Rstd,  # saved 1/sqrt(var + eps), (M,), same dtype as Mean
    stride_xm,
    stride_ym,
    M,
    N,
    inv_n,  # 1 / N in float32 (used where N is a power of 2: then exact)
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IS_FP64: tl.constexpr,
    UNROLL: tl.constexpr,  # row tiles per loop iteration (persistent grids): more loads in flight
    PREFETCH: tl.constexpr,  # persistent grids: load the next tile before this one's reductions
    KEEP_PARAMS: tl.constexpr,  # weight and bias loaded before the loop (once per program)
    EVEN_N: tl.constexpr,  # N == BLOCK_N: no column masks
    POW2_N: tl.constexpr,  # N is a power of 2: divisions by N as products by 1/N (exact)
    ONE_TILE: tl.constexpr,  # a program per tile: no loop (and, one row per tile, no row mask)
    SHIFTED: tl.constexpr = False,  # statistics about each row's first element (see _ln_fwd_tile)
    MAX_R: tl.constexpr = 0.0,  # SHIFTED: shifted_max_ratio
):
    # a program normalises row tiles pid, pid + num_programs, ...: one tile each when the grid has a
    # program per tile, several when the grid is persistent
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    acc_ty: tl.constexpr = tl.float64 if IS_FP64 else tl.float32
    cols, col_ok = _columns(N, BLOCK_N, EVEN_N)
    weight, bias = _kept_params(W, B, cols, col_ok, acc_ty, HAS_WEIGHT, HAS_BIAS, KEEP_PARAMS)
    if ONE_TILE:
        rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        if BLOCK_M == 1:
            row_ok = tl.full([1], True, tl.int1)  # the grid has one program per row
        x = _load_rows(X, stride_xm, rows, M, cols, col_ok).to(acc_ty)
        shift = _row_heads(X, stride_xm, rows, M, acc_ty, SHIFTED)
        _ln_fwd_tile(x, Y, W, B, Mean, Rstd, weight, bias, shift, rows, row_ok, cols, col_ok, stride_ym, N,
                     inv_n, eps, HAS_WEIGHT, HAS_BIAS, IS_FP64, KEEP_PARAMS, EVEN_N, POW2_N, SHIFTED,
                     MAX_R)  # fmt: skip
    else:
        if PREFETCH:  # the first tile; each iteration then loads the next one before it reduces its own
            x_next = _load_rows(X, stride_xm, pid * BLOCK_M + tl.arange(0, BLOCK_M), M, cols, col_ok)
        for tile in tl.range(pid, tl.cdiv(M, BLOCK_M), num_programs, loop_unroll_factor=UNROLL):
            rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
            row_ok = rows < M
            if PREFETCH:
                # in the input's dtype (half the registers of float32 for 2-byte types); its loads stay in
                # flight through this tile's reductions and stores
                x = x_next.to(acc_ty)
                x_next = _load_rows(X, stride_xm, rows + num_programs * BLOCK_M, M, cols, col_ok)
            else:
                x = _load_rows(X, stride_xm, rows, M, cols, col_ok).to(acc_ty)
            shift = _row_heads(X, stride_xm, rows, M, acc_ty, SHIFTED)
            _ln_fwd_tile(x, Y, W, B, Mean, Rstd, weight, bias, shift, rows, row_ok, cols, col_ok, stride_ym,
                         N, inv_n, eps, HAS_WEIGHT, HAS_BIAS, IS_FP64, KEEP_PARAMS, EVEN_N, POW2_N, SHIFTED,
                         MAX_R)  # fmt: skip


@triton.jit(do_not_specialize=["M"])
def _ln_fwd_tma_kernel(
    Xd,  # input, a tensor descriptor over (M, N), boxes [BLOCK_M, BLOCK_N]
    Y,  # output, (M, N), row stride stride_ym
    W,  # weight, (N,); unused unless HAS_WEIGHT
    B,  # bias, (N,); unused unless HAS_BIAS
    Mean,  # (M,)
    Rstd,  # (M,)
    stride_ym,
    M,
    N,
    inv_n,  # 1 / N in float32 (used where N is a power of 2: then exact)
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IS_FP64: tl.constexpr,
    KEEP_PARAMS: tl.constexpr,
    EVEN_N: tl.constexpr,
    POW2_N: tl.constexpr,
    STAGES: tl.constexpr,  # row tiles in flight: the copy engine fills shared memory, STAGES - 1 ahead
):
    # the persistent forward with its row tiles brought in by the copy engine (TMA): Triton pipelines
    # the descriptor loads over STAGES buffers of shared memory, so the tiles in flight cost no registers;
    # rows past M and columns past N arrive as zeros
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    acc_ty: tl.constexpr = tl.float64 if IS_FP64 else tl.float32
    cols, col_ok = _columns(N, BLOCK_N, EVEN_N)
    weight, bias = _kept_params(W, B, cols, col_ok, acc_ty, HAS_WEIGHT, HAS_BIAS, KEEP_PARAMS)
    for tile in tl.range(pid, tl.cdiv(M, BLOCK_M), num_programs, num_stages=STAGES):
        x = Xd.load([tile * BLOCK_M, 0]).to(acc_ty)
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        _ln_fwd_tile(x, Y, W, B, Mean, Rstd, weight, bias, rows, rows, rows < M, cols, col_ok, stride_ym, N,
                     inv_n, eps, HAS_WEIGHT, HAS_BIAS, IS_FP64, KEEP_PARAMS, EVEN_N, POW2_N)  # fmt: skip


@triton.jit
def _centred_sums(X, cols, N, mean, acc1, acc2, BLOCK_N: tl.constexpr, UNROLL: tl.constexpr):
    """Per-lane sums of ``x - mean`` and its square over the row's chunks (loads kept in L2 for the
    passes after this one), added to ``acc1``, ``acc2``."""
    for start in tl.range(0, N, BLOCK_N, loop_unroll_factor=UNROLL):
        ok = start + cols < N
        x = tl.load(X + start + cols, mask=ok, other=0.0, eviction_policy="evict_last").to(acc1.dtype)
        xc = tl.where(ok, x - mean, 0.0)
        acc1 += xc
        acc2 += xc * xc
    return acc1, acc2


@triton.jit
def _chunk_moments(acc1, acc2, N, IS_FP64: tl.constexpr):
    """``(corr, var)`` of a row from its [1, BLOCK_N] per-lane sums of ``x - shift`` and its square (the
    chunked forwards): the mean is ``shift + corr``."""
    s1, s2 = _sum2(acc1, acc2, 1)
    corr = _div(tl.sum(s1, axis=0), N, IS_FP64)
    return corr, tl.maximum(_div(tl.sum(s2, axis=0), N, IS_FP64) - corr * corr, 0.0)


@triton.jit
def _normalise_row(X, Y, W, B, cols, N, mean, corr, rstd, acc_ty: tl.constexpr, BLOCK_N: tl.constexpr,
                   UNROLL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):  # fmt: skip
    """The chunked forwards' last pass: y of the row from L2 (loaded with ``evict_first``, stored past L2
    with ``.cs``). As in the fused kernel the row is centred on ``mean`` and then corrected by ``corr``
    (x - (mean + corr) would round the sum to ulp(mean): ~1e-3 for rows of 1e4 + randn)."""
    for start in tl.range(0, N, BLOCK_N, loop_unroll_factor=UNROLL):
        ok = start + cols < N
        x = tl.load(X + start + cols, mask=ok, other=0.0, eviction_policy="evict_first").to(acc_ty)
        y = ((x - mean) - corr) * rstd
        if HAS_WEIGHT:
            y = y * tl.load(W + start + cols, mask=ok, other=0.0).to(acc_ty)
        if HAS_BIAS:
            y = y + tl.load(B + start + cols, mask=ok, other=0.0).to(acc_ty)
        tl.store(Y + start + cols, y.to(Y.dtype.element_ty), mask=ok, cache_modifier=".cs")


@triton.jit(do_not_specialize=["M"])
def _ln_fwd_chunked_kernel(
    X,  # input, (M, N), row stride stride_xm
    Y,  # output, (M, N), row stride stride_ym
    W,  # weight, (N,)
    B,  # bias, (N,)
    Mean,  # (M,)
    Rstd,  # (M,)
    stride_xm,
    stride_ym,
    M,
    N: tl.constexpr,  # a constant: the chunk loops have known trip counts (unrolled, masks folded)
    eps,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IS_FP64: tl.constexpr,
    UNROLL: tl.constexpr,  # chunks per loop iteration: more loads in flight, more registers
):
    row = tl.program_id(0).to(tl.int64)
    X += row * stride_xm
    Y += row * stride_ym
    acc_ty = tl.float64 if IS_FP64 else tl.float32
    cols = tl.arange(0, BLOCK_N)[None, :]  # [1, BLOCK_N] chunks (see _ln_fwd_shifted_kernel)
    # The statistics of the fused kernel (corrected two-pass), summed per lane: each thread adds its own
    # elements of every chunk and the lanes are reduced once per pass, so no barrier sits inside a loop
    # and the loads of successive chunks can be in flight together. Passes 2 and 3 re-read the row,
    # which is still in L2.
    # Eviction hints keep the row in L2 for the passes after the first (passes 1 and 2: evict last; the
    # last pass: evict first) and stream the output past it (.cs), as other programs' rows stream in.
    # pass 1: the mean
    zero = tl.zeros([1, BLOCK_N], dtype=acc_ty)
    acc = zero
    for start in tl.range(0, N, BLOCK_N, loop_unroll_factor=UNROLL):
        x = tl.load(X + start + cols, mask=start + cols < N, other=0.0, eviction_policy="evict_last")
        acc += x.to(acc_ty)
    mean = _div(tl.sum(tl.sum(acc, axis=1), axis=0), N, IS_FP64)
    # pass 2: centred sums; the residual sum corrects the first mean's rounding
    acc1, acc2 = _centred_sums(X, cols, N, mean, zero, zero, BLOCK_N, UNROLL)
    corr, var = _chunk_moments(acc1, acc2, N, IS_FP64)
    rstd = 1.0 / tl.sqrt(var + eps)
    # pass 3: normalise and write
    _normalise_row(X, Y, W, B, cols, N, mean, corr, rstd, acc_ty, BLOCK_N, UNROLL, HAS_WEIGHT, HAS_BIAS)
    tl.store(Mean + row, mean + corr)
    tl.store(Rstd + row, rstd)


@triton.jit(do_not_specialize=["M"])
def _ln_fwd_shifted_kernel(
    X,  # input, (M, N), row stride stride_xm
    Y,  # output, (M, N), row stride stride_ym
    W,  # weight, (N,)
    B,  # bias, (N,)
    Mean,  # (M,)
    Rstd,  # (M,)
    stride_xm,
    stride_ym,
    M,
    N: tl.constexpr,  # a constant, as in the chunked kernel
    eps,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IS_FP64: tl.constexpr,
    UNROLL: tl.constexpr,  # chunks per loop iteration
    MAX_R: tl.constexpr,  # the largest (mean - shift)^2 / var kept (shifted_max_ratio)
):
    """The chunked forward in two passes over the row (``shifted`` in the table): per-lane sums about a
    shift, then normalise and write from L2.

    The shift is the row's first element: a scalar load, no block reduction before the first pass. The
    sums about a shift s give var = S2/N - (S1/N)^2, which cancels in proportion to R = (mean - s)^2 /
    var; where R > MAX_R (a first element far from the row's mean: a row with one large feature there)
    the sums are taken again, from L2, about s + S1/N, which is the mean up to rounding, so for any row
    the variance comes from sums with R <= MAX_R; likewise where the sum of squares overflowed (a first
    element some 1e17 from the rest, which the three-pass sums would still hold). The chunks are
    [1, BLOCK_N] tiles: in that form this kernel compiled 6-8% faster than in one dimension here (run
    179)."""
    row = tl.program_id(0).to(tl.int64)
    X += row * stride_xm
    Y += row * stride_ym
    acc_ty = tl.float64 if IS_FP64 else tl.float32
    cols = tl.arange(0, BLOCK_N)[None, :]
    zero = tl.zeros([1, BLOCK_N], dtype=acc_ty)
    shift = tl.load(X).to(acc_ty)
    acc1, acc2 = _centred_sums(X, cols, N, shift, zero, zero, BLOCK_N, UNROLL)
    corr, var = _chunk_moments(acc1, acc2, N, IS_FP64)
    if (corr * corr > MAX_R * var) | (var > 3.0e38):  # or sums of squares past float32's range
        shift += corr
        acc1, acc2 = _centred_sums(X, cols, N, shift, zero, zero, BLOCK_N, UNROLL)
        corr, var = _chunk_moments(acc1, acc2, N, IS_FP64)
    rstd = 1.0 / tl.sqrt(var + eps)
    _normalise_row(X, Y, W, B, cols, N, shift, corr, rstd, acc_ty, BLOCK_N, UNROLL, HAS_WEIGHT, HAS_BIAS)
    tl.store(Mean + row, shift + corr)
    tl.store(Rstd + row, rstd)


@triton.jit
def _ln_bwd_tile(x, dy, mean, rstd, w, N, inv_n, HAS_WEIGHT: tl.constexpr, POW2_N: tl.constexpr,
                 IS_FP64: tl.constexpr):  # fmt: skip
    """``(xhat, dx)`` of one row tile (float32/float64 x and dy; w unused unless HAS_WEIGHT). No select for
    masked elements: x and dy read as 0 there (mean and rstd too, in masked rows), so xhat is finite, and
    every sum takes them through a product with dy or g, which are 0; their dx is not stored."""
    xhat = (x - mean[:, None]) * rstd[:, None]
    if HAS_WEIGHT:
        g = dy * w[None, :]
    else:
        g = dy
    # two separate sums: one tl.reduce of the pair (one trip through shared memory) measured 12% slower
    # here in bfloat16 (run 14), though it does not slow the forward
    c1 = _div_n(tl.sum(xhat * g, axis=1), N, inv_n, POW2_N, IS_FP64)
    c2 = _div_n(tl.sum(g, axis=1), N, inv_n, POW2_N, IS_FP64)
    return xhat, (g - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]


@triton.jit(do_not_specialize=["ROW0", "M", "DX_M"])
def _ln_bwd_kernel(
    DX,  # input gradient, (M, N), row stride stride_dxm
    DY,  # output gradient, (M, N), row stride stride_dym
    X,  # input, (M, N), row stride stride_xm
    W,  # weight, (N,); unused unless HAS_WEIGHT
    Mean,  # (M,)
    Rstd,  # (M,)
    DW_part,  # partial dw, (num_programs, N), float32/float64; unused unless COMPUTE_DW
    DB_part,  # partial db, (num_programs, N); unused unless COMPUTE_DB
    stride_dxm,
    stride_dym,
    stride_xm,
    ROW0,  # this launch takes the rows ROW0 <= row < M,
    M,
    DX_M,  # and stores dx for rows below DX_M only (the sums of dw and db take them all)
    N,
    inv_n,  # 1 / N in float32 (used where N is a power of 2: then exact)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    COMPUTE_DW: tl.constexpr,
    COMPUTE_DB: tl.constexpr,
    IS_FP64: tl.constexpr,
    UNROLL: tl.constexpr,  # row tiles per loop iteration: more loads in flight, more registers
    PREFETCH: tl.constexpr,  # load the next tile before this one's reductions
    EVEN_N: tl.constexpr,  # N == BLOCK_N: no column masks
    POW2_N: tl.constexpr,  # N is a power of 2: divisions by N as products by 1/N (exact)
    GDC: tl.constexpr = False,  # grid dependency control: dx stored after _wait_for_previous
):
    _launch_dependents(GDC)
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    acc_ty = tl.float64 if IS_FP64 else tl.float32
    cols, col_ok = _columns(N, BLOCK_N, EVEN_N)
    w = cols  # a placeholder without weights
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(acc_ty)
    dw = tl.zeros([BLOCK_N], dtype=acc_ty)
    db = tl.zeros([BLOCK_N], dtype=acc_ty)
    num_tiles = tl.cdiv(M - ROW0, BLOCK_M)
    if PREFETCH:  # the first tile; each iteration then loads the next one before it reduces its own
        x_next, dy_next, mean_next, rstd_next = _load_bwd_tile(
            X, DY, Mean, Rstd, stride_xm, stride_dym, ROW0 + pid * BLOCK_M + tl.arange(0, BLOCK_M), M, cols,
            col_ok,
        )  # fmt: skip
    for tile in tl.range(pid, num_tiles, num_programs, loop_unroll_factor=UNROLL):
        rows = ROW0 + tile * BLOCK_M + tl.arange(0, BLOCK_M)
        mask = (rows < DX_M)[:, None] & col_ok[None, :]
        if PREFETCH:  # this tile from the registers (its own dtype), the next one's loads in flight
            x, dy, mean, rstd = x_next.to(acc_ty), dy_next.to(acc_ty), mean_next, rstd_next
            x_next, dy_next, mean_next, rstd_next = _load_bwd_tile(
                X, DY, Mean, Rstd, stride_xm, stride_dym, rows + num_programs * BLOCK_M, M, cols, col_ok
            )
        else:
            x, dy, mean, rstd = _load_bwd_tile(
                X, DY, Mean, Rstd, stride_xm, stride_dym, rows, M, cols, col_ok
            )
            x, dy = x.to(acc_ty), dy.to(acc_ty)
        rows = rows.to(tl.int64)
        xhat, dx = _ln_bwd_tile(x, dy, mean, rstd, w, N, inv_n, HAS_WEIGHT, POW2_N, IS_FP64)
        _wait_for_previous(GDC)
        tl.store(DX + rows[:, None] * stride_dxm + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            dw += tl.sum(dy * xhat, axis=0)
        if COMPUTE_DB:
            db += tl.sum(dy, axis=0)
    if COMPUTE_DW:
        tl.store(DW_part + pid * N + cols, dw, mask=col_ok)
    if COMPUTE_DB:
        tl.store(DB_part + pid * N + cols, db, mask=col_ok)


@triton.jit(do_not_specialize=["ROW0", "M", "DX_M"])
def _ln_bwd_tma_kernel(
    DX,  # input gradient, (M, N), row stride stride_dxm
    DYd,  # output gradient, a tensor descriptor over (M, N), boxes [BLOCK_M, BLOCK_N]
    Xd,  # input, a tensor descriptor over (M, N), boxes [BLOCK_M, BLOCK_N]
    W,  # weight, (N,); unused unless HAS_WEIGHT
    Mean,  # (M,)
    Rstd,  # (M,)
    DW_part,  # partial dw, (num_programs, N); unused unless COMPUTE_DW
    DB_part,  # partial db, (num_programs, N); unused unless COMPUTE_DB
    stride_dxm,
    ROW0,  # this launch takes the rows ROW0 <= row < M (M: the descriptors' row count),
    M,
    DX_M,  # and stores dx for rows below DX_M only (the sums of dw and db take them all)
    N,
    inv_n,  # 1 / N in float32 (used where N is a power of 2: then exact)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    COMPUTE_DW: tl.constexpr,
    COMPUTE_DB: tl.constexpr,
    IS_FP64: tl.constexpr,
    EVEN_N: tl.constexpr,
    POW2_N: tl.constexpr,
    STAGES: tl.constexpr,  # row tiles in flight: the copy engine fills shared memory, STAGES - 1 ahead
    GDC: tl.constexpr = False,  # grid dependency control: dx stored after _wait_for_previous
):
    # _ln_bwd_kernel with x and dy brought in by the copy engine (TMA), pipelined by Triton over STAGES
    # shared-memory buffers instead of prefetched into registers; rows past M and columns past N arrive
    # as zeros, which every sum takes through a product with dy or g (see _ln_bwd_kernel)
    _launch_dependents(GDC)
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    acc_ty = tl.float64 if IS_FP64 else tl.float32
    cols, col_ok = _columns(N, BLOCK_N, EVEN_N)
    w = cols  # a placeholder without weights
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(acc_ty)
    dw = tl.zeros([BLOCK_N], dtype=acc_ty)
    db = tl.zeros([BLOCK_N], dtype=acc_ty)
    for tile in tl.range(pid, tl.cdiv(M - ROW0, BLOCK_M), num_programs, num_stages=STAGES):
        row0 = ROW0 + tile * BLOCK_M
        x = Xd.load([row0, 0]).to(acc_ty)
        dy = DYd.load([row0, 0]).to(acc_ty)
        rows = row0 + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        mean = tl.load(Mean + rows, mask=row_ok, other=0.0)
        rstd = tl.load(Rstd + rows, mask=row_ok, other=0.0)
        xhat, dx = _ln_bwd_tile(x, dy, mean, rstd, w, N, inv_n, HAS_WEIGHT, POW2_N, IS_FP64)
        mask = (rows < DX_M)[:, None] & col_ok[None, :]
        _wait_for_previous(GDC)
        tl.store(DX + rows.to(tl.int64)[:, None] * stride_dxm + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=mask)  # fmt: skip
        if COMPUTE_DW:
            dw += tl.sum(dy * xhat, axis=0)
        if COMPUTE_DB:
            db += tl.sum(dy, axis=0)
    if COMPUTE_DW:
        tl.store(DW_part + pid * N + cols, dw, mask=col_ok)
    if COMPUTE_DB:
        tl.store(DB_part + pid * N + cols, db, mask=col_ok)


@triton.jit
def _row_chunk(X, DY, W, row, stride_xm, stride_dym, start, cols, N, acc_ty: tl.constexpr,
               HAS_WEIGHT: tl.constexpr):  # fmt: skip
    """Columns ``start + cols`` of a row for the row-wise backward: x and g = dy * w in ``acc_ty`` (0 past
    N), and which are inside the row."""
    ok = start + cols < N
    x = tl.load(X + row * stride_xm + start + cols, mask=ok, other=0.0).to(acc_ty)
    g = tl.load(DY + row * stride_dym + start + cols, mask=ok, other=0.0).to(acc_ty)
    if HAS_WEIGHT:
        g = g * tl.load(W + start + cols, mask=ok, other=0.0).to(acc_ty)
    return x, g, ok


@triton.jit(do_not_specialize=["ROW0", "M"])
def _ln_bwd_rowsums_kernel(
    DY,  # output gradient, (M, N), row stride stride_dym
    X,  # input, (M, N), row stride stride_xm
    W,  # weight, (N,)
    Mean,  # (M,)
    Rstd,  # (M,)
    C1,  # out: mean(g * xhat) of row ROW0 + i at i; unused if WRITE_DX
    C2,  # out: mean(g) likewise; unused if WRITE_DX
    DX,  # out if WRITE_DX: input gradient, (M, N), row stride stride_dxm
    stride_dym,
    stride_xm,
    stride_dxm,
    ROW0,  # program i takes row ROW0 + i
    M,
    N,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    IS_FP64: tl.constexpr,
    WRITE_DX: tl.constexpr,  # a second pass over the row writes its dx instead of storing the sums
    UNROLL: tl.constexpr = 1,  # chunks per loop iteration, their loads issued together
    GDC: tl.constexpr = False,  # grid dependency control: the dx pass after _wait_for_previous
    N_C: tl.constexpr = 0,  # > 0: N as a compile-time constant (known trip counts, the loop unrolled)
):
    _launch_dependents(GDC)
    if N_C > 0:
        N = N_C
    i = tl.program_id(0).to(tl.int64)
    row = ROW0 + i
    acc_ty = tl.float64 if IS_FP64 else tl.float32
    cols = tl.arange(0, BLOCK_N)
    mean = tl.load(Mean + row)
    rstd = tl.load(Rstd + row)
    acc1 = tl.zeros([BLOCK_N], dtype=acc_ty)
    acc2 = tl.zeros([BLOCK_N], dtype=acc_ty)
    for start in tl.range(0, N, BLOCK_N, loop_unroll_factor=UNROLL):
        x, g, ok = _row_chunk(X, DY, W, row, stride_xm, stride_dym, start, cols, N, acc_ty, HAS_WEIGHT)
        xhat = tl.where(ok, (x - mean) * rstd, 0.0)
        acc1 += xhat * g
        acc2 += g
    c1 = _div(tl.sum(acc1, axis=0), N, IS_FP64)
    c2 = _div(tl.sum(acc2, axis=0), N, IS_FP64)
    if WRITE_DX:  # the row again (from L2), as _ln_bwd_split_kernel writes it
        _wait_for_previous(GDC)
        for start in tl.range(0, N, BLOCK_N, loop_unroll_factor=UNROLL):
            x, g, ok = _row_chunk(X, DY, W, row, stride_xm, stride_dym, start, cols, N, acc_ty, HAS_WEIGHT)
            dx = (g - ((x - mean) * rstd * c1 + c2)) * rstd
            tl.store(DX + row * stride_dxm + start + cols, dx.to(DX.dtype.element_ty), mask=ok)
    else:
        tl.store(C1 + i, c1)
        tl.store(C2 + i, c2)


@triton.jit
def _group_sums(Shares, rows, k, SLICES: tl.constexpr, inv_n):
    """``(c1, c2)`` of ``rows`` (a tensor of row indices; masked rows: ``rows < 0``, their sums 0) from the
    grouped kernel's posted shares ((M, 2, SLICES) int64, see ``_ln_bwd_rows._posted``), added in slice
    order as that kernel adds them; waits until every share is posted (its tag set)."""
    at = Shares + tl.maximum(rows, 0).to(tl.int64)[:, None] * (2 * SLICES) + k[None, :]
    ok = (rows >= 0)[:, None]
    posted = 0x100000000  # a posted zero: what masked rows read
    s1 = tl.load(at, mask=ok, other=posted, volatile=True)
    s2 = tl.load(at + SLICES, mask=ok, other=posted, volatile=True)
    while tl.min(tl.min(tl.minimum(s1, s2), axis=1), axis=0) <= 0xFFFFFFFF:
        s1 = tl.load(at, mask=ok, other=posted, volatile=True)
        s2 = tl.load(at + SLICES, mask=ok, other=posted, volatile=True)
    return tl.sum(_unposted(s1), axis=1) * inv_n, tl.sum(_unposted(s2), axis=1) * inv_n


@triton.jit
def _unposted(w):
    """The float32 posted in the 64-bit word ``w`` (as ``_ln_bwd_rows._unposted``, in Triton)."""
    return (w & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _finish_loads(DY, X, W, Mean, Rstd, stride_dym, stride_xm, row, start, cols, HAS_WEIGHT: tl.constexpr):
    """``(x, g, mean, rstd)`` of the tile ``start + cols`` of ``row`` (int64), in float32 (g = dy * w)."""
    x = tl.load(X + row * stride_xm + start + cols).to(tl.float32)
    g = tl.load(DY + row * stride_dym + start + cols).to(tl.float32)
    if HAS_WEIGHT:
        g = g * tl.load(W + start + cols).to(tl.float32)
    return x, g, tl.load(Mean + row), tl.load(Rstd + row)


@triton.jit
def _finish_dx(x, g, mean, rstd, c1, c2):
    """dx of a tile from its loads (``_finish_loads``) and its row's sums, as the grouped kernel writes it."""
    xhat = (x - mean) * rstd
    return g * rstd - (xhat * (c1 * rstd) + c2 * rstd)


@triton.jit(do_not_specialize=["ROW0", "M", "HOT_TILE", "LAST_TILE", "TILES", "TARGET"])  # none across M
def _ln_bwd_finish_kernel(
    DY,  # output gradient, (M, N), row stride stride_dym
    X,  # input, (M, N), row stride stride_xm
    W,  # weight, (N,)
    Mean,  # (M,) float32
    Rstd,  # (M,) float32
    Shares,  # (M, 2, SLICES) int64: the grouped kernel's posted shares of the row sums
    Count,  # (1,) int32: the grouped kernel's ticket counter (its program count by now)
    DX,  # out: input gradient, (M, N), row stride stride_dxm; its last rows hold Shares and Count
    stride_dym,
    stride_xm,
    stride_dxm,
    ROW0,  # the first row: tiles are numbered row-major from (ROW0, 0), BLOCK_N columns each
    M,
    inv_n,
    HOT_TILE,  # the first tile whose bytes hold the shares of rows ROW0.. or Count (all later ones too)
    LAST_TILE,  # the first tile whose bytes hold the shares of a row of a hot tile or Count (>= HOT_TILE)
    TILES,  # tiles of the rows ROW0..M-1
    TARGET,  # Count once each program before HOT_TILE has read its shares (< 2**24)
    N: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SLICES: tl.constexpr,
    HOT_ROWS: tl.constexpr,  # a power of 2, at least the rows of the tiles from LAST_TILE on
    HAS_WEIGHT: tl.constexpr,
    GDC: tl.constexpr = False,  # grid dependency control: the dx stores after _wait_for_previous
):
    # dx of the rows whose bytes held the grouped backward's partials, from the row sums that kernel
    # posted (no second pass over the rows). Program t < HOT_TILE takes tile t: it reads its row's sums,
    # loads its tile, counts itself in Count (release: its reads are done), then, once the reduction of
    # the partials is over (_wait_for_previous), stores the tile. The tiles from HOT_TILE on overwrite
    # sums: program t in HOT_TILE..LAST_TILE-1 takes tile t as the others do, but counts itself in
    # Count's top byte and stores only once the low bytes say every program before HOT_TILE has read (its
    # tile holds only their rows' sums); the tiles from LAST_TILE on hold the sums of the hot tiles' own
    # rows and the counter, so the last program takes all of them, after every other program has counted
    # itself (acquire), its own rows' sums read first. A program waits only for programs before it: under
    # the interpreter, which runs programs in order, this completes too.
    _launch_dependents(GDC)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    k = tl.arange(0, SLICES)
    per_row: tl.constexpr = N // BLOCK_N
    if pid < LAST_TILE:
        row = ROW0 + pid // per_row
        start = (pid % per_row) * BLOCK_N
        c1, c2 = _group_sums(Shares, tl.full([1], 0, tl.int32) + row, k, SLICES, inv_n)
        row = row.to(tl.int64)
        x, g, mean, rstd = _finish_loads(DY, X, W, Mean, Rstd, stride_dym, stride_xm, row, start, cols,
                                         HAS_WEIGHT)  # fmt: skip
        dx = _finish_dx(x, g, mean, rstd, tl.sum(c1, axis=0), tl.sum(c2, axis=0))
        if pid < HOT_TILE:
            tl.atomic_add(Count, 1, sem="release")
        else:
            tl.atomic_add(Count, 1 << 24, sem="release")
            while (tl.atomic_add(Count, 0, sem="acquire") & 0xFFFFFF) < TARGET:
                pass
        _wait_for_previous(GDC)
        tl.store(DX + row * stride_dxm + start + cols, dx.to(DX.dtype.element_ty))
    else:
        first = ROW0 + LAST_TILE // per_row
        h = tl.arange(0, HOT_ROWS)
        rows = tl.where(first + h < M, first + h, -1)
        c1s, c2s = _group_sums(Shares, rows, k, SLICES, inv_n)
        # the tiles go one after another, each tile's loads issued before the previous tile's store (the
        # first before the wait): x and dy are inputs, read whenever, only the stores must wait
        row_n = first.to(tl.int64)  # the row of tile LAST_TILE
        start_n = (LAST_TILE % per_row) * BLOCK_N
        x_n, g_n, mean_n, rstd_n = _finish_loads(DY, X, W, Mean, Rstd, stride_dym, stride_xm, row_n, start_n,
                                                 cols, HAS_WEIGHT)  # fmt: skip
        while tl.atomic_add(Count, 0, sem="acquire") < TARGET + ((LAST_TILE - HOT_TILE) << 24):
            pass
        _wait_for_previous(GDC)
        for t in range(LAST_TILE, TILES):
            row = ROW0 + t // per_row
            start = (t % per_row) * BLOCK_N
            x, g, mean, rstd = x_n, g_n, mean_n, rstd_n
            nxt = tl.minimum(t + 1, TILES - 1)  # past the last tile, that tile again (not stored)
            row_n = (ROW0 + nxt // per_row).to(tl.int64)
            x_n, g_n, mean_n, rstd_n = _finish_loads(DY, X, W, Mean, Rstd, stride_dym, stride_xm, row_n,
                                                     (nxt % per_row) * BLOCK_N, cols, HAS_WEIGHT)  # fmt: skip
            at = h == row - first  # the row's sums (a sum of one nonzero term: exact)
            c1 = tl.sum(tl.where(at, c1s, 0.0), axis=0)
            c2 = tl.sum(tl.where(at, c2s, 0.0), axis=0)
            dx = _finish_dx(x, g, mean, rstd, c1, c2)
            tl.store(DX + row.to(tl.int64) * stride_dxm + start + cols, dx.to(DX.dtype.element_ty))


@triton.jit
def _slab_tiles(X, DY, stride_xm, stride_dym, rows, M, cols, col_ok, x_next, dy_next, step,
                acc_ty: tl.constexpr, PREFETCH: tl.constexpr):  # fmt: skip
    """x and dy (in ``acc_ty``) of the tile ``rows`` x ``cols`` of a column-slab kernel, and the next
    tile's raw loads: where PREFETCH, this tile is ``x_next``/``dy_next`` (issued an iteration earlier)
    and the loads of the tile ``step`` rows further are issued now, to stay in flight through this
    tile's work; else this tile is loaded now and the placeholders pass through."""
    if PREFETCH:
        x, dy = x_next.to(acc_ty), dy_next.to(acc_ty)
        x_next = _load_rows(X, stride_xm, rows + step, M, cols, col_ok)
        dy_next = _load_rows(DY, stride_dym, rows + step, M, cols, col_ok)
    else:
        x = _load_rows(X, stride_xm, rows, M, cols, col_ok).to(acc_ty)
        dy = _load_rows(DY, stride_dym, rows, M, cols, col_ok).to(acc_ty)
    return x, dy, x_next, dy_next


@triton.jit
def _first_slab_tiles(X, DY, stride_xm, stride_dym, rows, M, cols, col_ok, PREFETCH: tl.constexpr):
    """The raw loads of a slab kernel's first tile where PREFETCH, else placeholders (see _slab_tiles)."""
    x_next = cols
    dy_next = cols
    if PREFETCH:
        x_next = _load_rows(X, stride_xm, rows, M, cols, col_ok)
        dy_next = _load_rows(DY, stride_dym, rows, M, cols, col_ok)
    return x_next, dy_next


@triton.jit
def _store_dwdb_part(DW_part, DB_part, dw, db, group, N, cols, col_ok, COMPUTE_DW: tl.constexpr,
                     COMPUTE_DB: tl.constexpr):  # fmt: skip
    """A row group's partial dw and db of its column slab, into row ``group`` of the (groups, N) partials."""
    if COMPUTE_DW:
        tl.store(DW_part + group * N + cols, dw, mask=col_ok)
    if COMPUTE_DB:
        tl.store(DB_part + group * N + cols, db, mask=col_ok)


@triton.jit(do_not_specialize=["M", "DX_M"])
def _ln_bwd_split_kernel(
    DX,  # input gradient, (M, N), row stride stride_dxm
    DY,  # output gradient, (M, N), row stride stride_dym
    X,  # input, (M, N), row stride stride_xm
    W,  # weight, (N,)
    Mean,  # (M,)
    Rstd,  # (M,)
    C1,  # mean(g * xhat) per row, (DX_M,)
    C2,  # mean(g) per row, (DX_M,)
    DW_part,  # partial dw, (num row groups, N)
    DB_part,  # partial db, (num row groups, N)
    stride_dxm,
    stride_dym,
    stride_xm,
    M,
    DX_M,  # dx is stored for rows below DX_M only (the sums of dw and db take all M)
    N,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    COMPUTE_DW: tl.constexpr,
    COMPUTE_DB: tl.constexpr,
    IS_FP64: tl.constexpr,
    UNROLL: tl.constexpr,  # row tiles per loop iteration: more loads in flight, more registers
    PREFETCH: tl.constexpr,  # load the next tile before this one's reductions
    GDC: tl.constexpr = False,  # grid dependency control: the row sums read after _wait_for_previous
):
    _launch_dependents(GDC)
    pid_n = tl.program_id(0)
    group = tl.program_id(1)
    num_groups = tl.num_programs(1)
    acc_ty = tl.float64 if IS_FP64 else tl.float32
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(acc_ty)
    dw = tl.zeros([BLOCK_N], dtype=acc_ty)
    db = tl.zeros([BLOCK_N], dtype=acc_ty)
    first = group * BLOCK_M + tl.arange(0, BLOCK_M)
    x_next, dy_next = _first_slab_tiles(X, DY, stride_xm, stride_dym, first, M, cols, col_ok, PREFETCH)
    _wait_for_previous(GDC)  # for C1 and C2
    for tile in tl.range(group, tl.cdiv(M, BLOCK_M), num_groups, loop_unroll_factor=UNROLL):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        mask = row_ok[:, None] & col_ok[None, :]
        x, dy, x_next, dy_next = _slab_tiles(X, DY, stride_xm, stride_dym, rows, M, cols, col_ok, x_next,
                                             dy_next, num_groups * BLOCK_M, acc_ty, PREFETCH)  # fmt: skip
        rows = rows.to(tl.int64)
        mean = tl.load(Mean + rows, mask=row_ok, other=0.0)
        rstd = tl.load(Rstd + rows, mask=row_ok, other=0.0)
        dx_ok = rows < DX_M
        c1 = tl.load(C1 + rows, mask=dx_ok, other=0.0)
        c2 = tl.load(C2 + rows, mask=dx_ok, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        if HAS_WEIGHT:
            g = dy * w[None, :]
        else:
            g = dy
        dx = (g - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        tl.store(DX + rows[:, None] * stride_dxm + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=dx_ok[:, None] & col_ok[None, :])  # fmt: skip
        if COMPUTE_DW:
            dw += tl.sum(dy * xhat, axis=0)
        if COMPUTE_DB:
            db += tl.sum(dy, axis=0)
    _store_dwdb_part(DW_part, DB_part, dw, db, group, N, cols, col_ok, COMPUTE_DW, COMPUTE_DB)


@triton.jit(do_not_specialize=["M", "DX_M"])
def _ln_bwd_coop_kernel(
    DX,  # input gradient, (M, N), row stride stride_dxm
    DY,  # output gradient, (M, N), row stride stride_dym
    X,  # input, (M, N), row stride stride_xm
    W,  # weight, (N,)
    Mean,  # (M,)
    Rstd,  # (M,)
    Part,  # (row groups, 2 ring slots, 2 sums, SLABS, BLOCK_M) float32/float64: each slab's row sums
    Count,  # (row groups + 1,) int32, zero at launch: shares of row sums posted by each group's programs;
    # the last: tickets handed out
    DW_part,  # partial dw, (num row groups, N)
    DB_part,  # partial db, (num row groups, N)
    stride_dxm,
    stride_dym,
    stride_xm,
    M,
    DX_M,  # dx is stored for rows below DX_M only (the sums of dw and db take all M)
    N,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    # column slabs of BLOCK_N (the grid is SLABS times the row groups); a constant: a division by it at
    # run time took ~27 more registers per thread (sm_90, Triton 3.6)
    SLABS: tl.constexpr,
    SLABS_P2: tl.constexpr,  # next power of 2 of SLABS
    HAS_WEIGHT: tl.constexpr,
    COMPUTE_DW: tl.constexpr,
    COMPUTE_DB: tl.constexpr,
    IS_FP64: tl.constexpr,
    PREFETCH: tl.constexpr,  # load the next tile before this one's reductions
    GDC: tl.constexpr = False,  # grid dependency control (the first kernel: no wait)
):
    # The backward of long rows with x and dy read once. Program (slab, group) owns a slab of columns
    # and walks the row tiles of its group, holding its slab of each tile in registers; it posts its
    # shares of the tile's two row sums, adds the tile to its dw and db, then waits until every slab of
    # the group has posted, adds the shares in slab order (the same sums in every program: dx does not
    # depend on the schedule) and writes its slab's dx.
    # Waiting needs the group's programs to run together. Each program takes its (slab, group) from a
    # ticket counter when it starts, so the programs that run have the lowest tickets whatever order the
    # GPU starts them in: every group but the last of those is complete and finishes, freeing room for the
    # rest (no deadlock when one group fits on the GPU; the grid is a few programs per SM anyway). The
    # interpreter runs one program at a time: layer_norm_bwd uses this kernel there only with one slab.
    # The shares go to a ring of two slots per group: a program overwrites slot k % 2 at tile k + 2 only
    # after every program of the group posted tile k + 1, that is, after each read its shares of tile k.
    _launch_dependents(GDC)
    num_groups = tl.num_programs(0) // SLABS
    ticket = tl.atomic_add(Count + num_groups, 1, sem="relaxed")
    slab = ticket % SLABS
    group = ticket // SLABS
    acc_ty = tl.float64 if IS_FP64 else tl.float32
    cols = tl.multiple_of(slab * BLOCK_N, BLOCK_N) + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(acc_ty)
    dw = tl.zeros([BLOCK_N], dtype=acc_ty)
    db = tl.zeros([BLOCK_N], dtype=acc_ty)
    ring = Part + group.to(tl.int64) * (4 * SLABS * BLOCK_M)
    lanes = tl.arange(0, BLOCK_M)
    slabs = tl.arange(0, SLABS_P2)
    first = group * BLOCK_M + lanes
    x_next, dy_next = _first_slab_tiles(X, DY, stride_xm, stride_dym, first, M, cols, col_ok, PREFETCH)
    k = 0
    for tile in tl.range(group, tl.cdiv(M, BLOCK_M), num_groups):
        rows = tile * BLOCK_M + lanes
        row_ok = rows < M
        x, dy, x_next, dy_next = _slab_tiles(X, DY, stride_xm, stride_dym, rows, M, cols, col_ok, x_next,
                                             dy_next, num_groups * BLOCK_M, acc_ty, PREFETCH)  # fmt: skip
        rows = rows.to(tl.int64)
        mean = tl.load(Mean + rows, mask=row_ok, other=0.0)
        rstd = tl.load(Rstd + rows, mask=row_ok, other=0.0)
        # masked elements: x, dy, mean and rstd read as 0, so xhat is finite and every sum takes it through
        # a product with dy or g, which are 0 there (as in _ln_bwd_tile)
        xhat = (x - mean[:, None]) * rstd[:, None]
        if HAS_WEIGHT:
            g = dy * w[None, :]
        else:
            g = dy
        slot = ring + (k % 2) * (2 * SLABS * BLOCK_M)
        tl.store(slot + slab * BLOCK_M + lanes, tl.sum(xhat * g, axis=1))
        tl.store(slot + (SLABS + slab) * BLOCK_M + lanes, tl.sum(g, axis=1))
        # every thread's shares stored before one thread posts them (release), then this tile's dw and db
        # while the other programs post theirs
        tl.debug_barrier()
        tl.atomic_add(Count + group, 1, sem="release")
        if COMPUTE_DW:
            dw += tl.sum(dy * xhat, axis=0)
        if COMPUTE_DB:
            db += tl.sum(dy, axis=0)
        k += 1
        while tl.atomic_add(Count + group, 0, sem="acquire") < k * SLABS:
            pass
        # the shares in slab order, from L2 (.cg: an earlier tile's line may sit in this SM's L1)
        shares = slot + slabs[:, None] * BLOCK_M + lanes[None, :]
        ok = (slabs < SLABS)[:, None]
        c1 = _div(tl.sum(tl.load(shares, mask=ok, other=0.0, cache_modifier=".cg"), axis=0), N, IS_FP64)
        c2 = _div(tl.sum(tl.load(shares + SLABS * BLOCK_M, mask=ok, other=0.0, cache_modifier=".cg"), axis=0),
                  N, IS_FP64)  # fmt: skip
        dx = (g - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        tl.store(DX + rows[:, None] * stride_dxm + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=(rows < DX_M)[:, None] & col_ok[None, :])  # fmt: skip
    _store_dwdb_part(DW_part, DB_part, dw, db, group, N, cols, col_ok, COMPUTE_DW, COMPUTE_DB)


@triton.jit(do_not_specialize=["P"])
def _dwdb_reduce_kernel(
    DW_part,  # (P, N) partial sums; unused unless COMPUTE_DW
    DB_part,  # (P, N) partial sums; unused unless COMPUTE_DB
    DW,  # out, (N,), weight's dtype
    DB,  # out, (N,), bias's dtype
    P,
    N,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    COMPUTE_DW: tl.constexpr,
    COMPUTE_DB: tl.constexpr,
    GDC: tl.constexpr = False,  # grid dependency control: the partials read after _wait_for_previous
):
    # a narrow column block per program (enough programs to fill the GPU), the partials' rows walked two
    # blocks per iteration, both blocks' loads issued before either is added: the partials sit in L2
    # (just written), so each iteration costs about one L2 round trip, and P/(2*BLOCK_P) of them follow
    # one another. The sums are added in the same order on every call.
    _launch_dependents(GDC)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    acc_dw = tl.zeros([BLOCK_P, BLOCK_N], dtype=DW_part.dtype.element_ty)
    acc_db = tl.zeros([BLOCK_P, BLOCK_N], dtype=DB_part.dtype.element_ty)
    _wait_for_previous(GDC)  # for the partials
    for start in range(0, P, 2 * BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        mask0 = (rows[:, None] < P) & col_ok[None, :]
        mask1 = (rows[:, None] + BLOCK_P < P) & col_ok[None, :]
        offs = rows[:, None] * N + cols[None, :]
        if COMPUTE_DW:
            dw0 = tl.load(DW_part + offs, mask=mask0, other=0.0)
            dw1 = tl.load(DW_part + offs + BLOCK_P * N, mask=mask1, other=0.0)
        if COMPUTE_DB:
            db0 = tl.load(DB_part + offs, mask=mask0, other=0.0)
            db1 = tl.load(DB_part + offs + BLOCK_P * N, mask=mask1, other=0.0)
        if COMPUTE_DW:
            acc_dw += dw0 + dw1
        if COMPUTE_DB:
            acc_db += db0 + db1
    if COMPUTE_DW:
        tl.store(DW + cols, _to_param_dtype(tl.sum(acc_dw, axis=0), DW), mask=col_ok)
    if COMPUTE_DB:
        tl.store(DB + cols, _to_param_dtype(tl.sum(acc_db, axis=0), DB), mask=col_ok)


@triton.jit
def _to_param_dtype(v, OUT):
    """``v`` in ``OUT``'s element type; bfloat16 through float32 (float64 sums of float64 inputs with a
    bfloat16 weight: Triton's interpreter turns a direct float64 -> bfloat16 cast into garbage)."""
    if OUT.dtype.element_ty == tl.bfloat16:
        v = v.to(tl.float32)
    return v.to(OUT.dtype.element_ty)


def reduce_tile(n: int, acc_size: int, max_p: int) -> tuple[int, int, int]:
    """``(BLOCK_P, BLOCK_N, num_warps)`` of the dw/db reduction of at most ``max_p`` partial rows of
    ``n`` columns (``acc_size``-byte values). BLOCK_N: a power of 2 from 4 to 16 giving about 128
    programs up to n = 2048, more beyond (1024 at n = 16384: 1.01-1.02x the 256 of 64 columns at 4096
    rows, run 255). BLOCK_P: enough for two blocks to cover ``max_p`` rows, at most 16 KB of partials per
    block and tensor. Warps: 16 values per thread and tensor. The partials are a few MB at most, just written,
    so read from L2: what costs is each program's chain of round trips (one per 2 * BLOCK_P rows), so
    many programs, each with few trips. ``max_p`` depends on the configuration, not on the row count, so
    the kernel does not recompile as M changes."""
    per = max(1, n // 128)
    block_n = max(4, min(16, 1 << (per.bit_length() - 1)))
    block_p = max(8, min(16384 // acc_size // block_n, triton.next_power_of_2(max_p) // 2))
    return block_p, block_n, max(1, min(8, block_p * block_n * acc_size // 2048))


# ----------------------------------------------------------------------------------------------------
# Launch heuristics: the one place tile shapes and warps are chosen (from N and the dtype only)
# ----------------------------------------------------------------------------------------------------


class LaunchConfig(NamedTuple):
    block_m: int  # rows per tile
    block_n: int  # columns per tile (the whole row when N <= FUSED_MAX_N)
    num_warps: int
    # persistent programs per SM; 0 = one program per row tile (forward only)
    programs_per_sm: int = 1
    unroll: int = 1  # tiles (or chunks, chunked forward) per loop iteration: tl.range's loop_unroll_factor
    # persistent loops: each iteration loads the next row tile before it reduces its own, so a program
    # keeps two tiles' loads in flight (costing the next tile's registers, in the input's dtype)
    prefetch: bool = False
    # forward: weight and bias loaded with the first tile, before the row statistics (and kept in
    # registers by persistent grids), instead of after the statistics of every tile (fewer registers,
    # but an L1/L2 round trip between each tile's statistics and its store)
    keep_params: bool = False
    # forward: the row statistics summed about each row's first element, then a second time only where
    # that lies far from the mean (shifted_max_ratio). Chunked forward: two passes over the row instead
    # of three (_ln_fwd_shifted_kernel); whole rows of 16-bit inputs through pointers: one block
    # reduction instead of two (_ln_fwd_tile); float32, float64 and the descriptor (tma_stages) forward
    # of whole rows ignore it
    shifted: bool = False
    # whole-row kernels on a persistent grid: 0 = x (and dy) loaded through pointers; k >= 2 = through
    # tensor descriptors (the copy engine, TMA) into k shared-memory buffers, where _tma_usable allows
    tma_stages: int = 0
    # backward: column slabs of block_n whose programs exchange their shares of each row tile's two row
    # sums and wait for each other, so that x and dy are read once (the split backward reads them twice);
    # with block_n >= N, one slab that waits for nobody
    coop: bool = False
    # backward: the Gluon kernel that brings each whole row into shared memory and reads it from there
    # twice (crossfuse.ops._ln_bwd_rows), launched with num_warps, tma_stages row buffers and
    # programs_per_sm; where it cannot run (_ln_bwd_rows.usable), the entry of SMEM_ROWS_FALLBACK
    smem_rows: bool = False
    # with smem_rows: each row split between a group of `slices` programs (_ln_bwd_rows's grouped kernel),
    # each streaming its slice of the rows through tma_stages buffers and finishing a row `lag` rows
    # after posting its shares of the row's sums; 1 = whole rows
    slices: int = 1
    lag: int = 1
    # with slices > 1: groups 2k and 2k + 1 add their dw and db partials into one row (the second of the two
    # programs to end adds the first's), halving the partials and the scratch rows of dx finished after them
    paired: bool = False


# Rows at which the "many rows" entries of TUNED take over from the "few rows" ones: with few rows a
# grid of one program per tile leaves SMs idle or short of bytes in flight, and launch and tail costs
# weigh more, so the two regimes have different fastest tiles. A kernel compiles at most once per
# (N, dtype, regime): the row count is never specialised on.
MANY_ROWS = 8192

# Measured on the H200 by bench/tune.py (bench/results/h200/NOTES.md): run 36 swept the fused kernels with
# fewer instructions per element and the forward without a tile loop (--only ln-fwd,ln-prefetch,
# ln-fwd-params) against the tables of runs 15, 16 and 26; run 38 swept the kernels that read through
# tensor descriptors (--only ln-tma) against run 36's table ("kept": the earlier entry was the fastest);
# run 44 swept the backward again once its partial sums had moved into dx (--only ln-tma,ln-prefetch,
# ln-split --kind bwd) against run 38's table; run 49 swept the cooperative backward (--only ln-coop
# --kind bwd) against run 44's entries for N = 8192 and 16384; run 64 swept the backward with its
# dependent launches (--only ln,ln-tma,ln-prefetch,ln-prefetch-wide,ln-split,ln-coop --kind bwd) against
# the table of runs 44 and 49, and took the four winners more than 1.5% ahead (all with few rows); run 77
# swept the forward once the chunked kernel took N as a constant (--only ln-chunked,ln-shifted --kind fwd)
# against the code's table and took the ten winners more than 1.5% ahead (all N >= 4096).
# The fastest by median GPU time, "few rows" at M=4096 and "many rows" at M*N=128M elements (M >= 16384).
# (kind, element bytes, next_power_of_2(N), many rows) -> config; a config whose block_n is below N runs
# the chunked forward or the split backward. Shapes not listed (float16 uses the bfloat16 rows) fall back
# to the entry of the other regime, then to the rule in launch_config.
TUNED: dict[tuple[str, int, int, bool], LaunchConfig] = {
    ("bwd", 2, 1024, False): LaunchConfig(2, 1024, 4, 1, prefetch=True),  # 1120 GB/s (run 64; the old 1102)
    ("bwd", 2, 1024, True): LaunchConfig(2, 1024, 4, 4, tma_stages=3),  # 3562 GB/s (run 44, kept)
    ("bwd", 2, 2048, False): LaunchConfig(2, 2048, 8, 1, prefetch=True),  # 1785 GB/s (run 64; the old 1712)
    ("bwd", 2, 2048, True): LaunchConfig(2, 2048, 8, 2, tma_stages=3),  # 3676 GB/s (run 44, kept)
    ("bwd", 2, 4096, False): LaunchConfig(2, 4096, 16, 4, tma_stages=3),  # 2056 GB/s (run 44)
    # the Gluon kernel that reads each row once (smem_rows), run 112 (the code's entry then in brackets);
    # the many-rows entry of 16384 is the few-rows winner (timed at 8192 rows there)
    ("bwd", 2, 4096, True): LaunchConfig(1, 4096, 8, 2, tma_stages=3, smem_rows=True),  # 3973 GB/s (3806)
    ("bwd", 2, 8192, False): LaunchConfig(1, 8192, 8, 1, tma_stages=3, smem_rows=True),  # 3054 GB/s (2732)
    ("bwd", 2, 8192, True): LaunchConfig(1, 8192, 8, 1, tma_stages=3, smem_rows=True),  # 4001 GB/s (3600)
    # each row split between the eight programs of a group (the grouped Gluon kernel), four programs of 2
    # warps an SM, 4 buffers each, a row finished 2 rows after its sums: 1.015x the two programs a group,
    # one of 8 warps an SM, at 4096x16384 and 1.024x at 8192x16384 (runs 249-250, alternated in one
    # process); those took 3014 GB/s against the whole-row Gluon entry's 2726 (session 37's run 4)
    # since v41, six programs an SM (the shares spread over the lanes: 168 registers a thread instead of
    # 255, so six fit): 1.035x four at bf16 4096x16384 and 1.074x at 8192x16384 (run 274, alternated);
    # 1.030x and 1.052x v38 (run 275); in the session 3326 GB/s at 4096x16384, 78.2% of copy (run 275).
    # Since v42 its groups paired (half the partials and scratch rows) and launched after the memset as a
    # dependent launch: 1.039x v41 at 4096x16384, 1.019x at 8192x16384 (run 278, alternated); in the session
    # 3451 GB/s at 4096x16384, 81.2% of copy (run 279). float32's entries paired: 1.003x, 1.001x (run 277)
    ("bwd", 2, 16384, False): LaunchConfig(
        1, 16384, 2, 6, tma_stages=4, smem_rows=True, slices=8, lag=2, paired=True
    ),
    ("bwd", 2, 16384, True): LaunchConfig(
        1, 16384, 2, 6, tma_stages=4, smem_rows=True, slices=8, lag=2, paired=True
    ),
    ("bwd", 4, 1024, False): LaunchConfig(4, 1024, 8, 1, tma_stages=3),  # 2111 GB/s (run 64; the old 1967)
    ("bwd", 4, 1024, True): LaunchConfig(4, 1024, 8, 1, tma_stages=3),  # 4044 GB/s (run 44, kept)
    ("bwd", 4, 2048, False): LaunchConfig(4, 2048, 16, 1, prefetch=True),  # 2314 GB/s (run 44, kept)
    ("bwd", 4, 2048, True): LaunchConfig(2, 2048, 8, 1, tma_stages=3),  # 4049 GB/s (run 44, kept)
    ("bwd", 4, 4096, False): LaunchConfig(1, 4096, 8, 1, tma_stages=3),  # 3256 GB/s (run 64; the old 3199)
    ("bwd", 4, 4096, True): LaunchConfig(1, 4096, 8, 1, tma_stages=3),  # 4057 GB/s (run 44, kept)
    ("bwd", 4, 8192, False): LaunchConfig(1, 8192, 16, 1),  # 3361 GB/s (run 44)
    ("bwd", 4, 8192, True): LaunchConfig(1, 8192, 16, 1),  # 3941 GB/s (run 44)
    # the grouped Gluon kernel, two programs a row, 3 buffers: 3831 GB/s against the cooperative entry's 3286
    # at 4096x16384, 4033 against 3406 at 8192x16384 (session 37's run 4, alternated in one process)
    ("bwd", 4, 16384, False): LaunchConfig(1, 16384, 8, 1, tma_stages=3, smem_rows=True, slices=2, lag=1),
    ("bwd", 4, 16384, True): LaunchConfig(1, 16384, 8, 1, tma_stages=3, smem_rows=True, slices=2, lag=1),
    # statistics about each row's first element (v33): 1.026x the same launch without (run 185)
    ("fwd", 2, 1024, False): LaunchConfig(2, 1024, 2, 0, keep_params=True, shifted=True),  # 1824 GB/s
    ("fwd", 2, 1024, True): LaunchConfig(2, 1024, 2, 0, keep_params=True),  # 4004 GB/s (run 38, kept)
    ("fwd", 2, 2048, False): LaunchConfig(1, 2048, 4, 8, prefetch=True),  # 2416 GB/s (run 38, kept)
    ("fwd", 2, 2048, True): LaunchConfig(1, 2048, 2, 0),  # 4019 GB/s (run 38, kept)
    # the shifted chunked kernel: 3178 GB/s against the whole-row entry's 3015 in run 225's sweep (the first
    # under the timer that resets persisting L2 lines), 1.054x alternated (run 226)
    ("fwd", 2, 4096, False): LaunchConfig(1, 2048, 4, 0, unroll=2, shifted=True),
    ("fwd", 2, 4096, True): LaunchConfig(1, 2048, 4, 0, unroll=2),  # 4135 GB/s (run 77; the old 3992)
    # the shifted kernel summing about the row's first element (run 181's sweep; the code's entry in the
    # same run in brackets; run 182 alternated them: 1.026)
    ("fwd", 2, 8192, False): LaunchConfig(1, 2048, 8, 0, unroll=2, shifted=True),  # 3551 GB/s (3487)
    ("fwd", 2, 8192, True): LaunchConfig(1, 4096, 4, 0, unroll=2),  # 4101 GB/s (run 77; the old 3971)
    # unrolled twice: 3893 and 4238 GB/s against 3855 and 4194 (run 225's sweep), 1.007-1.008x alternated
    # (run 226)
    ("fwd", 2, 16384, False): LaunchConfig(1, 4096, 16, 0, unroll=2, shifted=True),
    ("fwd", 2, 16384, True): LaunchConfig(1, 4096, 16, 0, unroll=2, shifted=True),
    # 2589 GB/s (run 38, kept)
    ("fwd", 4, 1024, False): LaunchConfig(4, 1024, 4, 4, prefetch=True, keep_params=True),
    ("fwd", 4, 1024, True): LaunchConfig(1, 1024, 4, 0, keep_params=True),  # 4163 GB/s (run 38, kept)
    # 3062 GB/s (run 38, kept)
    ("fwd", 4, 2048, False): LaunchConfig(2, 2048, 4, 4, prefetch=True, keep_params=True),
    ("fwd", 4, 2048, True): LaunchConfig(2, 2048, 16, 0),  # 4119 GB/s (run 38, kept)
    # the chunked kernel, as with many rows: 3628 GB/s against the whole-row (2, 4096, 8, 0, keep_params)'s
    # 3539 of run 38, alternated under the timer that resets persisting L2 lines (run 222; the old timer
    # had flattered whole-row kernels measured after the chunked one, runs 219-221)
    ("fwd", 4, 4096, False): LaunchConfig(1, 2048, 8, 0, unroll=2),
    ("fwd", 4, 4096, True): LaunchConfig(1, 2048, 8, 0, unroll=2),  # 4210 GB/s (run 77; the old 4104)
    ("fwd", 4, 8192, False): LaunchConfig(1, 4096, 16, 0, unroll=2),  # 3897 GB/s (run 77; the old 3837)
    ("fwd", 4, 8192, True): LaunchConfig(1, 4096, 16, 0, unroll=2),  # 4227 GB/s (run 77; the old 4149)
    ("fwd", 4, 16384, False): LaunchConfig(1, 8192, 8, 0, unroll=2),  # 4048 GB/s (run 77; the old 3898)
    # the shifted kernel (run 181's sweep; the code's entry in the same run in brackets; run 182: 1.043)
    ("fwd", 4, 16384, True): LaunchConfig(1, 4096, 32, 0, unroll=2, shifted=True),  # 4260 GB/s (4061)
}

TUNED.update(_tuning.layer_norm_overrides(LaunchConfig))  # CROSSFUSE_TUNED_CONFIGS, when set

# Where the Gluon kernels of the smem_rows entries cannot run (a GPU before compute capability 9, a
# Triton without Gluon, rows that are not contiguous): the Triton kernels' entries they replaced (runs 44
# and 49).
SMEM_ROWS_FALLBACK: dict[tuple[str, int, int, bool], LaunchConfig] = {
    ("bwd", 2, 4096, True): LaunchConfig(2, 4096, 16, 1, tma_stages=3),  # 3680 GB/s (run 44, kept)
    ("bwd", 2, 8192, False): LaunchConfig(1, 8192, 16, 4, prefetch=True),  # 2521 GB/s (run 44)
    ("bwd", 2, 8192, True): LaunchConfig(1, 8192, 16, 1, tma_stages=3),  # 3522 GB/s (run 44, kept)
    ("bwd", 2, 16384, False): LaunchConfig(2, 2048, 8, 2, prefetch=True),  # 2159 GB/s (run 44, kept)
    ("bwd", 2, 16384, True): LaunchConfig(2, 2048, 8, 2, prefetch=True),  # 2477 GB/s (run 44, kept)
    ("bwd", 4, 16384, False): LaunchConfig(2, 4096, 16, 1, prefetch=True, coop=True),  # 3153 GB/s (run 49)
    ("bwd", 4, 16384, True): LaunchConfig(2, 4096, 16, 1, prefetch=True, coop=True),  # 3437 GB/s (run 49)
}


def smem_rows_fallback(cfg: LaunchConfig, n: int, esize: int, m: int) -> LaunchConfig:
    """The Triton kernels' configuration that takes the place of the Gluon entry ``cfg`` (``smem_rows``)
    where that kernel cannot run: SMEM_ROWS_FALLBACK's entry for its key, else the rule."""
    return SMEM_ROWS_FALLBACK.get(("bwd", esize, cfg.block_n, m > MANY_ROWS)) or rule_config(n, "bwd")


def launch_config(n: int, dtype: torch.dtype, kind: str, m: int | None = None) -> LaunchConfig:
    """Tile shape, warps and grid for rows of length ``n`` (``m`` rows, when known); ``kind`` is
    ``"fwd"`` or ``"bwd"``.

    Rule of thumb where nothing was measured: a tile of about 4096 elements per program (several rows
    when rows are short), one warp per 256 elements of the tile, 1 to 16 warps.
    """
    if kind not in ("fwd", "bwd"):
        raise ValueError(f"kind must be 'fwd' or 'bwd', got {kind!r}")
    block_n = triton.next_power_of_2(min(n, FUSED_MAX_N)) if n <= FUSED_MAX_N else 4096
    esize = dtype.itemsize
    many = m is not None and m > MANY_ROWS
    tuned = TUNED.get((kind, esize, block_n, many), TUNED.get((kind, esize, block_n, not many)))
    if tuned is not None and n <= FUSED_MAX_N:
        return tuned
    return rule_config(n, kind)


def rule_config(n: int, kind: str) -> LaunchConfig:
    """The rule of :func:`launch_config`, without the tables."""
    block_n = triton.next_power_of_2(min(n, FUSED_MAX_N)) if n <= FUSED_MAX_N else 4096
    if n > FUSED_MAX_N:
        return LaunchConfig(
            1 if kind == "fwd" else 4, block_n, 8 if kind == "fwd" else 4, 0 if kind == "fwd" else 2
        )
    target = 4096 if kind == "fwd" else 2048
    block_m = max(1, min(64, target // block_n))
    num_warps = max(1, min(16, block_m * block_n // 256))
    return LaunchConfig(block_m, block_n, num_warps, 0 if kind == "fwd" else 2)


def backward_programs(cfg: LaunchConfig, m: int, esize: int, sms: int) -> int:
    """Persistent programs of the backward: ``programs_per_sm`` per SM, no more than there are tiles, and
    few enough that the float32 dw/db partials (written once, read once: 16 bytes per program and column)
    stay under an eighth of the 3·M·N·esize bytes the backward must move; a whole number of programs per
    SM, at least one (an SM with one program more than the others would set the time)."""
    tiles = triton.cdiv(m, cfg.block_m)
    per_sm = max(1, min(cfg.programs_per_sm, (3 * m * esize) // (8 * 16 * sms)))
    return max(1, min(tiles, per_sm * sms))


# ----------------------------------------------------------------------------------------------------
# Launchers: (M, N) views in, kernels out
# ----------------------------------------------------------------------------------------------------


def _tma_usable(*tensors: torch.Tensor) -> bool:
    """Whether the descriptor kernels can read these (M, N) views: on a GPU with a copy engine for
    tensors (compute capability 9+), 2- or 4-byte types, 16-byte aligned base and row stride, unit
    column stride (under the interpreter, any such layout)."""
    if TensorDescriptor is None:
        return False
    t0 = tensors[0]
    if not is_interpreted(_ln_fwd_kernel):
        if t0.device.type != "cuda" or compute_capability_major(t0) < 9:
            return False
    if t0.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    esize = t0.element_size()
    return all(
        t.stride(1) == 1 and t.data_ptr() % 16 == 0 and t.stride(0) > 0 and t.stride(0) * esize % 16 == 0
        for t in tensors
    )


def _gdc_usable(t: torch.Tensor) -> bool:
    """Whether the backward's kernels on ``t``'s device can chain by programmatic dependent launch
    (:mod:`crossfuse.ops._runtime.pdl`)."""
    return _gdc.usable(t, is_interpreted(_ln_bwd_kernel))


def _row_desc(t: torch.Tensor, cfg: LaunchConfig):
    """A tensor descriptor over the (M, N) view ``t``, boxes of one row tile."""
    bind_cuda_context(t)  # Triton fills the descriptor before it makes a context current
    return TensorDescriptor(t, list(t.shape), [t.stride(0), 1], [cfg.block_m, cfg.block_n])


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _unit_stride(p: torch.Tensor | None) -> torch.Tensor | None:
    """A weight or bias as the kernels read it: ``p + col``, so unit stride (a copy of a strided or
    expanded one)."""
    return None if p is None else p.contiguous()


@quiet_interpreter
@on_input_device
def layer_norm_fwd(x: torch.Tensor, weight, bias, eps: float, config: LaunchConfig | None = None,
                   out: torch.Tensor | None = None):  # fmt: skip
    """Forward on a 2-D ``x`` with unit column stride. Returns ``(y, mean, rstd)``; ``y`` contiguous, or
    ``out`` where given (an (M, N) tensor with unit column stride). ``config`` overrides
    :func:`launch_config` (for tuning)."""
    M, N = x.shape
    y = torch.empty((M, N), dtype=x.dtype, device=x.device) if out is None else out
    weight, bias = _unit_stride(weight), _unit_stride(bias)
    mean = torch.empty((M,), dtype=_stats_dtype(x.dtype), device=x.device)
    rstd = torch.empty((M,), dtype=_stats_dtype(x.dtype), device=x.device)
    if M == 0:
        return y, mean, rstd
    cfg = config or launch_config(N, x.dtype, "fwd", M)
    w = weight if weight is not None else x
    b = bias if bias is not None else x
    common = dict(
        HAS_WEIGHT=weight is not None,
        HAS_BIAS=bias is not None,
        IS_FP64=x.dtype == torch.float64,
        num_warps=cfg.num_warps,
    )
    if N <= cfg.block_n and cfg.tma_stages and cfg.programs_per_sm > 0 and _tma_usable(x):
        programs = min(triton.cdiv(M, cfg.block_m), cfg.programs_per_sm * device_parallelism(x))
        _ln_fwd_tma_kernel[(programs,)](
            _row_desc(x, cfg), y, w, b, mean, rstd, y.stride(0), M, N, 1.0 / N, eps,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, KEEP_PARAMS=cfg.keep_params, EVEN_N=N == cfg.block_n,
            POW2_N=_is_pow2(N), STAGES=cfg.tma_stages, **common,
        )  # fmt: skip
    elif N <= cfg.block_n:  # the whole row in one tile
        shifted_tile = cfg.shifted and x.element_size() == 2  # see _ln_fwd_tile
        tiles = triton.cdiv(M, cfg.block_m)
        if cfg.programs_per_sm > 0:  # a persistent grid
            tiles = min(tiles, cfg.programs_per_sm * device_parallelism(x))
        _ln_fwd_kernel[(tiles,)](
            x, y, w, b, mean, rstd, x.stride(0), y.stride(0), M, N, 1.0 / N, eps,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, UNROLL=cfg.unroll, PREFETCH=cfg.prefetch,
            KEEP_PARAMS=cfg.keep_params, EVEN_N=N == cfg.block_n, POW2_N=_is_pow2(N),
            ONE_TILE=cfg.programs_per_sm == 0, SHIFTED=shifted_tile,
            MAX_R=shifted_max_ratio(x.dtype) if shifted_tile else 0.0, **common,
        )  # fmt: skip
    else:
        if cfg.shifted:
            kernel, extra = _ln_fwd_shifted_kernel, dict(MAX_R=shifted_max_ratio(x.dtype))
        else:
            kernel, extra = _ln_fwd_chunked_kernel, {}
        kernel[(M,)](
            x, y, w, b, mean, rstd, x.stride(0), y.stride(0), M, N, eps, BLOCK_N=cfg.block_n,
            UNROLL=cfg.unroll, **extra, **common,
        )  # fmt: skip
    return y, mean, rstd


def shifted_max_ratio(dtype: torch.dtype) -> float:
    """The shifted forward's largest accepted (mean - shift)^2 / var (``_ln_fwd_shifted_kernel``, and
    ``_ln_fwd_tile`` for 16-bit inputs): its variance loses up to about 1 + R roundings of the float32
    (float64) sums. 16 for 16-bit inputs, whose output rounding (2^-8 or 2^-11) is far above that; 1 for
    float32 and float64, which keep about their three-pass accuracy (the second sums then serve about
    one Gaussian row in three, at no cost measured: run 182, float32 16384×16384, 4240 GB/s with 1, 4255
    with 4, 4064 three-pass; y within 6.5e-8 of float64 with 1, 1.3e-7 with 4, 5e-8 three-pass, against
    a tolerance of 2e-6)."""
    return 16.0 if dtype in (torch.bfloat16, torch.float16) else 1.0


def _align(n: int, k: int = 32) -> int:
    return triton.cdiv(n, k) * k


# False: the two-pass kernel after the grouped one too (for bench/probe_ln_bwd_groups.py's comparison)
FINISH_FROM_SHARES = True
FINISH_TILE_BYTES = 8192  # of x (and dy, dx) per program of _ln_bwd_finish_kernel
FINISH_HOT_ROWS = 4  # a power of 2: at most this many rows of tiles for its last program (else two-pass)


def _finish_plan(dx: torch.Tensor, R: int, shares: torch.Tensor, slices: int):
    """``(HOT_TILE, LAST_TILE, TILES, BLOCK_N, HOT_ROWS)`` of :func:`_ln_bwd_finish_kernel` on the last ``R``
    rows of ``dx`` (contiguous), whose bytes hold ``shares`` ((M, 2, slices) int64, then the counter) from
    the tile that holds the shares of row M - R on (HOT_TILE), those of the hot tiles' rows from LAST_TILE
    on; None where the tiles from LAST_TILE on would span more than ``FINISH_HOT_ROWS`` rows (the two-pass
    kernel then)."""
    M, N = dx.shape
    es = dx.element_size()
    block_n = min(N, FINISH_TILE_BYTES // es)
    per_row = N // block_n
    row0 = M - R
    at = shares.data_ptr() + row0 * 2 * slices * 8 - (dx.data_ptr() + row0 * N * es)  # bytes past row0
    if at < 0 or N % block_n:
        return None
    hot_tile = at // (block_n * es)
    first = row0 + hot_tile // per_row  # the first row with a hot tile
    last_tile = (at + (first - row0) * 2 * slices * 8) // (block_n * es)
    if M - (row0 + last_tile // per_row) > FINISH_HOT_ROWS:
        return None
    if hot_tile >= 1 << 23 or last_tile - hot_tile >= 1 << 7:  # Count's low 24 bits and its top byte
        return None
    # HOT_ROWS is FINISH_HOT_ROWS whatever the rows the last program's tiles span (1 to 4 with the table's
    # entries, by the row count): a constexpr that followed them would compile the kernel again as M changes
    return hot_tile, last_tile, R * per_row, block_n, FINISH_HOT_ROWS


def finish_from_shares(dx, dy, x, weight, mean, rstd, shares, count, R: int, slices: int, launched: int, plan,
                       order: dict | None = None) -> None:  # fmt: skip
    """dx of the last ``R`` rows of ``dx`` from the row sums a grouped kernel of ``launched`` programs in
    groups of ``slices`` posted in ``shares`` (its ticket counter ``count`` at ``launched``), by
    :func:`_ln_bwd_finish_kernel` with ``plan`` (:func:`_finish_plan`); ``order``: the launch's grid
    dependency control (see layer_norm_bwd), none by default."""
    M, N = dx.shape
    hot_tile, last_tile, tiles, block_n, hot_rows = plan
    if launched + hot_tile >= 1 << 24:  # what Count's low bytes hold
        raise ValueError(f"finish_from_shares: {launched} programs and a plan of {plan} overflow the counter")
    _ln_bwd_finish_kernel[(last_tile + 1,)](
        dy, x, weight if weight is not None else x, mean, rstd, shares, count, dx, dy.stride(0), x.stride(0),
        dx.stride(0), M - R, M, 1.0 / N, hot_tile, last_tile, tiles, launched + hot_tile, N=N,
        BLOCK_N=block_n, SLICES=slices, HOT_ROWS=hot_rows, HAS_WEIGHT=weight is not None, num_warps=4,
        **(order or {}),
    )  # fmt: skip


def _scratch(dx: torch.Tensor, acc: torch.dtype, elems: int) -> tuple[int, torch.Tensor | None]:
    """``(R, buffer)``: ``elems`` values of ``acc`` in the bytes of the last R rows of ``dx`` (128-byte
    aligned), to hold the backward's float32 partial sums until those rows' own dx is written last; or
    ``(0, None)`` when that would take more than a quarter of the rows (then the sums get a buffer)."""
    M, N = dx.shape
    row_bytes, nbytes = N * dx.element_size(), elems * acc.itemsize
    start = (M * row_bytes - nbytes) // 128 * 128
    rows = M - start // row_bytes if start >= 0 else M + 1
    if rows > M // 4:
        return 0, None
    return rows, dx.view(torch.uint8).view(-1)[start : start + nbytes].view(acc)


@quiet_interpreter
@on_input_device
def layer_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight, mean, rstd, compute_dw: bool, compute_db: bool,
                   config: LaunchConfig | None = None):  # fmt: skip
    """Backward on 2-D ``dy`` and ``x`` (unit column stride). Returns ``(dx, dw, db)``; dw/db may be None.
    ``config`` overrides :func:`launch_config` (for tuning).

    Allocates dx, dw and db only, like torch: the float32 partial sums of dw and db (and the split
    backward's row sums) live in the last R rows of dx, whose dx the main kernels leave unwritten (they
    still add those rows to dw and db, last, so that the rows are still in L2 for the end); after the
    partials are reduced, a last launch writes the R rows' dx. Where R would exceed a quarter of the rows
    (few rows), the partials get a buffer of their own."""
    M, N = x.shape
    dx = torch.empty((M, N), dtype=x.dtype, device=x.device)
    weight = _unit_stride(weight)
    acc = _stats_dtype(x.dtype)
    param_dtype = weight.dtype if weight is not None else x.dtype
    dw = torch.empty((N,), dtype=param_dtype, device=x.device) if compute_dw else None
    db = torch.empty((N,), dtype=param_dtype, device=x.device) if compute_db else None
    if M == 0:
        for t in (dw, db):
            if t is not None:
                t.zero_()
        return dx, dw, db
    cfg = config or launch_config(N, x.dtype, "bwd", M)
    if cfg.smem_rows:  # a Gluon kernel, where it can run; else the Triton kernels in its place
        interpreted = is_interpreted(_ln_bwd_kernel)
        if cfg.slices > 1:  # and a launch that fits these rows (an entry of another N may not)
            usable = _ln_bwd_rows.groups_usable(x, dy, weight, interpreted, cfg.slices) and not (
                _ln_bwd_rows.groups_launch_unfit(N, x.element_size(), cfg.slices, cfg.num_warps,
                                                 cfg.tma_stages, cfg.lag)
            )  # fmt: skip
        else:
            usable = _ln_bwd_rows.usable(x, dy, weight, interpreted)
        if not usable:
            cfg = smem_rows_fallback(cfg, N, x.element_size(), M)
    grouped = cfg.smem_rows and cfg.slices > 1  # rows split between the programs of a group
    smem_rows = cfg.smem_rows and not grouped  # whole rows
    w = weight if weight is not None else x
    sms = device_parallelism(x)
    col_blocks = triton.cdiv(N, cfg.block_n)
    # the cooperative kernel's programs wait for each other: not under the interpreter, which runs one
    # program at a time, unless a row is one slab (then the split backward gives the same results)
    coop = cfg.coop and (col_blocks == 1 or not is_interpreted(_ln_bwd_coop_kernel))
    whole_rows = col_blocks == 1 and not coop and not grouped
    if grouped:  # programs_per_sm programs an SM, in groups of `slices`; partials a row a group (or a pair)
        max_programs = max(1, max(1, cfg.programs_per_sm) * sms // cfg.slices)
        programs = min(M, max_programs)
    elif whole_rows:
        programs = backward_programs(cfg, M, x.element_size(), sms)
        max_programs = max(1, cfg.programs_per_sm) * sms
    else:
        max_programs = math.ceil(cfg.programs_per_sm * sms / col_blocks)  # row groups
        programs = max(1, min(triton.cdiv(M, cfg.block_m), max_programs))
    paired = grouped and cfg.paired
    slots = _ln_bwd_rows.partial_slots(programs, paired)  # rows of partials
    max_slots = _ln_bwd_rows.partial_slots(max_programs, paired)
    # the scratch: [dw partials | db partials | the split backward's c1 | c2, or the cooperative
    # kernel's ring of row-sum shares | counters, or the grouped kernel's pairs' arrivals and flags and its
    # row-sum shares | its ticket counter], each 128-byte aligned
    part = _align(slots * N)
    at_db = part if compute_dw else 0
    at_c1 = at_db + part if compute_db else at_db
    pair_words = _align(2 * slots * cfg.slices) if paired else 0
    if grouped:  # (2, slots, slices) int32 if paired, the row sums' shares (M, 2, slices) int64; tickets
        extra = (pair_words + _align(4 * cfg.slices * M), _align(1))
    elif whole_rows:
        extra = (0, 0)
    elif coop:
        extra = (_align(programs * 4 * col_blocks * cfg.block_m), _align(programs + 1))
    else:
        extra = (_align(M), _align(M))
    at_c2 = at_c1 + extra[0]
    total = at_c2 + extra[1]
    R, scratch = _scratch(dx, acc, total) if total else (0, None)
    if scratch is None:  # a buffer of their own (few rows), or nothing to keep
        scratch = torch.empty((total,), dtype=acc, device=x.device) if total else dx
    dw_part = scratch if compute_dw else dx
    db_part = scratch[at_db:] if compute_db else dx
    flags = dict(HAS_WEIGHT=weight is not None, IS_FP64=x.dtype == torch.float64)
    # each kernel after the first is a programmatic dependent launch where the GPU allows (``then``): it
    # starts while the kernel before it ends and waits for it inside (_wait_for_previous)
    gdc = _gdc_usable(x)
    first = dict(GDC=gdc)
    then = dict(GDC=True, launch_pdl=True) if gdc else first
    if grouped:
        scratch[at_c1 : at_c2 + 1].zero_()  # pairs, shares and tickets: one memset
        pairs = scratch[at_c1 : at_c1 + pair_words].view(torch.int32)
        shares = scratch[at_c1 + pair_words : at_c2].view(torch.int64)
        count = scratch[at_c2 : at_c2 + 1].view(torch.int32)
        _ln_bwd_rows.launch_groups(
            dx, dy, x, weight, mean, rstd, shares, count, pairs, dw_part, db_part, programs, M - R,
            compute_dw, compute_db, cfg.slices, cfg.num_warps, cfg.tma_stages, cfg.lag, paired, pdl=gdc,
        )  # fmt: skip
    elif smem_rows:
        _ln_bwd_rows.launch(dx, dy, x, weight, mean, rstd, dw_part, db_part, programs, M - R, compute_dw,
                            compute_db, cfg.num_warps, cfg.tma_stages)  # fmt: skip
    elif whole_rows:
        use_tma = cfg.tma_stages and _tma_usable(x, dy)

        def fused(row0, dx_m, grid, compute_dw, compute_db, order):  # rows row0..M-1; dx of those below dx_m
            sums = dict(COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db, num_warps=cfg.num_warps, **flags)
            sums.update(order)
            if use_tma:
                _ln_bwd_tma_kernel[(grid,)](
                    dx, _row_desc(dy, cfg), _row_desc(x, cfg), w, mean, rstd, dw_part, db_part, dx.stride(0),
                    row0, M, dx_m, N, 1.0 / N, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                    EVEN_N=N == cfg.block_n, POW2_N=_is_pow2(N), STAGES=cfg.tma_stages, **sums,
                )  # fmt: skip
            else:
                _ln_bwd_kernel[(grid,)](
                    dx, dy, x, w, mean, rstd, dw_part, db_part, dx.stride(0), dy.stride(0), x.stride(0), row0,
                    M, dx_m, N, 1.0 / N, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, EVEN_N=N == cfg.block_n,
                    POW2_N=_is_pow2(N), UNROLL=cfg.unroll, PREFETCH=cfg.prefetch, **sums,
                )  # fmt: skip

        fused(0, M - R, programs, compute_dw, compute_db, first)
    elif coop:
        count = scratch[at_c2 : at_c2 + programs + 1].view(torch.int32)
        count.zero_()
        _ln_bwd_coop_kernel[(col_blocks * programs,)](
            dx, dy, x, w, mean, rstd, scratch[at_c1:], count, dw_part, db_part, dx.stride(0), dy.stride(0),
            x.stride(0), M, M - R, N, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SLABS=col_blocks,
            SLABS_P2=triton.next_power_of_2(col_blocks), COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db,
            PREFETCH=cfg.prefetch, num_warps=cfg.num_warps, **flags, **first,
        )  # fmt: skip
    else:
        c1, c2 = scratch[at_c1:], scratch[at_c2:]  # of the rows below M - R
        # the row sums' own launch: chunks of ROWSUMS_BLOCK_N, N a constant within the table's range (its
        # chunk loop unrolled, every chunk's loads out together)
        _ln_bwd_rowsums_kernel[(M - R,)](
            dy, x, w, mean, rstd, c1, c2, dx, dy.stride(0), x.stride(0), dx.stride(0), 0, M, N,
            BLOCK_N=min(ROWSUMS_BLOCK_N, triton.next_power_of_2(N)), WRITE_DX=False,
            N_C=N if N <= FUSED_MAX_N else 0, num_warps=8, **flags, **first,
        )  # fmt: skip
        _ln_bwd_split_kernel[(col_blocks, programs)](
            dx, dy, x, w, mean, rstd, c1, c2, dw_part, db_part, dx.stride(0), dy.stride(0), x.stride(0),
            M, M - R, N, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, COMPUTE_DW=compute_dw,
            COMPUTE_DB=compute_db, UNROLL=cfg.unroll, PREFETCH=cfg.prefetch, num_warps=cfg.num_warps, **flags,
            **then,
        )  # fmt: skip
    if compute_dw or compute_db:
        reduce_partials(dw_part if compute_dw else None, db_part if compute_db else None, dw, db, slots, N,
                        max_slots, then)  # fmt: skip
    finish = _finish_plan(dx, R, shares, cfg.slices) if grouped and R and FINISH_FROM_SHARES else None
    if finish:  # the grouped kernel posted the R rows' sums: their dx from those, in parallel
        finish_from_shares(dx, dy, x, weight, mean, rstd, shares, count, R, cfg.slices, programs * cfg.slices,
                           finish, then)  # fmt: skip
    elif R:  # the last R rows' dx, over the partials (read by now: the same stream), one program per tile
        if whole_rows and not smem_rows:
            fused(M - R, M, triton.cdiv(R, cfg.block_m), False, False, then)
        else:
            # one program per row, about one per SM, walking its row twice: four chunks' loads go out
            # together (float32 N = 16384 in run 55: 8.3 -> 6.7 us; bf16 unchanged at 7.6). After the
            # Gluon kernel too: that kernel again over the R rows measured 0.94x at bf16 4096x8192 (run 114)
            _ln_bwd_rowsums_kernel[(R,)](
                dy, x, w, mean, rstd, dx, dx, dx, dy.stride(0), x.stride(0), dx.stride(0), M - R, M, N,
                BLOCK_N=2048 if cfg.smem_rows else cfg.block_n, WRITE_DX=True, UNROLL=4, num_warps=8, **flags,
                **then,
            )  # fmt: skip
    return dx, dw, db


@quiet_interpreter
@on_input_device
def reduce_partials(dw_part, db_part, dw, db, p: int, n: int, max_p: int, order: dict | None = None) -> None:
    """dw (db) = the column sums of the first ``p`` rows of the (p, n) partials ``dw_part`` (``db_part``),
    cast to dw's (db's) dtype; a None partial buffer skips its sum. ``max_p`` bounds ``p`` for the
    configuration (it sets the tile, see :func:`reduce_tile`). ``order``: the launch's grid dependency
    control (``GDC``, ``launch_pdl``; see layer_norm_bwd), none by default."""
    compute_dw, compute_db = dw_part is not None, db_part is not None
    if not compute_dw:  # the skipped sum's pointers: placeholders the kernel does not touch
        dw_part, dw = db_part, db
    if not compute_db:
        db_part, db = dw_part, dw
    block_p, block_n, warps = reduce_tile(n, dw_part.element_size(), max_p)
    _dwdb_reduce_kernel[(triton.cdiv(n, block_n),)](
        dw_part, db_part, dw, db, p, n, BLOCK_P=block_p, BLOCK_N=block_n, COMPUTE_DW=compute_dw,
        COMPUTE_DB=compute_db, num_warps=warps, **(order or {}),
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------------
# the implementations of the custom operators torch.compile sees (crossfuse.ops._library)
# ----------------------------------------------------------------------------------------------------


def _operator_fwd(x, weight, bias, eps):
    # rows with unit column stride, as the launchers need: a direct call of the operator may not pass them
    return layer_norm_fwd(_rows(x, x.shape[1]), weight, bias, eps)


def _operator_fwd_shaped(x, shape, weight, bias, eps):
    """The forward on (M, N) rows ``x``, ``y`` allocated in ``shape`` (the input's shape): a tensor of its
    own, not a view of an (M, N) one, so that in-place ops on it work. Returns ``(y, mean, rstd)``."""
    x2 = _rows(x, x.shape[1])
    y = torch.empty(shape, dtype=x.dtype, device=x.device)
    _, mean, rstd = layer_norm_fwd(x2, weight, bias, eps, out=y.view(x2.shape))
    return y, mean, rstd


def _operator_bwd(dy, x, *rest):
    return layer_norm_bwd(_rows(dy, dy.shape[1]), _rows(x, x.shape[1]), *rest)


# ----------------------------------------------------------------------------------------------------
# autograd.Function and the functional entry point
# ----------------------------------------------------------------------------------------------------


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """(M, n) view of ``t`` (a copy only when no view with unit column stride exists)."""
    t2 = t.reshape(-1, n)
    return t2 if t2.stride(-1) == 1 or n == 1 else t2.contiguous()


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n, weight, bias, eps):
        x2 = _rows(x, n)
        # unit stride (a weight or bias may be a slice or an expanded scalar), before w is saved
        w, b = (None if p is None else _unit_stride(p.reshape(-1)) for p in (weight, bias))
        fwd = _library.LAYER_NORM_FWD_SHAPED if _library.tracing() else _operator_fwd_shaped
        y, mean, rstd = fwd(x2, list(x.shape), w, b, eps)
        ctx.save_for_backward(x2, w, mean, rstd)
        ctx.x_shape = x.shape
        ctx.params = [(p.shape, p.dtype) if p is not None else None for p in (weight, bias)]
        return y

    @staticmethod
    @once_differentiable  # no double backward: differentiating the gradients raises, never silently drops
    def backward(ctx, dy):
        x2, w, mean, rstd = ctx.saved_tensors
        need_dw, need_db = ctx.needs_input_grad[2], ctx.needs_input_grad[3]
        # while tracing, the operator fixes the strides (torch 2.6 refused .stride() in a traced backward)
        if _library.tracing():
            dy2 = dy.reshape(-1, x2.shape[1])
            dx, dw, db = _library.LAYER_NORM_BWD(dy2, x2, w, mean, rstd, need_dw, need_db)
        else:
            dx, dw, db = layer_norm_bwd(_rows(dy, x2.shape[1]), x2, w, mean, rstd, need_dw, need_db)
        grads = []
        for g, p in zip((dw, db), ctx.params, strict=True):
            grads.append(None if g is None else g.view(p[0]).to(p[1]))
        return dx.view(ctx.x_shape), None, grads[0], grads[1], None


# whether the kernels were built for the interpreter: fixed at import, so a constant to torch.compile
_INTERPRETED = is_interpreted(_ln_fwd_kernel)
_INTERPRETER_PROBLEM = interpreter_problem() if _INTERPRETED else None


def _check_layer_norm_args(x, normalized_shape, weight, bias, eps) -> int:
    check_tensor(x, "x", SUPPORTED_DTYPES)
    if isinstance(normalized_shape, numbers.Integral):
        normalized_shape = (normalized_shape,)
    try:
        if isinstance(normalized_shape, (str, bytes)):
            raise TypeError
        # operator.index: ints (numpy's too), not floats such as 8.7, which int() would truncate
        normalized_shape = tuple(operator.index(d) for d in normalized_shape)
    except (TypeError, ValueError):
        raise TypeError(
            f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
        ) from None
    k = len(normalized_shape)
    if k == 0 or x.dim() < k or tuple(x.shape[x.dim() - k :]) != normalized_shape:
        raise ValueError(
            f"normalized_shape {list(normalized_shape)} does not match the trailing dims of x, "
            f"whose shape is {list(x.shape)}"
        )
    n = math.prod(normalized_shape)
    if n < 1 or n > MAX_N:
        raise ValueError(
            f"x's normalised size is {n} (normalized_shape {list(normalized_shape)}); "
            f"crossfuse.layer_norm supports 1 to {MAX_N} elements per row"
        )
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None:
            continue
        check_tensor(p, name, SUPPORTED_DTYPES)
        if tuple(p.shape) != normalized_shape:
            raise ValueError(
                f"{name} has shape {list(p.shape)}; expected normalized_shape {list(normalized_shape)}"
            )
        check_same_device(p, name, x, "x")
    check_positive_float(eps, "eps")
    check_runnable(x, "x", _INTERPRETED, _INTERPRETER_PROBLEM)
    return n


def layer_norm(
    x: torch.Tensor,
    normalized_shape,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """Layer norm with ``torch.nn.functional.layer_norm``'s signature and semantics, fused in Triton.

    Normalises over the trailing ``normalized_shape`` dims: ``(x - mean) / sqrt(var + eps) * weight +
    bias`` with the biased variance. ``weight`` and ``bias`` are each optional. Differentiable in
    ``x``, ``weight`` and ``bias``. See the module docstring for limits.
    """
    n = _check_layer_norm_args(x, normalized_shape, weight, bias, eps)
    if _library.tracing():  # one tensor as weight and bias: see distinct
        x, weight, bias = _library.distinct(x, weight, bias)
    return LayerNormFunction.apply(x, n, weight, bias, float(eps))
