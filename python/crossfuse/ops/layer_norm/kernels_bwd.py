"""The layer norm's backward kernels in Triton: whole rows (pointers or tensor descriptors), the split
backward of long rows (row sums, then column chunks), the cooperative one (column slabs that exchange
their row sums), and the reduction of the dw/db partial sums. See the package docstring."""

from __future__ import annotations

import triton
import triton.language as tl

from .._runtime.pdl import launch_dependents as _launch_dependents
from .._runtime.pdl import wait_for_previous as _wait_for_previous
from .kernels_common import _columns, _div, _div_n, _load_rows


@triton.jit
def _load_bwd_tile(X, DY, Mean, Rstd, stride_xm, stride_dym, rows, M, cols, col_ok):
    """What the backward reads for the row tile ``rows``: x and dy in their own dtype, mean and rstd."""
    x = _load_rows(X, stride_xm, rows, M, cols, col_ok)
    dy = _load_rows(DY, stride_dym, rows, M, cols, col_ok)
    mean = tl.load(Mean + rows, mask=rows < M, other=0.0)
    rstd = tl.load(Rstd + rows, mask=rows < M, other=0.0)
    return x, dy, mean, rstd


@triton.jit
def _ln_bwd_tile(x, dy, mean, rstd, w, N, inv_n, HAS_WEIGHT: tl.constexpr, POW2_N: tl.constexpr,
                 IS_FP64: tl.constexpr, ONE_COL: tl.constexpr = False):  # fmt: skip
    """``(xhat, dx)`` of one row tile (float32/float64 x and dy; w unused unless HAS_WEIGHT). No select for
    masked elements: x and dy read as 0 there (mean and rstd too, in masked rows), so xhat is finite, and
    every sum takes them through a product with dy or g, which are 0; their dx is not stored.

    ONE_COL (N == 1): dx is exactly 0 (y is the bias whatever x is), as torch gives it. The general form
    is not: the GPU's compiler contracts g - mean(g), with g = dy * w, into fma(dy, w, -mean(g)), which
    leaves g's rounding error, magnified by rstd = 1/sqrt(eps) (|dx| ~ 6e-5 |dy| at eps = 1e-5)."""
    xhat = (x - mean[:, None]) * rstd[:, None]
    if HAS_WEIGHT:
        g = dy * w[None, :]
    else:
        g = dy
    if ONE_COL:
        return xhat, g * 0.0  # 0, and NaN where g is (inf - inf in the general form)
    # two separate sums: one tl.reduce of the pair (one trip through shared memory) measured 12% slower
    # here in bfloat16, though it does not slow the forward
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
    ONE_COL: tl.constexpr = False,  # N == 1: dx exactly 0 (see _ln_bwd_tile)
):
    _launch_dependents(GDC)
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    acc_ty = tl.float64 if IS_FP64 else tl.float32
    cols, col_ok = _columns(N, BLOCK_N, EVEN_N)
    w = cols  # a placeholder without weights
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(acc_ty)
    # dw and db summed per row slot of the tile, over the rows once at the end: a sum over the tile's rows
    # every tile crosses warps (shared memory and a barrier), which the small tiles of narrow rows pay often
    dw = tl.zeros([BLOCK_M, BLOCK_N], dtype=acc_ty)
    db = tl.zeros([BLOCK_M, BLOCK_N], dtype=acc_ty)
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
        xhat, dx = _ln_bwd_tile(x, dy, mean, rstd, w, N, inv_n, HAS_WEIGHT, POW2_N, IS_FP64, ONE_COL)
        _wait_for_previous(GDC)
        tl.store(DX + rows[:, None] * stride_dxm + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            dw += dy * xhat
        if COMPUTE_DB:
            db += dy
    if COMPUTE_DW:
        tl.store(DW_part + pid * N + cols, tl.sum(dw, axis=0), mask=col_ok)
    if COMPUTE_DB:
        tl.store(DB_part + pid * N + cols, tl.sum(db, axis=0), mask=col_ok)


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
    ONE_COL: tl.constexpr = False,  # N == 1: dx exactly 0 (see _ln_bwd_tile)
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
    # dw and db per row slot, as _ln_bwd_kernel's
    dw = tl.zeros([BLOCK_M, BLOCK_N], dtype=acc_ty)
    db = tl.zeros([BLOCK_M, BLOCK_N], dtype=acc_ty)
    for tile in tl.range(pid, tl.cdiv(M - ROW0, BLOCK_M), num_programs, num_stages=STAGES):
        row0 = ROW0 + tile * BLOCK_M
        x = Xd.load([row0, 0]).to(acc_ty)
        dy = DYd.load([row0, 0]).to(acc_ty)
        rows = row0 + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        mean = tl.load(Mean + rows, mask=row_ok, other=0.0)
        rstd = tl.load(Rstd + rows, mask=row_ok, other=0.0)
        xhat, dx = _ln_bwd_tile(x, dy, mean, rstd, w, N, inv_n, HAS_WEIGHT, POW2_N, IS_FP64, ONE_COL)
        mask = (rows < DX_M)[:, None] & col_ok[None, :]
        _wait_for_previous(GDC)
        tl.store(DX + rows.to(tl.int64)[:, None] * stride_dxm + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=mask)  # fmt: skip
        if COMPUTE_DW:
            dw += dy * xhat
        if COMPUTE_DB:
            db += dy
    if COMPUTE_DW:
        tl.store(DW_part + pid * N + cols, tl.sum(dw, axis=0), mask=col_ok)
    if COMPUTE_DB:
        tl.store(DB_part + pid * N + cols, tl.sum(db, axis=0), mask=col_ok)


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


@triton.jit
def _row_sums(X, DY, W, row, mean, rstd, stride_xm, stride_dym, cols, N, BLOCK_N: tl.constexpr,
              acc_ty: tl.constexpr, HAS_WEIGHT: tl.constexpr, IS_FP64: tl.constexpr,
              UNROLL: tl.constexpr):  # fmt: skip
    """``(mean(g * xhat), mean(g))`` of one row, walked in chunks of BLOCK_N (UNROLL chunks' loads out
    together)."""
    acc1 = tl.zeros([BLOCK_N], dtype=acc_ty)
    acc2 = tl.zeros([BLOCK_N], dtype=acc_ty)
    for start in tl.range(0, N, BLOCK_N, loop_unroll_factor=UNROLL):
        x, g, ok = _row_chunk(X, DY, W, row, stride_xm, stride_dym, start, cols, N, acc_ty, HAS_WEIGHT)
        xhat = tl.where(ok, (x - mean) * rstd, 0.0)
        acc1 += xhat * g
        acc2 += g
    return _div(tl.sum(acc1, axis=0), N, IS_FP64), _div(tl.sum(acc2, axis=0), N, IS_FP64)


@triton.jit
def _row_dx(DX, X, DY, W, row, mean, rstd, c1, c2, stride_dxm, stride_xm, stride_dym, cols, N,
            BLOCK_N: tl.constexpr, acc_ty: tl.constexpr, HAS_WEIGHT: tl.constexpr,
            UNROLL: tl.constexpr):  # fmt: skip
    """dx of one row from its two sums (:func:`_row_sums`), walked in chunks of BLOCK_N."""
    for start in tl.range(0, N, BLOCK_N, loop_unroll_factor=UNROLL):
        x, g, ok = _row_chunk(X, DY, W, row, stride_xm, stride_dym, start, cols, N, acc_ty, HAS_WEIGHT)
        dx = (g - ((x - mean) * rstd * c1 + c2)) * rstd
        tl.store(DX + row * stride_dxm + start + cols, dx.to(DX.dtype.element_ty), mask=ok)


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
    c1, c2 = _row_sums(X, DY, W, row, mean, rstd, stride_xm, stride_dym, cols, N, BLOCK_N, acc_ty, HAS_WEIGHT,
                       IS_FP64, UNROLL)  # fmt: skip
    if WRITE_DX:  # the row again (from L2), as _ln_bwd_split_kernel writes it
        _wait_for_previous(GDC)
        _row_dx(DX, X, DY, W, row, mean, rstd, c1, c2, stride_dxm, stride_xm, stride_dym, cols, N, BLOCK_N,
                acc_ty, HAS_WEIGHT, UNROLL)  # fmt: skip
    else:
        tl.store(C1 + i, c1)
        tl.store(C2 + i, c2)


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
