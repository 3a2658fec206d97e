"""The layer norm's forward kernels: whole rows in registers (pointers or tensor descriptors) and long rows
in chunks (three passes, or two about a shift). See the package docstring for the formulas."""

from __future__ import annotations

import triton
import triton.language as tl

from .kernels_common import _centred_moments, _columns, _div, _div_n, _kept_params, _load_rows, _sum2


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
    [1, BLOCK_N] tiles: in that form this kernel compiled 6-8% faster than in one dimension on the H200."""
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
