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

The second kernel here, for the longest rows, splits each row between a *group* of ``SLICES`` programs,
each owning ``N / SLICES`` columns (``_ln_bwd_groups_kernel``). The whole-row kernel keeps a float32 dw
and db of the whole row in every program, and all of them are written at the end: 132 x N x 8 bytes
(17 MB at N = 16384) that live in dx's last rows, whose dx must then be computed again from x and dy
(528 rows of 4096 in bf16, 13% more traffic). A program of a group keeps only its slice's dw and db, so
that scratch, and the rows recomputed, shrink ``SLICES`` times, and its row slices are small enough for
several to stream through shared memory at once. The price is the exchange of the two row sums: each
program posts its slice's shares of a row to L2 as 64-bit words (value | a tag), each written once by
one atomic exchange, and uses the group's shares ``LAG`` rows later, by which time they have usually
arrived (the words are asked for an iteration before they are used); where not, it polls them until
every tag is set. The shares are added in slice order, so
every program of a group computes the same c1 and c2, and dx does not depend on the schedule. The
programs of a group wait for each other, so they take their place from a ticket counter as they start
(as the cooperative Triton kernel does): the programs that run hold the lowest tickets, every group but
the last of them is complete, and the grid is ``programs_per_sm`` programs per SM (one of 8 warps, or
several smaller ones, each with its own buffers: in 16 bits four programs of 2 warps an SM measured 1.5-2.4%
faster than one of 8, at the same groups and partials, and six 3.5-7.4% faster than four, their groups
and partials 1.5 times as many, on the H200). With ``PAIRED``
the groups 2k and 2k + 1 add their dw and db into one row of partials: the program of the two (of a
slice) that ends second waits for the other's stores and adds its own, so the partials, and the scratch
rows of dx they take, halve.
"""

from __future__ import annotations

import torch

from .._runtime.device import compute_capability_major
from .._runtime.versions import GLUON_TRITON, triton_version
from .plan import Launch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
except ImportError:  # a Triton without Gluon: the launcher never picks this kernel
    gluon = None

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


    @gluon.jit
    def _slice_g(xb, dyb, w, mean, layout: gl.constexpr, HAS_WEIGHT: gl.constexpr):
        """``(x - mean, dy, g = dy * w)`` of a row slice, from its shared-memory buffers, in float32
        (``w``: the slice's weight, in registers)."""
        xc = xb.load(layout).to(gl.float32) - mean
        dy = dyb.load(layout).to(gl.float32)
        if HAS_WEIGHT:
            g = dy * w
        else:
            g = dy
        return xc, dy, g

    @gluon.jit
    def _add_pairs(a0, b0, a1, b1):
        return a0 + a1, b0 + b1

    @gluon.jit
    def _posted(v):
        """The 64-bit word that posts the float32 ``v``: its bits below, a tag of 1 above (the words are
        zero until posted, so a word is complete exactly when its tag is set)."""
        return (v.to(gl.int32, bitcast=True).to(gl.int64) & 0xFFFFFFFF) | 0x100000000

    @gluon.jit
    def _unposted(w):
        """The float32 posted in the 64-bit word ``w`` (see ``_posted``)."""
        return (w & 0xFFFFFFFF).to(gl.int32).to(gl.float32, bitcast=True)

    @gluon.jit(do_not_specialize=["M", "DX_M"])  # a new row count reuses the compiled kernel
    def _ln_bwd_groups_kernel(
        DX,  # input gradient, (M, N), row stride stride_dxm
        Xd,  # x as a (M * N / BOX_W, BOX_W) descriptor, boxes [BOX_R, BOX_W] (one row slice each)
        DYd,  # dy, likewise
        W,  # weight, (N,); unused unless HAS_WEIGHT
        Mean,  # (M,) float32
        Rstd,  # (M,) float32
        Shares,  # (M, 2, SLICES) int64, zero at launch: the slices' two row sums, posted (_posted)
        Tickets,  # (1,) int32, zero at launch: the places handed out
        Pairs,  # (2, slots, SLICES) int32, zero at launch, with PAIRED: each slot's arrivals, then its flags
        DW_part,  # partial dw, (slots, N) float32; unused unless COMPUTE_DW
        DB_part,  # partial db, (slots, N) float32; unused unless COMPUTE_DB
        stride_dxm,
        M,
        DX_M,  # dx is stored for rows below DX_M only (dw and db take every row)
        inv_n,  # 1 / N (exact: N is a power of 2)
        SLICES: gl.constexpr,  # programs per row (a group)
        BOX_R: gl.constexpr,  # box rows of a slice: a slice is BOX_R * BOX_W columns
        BOX_W: gl.constexpr,
        STAGES: gl.constexpr,  # row-slice buffers in shared memory
        LAG: gl.constexpr,  # rows between a slice's sums and its dx (STAGES - 1 - LAG rows load ahead)
        VEC: gl.constexpr,  # elements of 16 bytes: what a thread reads of a box row at a time
        HAS_WEIGHT: gl.constexpr,
        COMPUTE_DW: gl.constexpr,
        COMPUTE_DB: gl.constexpr,
        PAIRED: gl.constexpr,  # groups 2k and 2k + 1 add their dw and db into slot k (else a slot a group)
        WARPS: gl.constexpr,
        GDC: gl.constexpr,  # a programmatic dependent launch: wait for the kernel before (the memset) first
    ):
        layout: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [WARPS, 1], [1, 0])
        # the group's SLICES shares of a row, one a lane (summed across the lanes): with every thread
        # holding all of them the kernel took 255 registers a thread at bf16 rows of 16384, four programs
        # an SM; spread, 168, and six fit
        shares_layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
        NS: gl.constexpr = BOX_R * BOX_W  # columns of a slice
        N: gl.constexpr = NS * SLICES
        AHEAD: gl.constexpr = STAGES - 1 - LAG
        groups = gl.num_programs(0) // SLICES
        if GDC:  # the tickets, shares and pairs zeroed and visible (see crossfuse.ops._runtime.pdl)
            gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)  # fmt: skip
        ticket = gl.atomic_add(Tickets, 1, sem="relaxed")
        part = ticket % SLICES
        group = ticket // SLICES
        r = gl.arange(0, BOX_R, layout=gl.SliceLayout(1, layout))
        c = gl.arange(0, BOX_W, layout=gl.SliceLayout(0, layout))
        cols = part * NS + r[:, None] * BOX_W + c[None, :]  # this slice's columns
        k = gl.arange(0, SLICES, layout=shares_layout)

        xs = gl.allocate_shared_memory(Xd.dtype, [STAGES, BOX_R, BOX_W], Xd.layout)
        dys = gl.allocate_shared_memory(DYd.dtype, [STAGES, BOX_R, BOX_W], DYd.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for b in gl.static_range(STAGES):
            mbarrier.init(bars.index(b), count=1)
        if HAS_WEIGHT:
            w = gl.load(W + cols).to(gl.float32)
        else:  # a placeholder, not read
            w = gl.zeros([BOX_R, BOX_W], gl.float32, layout)
        stage_bytes: gl.constexpr = 2 * Xd.block_type.nbytes
        boxes: gl.constexpr = N // BOX_W  # box rows of a whole row
        at = part * BOX_R  # this slice's first box row within a row

        mine = gl.cdiv(M - group, groups)  # rows group, group + groups, ...
        for a in gl.static_range(AHEAD):  # the first rows' copies
            ok = a < mine
            first = (group + a * groups) * boxes + at
            mbarrier.expect(bars.index(a), stage_bytes, pred=ok)
            tma.async_copy_global_to_shared(Xd, [first, 0], bars.index(a), xs.index(a), pred=ok)
            tma.async_copy_global_to_shared(DYd, [first, 0], bars.index(a), dys.index(a), pred=ok)

        dw = gl.zeros([BOX_R, BOX_W], gl.float32, layout)
        db = gl.zeros([BOX_R, BOX_W], gl.float32, layout)
        mean_i = gl.load(Mean + group)
        rstd_i = gl.load(Rstd + group)
        # with LAG >= 2 the shares a row needs are asked for an iteration before the one that uses them
        # (an L2 round trip under the load of the copies takes longer than a slice's sums), so first
        # those of row 1 - LAG; with LAG = 1 that row is being posted then, so they are asked for at the
        # start of the iteration that uses them
        EARLY: gl.constexpr = LAG >= 2
        at_j = Shares + (group + gl.maximum(1 - LAG, 0) * groups).to(gl.int64) * (2 * SLICES)
        s1s = gl.load(at_j + k, volatile=True)
        s2s = gl.load(at_j + SLICES + k, volatile=True)
        # iteration i sums row i (its slice's shares posted) and finishes row i - LAG (its dx, dw and db)
        for i in range(mine + LAG):
            # the copy AHEAD rows on goes into the buffer row i - LAG - 1 left (every thread finished
            # reading it at the end of the previous iteration)
            ahead = i + AHEAD
            b_ahead = ahead % STAGES
            fence_async_shared()
            mbarrier.expect(bars.index(b_ahead), stage_bytes, pred=ahead < mine)
            at_ahead = (group + ahead * groups) * boxes + at
            tma.async_copy_global_to_shared(Xd, [at_ahead, 0], bars.index(b_ahead), xs.index(b_ahead),
                                            pred=ahead < mine)  # fmt: skip
            tma.async_copy_global_to_shared(DYd, [at_ahead, 0], bars.index(b_ahead), dys.index(b_ahead),
                                            pred=ahead < mine)  # fmt: skip
            # row i - LAG is finished now (its shares asked for last iteration); row i + 1 - LAG's
            # shares are asked for now
            j = i - LAG
            row_j = group + gl.maximum(j, 0) * groups
            at_j = Shares + row_j.to(gl.int64) * (2 * SLICES)
            if EARLY:  # past the last row (the drain's last iteration) a row in bounds, not read
                row_n = gl.minimum(group + gl.maximum(j + 1, 0) * groups, M - 1)
                at_n = Shares + row_n.to(gl.int64) * (2 * SLICES)
            else:
                at_n = at_j
            s1n = gl.load(at_n + k, volatile=True)
            s2n = gl.load(at_n + SLICES + k, volatile=True)
            if not EARLY:
                s1s = s1n
                s2s = s2n
            mean_j = gl.load(Mean + row_j)
            rstd_j = gl.load(Rstd + row_j)
            nxt = gl.minimum(group + (i + 1) * groups, M - 1)
            mean_n = gl.load(Mean + nxt)
            rstd_n = gl.load(Rstd + nxt)
            if i < mine:
                row_i = group + i * groups
                buf = i % STAGES
                mbarrier.wait(bars.index(buf), (i // STAGES) & 1)
                xc, _, g = _slice_g(xs.index(buf), dys.index(buf), w, mean_i, layout, HAS_WEIGHT)
                # the two sums in one reduction (one trip through shared memory for both), over the slice
                # flattened: each thread adds all its elements before the shuffles; rstd once, at the end
                s1, s2 = gl.reduce((gl.reshape(xc * g, [NS]), gl.reshape(g, [NS])), 0, _add_pairs)
                s1 = s1 * rstd_i
                at_i = Shares + row_i.to(gl.int64) * (2 * SLICES)
                gl.atomic_xchg(at_i + part, _posted(s1), sem="relaxed")
                gl.atomic_xchg(at_i + SLICES + part, _posted(s2), sem="relaxed")
            if j >= 0:
                # every share posted: the tags set (a word is written once, whole)
                while gl.min(gl.minimum(s1s, s2s), axis=0) <= 0xFFFFFFFF:
                    s1s = gl.load(at_j + k, volatile=True)
                    s2s = gl.load(at_j + SLICES + k, volatile=True)
                c1 = gl.sum(_unposted(s1s), axis=0) * inv_n  # in slice order: the same in every program
                c2 = gl.sum(_unposted(s2s), axis=0) * inv_n
                b_j = j % STAGES
                xc, dy, g = _slice_g(xs.index(b_j), dys.index(b_j), w, mean_j, layout, HAS_WEIGHT)
                xhat = xc * rstd_j
                # (g - (xhat * c1 + c2)) * rstd, as two fused multiply-adds
                dx = g * rstd_j - (xhat * (c1 * rstd_j) + c2 * rstd_j)
                gl.store(DX + row_j.to(gl.int64) * stride_dxm + cols, dx.to(DX.dtype.element_ty),
                         mask=row_j < DX_M)  # fmt: skip
                if COMPUTE_DW:
                    dw += dy * xhat
                if COMPUTE_DB:
                    db += dy
            gl.thread_barrier()  # every thread is done with row j's buffer: the next iteration refills it
            mean_i = mean_n
            rstd_i = rstd_n
            s1s = s1n
            s2s = s2n

        for b in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(b))
        if PAIRED:
            # of the pair's two programs of this slice, the one to arrive second waits for the first's dw
            # and db in the slot and adds its own: a + b is b + a, so the slot does not depend on which came
            # first (a group without a partner arrives first and is never waited for)
            slot = group // 2
            slots = (groups + 1) // 2
            arrive = Pairs + slot * SLICES + part
            ready = arrive + slots * SLICES
            arrived = gl.atomic_add(arrive, 1, sem="relaxed")
            if arrived > 0:
                while gl.atomic_add(ready, 0, sem="acquire") == 0:
                    pass
                if COMPUTE_DW:  # from L2 (.cg), where the first's stores are
                    dw += gl.load(DW_part + slot * N + cols, cache_modifier=".cg")
                if COMPUTE_DB:
                    db += gl.load(DB_part + slot * N + cols, cache_modifier=".cg")
        else:
            slot = group
        if COMPUTE_DW:
            gl.store(DW_part + slot * N + cols, dw)
        if COMPUTE_DB:
            gl.store(DB_part + slot * N + cols, db)
        if PAIRED:
            if arrived == 0:  # every thread's stores made before one thread releases the slot
                gl.thread_barrier()
                gl.atomic_xchg(ready, 1, sem="release")


def stages_that_fit(n: int, esize: int, has_weight: bool) -> int:
    """Row buffers (x and dy) that fit one program's shared memory beside the weight, at most 3."""
    row = 2 * n * esize
    return min(3, (SMEM_BYTES - (n * esize if has_weight else 0) - 1024) // row)


def _rows_for_gluon(x: torch.Tensor, dy: torch.Tensor, weight, interpreted: bool, dtypes) -> bool:
    """What both kernels need: Gluon present in the Triton of ``GLUON_TRITON``, a GPU of compute
    capability 9+, ``x`` of one of ``dtypes`` (dy and weight alike), N a power of 2, contiguous rows with
    16-byte aligned bases, row coordinates of the copy engine within 32 bits."""
    if gluon is None or interpreted or x.device.type != "cuda" or triton_version() != GLUON_TRITON:
        return False
    if x.dtype not in dtypes or dy.dtype != x.dtype:
        return False
    if weight is not None and (weight.dtype != x.dtype or not weight.is_contiguous()):
        return False
    M, N = x.shape
    if N & (N - 1) or compute_capability_major(x) < 9:
        return False
    if any(t.stride(1) != 1 or t.stride(0) != N or t.data_ptr() % 16 for t in (x, dy)):
        return False
    return M * (N // BOX_W) < 2**31


def usable(x: torch.Tensor, dy: torch.Tensor, weight, interpreted: bool) -> bool:
    """Whether the whole-row kernel can take the backward of ``x`` and ``dy`` ((M, N) views): bfloat16 or
    float16, N from 4096 to 16384, at least two row buffers in shared memory, and what
    :func:`_rows_for_gluon` asks."""
    if not _rows_for_gluon(x, dy, weight, interpreted, (torch.bfloat16, torch.float16)):
        return False
    N = x.shape[1]
    return 4096 <= N <= 16384 and stages_that_fit(N, x.element_size(), weight is not None) >= 2


def _row_box_descs(m: int, n: int, esize: int, slices: int = 1) -> dict:
    """The kernels' descriptors (``descs`` of :class:`.plan.Launch`, at x's and dy's places) over contiguous
    (M, N) rows as (M * N / BOX_W, BOX_W), one row per box, or one ``1 / slices`` of a row."""
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=esize * 8, rank=2)
    spec = ([m * n // BOX_W, BOX_W], [BOX_W, 1], [n // BOX_W // slices, BOX_W], layout)
    return {1: spec, 2: spec}


def rows_launch(m: int, n: int, esize: int, has_weight: bool, programs: int, compute_dw: bool,
                compute_db: bool, warps: int, stages: int) -> Launch:  # fmt: skip
    """The whole-row kernel's launch for ``m`` rows of ``n`` ``esize``-byte elements on ``programs``
    programs of ``warps`` warps (at most N / 512: a warp takes 8 elements of 32 columns of each half row)
    with ``stages`` row buffers (see :func:`stages_that_fit`); its arguments: :func:`rows_args`."""
    if not 1 <= programs <= m:
        raise ValueError(f"programs must be from 1 to the row count {m}, got {programs}")
    if not 1 <= warps <= n // 512 or warps & (warps - 1):
        raise ValueError(f"warps must be a power of 2 from 1 to N / 512 = {n // 512}, got {warps}")
    if not 2 <= stages <= stages_that_fit(n, esize, has_weight):
        raise ValueError(f"stages must be from 2 to what fits in shared memory, got {stages}")
    return Launch(
        _ln_bwd_rows_kernel, (programs,), _row_box_descs(m, n, esize), BOX_R=n // BOX_W, BOX_W=BOX_W,
        STAGES=stages, HAS_WEIGHT=has_weight, COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db, WARPS=warps,
        num_warps=warps,
    )  # fmt: skip


def rows_args(dx, dy, x, weight, mean, rstd, dw_part, db_part, dx_m: int) -> tuple:
    """The whole-row kernel's arguments: dx of the rows below ``dx_m``, and each program's float32 share of
    dw and db (rows p, p + programs, ...) in row p of ``dw_part`` / ``db_part`` ((programs, N);
    placeholders when not computed)."""
    M, N = x.shape
    w = weight if weight is not None else x
    return dx, x, dy, w, mean, rstd, dw_part, db_part, dx.stride(0), M, dx_m, 1.0 / N


def launch(dx, dy, x, weight, mean, rstd, dw_part, db_part, programs: int, dx_m: int, compute_dw: bool,
           compute_db: bool, warps: int, stages: int) -> None:  # fmt: skip
    """The whole-row kernel (:func:`rows_launch`, :func:`rows_args`); see :func:`usable`."""
    M, N = x.shape
    run = rows_launch(M, N, x.element_size(), weight is not None, programs, compute_dw, compute_db, warps,
                      stages)  # fmt: skip
    run(*rows_args(dx, dy, x, weight, mean, rstd, dw_part, db_part, dx_m))


def group_stages_that_fit(n: int, esize: int, slices: int) -> int:
    """Row-slice buffers (x and dy) that fit one program of the grouped kernel's shared memory."""
    return (SMEM_BYTES - 1024) // (2 * n // slices * esize)


def groups_usable(x: torch.Tensor, dy: torch.Tensor, weight, interpreted: bool, slices: int) -> bool:
    """Whether the grouped kernel can take the backward of ``x`` and ``dy`` ((M, N) views) with rows in
    ``slices`` slices: bfloat16, float16 or float32, slices a power of 2 of at least ``BOX_W`` columns,
    and what :func:`_rows_for_gluon` asks."""
    dtypes = (torch.bfloat16, torch.float16, torch.float32)
    if slices < 2 or slices & (slices - 1) or not _rows_for_gluon(x, dy, weight, interpreted, dtypes):
        return False
    return x.shape[1] // slices >= BOX_W


def groups_launch_unfit(n: int, esize: int, slices: int, warps: int, stages: int, lag: int) -> str | None:
    """Why the grouped kernel cannot run rows of ``n`` ``esize``-byte elements in ``slices`` slices on
    ``warps`` warps with ``stages`` buffers of which ``lag`` wait for shares (None if it can): warps at most
    one per box row of a slice, buffers for the waiting rows and at least one loading, no more than fit."""
    box_r = n // slices // BOX_W
    if not 1 <= warps <= box_r or warps & (warps - 1):
        return f"warps must be a power of 2 from 1 to N / slices / {BOX_W} = {box_r}, got {warps}"
    if not 1 <= lag or not lag + 2 <= stages <= group_stages_that_fit(n, esize, slices):
        return (f"lag must be at least 1 and stages from lag + 2 to what fits in shared memory, "
                f"got lag {lag}, stages {stages}")  # fmt: skip
    return None


def partial_slots(groups: int, paired: bool) -> int:
    """Rows of dw (and db) partials the grouped kernel of ``groups`` groups writes: one a group, or one a
    pair of groups (``paired``)."""
    return (groups + 1) // 2 if paired else groups


def groups_launch(m: int, n: int, esize: int, has_weight: bool, groups: int, compute_dw: bool,
                  compute_db: bool, slices: int, warps: int, stages: int, lag: int, paired: bool = False,
                  pdl: bool = False) -> Launch:  # fmt: skip
    """The grouped kernel's launch (see the module docstring) for ``m`` rows of ``n`` ``esize``-byte
    elements: ``groups`` groups of ``slices`` programs, a row of dw and db partials a group, or with
    ``paired`` a row a pair of groups (2k and 2k + 1 into row k, added by the program of the two that ends
    second, which waits for the first's); ``stages`` row-slice buffers of which ``lag`` hold rows waiting
    for the group's shares, on ``warps`` warps (at most one per box row of a slice); ``pdl``: launched as
    a programmatic dependent launch, the kernel waiting for the one before it in the stream before its
    first access (``crossfuse.ops._runtime.pdl``). Its arguments: :func:`groups_args`."""
    if not 1 <= groups <= m:
        raise ValueError(f"groups must be from 1 to the row count {m}, got {groups}")
    unfit = groups_launch_unfit(n, esize, slices, warps, stages, lag)
    if unfit:
        raise ValueError(unfit)
    return Launch(
        _ln_bwd_groups_kernel, (groups * slices,), _row_box_descs(m, n, esize, slices), SLICES=slices,
        BOX_R=n // slices // BOX_W, BOX_W=BOX_W, STAGES=stages, LAG=lag, VEC=16 // esize,
        HAS_WEIGHT=has_weight, COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db, PAIRED=paired, WARPS=warps,
        GDC=pdl, num_warps=warps,
        **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip


def groups_args(dx, dy, x, weight, mean, rstd, shares, tickets, pairs, dw_part, db_part, dx_m: int,
                slices: int, paired: bool) -> tuple:  # fmt: skip
    """The grouped kernel's arguments: the float32 shares of dw and db in ``dw_part`` / ``db_part``
    ((slots, N), :func:`partial_slots`; placeholders when not computed); ``pairs``, (2, slots, slices)
    int32 zero at launch, holds the pairs' arrivals and flags (a placeholder when not ``paired``);
    ``shares`` ((M, 2, slices) int64) and ``tickets`` ((1,) int32) zero at launch."""
    M, N = x.shape
    w = weight if weight is not None else x
    return (dx, x, dy, w, mean, rstd, shares, tickets, pairs if paired else tickets, dw_part, db_part,
            dx.stride(0), M, dx_m, 1.0 / N)  # fmt: skip


def launch_groups(dx, dy, x, weight, mean, rstd, shares, tickets, pairs, dw_part, db_part, groups: int,
                  dx_m: int, compute_dw: bool, compute_db: bool, slices: int, warps: int, stages: int,
                  lag: int, paired: bool = False, pdl: bool = False) -> None:  # fmt: skip
    """The grouped kernel (:func:`groups_launch`, :func:`groups_args`); see :func:`groups_usable`."""
    M, N = x.shape
    run = groups_launch(M, N, x.element_size(), weight is not None, groups, compute_dw, compute_db, slices,
                        warps, stages, lag, paired, pdl)  # fmt: skip
    if shares.dtype != torch.int64 or shares.numel() < M * 2 * slices or tickets.dtype != torch.int32:
        raise ValueError("shares must hold (M, 2, slices) int64 and tickets an int32")
    if paired and (pairs.dtype != torch.int32 or pairs.numel() < 2 * partial_slots(groups, True) * slices):
        raise ValueError("pairs must hold (2, slots, slices) int32")
    run(*groups_args(dx, dy, x, weight, mean, rstd, shares, tickets, pairs, dw_part, db_part, dx_m, slices,
                     paired))  # fmt: skip


__all__ = [
    "group_stages_that_fit",
    "groups_args",
    "groups_launch",
    "groups_launch_unfit",
    "groups_usable",
    "launch",
    "launch_groups",
    "partial_slots",
    "rows_args",
    "rows_launch",
    "stages_that_fit",
    "usable",
]
