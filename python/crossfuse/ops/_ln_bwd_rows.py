"""The layer-norm backward of long rows, each row read once, written in Gluon (Triton's lower-level
language: explicit shared memory, copy engine and barriers).

One program per SM walks its rows. The copy engine (TMA) brings each row's x and dy into one of
``STAGES`` shared-memory buffers, ``STAGES - 1`` rows ahead. A row is read from shared memory twice:
its two sums (c1, c2), then dx (stored from registers) and the row's share of dw and db, added to
float32 accumulators that stay in registers for the whole walk. The accumulators are why this takes a
kernel of its own: for N = 16384 they fill half of an SM's registers, so Triton's whole-row kernels
(which also keep the row, the weight and their products in registers) spill; here the row and the
weight live in shared memory and the registers hold the accumulators and a few elements in flight.
HBM sees x and dy read once and dx written once; the split backward reads x and dy twice.

GPU only (compute capability 9+; Gluon kernels do not run under Triton's interpreter): ``usable`` says
when; the layer-norm launcher falls back to its other kernels otherwise. Gluon is experimental and its
API changes between Triton releases (3.9 has no ``thread_barrier``, for one), so the kernel is used only
with the Triton minor version it was written and tested for (``GLUON_TRITON``: compiled for sm_90 and
run on an H200 with 3.6); other versions take the Triton kernels.
"""

from __future__ import annotations

import functools

import torch
import triton

from .._backend import bind_cuda_context, compute_capability_major

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # a Triton without Gluon: the launcher never picks this kernel
    gluon = None

GLUON_TRITON = (3, 6)  # the Triton minor version this kernel was written and tested for
BOX_W = 256  # a row is brought in as a [N / BOX_W, BOX_W] box (a copy-engine box is at most 256 wide)
SMEM_BYTES = 227 * 1024  # shared memory one program may take on sm_90

if gluon is not None:

    @gluon.jit
    def _half_g(xb, dyb, wb, mean, rstd, layout: gl.constexpr, HAS_WEIGHT: gl.constexpr):
        """``(xhat, dy, g = dy * w)`` of half a row, from its shared-memory buffers, in float32."""
        x = xb.load(layout).to(gl.float32)
        dy = dyb.load(layout).to(gl.float32)
        xhat = (x - mean) * rstd
        if HAS_WEIGHT:
            g = dy * wb.load(layout).to(gl.float32)
        else:
            g = dy
        return xhat, dy, g

    @gluon.jit
    def _half_dx(xb, dyb, wb, mean, rstd, c1, c2, dw, db, dx_ptrs, dx_ok, layout: gl.constexpr,
                 HAS_WEIGHT: gl.constexpr, COMPUTE_DW: gl.constexpr, COMPUTE_DB: gl.constexpr):  # fmt: skip
        """Stores half a row's dx (where ``dx_ok``) and adds its share to the half's dw and db."""
        xhat, dy, g = _half_g(xb, dyb, wb, mean, rstd, layout, HAS_WEIGHT)
        dx = (g - (xhat * c1 + c2)) * rstd
        gl.store(dx_ptrs, dx.to(dx_ptrs.dtype.element_ty), mask=dx_ok)
        if COMPUTE_DW:
            dw += dy * xhat
        if COMPUTE_DB:
            db += dy
        return dw, db

    @gluon.jit(do_not_specialize=["M", "DX_M"])  # a new row count reuses the compiled kernel
    def _ln_bwd_rows_kernel(
        DX,  # input gradient, (M, N), row stride stride_dxm
        Xd,  # x as a (M * BOX_R, BOX_W) descriptor, boxes [BOX_R, BOX_W] (one row each)
        DYd,  # dy, likewise
        W,  # weight, (N,); unused unless HAS_WEIGHT
        Mean,  # (M,) float32
        Rstd,  # (M,) float32
        DW_part,  # partial dw, (programs, N) float32; unused unless COMPUTE_DW
        DB_part,  # partial db, (programs, N) float32; unused unless COMPUTE_DB
        stride_dxm,
        M,
        DX_M,  # dx is stored for rows below DX_M only (dw and db take every row)
        inv_n,  # 1 / N (exact: N is a power of 2)
        BOX_R: gl.constexpr,
        BOX_W: gl.constexpr,
        STAGES: gl.constexpr,
        HAS_WEIGHT: gl.constexpr,
        COMPUTE_DW: gl.constexpr,
        COMPUTE_DB: gl.constexpr,
        WARPS: gl.constexpr,
    ):
        # a row is taken in two halves of HALF box rows, so that a thread holds few elements of each
        # tensor at a time beside its accumulators (at N = 16384 on the table's 16 warps, 32 of dw and 32
        # of db per thread); each thread reads 16 consecutive bytes of a box row
        HALF: gl.constexpr = BOX_R // 2
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])
        plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        pid = gl.program_id(0)
        programs = gl.num_programs(0)
        r = gl.arange(0, HALF, layout=gl.SliceLayout(1, layout))
        c = gl.arange(0, BOX_W, layout=gl.SliceLayout(0, layout))
        cols0 = r[:, None] * BOX_W + c[None, :]  # the row's element of each (box row, box column), first half
        cols1 = cols0 + HALF * BOX_W

        xs = gl.allocate_shared_memory(Xd.dtype, [STAGES, BOX_R, BOX_W], Xd.layout)
        dys = gl.allocate_shared_memory(DYd.dtype, [STAGES, BOX_R, BOX_W], DYd.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for k in gl.static_range(STAGES):
            mbarrier.init(bars.index(k), count=1)
        if HAS_WEIGHT:
            ws = gl.allocate_shared_memory(W.dtype.element_ty, [BOX_R, BOX_W], plain)
            ws.slice(0, HALF).store(gl.load(W + cols0))
            ws.slice(HALF, HALF).store(gl.load(W + cols1))
            gl.thread_barrier()
            w0 = ws.slice(0, HALF)
            w1 = ws.slice(HALF, HALF)
        else:  # placeholders, not read
            w0 = xs.index(0).slice(0, HALF)
            w1 = w0
        row_bytes: gl.constexpr = 2 * Xd.block_type.nbytes

        mine = gl.cdiv(M - pid, programs)  # rows pid, pid + programs, ...
        for k in gl.static_range(STAGES - 1):  # the first rows' copies
            ok = k < mine
            first = pid + k * programs
            mbarrier.expect(bars.index(k), row_bytes, pred=ok)
            tma.async_copy_global_to_shared(Xd, [first * BOX_R, 0], bars.index(k), xs.index(k), pred=ok)
            tma.async_copy_global_to_shared(DYd, [first * BOX_R, 0], bars.index(k), dys.index(k), pred=ok)

        dw0 = gl.zeros([HALF, BOX_W], gl.float32, layout)
        dw1 = gl.zeros([HALF, BOX_W], gl.float32, layout)
        db0 = gl.zeros([HALF, BOX_W], gl.float32, layout)
        db1 = gl.zeros([HALF, BOX_W], gl.float32, layout)
        mean_next = gl.load(Mean + pid)
        rstd_next = gl.load(Rstd + pid)
        for i in range(mine):
            row = pid + i * programs
            # the copy STAGES - 1 rows ahead goes into the buffer the previous row left (every thread
            # finished reading it at the end of the previous iteration)
            ahead = i + STAGES - 1
            b_ahead = ahead % STAGES
            ok = ahead < mine
            fence_async_shared()
            mbarrier.expect(bars.index(b_ahead), row_bytes, pred=ok)
            tma.async_copy_global_to_shared(Xd, [(pid + ahead * programs) * BOX_R, 0], bars.index(b_ahead),
                                            xs.index(b_ahead), pred=ok)  # fmt: skip
            tma.async_copy_global_to_shared(DYd, [(pid + ahead * programs) * BOX_R, 0], bars.index(b_ahead),
                                            dys.index(b_ahead), pred=ok)  # fmt: skip
            mean = mean_next
            rstd = rstd_next
            nxt = gl.minimum(row + programs, M - 1)
            mean_next = gl.load(Mean + nxt)
            rstd_next = gl.load(Rstd + nxt)

            buf = i % STAGES
            mbarrier.wait(bars.index(buf), (i // STAGES) & 1)
            x0, dy0 = xs.index(buf).slice(0, HALF), dys.index(buf).slice(0, HALF)
            x1, dy1 = xs.index(buf).slice(HALF, HALF), dys.index(buf).slice(HALF, HALF)
            xhat, _, g = _half_g(x0, dy0, w0, mean, rstd, layout, HAS_WEIGHT)
            s1 = gl.sum(xhat * g, axis=1)  # within warps first: a value per box row, not per element
            s2 = gl.sum(g, axis=1)
            xhat, _, g = _half_g(x1, dy1, w1, mean, rstd, layout, HAS_WEIGHT)
            s1 += gl.sum(xhat * g, axis=1)
            s2 += gl.sum(g, axis=1)
            c1 = gl.sum(s1, axis=0) * inv_n
            c2 = gl.sum(s2, axis=0) * inv_n
            # the second read of the row, from shared memory
            dx_row = DX + row.to(gl.int64) * stride_dxm
            dx_ok = row < DX_M
            dw0, db0 = _half_dx(x0, dy0, w0, mean, rstd, c1, c2, dw0, db0, dx_row + cols0, dx_ok, layout,
                                HAS_WEIGHT, COMPUTE_DW, COMPUTE_DB)  # fmt: skip
            dw1, db1 = _half_dx(x1, dy1, w1, mean, rstd, c1, c2, dw1, db1, dx_row + cols1, dx_ok, layout,
                                HAS_WEIGHT, COMPUTE_DW, COMPUTE_DB)  # fmt: skip
            gl.thread_barrier()  # every thread is done with buffer buf: the next iteration refills it

        for k in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(k))
        N: gl.constexpr = BOX_R * BOX_W
        if COMPUTE_DW:
            gl.store(DW_part + pid * N + cols0, dw0)
            gl.store(DW_part + pid * N + cols1, dw1)
        if COMPUTE_DB:
            gl.store(DB_part + pid * N + cols0, db0)
            gl.store(DB_part + pid * N + cols1, db1)


@functools.cache
def triton_version() -> tuple[int, int]:
    """Triton's (major, minor) version."""
    major, minor = triton.__version__.split(".")[:2]
    return int(major), int(minor)


def stages_that_fit(n: int, esize: int, has_weight: bool) -> int:
    """Row buffers (x and dy) that fit one program's shared memory beside the weight, at most 3."""
    row = 2 * n * esize
    return min(3, (SMEM_BYTES - (n * esize if has_weight else 0) - 1024) // row)


def usable(x: torch.Tensor, dy: torch.Tensor, weight, interpreted: bool) -> bool:
    """Whether this kernel can take the backward of ``x`` and ``dy`` ((M, N) views): Gluon present in the
    Triton of ``GLUON_TRITON``, a GPU of compute capability 9+, bfloat16 or float16 (weight alike), N a
    power of 2 from 4096 to 16384, contiguous rows with 16-byte aligned bases, at least two row buffers in
    shared memory."""
    if gluon is None or interpreted or x.device.type != "cuda" or triton_version() != GLUON_TRITON:
        return False
    if x.dtype not in (torch.bfloat16, torch.float16) or dy.dtype != x.dtype:
        return False
    if weight is not None and (weight.dtype != x.dtype or not weight.is_contiguous()):
        return False
    N = x.shape[1]
    if N & (N - 1) or not 4096 <= N <= 16384 or compute_capability_major(x) < 9:
        return False
    if any(t.stride(1) != 1 or t.stride(0) != N or t.data_ptr() % 16 for t in (x, dy)):
        return False
    if x.shape[0] * (N // BOX_W) >= 2**31:  # the copy engine's row coordinates are 32-bit
        return False
    return stages_that_fit(N, x.element_size(), weight is not None) >= 2


def _row_boxes(t: torch.Tensor):
    """A descriptor over the contiguous (M, N) ``t`` as (M * N / BOX_W, BOX_W), one row per box."""
    M, N = t.shape
    bind_cuda_context(t)  # Triton fills the descriptor before it makes a context current
    flat = t.view(M * N // BOX_W, BOX_W)
    bits = t.element_size() * 8
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=2)
    return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [N // BOX_W, BOX_W], layout)


def launch(dx, dy, x, weight, mean, rstd, dw_part, db_part, programs: int, dx_m: int, compute_dw: bool,
           compute_db: bool, warps: int, stages: int) -> None:  # fmt: skip
    """dx of the rows below ``dx_m``, and each program's float32 share of dw and db (rows p, p +
    ``programs``, ...) in row p of ``dw_part`` / ``db_part`` ((programs, N); placeholders when not
    computed), on ``warps`` warps (at most N / 512: a warp takes 8 elements of 32 columns of each half
    row) with ``stages`` row buffers (see :func:`stages_that_fit`); see :func:`usable`."""
    M, N = x.shape
    if not 1 <= programs <= M:
        raise ValueError(f"programs must be from 1 to the row count {M}, got {programs}")
    if not 1 <= warps <= N // 512 or warps & (warps - 1):
        raise ValueError(f"warps must be a power of 2 from 1 to N / 512 = {N // 512}, got {warps}")
    if not 2 <= stages <= stages_that_fit(N, x.element_size(), weight is not None):
        raise ValueError(f"stages must be from 2 to what fits in shared memory, got {stages}")
    _ln_bwd_rows_kernel[(programs,)](
        dx, _row_boxes(x), _row_boxes(dy), weight if weight is not None else x, mean, rstd, dw_part, db_part,
        dx.stride(0), M, dx_m, 1.0 / N, BOX_R=N // BOX_W, BOX_W=BOX_W, STAGES=stages,
        HAS_WEIGHT=weight is not None, COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db, WARPS=warps,
        num_warps=warps,
    )  # fmt: skip


__all__ = ["launch", "stages_that_fit", "usable"]
