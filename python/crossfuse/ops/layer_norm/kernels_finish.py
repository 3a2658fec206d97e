"""The kernel that writes the grouped backward's scratch rows' dx from the row sums its programs posted
(no second pass over those rows), in Triton."""

from __future__ import annotations

import triton
import triton.language as tl

from .._runtime.pdl import launch_dependents as _launch_dependents
from .._runtime.pdl import wait_for_previous as _wait_for_previous


@triton.jit
def _group_sums(Shares, rows, k, SLICES: tl.constexpr, inv_n):
    """``(c1, c2)`` of ``rows`` (a tensor of row indices; masked rows: ``rows < 0``, their sums 0) from the
    grouped kernel's posted shares ((M, 2, SLICES) int64, see ``gluon_bwd._posted``), added in slice
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
    """The float32 posted in the 64-bit word ``w`` (as ``gluon_bwd._unposted``, in Triton)."""
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
