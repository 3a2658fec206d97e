"""The layer norm's backward for few rows, in one launch and no scratch memory.

With few rows the other backwards' dw/db partials (a float32 row per program, about a program an SM)
outweigh dx itself and need a buffer of their own, which put the backward's peak memory above torch's. Here
the first programs each own a column block and walk every row, summing dw and db straight into their
outputs; the others write dx a row tile at a time. Both halves read x and dy (the second read from L2 at
these sizes): one launch, where the partials' way takes two, and nothing allocated but dx, dw and db.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernels_bwd import _ln_bwd_tile, _load_bwd_tile, _row_dx, _row_sums, _to_param_dtype
from .kernels_common import _columns


@triton.jit
def _few_dwdb(DY, X, Mean, Rstd, DW, DB, stride_dym, stride_xm, block, M, N, COL_M: tl.constexpr,
              COL_N: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
              acc_ty: tl.constexpr):  # fmt: skip
    """dw and db of the columns of ``block`` (COL_N wide), summed over all M rows in COL_M-row tiles: each
    sum in a (COL_M, COL_N) accumulator, added over the tile's rows at the end. Rows past M read as 0."""
    cols = block * COL_N + tl.arange(0, COL_N)
    col_ok = cols < N
    acc_dw = tl.zeros([COL_M, COL_N], dtype=acc_ty)
    acc_db = tl.zeros([COL_M, COL_N], dtype=acc_ty)
    for start in tl.range(0, M, COL_M):
        rows = start + tl.arange(0, COL_M)
        x, dy, mean, rstd = _load_bwd_tile(X, DY, Mean, Rstd, stride_xm, stride_dym, rows, M, cols, col_ok)
        dy = dy.to(acc_ty)
        if COMPUTE_DW:
            acc_dw += dy * ((x.to(acc_ty) - mean[:, None]) * rstd[:, None])
        if COMPUTE_DB:
            acc_db += dy
    if COMPUTE_DW:
        tl.store(DW + cols, _to_param_dtype(tl.sum(acc_dw, axis=0), DW), mask=col_ok)
    if COMPUTE_DB:
        tl.store(DB + cols, _to_param_dtype(tl.sum(acc_db, axis=0), DB), mask=col_ok)


@triton.jit
def _few_dx_chunked(DX, DY, X, W, Mean, Rstd, stride_dxm, stride_dym, stride_xm, first, step, M, N,
                    BLOCK_N: tl.constexpr, HAS_WEIGHT: tl.constexpr, IS_FP64: tl.constexpr,
                    acc_ty: tl.constexpr):  # fmt: skip
    """dx of the rows ``first``, ``first + step``, … below M, rows longer than BLOCK_N: the row's two sums
    over its chunks, then the row again (from L2) for its dx."""
    cols = tl.arange(0, BLOCK_N)
    for r in tl.range(first, M, step):
        row = tl.cast(r, tl.int64)  # an int under the interpreter
        mean = tl.load(Mean + row)
        rstd = tl.load(Rstd + row)
        c1, c2 = _row_sums(X, DY, W, row, mean, rstd, stride_xm, stride_dym, cols, N, BLOCK_N, acc_ty,
                           HAS_WEIGHT, IS_FP64, 1)  # fmt: skip
        _row_dx(DX, X, DY, W, row, mean, rstd, c1, c2, stride_dxm, stride_xm, stride_dym, cols, N, BLOCK_N,
                acc_ty, HAS_WEIGHT, 1)  # fmt: skip


@triton.jit(do_not_specialize=["M"])
def _ln_bwd_few_kernel(
    DX,  # input gradient, (M, N), row stride stride_dxm
    DY,  # output gradient, (M, N), row stride stride_dym
    X,  # input, (M, N), row stride stride_xm
    W,  # weight, (N,); unused unless HAS_WEIGHT
    Mean,  # (M,)
    Rstd,  # (M,)
    DW,  # out, (N,), the weight's dtype; unused unless COMPUTE_DW
    DB,  # out, (N,), the bias's dtype; unused unless COMPUTE_DB
    stride_dxm,
    stride_dym,
    stride_xm,
    M,
    N,
    inv_n,  # 1 / N in float32 (used where N is a power of 2: then exact)
    COL_PROGRAMS: tl.constexpr,  # programs 0 .. COL_PROGRAMS - 1: dw and db of a column block each
    COL_M: tl.constexpr,
    COL_N: tl.constexpr,
    ROW_M: tl.constexpr,  # the others: dx of ROW_M-row tiles (whole rows), or of single rows in chunks
    BLOCK_N: tl.constexpr,  # the row tile's columns (the whole row unless CHUNKED), or the chunk
    HAS_WEIGHT: tl.constexpr,
    COMPUTE_DW: tl.constexpr,
    COMPUTE_DB: tl.constexpr,
    IS_FP64: tl.constexpr,
    EVEN_N: tl.constexpr,  # N == BLOCK_N: no column masks
    POW2_N: tl.constexpr,  # N is a power of 2: divisions by N as products by 1/N (exact)
    CHUNKED: tl.constexpr,  # rows longer than BLOCK_N
    ONE_COL: tl.constexpr = False,  # N == 1: dx exactly 0 (see _ln_bwd_tile)
):
    # the column blocks first: they walk every row, so they are the launch's longest programs and start first
    pid = tl.program_id(0)
    acc_ty = tl.float64 if IS_FP64 else tl.float32
    if pid < COL_PROGRAMS:
        _few_dwdb(DY, X, Mean, Rstd, DW, DB, stride_dym, stride_xm, pid, M, N, COL_M, COL_N, COMPUTE_DW,
                  COMPUTE_DB, acc_ty)  # fmt: skip
    else:
        first = pid - COL_PROGRAMS
        step = tl.num_programs(0) - COL_PROGRAMS
        if CHUNKED:
            _few_dx_chunked(DX, DY, X, W, Mean, Rstd, stride_dxm, stride_dym, stride_xm, first, step, M, N,
                            BLOCK_N, HAS_WEIGHT, IS_FP64, acc_ty)  # fmt: skip
        else:
            cols, col_ok = _columns(N, BLOCK_N, EVEN_N)
            w = cols  # a placeholder without weights
            if HAS_WEIGHT:
                w = tl.load(W + cols, mask=col_ok, other=0.0).to(acc_ty)
            for tile in tl.range(first, tl.cdiv(M, ROW_M), step):
                rows = tile * ROW_M + tl.arange(0, ROW_M)
                x, dy, mean, rstd = _load_bwd_tile(X, DY, Mean, Rstd, stride_xm, stride_dym, rows, M, cols,
                                                   col_ok)  # fmt: skip
                _, dx = _ln_bwd_tile(x.to(acc_ty), dy.to(acc_ty), mean, rstd, w, N, inv_n, HAS_WEIGHT, POW2_N,
                                     IS_FP64, ONE_COL)  # fmt: skip
                mask = (rows < M)[:, None] & col_ok[None, :]
                tl.store(DX + rows.to(tl.int64)[:, None] * stride_dxm + cols[None, :],
                         dx.to(DX.dtype.element_ty), mask=mask)  # fmt: skip
