"""The layer-norm forward through shared memory, written in Gluon (Triton's lower-level language: explicit
shared memory, copy engine and barriers), the forward's counterpart of :mod:`._ln_bwd_rows`.

A persistent grid walks tiles of ``T`` whole rows: program p takes tiles p, p + programs, .... The copy
engine (TMA) brings each tile (a [T·N/256, 256] box of the contiguous input, viewed as [T, N/256, 256]) into
one of ``STAGES`` shared-memory buffers; the program reads it into registers once and at once sends the
buffer for the tile ``STAGES`` ahead, so that ``STAGES`` tiles are always in flight and none of them holds
registers. The statistics (the same corrected two-pass sums as the Triton kernels) and y are computed from
the registers; y is stored from them. HBM sees x read once and y written once.

GPU only (compute capability 9+, Triton ``GLUON_TRITON``); :func:`usable` says when, and the launcher
takes the Triton kernels otherwise.
"""

from __future__ import annotations

import torch

from .._backend import compute_capability_major
from ._ln_bwd_rows import BOX_W, GLUON_TRITON, SMEM_BYTES, triton_version

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # a Triton without Gluon: the launcher never picks this kernel
    gluon = None

if gluon is not None:

    @gluon.jit
    def _add2(a1, a2, b1, b2):
        return a1 + b1, a2 + b2

    @gluon.jit(do_not_specialize=["M"])  # a new row count reuses the compiled kernel
    def _ln_fwd_rows_kernel(
        Xd,  # x as a (M * BOX_R, BOX_W) descriptor, boxes [T * BOX_R, BOX_W] (T rows each)
        Y,  # output, (M, N), row stride stride_ym
        W,  # weight, (N,); unused unless HAS_WEIGHT
        B,  # bias, (N,); unused unless HAS_BIAS
        Mean,  # (M,) float32
        Rstd,  # (M,) float32
        stride_ym,
        M,
        inv_n,  # 1 / N (exact: N is a power of 2)
        eps,
        T: gl.constexpr,  # rows per tile
        BOX_R: gl.constexpr,  # box rows per row: N / BOX_W
        BOX_W: gl.constexpr,
        STAGES: gl.constexpr,
        HAS_WEIGHT: gl.constexpr,
        HAS_BIAS: gl.constexpr,
        WARPS_T: gl.constexpr,  # warps along the tile's rows; WARPS // WARPS_T along each row
        WARPS: gl.constexpr,
    ):
        # each thread holds 8 consecutive elements (16 bytes in 16 bits) of a box row; the warps split the
        # tile's rows first, then each row's box rows (a row's sums cross warps only where WARPS_T < WARPS)
        warps: gl.constexpr = [WARPS_T, WARPS // WARPS_T, 1]
        layout: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 1, 32], warps, [2, 1, 0])
        row_l: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, layout))
        plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
        pid = gl.program_id(0)
        programs = gl.num_programs(0)
        t = gl.arange(0, T, layout=row_l)
        r = gl.arange(0, BOX_R, layout=gl.SliceLayout(0, gl.SliceLayout(2, layout)))
        c = gl.arange(0, BOX_W, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))
        cols = r[None, :, None] * BOX_W + c[None, None, :]  # [1, BOX_R, BOX_W]: the element of the row

        xs = gl.allocate_shared_memory(Xd.dtype, [STAGES, T * BOX_R, BOX_W], Xd.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for k in gl.static_range(STAGES):
            mbarrier.init(bars.index(k), count=1)
        tile_bytes: gl.constexpr = Xd.block_type.nbytes
        tiles = gl.cdiv(M, T)
        mine = gl.cdiv(tiles - pid, programs)  # tiles pid, pid + programs, ...
        for k in gl.static_range(STAGES):  # the first tiles' copies
            ok = k < mine
            mbarrier.expect(bars.index(k), tile_bytes, pred=ok)
            tma.async_copy_global_to_shared(Xd, [(pid + k * programs) * T * BOX_R, 0], bars.index(k),
                                            xs.index(k), pred=ok)  # fmt: skip
        if HAS_WEIGHT:
            w = gl.load(W + cols).to(gl.float32)
        if HAS_BIAS:
            b = gl.load(B + cols).to(gl.float32)

        for i in range(mine):
            tile = pid + i * programs
            buf = i % STAGES
            mbarrier.wait(bars.index(buf), (i // STAGES) & 1)
            x = xs.index(buf)._reinterpret(Xd.dtype, [T, BOX_R, BOX_W], plain).load(layout).to(gl.float32)
            gl.thread_barrier()  # every thread has its part of the tile: the buffer takes the next copy
            ahead = i + STAGES
            ok = ahead < mine
            fence_async_shared()
            mbarrier.expect(bars.index(buf), tile_bytes, pred=ok)
            tma.async_copy_global_to_shared(Xd, [(pid + ahead * programs) * T * BOX_R, 0], bars.index(buf),
                                            xs.index(buf), pred=ok)  # fmt: skip

            mean = gl.sum(gl.sum(x, axis=2), axis=1) * inv_n
            xc = x - mean[:, None, None]
            # corrected two-pass: the residual sum fixes the rounding of the first mean
            s1, s2 = gl.reduce((xc, xc * xc), 2, _add2)
            s1, s2 = gl.reduce((s1, s2), 1, _add2)
            corr = s1 * inv_n
            var = gl.maximum(s2 * inv_n - corr * corr, 0.0)
            rstd = gl.rsqrt(var + eps)
            y = (xc - corr[:, None, None]) * rstd[:, None, None]
            if HAS_WEIGHT:
                y = y * w
            if HAS_BIAS:
                y = y + b
            rows = tile * T + t
            row_ok = rows < M
            offs = rows.to(gl.int64)[:, None, None] * stride_ym + cols
            gl.store(Y + offs, y.to(Y.dtype.element_ty), mask=row_ok[:, None, None])
            gl.store(Mean + rows, mean + corr, mask=row_ok)
            gl.store(Rstd + rows, rstd, mask=row_ok)

        for k in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(k))


def stages_that_fit(n: int, esize: int, tile_rows: int) -> int:
    """Tile buffers that fit one program's shared memory, at most 8."""
    return min(8, (SMEM_BYTES - 1024) // (tile_rows * n * esize))


def usable(x: torch.Tensor, weight, bias, interpreted: bool) -> bool:
    """Whether this kernel can take the forward of ``x`` ((M, N) view): Gluon present in the Triton of
    ``GLUON_TRITON``, a GPU of compute capability 9+, 16- or 32-bit floats (weight and bias alike), N a power
    of 2 from 256 to 16384, contiguous rows with a 16-byte aligned base."""
    if gluon is None or interpreted or x.device.type != "cuda" or triton_version() != GLUON_TRITON:
        return False
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    for p in (weight, bias):
        if p is not None and (p.dtype != x.dtype or not p.is_contiguous()):
            return False
    N = x.shape[1]
    if N & (N - 1) or not BOX_W <= N <= 16384 or compute_capability_major(x) < 9:
        return False
    if x.stride(1) != 1 or x.stride(0) != N or x.data_ptr() % 16:
        return False
    return x.shape[0] * (N // BOX_W) < 2**31  # the copy engine's row coordinates are 32-bit


def _tile_boxes(x: torch.Tensor, tile_rows: int):
    """A descriptor over the contiguous (M, N) ``x`` as (M * N / BOX_W, BOX_W), a tile of rows per box."""
    M, N = x.shape
    flat = x.view(M * N // BOX_W, BOX_W)
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=x.element_size() * 8, rank=2)
    box = [tile_rows * N // BOX_W, BOX_W]
    return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), box, layout)


def launch(y, x, weight, bias, mean, rstd, eps: float, programs: int, tile_rows: int, warps: int,
           warps_t: int, stages: int) -> None:  # fmt: skip
    """y, mean and rstd of ``x`` by ``programs`` persistent programs of ``warps`` warps (``warps_t`` of
    them along a tile's ``tile_rows`` rows), ``stages`` tiles in flight each; see :func:`usable`."""
    M, N = x.shape
    box_r = N // BOX_W
    if tile_rows < 1 or tile_rows & (tile_rows - 1) or tile_rows * box_r > 256:
        raise ValueError(f"tile_rows must be a power of 2 of at most 256 box rows, got {tile_rows}")
    if warps < 1 or warps & (warps - 1) or warps_t < 1 or warps % warps_t or warps_t > tile_rows:
        raise ValueError(f"warps ({warps}) and warps_t ({warps_t}) must be powers of 2, warps_t dividing "
                         f"warps and at most tile_rows ({tile_rows})")  # fmt: skip
    if warps // warps_t > box_r:
        raise ValueError(f"warps / warps_t must be at most N / {BOX_W} = {box_r}, got {warps // warps_t}")
    if not 1 <= stages <= stages_that_fit(N, x.element_size(), tile_rows):
        raise ValueError(f"stages must be from 1 to what fits in shared memory, got {stages}")
    if not 1 <= programs:
        raise ValueError(f"programs must be at least 1, got {programs}")
    _ln_fwd_rows_kernel[(programs,)](
        _tile_boxes(x, tile_rows), y, weight if weight is not None else x, bias if bias is not None else x,
        mean, rstd, y.stride(0), M, 1.0 / N, eps, T=tile_rows, BOX_R=box_r, BOX_W=BOX_W, STAGES=stages,
        HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, WARPS_T=warps_t, WARPS=warps,
        num_warps=warps,
    )  # fmt: skip


__all__ = ["launch", "stages_that_fit", "usable"]
