"""The float32 attention forward in Gluon, with both products' left operands in registers (attention v26).

Compiled for sm_90 (Triton 3.6), Triton's float32 forward (``_relu_attn_fwd_kernel``) multiplies with
both operands of both products in shared memory: Triton keeps a product's left operand in registers for
16-bit types only, so ``p`` is stored to shared memory every step and read back, and ``q`` is read again
by every ``q @ k^T``. Per step of 64 x 64 x 64 that is 64 KB read and 16 KB written besides the 32 KB the
copies of k and v write: 9.4 FLOP per byte of shared memory, 59% of tf32's rate at 128 bytes a clock, and
the kernel runs at 58% of it (bench/results/h200/NOTES.md, attention v26). Here ``q`` is loaded into
registers once, in the layout of a product's left operand, and ``p`` is moved there from the scores'
layout by shuffles; both products read only their right operand (k, then v's copy with unit stride on L)
from shared memory: 32 KB read a step.

One warp group per 64 query rows (``num_warps`` 4 or 8); k and v's copy stream through ``STAGES``
shared-memory buffers filled by the copy engine (an mbarrier each); each step's products are synchronous
(the warp groups of other programs on the SM fill the tensor cores meanwhile), or with ASYNC (attention
v30) in flight: block j+1's scores are issued before block j's relu and ``p @ v``, which runs on while
block j+1's relu is taken (k and v then have rings of their own). With TRANS (attention v31) the kernel
reads v itself, not a copy: each step's v tile is read from shared memory into registers, 4 keys of one
column a thread, and stored transposed (16-byte vectors along the keys) into one of two buffers that the
``p @ v`` product reads, while the step's scores run; the 128-row tiles' two buffers are q's, which is in
registers by then. That costs a step 32 KB of shared-memory traffic besides the products' 96 and saves the
launch of v's copy, a pass over v: faster but at long non-causal sequences (v33, run 307). Rows of q, k
(and v), and of the output, are addressed through 2-D views: ``(rb, rh, ch)`` place row l of head (b, h)
at row ``b*rb + h*rh + l``, column ``h*ch`` of the view (heads in rows for [B, H, L, D] layouts, in
columns for [B, L, H, D]); v's copy is [B, H, D, L]. Sequence lengths must be multiples of both tiles (see
:func:`usable`): there are no masks for tails.

The backward (attention v27) is two kernels of the same kind. The dK/dV kernel holds a block of k and v in
registers and streams q, dout and their copies with unit stride on L: ``s^T = k q^T`` and ``dp^T = v
dout^T``, then ``dv += p^T dout`` and ``dk += ds^T q`` with p^T and ds^T moved into the left operand's
layout by shuffles; the dQ kernel holds q and dout and streams k, v and k's copy: ``s = q k^T``, ``dp =
dout v^T``, ``dq += ds k``. With TRANS (attention v32) a kernel reads no copy: it transposes its tiles of
q and dout (dK/dV) or of k (dQ) into buffers of its own as the forward does v's, while the scores run;
the dK/dV kernel then has two tiles to transpose a step on 4 warps, which only the causal rows up to
L=2048 repay. With ASYNC each product is issued asynchronously and the elementwise work before the next one
runs while it does (``warpgroup_mma_wait``): 1.02-1.06x the synchronous form (run 291).
Triton's float32 backward kernels, which keep every tf32 product's left operand in shared memory (as its
forward, above), write p^T, ds^T and ds there each step and read them back.

A product's accumulator becomes the next product's left operand without moving (attention v34): a thread
holds columns 2t, 2t + 1 of each 8 of an accumulator and columns t, t + 4 of a tf32 left operand, so the
columns are relabelled by a fixed permutation sigma of each 8 (:func:`_left`) instead of exchanged between
the lanes of a quad (32 shuffles and 64 selects a thread a step at 128 x 64: a third of the forward loop's
instructions), and the right operand takes its rows in sigma's order: the copies are made so
(``_l_contiguous`` with ``sigma``) and :func:`_transpose` stores so. 1.10-1.19x the forward and 1.04-1.18x
the backward before it (run 311). The forward applies a positive ``scale`` with ``relu_scale``, to the
output (relu(s * scale) = scale * relu(s); squared, scale^2: attention v35), which takes the multiply off
each score: 1.015-1.025x (run 315).

Attention v36, compiled for sm_90 but not yet run on a GPU (no entry of the tables takes it, and the
backward's fold is off): the backward kernels fold the scale as the forward does (``FOLD_BWD``: 32
multiplies a thread a step off each kernel at the full rows' tiles, 32 x 64 dK/dV and 64 x 64 dQ, by the
PTX), and the dQ kernel, transposing k's tiles itself, can run first and write the copies of q and dout
that the dK/dV kernel reads (``WRITE``, a sixth field of its tiles: :func:`_write_transposed`) in place
of the copy kernel's pass over them. Attention v37, the same (``SPLIT_BARS``, off): a barrier array per
tensor of each ring, so that a step's loads need no CTA barriers between them (:func:`_refill`): 3 a step
in every kernel but the forward with ASYNC (whose k and v have rings of their own), where there were 4
to 6.

Every kernel's blocks start in the order of :func:`head_group` (attention v30): where causal, the heaviest
blocks of a group of heads first, not of one head after another's. A kernel launched after a copy (the
forward after v's, where not TRANS; the dK/dV kernel after those of q, dout and k) issues its loads of the
tensors the copy does not write before it waits for the copy.
"""

from __future__ import annotations

import functools
import math

import torch
import triton.language as tl

from ._runtime.device import bind_cuda_context, compute_capability_major
from ._runtime.versions import GLUON_TRITON, triton_version

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # Triton without Gluon's Hopper modules
    gluon = None

if gluon is not None:

    @gluon.jit
    def _block_order(GROUP):
        """``(i, pid_bh, blocks)`` of this program of a grid (blocks * GROUP, B*H / GROUP): its block's place
        in the launch order, its (batch, head) pair and the number of blocks per head. The heads go in groups
        of GROUP, and within a group the i-th blocks of all its heads start before the (i+1)-th (GROUP = 1:
        one head's blocks after the other's; GROUP = B*H: the i-th blocks of all heads first)."""
        t = gl.program_id(0)
        return t // GROUP, gl.program_id(1) * GROUP + t % GROUP, gl.num_programs(0) // GROUP

    @gluon.jit
    def _query_block(H, Lk, GROUP, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
        """``(pid_bh, b, h, start_m, steps)`` of a program over one query block (the heaviest causal blocks
        first, in groups of GROUP heads: :func:`_block_order`): its (batch, head) pair, first query row, and
        how many key blocks it reads (up to the diagonal's where CAUSAL)."""
        i, pid_bh, blocks = _block_order(GROUP)
        pid_m = blocks - 1 - i
        start_m = pid_m * BLOCK_M
        if CAUSAL:
            steps = gl.minimum(start_m + BLOCK_M, Lk) // BLOCK_N
        else:
            steps = Lk // BLOCK_N
        return pid_bh, pid_bh // H, pid_bh % H, start_m, steps

    @gluon.jit
    def _head_at(b, h, rb, rh, ch):
        """``(row, column)`` where head (b, h) starts in a 2-D row view (:func:`rows_view`'s rb, rh, ch)."""
        return b * rb + h * rh, h * ch

    @gluon.jit
    def _barriers(N: gl.constexpr):
        """N mbarriers in shared memory ([N, 1]), each expecting one arrival (:func:`_release` ends them)."""
        bars = gl.allocate_shared_memory(gl.int64, [N, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(N):
            mbarrier.init(bars.index(s), count=1)
        return bars

    @gluon.jit
    def _release(bars, N: gl.constexpr):
        for s in gl.static_range(N):
            mbarrier.invalidate(bars.index(s))

    @gluon.jit
    def _griddep(WAIT: gl.constexpr):
        """``griddepcontrol.wait`` where WAIT, else ``griddepcontrol.launch_dependents`` (see
        crossfuse.ops._runtime.pdl)."""
        if WAIT:
            gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)  # fmt: skip
        else:
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [],
                                      dtype=gl.int32, is_pure=False, pack=1)  # fmt: skip

    @gluon.jit
    def _ring_barriers(N: gl.constexpr, STAGES: gl.constexpr, SPLIT: gl.constexpr):
        """The mbarriers of a ring of N tensors' STAGES buffers, as a tuple: one array of STAGES, under which
        a slot's tiles of all N tensors land; where SPLIT (attention v37) an array per tensor (N = 2, 3 or
        4), so that the copy engine's loads of a slot, under distinct barriers, need no CTA barrier between
        them (see :func:`_refill`)."""
        if SPLIT:
            if N == 2:
                bars = (_barriers(STAGES), _barriers(STAGES))
            elif N == 3:
                bars = (_barriers(STAGES), _barriers(STAGES), _barriers(STAGES))
            else:
                gl.static_assert(N == 4, "a ring of 2, 3 or 4 tensors")
                bars = (_barriers(STAGES), _barriers(STAGES), _barriers(STAGES), _barriers(STAGES))
        else:
            bars = (_barriers(STAGES),)
        return bars

    @gluon.jit
    def _ring_release(bars, STAGES: gl.constexpr):
        for i in gl.static_range(len(bars)):
            _release(bars[i], STAGES)

    @gluon.jit
    def _ring_wait(bars, slot, phase):
        """Wait for slot ``slot``'s tiles (``phase``: the parity of its fills so far) under every barrier of
        the ring (:func:`_ring_barriers`), the last array's first: in the order of allocation Triton 3.6's
        barrier analysis put a CTA barrier before the wait on the last one, and another before its expect
        (offline sm_90 compile; the reason not found)."""
        for i in gl.static_range(len(bars)):
            mbarrier.wait(bars[len(bars) - 1 - i].index(slot), phase)

    @gluon.jit
    def _fill_rest(descs, bars, bufs, slot, at_rows, at_cols, ok, FIRST: gl.constexpr):
        """Buffer ``slot`` of the ring's tensors from the FIRST-th on takes its tile (``descs[i]`` at
        ``[at_rows[i], at_cols[i]]``); nothing where not ``ok``. With one barrier array (``bars``: see
        :func:`_ring_barriers`), under ``bars[0][slot]``, whose bytes :func:`_fill_first` expected; with
        one per tensor, each tile's barrier expects its bytes here."""
        for i in gl.static_range(FIRST, len(descs)):
            if len(bars) > 1:
                mbarrier.expect(bars[i].index(slot), descs[i].block_type.nbytes, pred=ok)
                tma.async_copy_global_to_shared(descs[i], [at_rows[i], at_cols[i]], bars[i].index(slot),
                                                bufs[i].index(slot), pred=ok)  # fmt: skip
            else:
                tma.async_copy_global_to_shared(descs[i], [at_rows[i], at_cols[i]], bars[0].index(slot),
                                                bufs[i].index(slot), pred=ok)  # fmt: skip

    @gluon.jit
    def _fill_first(descs, bars, bufs, slot, at_rows, at_cols, ok, FIRST: gl.constexpr):
        """The tiles of the ring's first FIRST tensors (boxes of one size) come now (:func:`_fill_rest`),
        the others' by a call of ``_fill_rest`` later (a dependent launch issues its loads of the earlier
        kernel's results after it waits for that); with one barrier array, ``bars[0][slot]`` expects them
        all now."""
        if len(bars) == 1:
            nbytes: gl.constexpr = descs[0].block_type.nbytes * len(descs)
            mbarrier.expect(bars[0].index(slot), nbytes, pred=ok)
        _fill_rest(descs[:FIRST], bars, bufs, slot, at_rows, at_cols, ok, 0)

    @gluon.jit
    def _fill(descs, bars, bufs, slot, at_rows, at_cols, ok):
        """Buffer ``slot`` of each of the ring's tensors (boxes of one size) takes its tile (``descs[i]`` at
        ``[at_rows[i], at_cols[i]]``); nothing where not ``ok``."""
        _fill_first(descs, bars, bufs, slot, at_rows, at_cols, ok, len(descs))

    @gluon.jit
    def _refill(descs, bars, bufs, slot, at_rows, at_cols, ok):
        """Once every warp is done with buffer ``slot`` (a CTA barrier here), its tiles of the ring's
        tensors are refilled (:func:`_fill`). Triton 3.6's barrier analysis puts a CTA barrier between
        two accesses of one allocation (an expect and a copy under one barrier, two copies under one
        barrier): with one array, one before every copy. With a barrier array per tensor (attention v37)
        the barriers expect their bytes before this CTA barrier and the copies, each under its own, follow
        it with none between them. Offline sm_90 compile, CTA barriers a step: the dK/dV kernel reading
        copies 6 -> 3 (with TRANS 5 -> 3), the dQ kernel 5 -> 3, the forward 4 -> 3 (:func:`_ring_wait`'s
        order included)."""
        if len(bars) > 1:
            for i in gl.static_range(len(descs)):
                mbarrier.expect(bars[i].index(slot), descs[i].block_type.nbytes, pred=ok)
            gl.thread_barrier()
            for i in gl.static_range(len(descs)):
                tma.async_copy_global_to_shared(descs[i], [at_rows[i], at_cols[i]], bars[i].index(slot),
                                                bufs[i].index(slot), pred=ok)  # fmt: skip
        else:
            gl.thread_barrier()
            _fill(descs, bars, bufs, slot, at_rows, at_cols, ok)

    @gluon.jit
    def _v_at(v_row, v_col, at, TRANS: gl.constexpr):
        """Where v's tile of the keys from ``at`` on starts: rows of v's row view where TRANS (v itself), else
        columns of its copy ([B*H*D, L], the head's rows from ``v_row``)."""
        if TRANS:
            return v_row + at, v_col
        else:
            return v_row, v_col + at

    @gluon.constexpr_function
    def _xt_layout(COLS):
        """The shared layout of a transposed tile with ``COLS`` float32 columns: the copy engine's default
        for such tiles (rows of at least 128 bytes: the 128-byte swizzle)."""
        assert COLS * 4 >= 128, "a transposed tile needs rows of at least 128 bytes"
        return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)

    @gluon.jit
    def _sigma(x, DIM: gl.constexpr):
        """``x`` with its indices along DIM (0 or 1 of a 2-D tensor) permuted by sigma within each group of 8:
        index ``8g + 4b2 + 2b1 + b0`` moves to ``8g + 4b0 + 2b2 + b1`` (attention v34). A relabelling: no
        data moves where the layout allows (see :func:`_left`)."""
        R: gl.constexpr = x.shape[0]
        C: gl.constexpr = x.shape[1]
        if DIM == 0:
            y = gl.permute(gl.reshape(x, [R // 8, 2, 2, 2, C]), [0, 3, 1, 2, 4])
        else:
            y = gl.permute(gl.reshape(x, [R, C // 8, 2, 2, 2]), [0, 1, 4, 2, 3])
        return gl.reshape(y, [R, C])

    @gluon.jit
    def _left(x, layout: gl.constexpr, PERM: gl.constexpr):
        """The accumulator ``x`` of a tf32 product as the left operand (``layout``) of the next. A thread
        holds columns 2t, 2t + 1 of each 8 of an accumulator (t = lane % 4) and columns t, t + 4 of a left
        operand: where PERM the columns are relabelled by :func:`_sigma` instead (no data moves, checked at
        compile time), and the right operand's rows must be in sigma's order too (:func:`_transpose`, or a
        copy in that order); else the columns move between the lanes of each quad (32 shuffles and 64
        selects a thread for a 128 x 64 tile on 8 warps)."""
        if PERM:
            return gl.convert_layout(_sigma(x, 1), layout, assert_trivial=True)
        else:
            return gl.convert_layout(x, layout)

    @gluon.constexpr_function
    def _rows_by_sigma(ROWS, COLS, WARPS):
        """The register layout in which :func:`_transpose` reads a [ROWS, COLS] tile: the layout of its
        stores with the roles of the rows' bits 1, 2 and 4 taken by 2, 4 and 1, so that sigma
        (:func:`_sigma`) of the tile is in the stores' layout, each thread's 4 registers then holding 4
        consecutive rows."""
        assert ROWS % 8 == 0 and COLS % 16 == 0, "a tile of rows in 8s and columns in 16s"
        rows_warps = min(WARPS, ROWS // 8)  # warps beyond the tile's rows hold copies (as the blocked layout)
        regs = [[2, 0], [4, 0]]
        regs += [[0, 16 << i] for i in range((COLS // 16).bit_length() - 1)]
        regs += [[8 * rows_warps << i, 0] for i in range((ROWS // (8 * rows_warps)).bit_length() - 1)]
        lanes = [[0, 1], [0, 2], [0, 4], [0, 8], [1, 0]]
        warps = [[8 << i, 0] for i in range(rows_warps.bit_length() - 1)]
        warps += [[0, 0]] * ((WARPS // rows_warps).bit_length() - 1)
        return gl.DistributedLinearLayout(reg_bases=regs, lane_bases=lanes, warp_bases=warps, block_bases=[],
                                          shape=[ROWS, COLS])  # fmt: skip

    @gluon.jit
    def _transpose(buf, xt_buf, WARPS: gl.constexpr):
        """The tile [ROWS, HEAD_D] in ``buf`` (v's, or q's, dout's or k's in the backward) stored transposed
        into ``xt_buf`` (attention v31): each thread takes 4 consecutive rows of one column and stores them
        as one 16-byte vector along the rows of xt. Consecutive lanes take consecutive columns (v33): the 8
        lanes of each quarter of a warp's store write 8 rows of xt, which the 128-byte swizzle puts in
        distinct banks (with the rows of a column on consecutive lanes, v31, two lanes shared each bank),
        and Triton 3.6 reads the tile with ``ldmatrix`` (16 scalar loads a thread before). xt's columns are
        in sigma's order (attention v34: :func:`_sigma`; the product's left operand from :func:`_left` with
        PERM): the tile is read in the layout whose sigma is the store's. The caller fences
        (``fence_async_shared``) and waits for every warp before a product reads xt."""
        layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[4, 1], threads_per_warp=[2, 16],
                                                warps_per_cta=[WARPS, 1], order=[1, 0])  # fmt: skip
        ROWS: gl.constexpr = buf.shape[0]
        COLS: gl.constexpr = buf.shape[1]
        tile = buf.load(_rows_by_sigma(ROWS, COLS, WARPS))
        tile = gl.convert_layout(_sigma(tile, 0), layout, assert_trivial=True)
        xt_buf.store(gl.permute(tile, [1, 0]))

    @gluon.jit
    def _probs(sc, j, offs_m, scale, s_layout: gl.constexpr, BLOCK_N: gl.constexpr, SQUARED: gl.constexpr,
               MASKED: gl.constexpr):  # fmt: skip
        """p of key block j from its scores ``sc``: relu (squared where SQUARED) of the scaled scores, the
        keys after each query (rows ``offs_m``) zeroed where MASKED."""
        a = gl.maximum(sc * scale, 0.0, propagate_nan=tl.PropagateNan.ALL)
        if SQUARED:
            p = a * a
        else:
            p = a
        if MASKED:
            offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            p = gl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
        return p

    @gluon.jit
    def _step(acc, q, zero, j, ring, offs_m, scale, s_layout: gl.constexpr, p_layout: gl.constexpr,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr, SQUARED: gl.constexpr, MASKED: gl.constexpr,
              TRANS: gl.constexpr, PERM: gl.constexpr):  # fmt: skip
        """Key block j: its scores, p (keys after the query masked where MASKED), ``acc += p @ v``; then its
        buffers take key block j + STAGES. Where TRANS, v's tile is stored transposed into ``xt`` (one of two
        buffers, by j's parity) while the scores run, and the buffers are refilled before the relu. (A mask
        chosen per block by a run-time ``if`` came out wrong from Triton 3.6 on the GPU, run 287: the
        diagonal blocks have a loop of their own instead.)"""
        descs, bars, bufs, k_row, k_col, v_row, v_col, steps, xt = ring
        slot = j % STAGES
        nxt = (j + STAGES) * BLOCK_N
        v_at = _v_at(v_row, v_col, nxt, TRANS)
        _ring_wait(bars, slot, (j // STAGES) & 1)
        if TRANS:
            sc = warpgroup_mma(q, bufs[0].index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
            _transpose(bufs[1].index(slot), xt.index(j % 2), gl.num_warps())
            sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc,))
            fence_async_shared()
            # every warp has read buffer slot (k by its product, v into registers) and stored its part of
            # xt (whose buffer block j - 2's product read last: every warp was done with it before block
            # j - 1's barrier)
            _refill(descs, bars, bufs, slot, (k_row + nxt, v_at[0]), (k_col, v_at[1]), j + STAGES < steps)
            p = _probs(sc, j, offs_m, scale, s_layout, BLOCK_N, SQUARED, MASKED)
            acc = warpgroup_mma(_left(p, p_layout, True), xt.index(j % 2).permute((1, 0)), acc)
        else:
            sc = warpgroup_mma(q, bufs[0].index(slot).permute((1, 0)), zero, use_acc=False)
            p = _probs(sc, j, offs_m, scale, s_layout, BLOCK_N, SQUARED, MASKED)
            acc = warpgroup_mma(_left(p, p_layout, PERM), bufs[1].index(slot).permute((1, 0)), acc)
            # every warp's products have read buffer slot: it takes key block j + STAGES
            _refill(descs, bars, bufs, slot, (k_row + nxt, v_at[0]), (k_col, v_at[1]), j + STAGES < steps)
        return acc

    @gluon.jit
    def _step_async(acc, sc, p_prev, q, zero, j, ring, offs_m, scale, s_layout: gl.constexpr,
                    p_layout: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                    SQUARED: gl.constexpr, MASKED: gl.constexpr, NEXT: gl.constexpr,
                    TRANS: gl.constexpr, PERM: gl.constexpr):  # fmt: skip
        """Key block j with the products in flight (attention v30): ``sc`` holds its scores on entry; where
        NEXT, block j + 1's scores are issued first and taken while the relu of these and the product
        ``acc += p @ v`` of this block run. On entry ``acc += p_prev @ v`` of block j - 1 may be in flight;
        once it is done, k's buffer of block j and v's of block j - 1 take the blocks STAGES later (k and v
        have rings of their own). Where TRANS, v's tile of block j is stored transposed into ``xt`` (one of
        two buffers, by j's parity) while block j + 1's scores run, and v's buffer of block j is the one
        refilled. Returns ``(acc, scores of block j + 1, p)`` with this block's product in flight."""
        k_bars, v_bars, k_s, v_s, k_desc, v_desc, k_row, k_col, v_row, v_col, steps, xt = ring
        if NEXT:
            n = j + 1
            mbarrier.wait(k_bars.index(n % STAGES), (n // STAGES) & 1)
            sn = warpgroup_mma(q, k_s.index(n % STAGES).permute((1, 0)), zero, use_acc=False, is_async=True)
        else:
            sn = sc
        if TRANS:  # xt's buffer was last read by block j - 2's product, done before block j - 1's barrier
            mbarrier.wait(v_bars.index(j % STAGES), (j // STAGES) & 1)
            _transpose(v_s.index(j % STAGES), xt.index(j % 2), gl.num_warps())
        # block j - 1's product done (block j + 1's scores may run on) before p is computed: the tensor
        # cores read that product's left operand from registers until then, and p's registers may be
        # those (the deps name the loop's copies of p_prev, not the registers the product reads). With a
        # relabelled p (PERM, attention v34) the relu's results are p itself, and computing them before
        # this wait overwrote the operand in flight (run 311: wrong outputs at L >= 1024); sc passes
        # through the wait so that the relu comes after it
        if NEXT:
            acc, p_prev, sc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, p_prev, sc))
        else:
            acc, p_prev, sc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_prev, sc))
        p = _probs(sc, j, offs_m, scale, s_layout, BLOCK_N, SQUARED, MASKED)
        if TRANS:
            fence_async_shared()
        gl.thread_barrier()  # every warp group's products have read k's buffer of block j, v's of block j - 1
        nxt = j + STAGES
        _fill((k_desc,), (k_bars,), (k_s,), j % STAGES, (k_row + nxt * BLOCK_N,), (k_col,), nxt < steps)
        if TRANS:  # v's tile of block j is in xt: its buffer takes block j + STAGES
            v_at = _v_at(v_row, v_col, nxt * BLOCK_N, TRANS)
            _fill((v_desc,), (v_bars,), (v_s,), j % STAGES, (v_at[0],), (v_at[1],), nxt < steps)
            p = _left(p, p_layout, True)
            b_op = xt.index(j % 2)
        else:
            v_at = _v_at(v_row, v_col, (nxt - 1) * BLOCK_N, TRANS)
            _fill((v_desc,), (v_bars,), (v_s,), (j + STAGES - 1) % STAGES, (v_at[0],), (v_at[1],),
                  (j > 0) & (nxt - 1 < steps))  # fmt: skip
            p = _left(p, p_layout, PERM)
            mbarrier.wait(v_bars.index(j % STAGES), (j // STAGES) & 1)
            b_op = v_s.index(j % STAGES)
        acc = warpgroup_mma(p, b_op.permute((1, 0)), acc, is_async=True)
        if NEXT:  # block j + 1's scores done; this block's product runs on
            sn, p = warpgroup_mma_wait(num_outstanding=1, deps=(sn, p))
        return acc, sn, p

    @gluon.jit
    def _xt_buffers(q_s, HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    TRANS: gl.constexpr):  # fmt: skip
        """The two buffers [2, HEAD_D, BLOCK_N] that take v's tiles transposed where TRANS (q's buffer, once
        every warp has q in registers, where it holds both; otherwise buffers of their own); q's buffer
        where not TRANS (unused)."""
        if TRANS:
            XT_LAYOUT: gl.constexpr = _xt_layout(BLOCK_N)
            if BLOCK_M >= 2 * BLOCK_N:
                gl.thread_barrier()  # every warp has loaded q from q_s
                xt = q_s._reinterpret(gl.float32, [2, HEAD_D, BLOCK_N], XT_LAYOUT)
            else:
                xt = gl.allocate_shared_memory(gl.float32, [2, HEAD_D, BLOCK_N], XT_LAYOUT)
        else:
            xt = q_s
        return xt

    @gluon.jit
    def _attn_fwd_tf32_kernel(
        Qd, Kd, Vd,  # 2-D descriptors: q, k (boxes [BLOCK, HEAD_D]) and v: its row view (boxes [BLOCK_N,
        # HEAD_D]) where TRANS, else its copy [B*H*HEAD_D, L] (boxes [HEAD_D, BLOCK_N])
        O,  # out, (B, H, L, HEAD_D) through strides
        stride_ob, stride_oh, stride_ol,
        H, Lk, GROUP,  # GROUP: heads per group of the launch order (_block_order)
        q_rb, q_rh, q_ch, k_rb, k_rh, k_ch, v_rb, v_rh, v_ch,  # where head (b, h) sits in the 2-D views
        scale, relu_scale,
        HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
        CAUSAL: gl.constexpr, SQUARED: gl.constexpr,
        WAIT: gl.constexpr,  # a dependent launch after v's copy: wait for it first (ops._runtime.pdl)
        ASYNC: gl.constexpr,  # each block's scores issued before the relu and product of the one before
        TRANS: gl.constexpr,  # v read as it is and transposed in shared memory (attention v31): no copy
        PERM: gl.constexpr,  # p @ v's keys in sigma's order in v's copy (attention v34; TRANS: always)
        FOLD: gl.constexpr,  # scale > 0 folded into relu_scale by the launcher (attention v35): the scores
        # are not scaled (relu(s * scale) = scale * relu(s))
        SPLIT: gl.constexpr,  # a barrier array per tensor of the ring (attention v37: _ring_barriers); not
        # with ASYNC, whose k and v have rings of their own
    ):  # fmt: skip
        WARPS: gl.constexpr = gl.num_warps()
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                           instr_shape=[16, BLOCK_N, 8])  # fmt: skip
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                           instr_shape=[16, HEAD_D, 8])  # fmt: skip
        q_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=1)
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=1)

        if FOLD:  # a product by 1.0, which the compiler drops
            scale = 1.0
        pid_bh, b, h, start_m, steps = _query_block(H, Lk, GROUP, BLOCK_M, BLOCK_N, CAUSAL)
        k_row, k_col = _head_at(b, h, k_rb, k_rh, k_ch)
        q_row, q_col = _head_at(b, h, q_rb, q_rh, q_ch)
        q_s = gl.allocate_shared_memory(Qd.dtype, [BLOCK_M, HEAD_D], Qd.layout)
        k_s = gl.allocate_shared_memory(Kd.dtype, [STAGES, BLOCK_N, HEAD_D], Kd.layout)
        if TRANS:
            v_row, v_col = _head_at(b, h, v_rb, v_rh, v_ch)
            v_s = gl.allocate_shared_memory(Vd.dtype, [STAGES, BLOCK_N, HEAD_D], Vd.layout)
        else:
            v_row = pid_bh * HEAD_D
            v_col = 0
            v_s = gl.allocate_shared_memory(Vd.dtype, [STAGES, HEAD_D, BLOCK_N], Vd.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        gl.static_assert(not (SPLIT and ASYNC), "SPLIT is for the forward without ASYNC")
        bars = _ring_barriers(2, STAGES, SPLIT)
        mbarrier.expect(q_bar, Qd.block_type.nbytes)
        tma.async_copy_global_to_shared(Qd, [q_row + start_m, q_col], q_bar, q_s)
        offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)
        zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        if ASYNC:  # k's ring under ``bars``, v's under barriers of its own
            k_bars = bars[0]
            v_bars = _barriers(STAGES)
            for s in gl.static_range(STAGES):  # the first key blocks' tiles
                _fill((Kd,), (k_bars,), (k_s,), s, (k_row + s * BLOCK_N,), (k_col,), s < steps)
            if TRANS:  # v itself: nothing to wait for
                for s in gl.static_range(STAGES):
                    v_at = _v_at(v_row, v_col, s * BLOCK_N, TRANS)
                    _fill((Vd,), (v_bars,), (v_s,), s, (v_at[0],), (v_at[1],), s < steps)
            mbarrier.wait(q_bar, 0)
            q = q_s.load(q_layout)
            xt = _xt_buffers(q_s, HEAD_D, BLOCK_M, BLOCK_N, TRANS)
            mbarrier.wait(k_bars.index(0), 0)
            sc = warpgroup_mma(q, k_s.index(0).permute((1, 0)), zero, use_acc=False, is_async=True)
            if not TRANS:
                if WAIT:  # v's copy: written by the kernel before
                    _griddep(True)
                for s in gl.static_range(STAGES):
                    v_at = _v_at(v_row, v_col, s * BLOCK_N, TRANS)
                    _fill((Vd,), (v_bars,), (v_s,), s, (v_at[0],), (v_at[1],), s < steps)
            sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc,))
            p = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, p_layout)
            acc = warpgroup_mma_init(acc)  # the loop carries it in flight
            ring = (k_bars, v_bars, k_s, v_s, Kd, Vd, k_row, k_col, v_row, v_col, steps, xt)
            if CAUSAL:  # as below, the last block alone (no next block's scores)
                n_full = start_m // BLOCK_N
                for j in range(n_full):
                    acc, sc, p = _step_async(acc, sc, p, q, zero, j, ring, offs_m, scale, s_layout, p_layout,
                                             BLOCK_N, STAGES, SQUARED, False, True, TRANS, PERM)  # fmt: skip
                for j in range(n_full, steps - 1):
                    acc, sc, p = _step_async(acc, sc, p, q, zero, j, ring, offs_m, scale, s_layout, p_layout,
                                             BLOCK_N, STAGES, SQUARED, True, True, TRANS, PERM)  # fmt: skip
                acc, sc, p = _step_async(acc, sc, p, q, zero, steps - 1, ring, offs_m, scale, s_layout,
                                         p_layout, BLOCK_N, STAGES, SQUARED, True, False, TRANS,
                                         PERM)  # fmt: skip
            else:
                for j in range(steps - 1):
                    acc, sc, p = _step_async(acc, sc, p, q, zero, j, ring, offs_m, scale, s_layout, p_layout,
                                             BLOCK_N, STAGES, SQUARED, False, True, TRANS, PERM)  # fmt: skip
                acc, sc, p = _step_async(acc, sc, p, q, zero, steps - 1, ring, offs_m, scale, s_layout,
                                         p_layout, BLOCK_N, STAGES, SQUARED, False, False, TRANS,
                                         PERM)  # fmt: skip
            acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))
            _release(v_bars, STAGES)
        else:
            descs = (Kd, Vd)
            bufs = (k_s, v_s)
            FIRST: gl.constexpr = 1 + TRANS  # the tiles loaded before the wait: k's (and v's, where TRANS)
            for s in gl.static_range(STAGES):  # the first key blocks' tiles: k's now, v's copy after the wait
                at = s * BLOCK_N
                v_at = _v_at(v_row, v_col, at, TRANS)
                _fill_first(descs, bars, bufs, s, (k_row + at, v_at[0]), (k_col, v_at[1]), s < steps, FIRST)
            if WAIT:
                _griddep(True)
            for s in gl.static_range(STAGES):
                at = s * BLOCK_N
                v_at = _v_at(v_row, v_col, at, TRANS)
                _fill_rest(descs, bars, bufs, s, (k_row + at, v_at[0]), (k_col, v_at[1]), s < steps, FIRST)
            mbarrier.wait(q_bar, 0)
            q = q_s.load(q_layout)
            xt = _xt_buffers(q_s, HEAD_D, BLOCK_M, BLOCK_N, TRANS)
            ring = (descs, bars, bufs, k_row, k_col, v_row, v_col, steps, xt)
            if CAUSAL:  # the key blocks before the diagonal, then the diagonal's, masked (one ring)
                n_full = start_m // BLOCK_N
                for j in range(n_full):
                    acc = _step(acc, q, zero, j, ring, offs_m, scale, s_layout, p_layout, BLOCK_N, STAGES,
                                SQUARED, False, TRANS, PERM)  # fmt: skip
                for j in range(n_full, steps):
                    acc = _step(acc, q, zero, j, ring, offs_m, scale, s_layout, p_layout, BLOCK_N, STAGES,
                                SQUARED, True, TRANS, PERM)  # fmt: skip
            else:
                for j in range(steps):
                    acc = _step(acc, q, zero, j, ring, offs_m, scale, s_layout, p_layout, BLOCK_N, STAGES,
                                SQUARED, False, TRANS, PERM)  # fmt: skip

        _ring_release(bars, STAGES)
        mbarrier.invalidate(q_bar)
        offs_d = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, o_layout))
        rows = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        o_ptrs = O + b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh + rows[:, None] * stride_ol
        gl.store(o_ptrs + offs_d[None, :], acc * relu_scale)


    @gluon.jit
    def _write_transposed(buf, dst, row, col, ld):
        """The tile [ROWS, COLS] in ``buf`` written transposed into the float32 matrix at ``dst`` (row
        stride ``ld``) from row ``row``, column ``col`` on, its rows in sigma's order (place ``8g +
        sigma(c)`` takes row ``8g + c``: the copies of ``_l_contiguous`` with ``sigma``). Consecutive lanes
        take consecutive rows of the tile, so that each store of a warp fills 128 bytes of one row of
        ``dst`` (sigma permutes within each 32 bytes)."""
        ROWS: gl.constexpr = buf.shape[0]
        COLS: gl.constexpr = buf.shape[1]
        layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[32, 1],
                                                warps_per_cta=[1, gl.num_warps()], order=[0, 1])  # fmt: skip
        tile = buf.load(layout)
        m = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
        d = gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
        place = (m & -8) | ((m & 7) >> 1) | ((m & 1) << 2)  # sigma(b0 + 2 b1 + 4 b2) = b1 + 2 b2 + 4 b0
        ptrs = dst + (row + d).to(gl.int64)[None, :] * ld + (col + place)[:, None]
        gl.store(ptrs, tile)

    @gluon.jit
    def _operands(Ad, Bd, a_at, b_at, layout: gl.constexpr, copies, WRITE: gl.constexpr):
        """The tiles at ``a_at`` of ``Ad`` and at ``b_at`` of ``Bd`` (descriptors of one box shape) in
        registers, in the left-operand layout ``layout``; where WRITE, also written transposed into their
        copies ``copies = (A_T, B_T, row, col, ld)`` (:func:`_write_transposed`: the dQ kernel writing the
        copies of q and dout the dK/dV kernel after it reads, attention v36). Their shared memory is free
        once they are loaded: the caller allocates its buffers for the loop after this."""
        a_s = gl.allocate_shared_memory(Ad.dtype, Ad.block_type.shape, Ad.layout)
        b_s = gl.allocate_shared_memory(Bd.dtype, Bd.block_type.shape, Bd.layout)
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        mbarrier.expect(bar, Ad.block_type.nbytes + Bd.block_type.nbytes)
        tma.async_copy_global_to_shared(Ad, a_at, bar, a_s)
        tma.async_copy_global_to_shared(Bd, b_at, bar, b_s)
        mbarrier.wait(bar, 0)
        mbarrier.invalidate(bar)
        if WRITE:
            a_t, b_t, row, col, ld = copies
            _write_transposed(a_s, a_t, row, col, ld)
            _write_transposed(b_s, b_t, row, col, ld)
        return a_s.load(layout), b_s.load(layout)

    @gluon.jit
    def _dq_step(dq, q, do, zero, j, ring, offs_m, scale, s_layout: gl.constexpr, ds_layout: gl.constexpr,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, SQUARED: gl.constexpr, MASKED: gl.constexpr,
                 ASYNC: gl.constexpr, TRANS: gl.constexpr, FOLD: gl.constexpr):  # fmt: skip
        """Key block j of the dQ kernel: its scores and ``dp``, ``dq += ds @ k`` (k's copy; where TRANS,
        k's tile transposed into ``kx`` while the scores run); then its buffers take key block j + STAGES."""
        descs, bars, bufs, k_row, k_col, v_row, v_col, kt_row, steps, kx = ring
        slot = j % STAGES
        _ring_wait(bars, slot, (j // STAGES) & 1)
        if ASYNC:  # dp's product runs while the scores' relu is taken
            sc = warpgroup_mma(q, bufs[0].index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
            dp = warpgroup_mma(do, bufs[1].index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
            if TRANS:  # kx: the last product to read it (block j - 1's) was done before its end's barrier
                _transpose(bufs[0].index(slot), kx, gl.num_warps())
            sc = warpgroup_mma_wait(num_outstanding=1, deps=(sc,))
            if SQUARED:
                a = gl.maximum(sc * scale, 0.0)
                dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp,))
                if FOLD:  # 2 * scale^2 goes with relu_scale
                    ds = dp * a
                else:
                    ds = dp * (2.0 * scale) * a
            else:
                pos = sc > 0.0
                dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp,))
                ds = gl.where(pos, dp * scale, 0.0)
        else:
            sc = warpgroup_mma(q, bufs[0].index(slot).permute((1, 0)), zero, use_acc=False)
            dp = warpgroup_mma(do, bufs[1].index(slot).permute((1, 0)), zero, use_acc=False)
            if TRANS:
                _transpose(bufs[0].index(slot), kx, gl.num_warps())
            if SQUARED:
                if FOLD:
                    ds = dp * gl.maximum(sc, 0.0)
                else:
                    ds = dp * (2.0 * scale) * gl.maximum(sc * scale, 0.0)
            else:
                ds = gl.where(sc > 0.0, dp * scale, 0.0)
        if MASKED:
            offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            ds = gl.where(offs_m[:, None] >= offs_n[None, :], ds, 0.0)
        if TRANS:
            fence_async_shared()
            gl.thread_barrier()  # every warp's part of kx stored
            dq = warpgroup_mma(_left(ds, ds_layout, True), kx.permute((1, 0)), dq)
        else:
            dq = warpgroup_mma(_left(ds, ds_layout, True), bufs[2].index(slot).permute((1, 0)), dq)
        nxt = (j + STAGES) * BLOCK_N
        # every warp's products have read buffer slot (where TRANS, descs has no copy of k: the last place
        # goes unused)
        _refill(descs, bars, bufs, slot, (k_row + nxt, v_row + nxt, kt_row), (k_col, v_col, nxt),
                j + STAGES < steps)  # fmt: skip
        return dq

    @gluon.jit
    def _attn_bwd_dq_tf32_kernel(
        Qd, DOd,  # 2-D descriptors of q and dout, boxes [BLOCK_M, HEAD_D]
        Kd, Vd, KTd,  # of k and v (boxes [BLOCK_N, HEAD_D]) and k's copy (boxes [HEAD_D, BLOCK_N])
        DQ,  # out, (B, H, L, HEAD_D) through strides
        stride_dqb, stride_dqh, stride_dql,
        QT, DOT, t_ld,  # where WRITE, the copies of q and dout to write ([B*H*HEAD_D, L], row stride t_ld)
        H, Lk, GROUP,
        q_rb, q_rh, q_ch, do_rb, do_rh, do_ch, k_rb, k_rh, k_ch, v_rb, v_rh, v_ch,  # heads in the 2-D views
        scale, relu_scale,
        HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
        CAUSAL: gl.constexpr, SQUARED: gl.constexpr,
        WAIT_END: gl.constexpr,  # a dependent launch after the dK/dV kernel: complete after it
        ASYNC: gl.constexpr,  # the scores' relu taken while dp's product runs
        TRANS: gl.constexpr,  # k's tiles transposed in shared memory (attention v32): no copy (KTd unused)
        FOLD: gl.constexpr,  # scale > 0 (squared: scale^2) folded into relu_scale by the launcher (attention
        # v36, as the forward's v35): the scores are not scaled; squared, the 2 of ds goes with it too
        WRITE: gl.constexpr,  # the first kernel: writes the copies of q and dout that the dK/dV kernel after
        # it reads (attention v36; TRANS: no copy of k) and lets that kernel launch (ops._runtime.pdl)
        SPLIT: gl.constexpr,  # a barrier array per tensor of the ring (attention v37: _ring_barriers)
    ):  # fmt: skip
        WARPS: gl.constexpr = gl.num_warps()
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                           instr_shape=[16, BLOCK_N, 8])  # fmt: skip
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                           instr_shape=[16, HEAD_D, 8])  # fmt: skip
        q_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=1)
        ds_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=1)

        if FOLD:  # a product by 1.0, which the compiler drops
            scale = 1.0
            if SQUARED:
                relu_scale = relu_scale * 2.0
        pid_bh, b, h, start_m, steps = _query_block(H, Lk, GROUP, BLOCK_M, BLOCK_N, CAUSAL)
        q_row, q_col = _head_at(b, h, q_rb, q_rh, q_ch)
        do_row, do_col = _head_at(b, h, do_rb, do_rh, do_ch)
        if WRITE:
            _griddep(False)  # the dK/dV kernel may launch: it waits for this one before it reads the copies
        copies = (QT, DOT, pid_bh * HEAD_D, start_m, t_ld)
        q, do = _operands(Qd, DOd, [q_row + start_m, q_col], [do_row + start_m, do_col], q_layout, copies,
                          WRITE)  # fmt: skip

        k_s = gl.allocate_shared_memory(Kd.dtype, [STAGES, BLOCK_N, HEAD_D], Kd.layout)
        v_s = gl.allocate_shared_memory(Vd.dtype, [STAGES, BLOCK_N, HEAD_D], Vd.layout)
        if TRANS:
            kx = gl.allocate_shared_memory(gl.float32, [HEAD_D, BLOCK_N], _xt_layout(BLOCK_N))
        else:
            kt_s = gl.allocate_shared_memory(KTd.dtype, [STAGES, HEAD_D, BLOCK_N], KTd.layout)
            kx = kt_s  # unused
        bars = _ring_barriers(3 - TRANS, STAGES, SPLIT)
        k_row, k_col = _head_at(b, h, k_rb, k_rh, k_ch)
        v_row, v_col = _head_at(b, h, v_rb, v_rh, v_ch)
        kt_row = pid_bh * HEAD_D
        if TRANS:
            descs = (Kd, Vd)
            bufs = (k_s, v_s)
        else:
            descs = (Kd, Vd, KTd)
            bufs = (k_s, v_s, kt_s)
        for s in gl.static_range(STAGES):  # the first key blocks' tiles
            at = s * BLOCK_N
            _fill(descs, bars, bufs, s, (k_row + at, v_row + at, kt_row), (k_col, v_col, at), s < steps)

        offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        dq = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)
        zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        ring = (descs, bars, bufs, k_row, k_col, v_row, v_col, kt_row, steps, kx)
        if CAUSAL:  # the key blocks before the diagonal, then the diagonal's, masked
            n_full = start_m // BLOCK_N
            for j in range(n_full):
                dq = _dq_step(dq, q, do, zero, j, ring, offs_m, scale, s_layout, ds_layout, BLOCK_N, STAGES,
                              SQUARED, False, ASYNC, TRANS, FOLD)  # fmt: skip
            for j in range(n_full, steps):
                dq = _dq_step(dq, q, do, zero, j, ring, offs_m, scale, s_layout, ds_layout, BLOCK_N, STAGES,
                              SQUARED, True, ASYNC, TRANS, FOLD)  # fmt: skip
        else:
            for j in range(steps):
                dq = _dq_step(dq, q, do, zero, j, ring, offs_m, scale, s_layout, ds_layout, BLOCK_N, STAGES,
                              SQUARED, False, ASYNC, TRANS, FOLD)  # fmt: skip

        _ring_release(bars, STAGES)
        offs_d = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, o_layout))
        rows = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        ptrs = DQ + b.to(gl.int64) * stride_dqb + h.to(gl.int64) * stride_dqh + rows[:, None] * stride_dql
        gl.store(ptrs + offs_d[None, :], dq * relu_scale)
        if WAIT_END:
            _griddep(True)

    @gluon.jit
    def _dkdv_step(dk, dv, k, v, zero, j, ring, offs_n, scale, st_layout: gl.constexpr,
                   pt_layout: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                   SQUARED: gl.constexpr, MASKED: gl.constexpr, ASYNC: gl.constexpr,
                   TRANS: gl.constexpr, FOLD: gl.constexpr):  # fmt: skip
        """Query block ``first + j`` of the dK/dV kernel: the block's scores and ``dp`` transposed,
        ``dv += p^T @ dout`` and ``dk += ds^T @ q`` (dout's and q's copies; where TRANS, q's and dout's
        tiles transposed into ``qx`` and ``dox`` while the scores run); then its buffers take query block
        ``first + j + STAGES``."""
        descs, bars, bufs, q_row, q_col, do_row, do_col, t_row, first, steps, qx, dox = ring
        slot = j % STAGES
        _ring_wait(bars, slot, (j // STAGES) & 1)
        if ASYNC:  # each product runs while the elementwise work of the one before it is done
            st = warpgroup_mma(k, bufs[0].index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
            dpt = warpgroup_mma(v, bufs[1].index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
            if TRANS:  # qx, dox: the last products to read them (block j - 1's) were done before its barrier
                _transpose(bufs[0].index(slot), qx, gl.num_warps())
                _transpose(bufs[1].index(slot), dox, gl.num_warps())
            st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
        else:
            st = warpgroup_mma(k, bufs[0].index(slot).permute((1, 0)), zero, use_acc=False)
            dpt = warpgroup_mma(v, bufs[1].index(slot).permute((1, 0)), zero, use_acc=False)
            if TRANS:
                _transpose(bufs[0].index(slot), qx, gl.num_warps())
                _transpose(bufs[1].index(slot), dox, gl.num_warps())
        at = gl.maximum(st * scale, 0.0, propagate_nan=tl.PropagateNan.ALL)
        if SQUARED:
            pt = at * at
        else:
            pt = at
        if MASKED:
            offs_m = (first + j) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
            visible = offs_m[None, :] >= offs_n[:, None]
            pt = gl.where(visible, pt, 0.0)
        pt = _left(pt, pt_layout, True)
        if TRANS:
            fence_async_shared()
            gl.thread_barrier()  # every warp's parts of qx and dox stored
            dot_b = dox
            qt_b = qx
        else:
            dot_b = bufs[3].index(slot)
            qt_b = bufs[2].index(slot)
        if ASYNC:
            dv = warpgroup_mma(pt, dot_b.permute((1, 0)), dv, is_async=True)
            dpt, pt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt, pt))
        else:
            dv = warpgroup_mma(pt, dot_b.permute((1, 0)), dv)
        if SQUARED:
            if FOLD:  # 2 * scale^2 goes with relu_scale
                dst = dpt * at
            else:
                dst = dpt * (2.0 * scale) * at
        else:
            dst = gl.where(st > 0.0, dpt * scale, 0.0)
        if MASKED:
            dst = gl.where(visible, dst, 0.0)
        dst = _left(dst, pt_layout, True)
        if ASYNC:
            dk = warpgroup_mma(dst, qt_b.permute((1, 0)), dk, is_async=True)
            dv, dk, pt, dst = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, pt, dst))
        else:
            dk = warpgroup_mma(dst, qt_b.permute((1, 0)), dk)
        nxt = (first + j + STAGES) * BLOCK_M
        # every warp's products have read buffer slot (where TRANS, descs has no copies: the last two places
        # go unused)
        _refill(descs, bars, bufs, slot, (q_row + nxt, do_row + nxt, t_row, t_row), (q_col, do_col, nxt, nxt),
                j + STAGES < steps)  # fmt: skip
        return dk, dv

    @gluon.jit
    def _attn_bwd_dkdv_tf32_kernel(
        Kd, Vd,  # 2-D descriptors of k and v, boxes [BLOCK_N, HEAD_D]
        Qd, DOd, QTd, DOTd,  # of q and dout (boxes [BLOCK_M, HEAD_D]) and their copies ([HEAD_D, BLOCK_M])
        DK, DV,  # out, (B, H, L, HEAD_D) through strides
        stride_dkb, stride_dkh, stride_dkl, stride_dvb, stride_dvh, stride_dvl,
        H, Lq, GROUP,
        k_rb, k_rh, k_ch, v_rb, v_rh, v_ch, q_rb, q_rh, q_ch, do_rb, do_rh, do_ch,  # heads in the 2-D views
        scale, relu_scale,
        HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
        CAUSAL: gl.constexpr, SQUARED: gl.constexpr,
        CHAIN: gl.constexpr,  # a dependent launch after the copies (wait for them), before the dQ kernel
        ASYNC: gl.constexpr,  # each product running while the elementwise work of the one before is done
        TRANS: gl.constexpr,  # q's and dout's tiles transposed in shared memory (attention v32): no copies
        # (QTd, DOTd unused)
        SIGNAL: gl.constexpr,  # not a dependent launch, but the dQ kernel after it is (ops._runtime.pdl)
        FOLD: gl.constexpr,  # scale > 0 (squared: scale^2) folded into relu_scale (as the dQ kernel's FOLD):
        # squared, the 2 of ds^T goes with dk's
        SPLIT: gl.constexpr,  # a barrier array per tensor of the ring (attention v37: _ring_barriers)
    ):  # fmt: skip
        WARPS: gl.constexpr = gl.num_warps()
        st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                            instr_shape=[16, BLOCK_M, 8])  # fmt: skip
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                           instr_shape=[16, HEAD_D, 8])  # fmt: skip
        k_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=st_layout, k_width=1)
        pt_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=1)

        dk_scale = relu_scale
        if FOLD:  # a product by 1.0, which the compiler drops
            scale = 1.0
            if SQUARED:
                dk_scale = relu_scale * 2.0
        pid_n, pid_bh, _ = _block_order(GROUP)  # causal: the first key blocks see the most queries: first
        b = pid_bh // H
        h = pid_bh % H
        start_n = pid_n * BLOCK_N
        if CAUSAL:  # query blocks from the diagonal's on
            first = start_n // BLOCK_M
        else:
            first = 0
        steps = gl.maximum(Lq // BLOCK_M - first, 0)
        k_row, k_col = _head_at(b, h, k_rb, k_rh, k_ch)
        v_row, v_col = _head_at(b, h, v_rb, v_rh, v_ch)
        k, v = _operands(Kd, Vd, [k_row + start_n, k_col], [v_row + start_n, v_col], k_layout, None, False)

        q_s = gl.allocate_shared_memory(Qd.dtype, [STAGES, BLOCK_M, HEAD_D], Qd.layout)
        do_s = gl.allocate_shared_memory(DOd.dtype, [STAGES, BLOCK_M, HEAD_D], DOd.layout)
        if TRANS:
            qx = gl.allocate_shared_memory(gl.float32, [HEAD_D, BLOCK_M], _xt_layout(BLOCK_M))
            dox = gl.allocate_shared_memory(gl.float32, [HEAD_D, BLOCK_M], _xt_layout(BLOCK_M))
        else:
            qt_s = gl.allocate_shared_memory(QTd.dtype, [STAGES, HEAD_D, BLOCK_M], QTd.layout)
            dot_s = gl.allocate_shared_memory(DOTd.dtype, [STAGES, HEAD_D, BLOCK_M], DOTd.layout)
            qx = qt_s  # unused
            dox = dot_s
        bars = _ring_barriers(4 - 2 * TRANS, STAGES, SPLIT)
        q_row, q_col = _head_at(b, h, q_rb, q_rh, q_ch)
        do_row, do_col = _head_at(b, h, do_rb, do_rh, do_ch)
        t_row = pid_bh * HEAD_D
        if TRANS:  # no copies
            descs = (Qd, DOd)
            bufs = (q_s, do_s)
        else:
            descs = (Qd, DOd, QTd, DOTd)
            bufs = (q_s, do_s, qt_s, dot_s)
        for s in gl.static_range(STAGES):  # the first query blocks' tiles: q's and dout's now
            at = (first + s) * BLOCK_M
            rows = (q_row + at, do_row + at, t_row, t_row)
            _fill_first(descs, bars, bufs, s, rows, (q_col, do_col, at, at), s < steps, 2)
        if CHAIN:  # the copies done (k's, where TRANS); then the dQ kernel (which reads k's copy) may start
            _griddep(True)
            _griddep(False)
        elif SIGNAL:
            _griddep(False)
        for s in gl.static_range(STAGES):  # their copies' (none where TRANS)
            at = (first + s) * BLOCK_M
            _fill_rest(descs, bars, bufs, s, (t_row, t_row, t_row, t_row), (0, 0, at, at), s < steps, 2)

        offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
        dk = gl.zeros([BLOCK_N, HEAD_D], gl.float32, o_layout)
        dv = gl.zeros([BLOCK_N, HEAD_D], gl.float32, o_layout)
        zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
        ring = (descs, bars, bufs, q_row, q_col, do_row, do_col, t_row, first, steps, qx, dox)
        if CAUSAL:  # the query blocks on the diagonal, masked, then the later ones
            n_diag = gl.minimum(BLOCK_N // BLOCK_M, steps)
            for j in range(n_diag):
                dk, dv = _dkdv_step(dk, dv, k, v, zero, j, ring, offs_n, scale, st_layout, pt_layout, BLOCK_M,
                                    STAGES, SQUARED, True, ASYNC, TRANS, FOLD)  # fmt: skip
            for j in range(n_diag, steps):
                dk, dv = _dkdv_step(dk, dv, k, v, zero, j, ring, offs_n, scale, st_layout, pt_layout, BLOCK_M,
                                    STAGES, SQUARED, False, ASYNC, TRANS, FOLD)  # fmt: skip
        else:
            for j in range(steps):
                dk, dv = _dkdv_step(dk, dv, k, v, zero, j, ring, offs_n, scale, st_layout, pt_layout, BLOCK_M,
                                    STAGES, SQUARED, False, ASYNC, TRANS, FOLD)  # fmt: skip

        _ring_release(bars, STAGES)
        offs_d = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, o_layout))
        rows = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, o_layout))
        dk_ptrs = DK + b.to(gl.int64) * stride_dkb + h.to(gl.int64) * stride_dkh + rows[:, None] * stride_dkl
        dv_ptrs = DV + b.to(gl.int64) * stride_dvb + h.to(gl.int64) * stride_dvh + rows[:, None] * stride_dvl
        gl.store(dk_ptrs + offs_d[None, :], dk * dk_scale)
        gl.store(dv_ptrs + offs_d[None, :], dv * relu_scale)


def rows_view(t: torch.Tensor):
    """``(view, rb, rh, ch)``: a 2-D view of the [B, H, L, D] view ``t`` (unit stride on D) in which row l of
    head (b, h) is row ``b*rb + h*rh + l`` and starts at column ``h*ch``; ``None`` where no such view
    exists (the L stride must divide the batch stride and either divide the head stride or exceed the heads'
    columns)."""
    B, H, L, D = t.shape
    s0, s1, s2, s3 = t.stride()
    if s3 != 1 or s2 <= 0 or s0 <= 0 or s1 <= 0 or s0 % s2:
        return None
    if s1 % s2 == 0:  # heads in rows ([B, H, L, D]-like)
        rb, rh, ch = s0 // s2, s1 // s2, 0
        cols = D
    elif (H - 1) * s1 + D <= s2:  # heads in columns ([B, L, H, D]-like)
        rb, rh, ch = s0 // s2, 0, s1
        cols = (H - 1) * s1 + D
    else:
        return None
    rows = (B - 1) * rb + (H - 1) * rh + L
    return torch.as_strided(t, (rows, cols), (s2, 1)), rb, rh, ch


def _row_views(tensors, interpreted: bool, multiple: int):
    """The row views (:func:`rows_view`) of ``tensors`` ([B, H, L, D] views) where the Gluon kernels can
    take them, else ``None``: float32 on compute capability 9+ with the Triton of ``GLUON_TRITON``, not
    under the interpreter; lengths multiples of ``multiple``; the views' bases and rows 16-byte aligned."""
    q = tensors[0]
    if gluon is None or interpreted or q.device.type != "cuda" or q.dtype != torch.float32:
        return None
    if triton_version() != GLUON_TRITON:
        return None
    if compute_capability_major(q) < 9 or q.shape[3] not in (32, 64, 128):
        return None
    if any(t.shape[2] % multiple for t in tensors):
        return None
    views = tuple(rows_view(t) for t in tensors)
    for view in views:
        if view is None or view[0].data_ptr() % 16 or view[0].stride(0) * view[0].element_size() % 16:
            return None
    return views


def usable(q: torch.Tensor, k: torch.Tensor, interpreted: bool, block_m: int, block_n: int,
           v: torch.Tensor | None = None):  # fmt: skip
    """The row views of q and k (and of v where given: the kernel then transposes v's tiles itself) where
    the Gluon forward can take them, else ``None`` (see :func:`_row_views`); ``block_n`` must divide
    ``block_m`` (the causal loops' diagonal blocks), the lengths be multiples of ``block_m``."""
    if block_m % block_n:
        return None
    return _row_views((q, k) if v is None else (q, k, v), interpreted, block_m)


def l_major_2d(copy: torch.Tensor):
    """The [B*H*D, L] matrix of a [B, H, L, D] view with unit stride on L whose [B, H, D, L] transpose is
    contiguous (the launcher's copies), else ``None``."""
    t = copy.transpose(2, 3)
    if not t.is_contiguous() or t.data_ptr() % 16 or t.shape[3] * t.element_size() % 16:
        return None
    return t.reshape(-1, t.shape[3])


def usable_bwd(q, k, v, do, copies, outs, interpreted: bool, dkdv_tiles, dq_tiles):
    """``(row views of q, k, v, dout; [B*H*D, L] matrices of the copies of q, dout, k)`` where the Gluon
    backward can take them, else ``None``: as :func:`_row_views`, D <= 64, each kernel's query tile
    dividing its key tile (dK/dV) or the reverse (dQ), the larger tile at least 64 rows (4 warps), lengths
    multiples of every tile, ``copies`` (q, dout and k with unit stride on L; ``None`` for those a kernel
    transposes itself, TRANS, and for all of them to check the views only) whose transposes are contiguous;
    ``outs`` (dq, dk, dv) with unit stride on D. A dQ kernel that writes the copies of q and dout (WRITE,
    :func:`says_write`) must transpose k's tiles itself and the dK/dV kernel read those copies."""
    if any(t.stride(3) != 1 for t in outs):
        return None
    if says_write(dq_tiles) and (not says_trans(dq_tiles) or says_trans(dkdv_tiles)):
        return None
    (bm1, bn1, *_), (bm2, bn2, *_) = dkdv_tiles, dq_tiles
    if bn1 % bm1 or bm2 % bn2 or min(bn1, bm2) < 64:  # a warp per 16 rows; wgmma needs 4
        return None
    if q.shape[3] > 64:  # D=128: compiled for D <= 64 only (the dK/dV kernel keeps k, v, dk, dv in registers)
        return None
    views = _row_views((q, k, v, do), interpreted, math.lcm(bn1, bm2))
    if views is None:
        return None
    copies = copies or (None, None, None)
    mats = tuple(None if c is None else l_major_2d(c) for c in copies)
    if any(m is None and c is not None for m, c in zip(mats, copies, strict=True)):
        return None
    return views, mats


# The fewest programs one group of heads of the causal launch order should have (:func:`head_group`):
# about a wave of them on an H200 (132 SMs, two programs each), so that the last group's blocks, heaviest
# first, keep every SM busy to the end.
GROUP_PROGRAMS = 256
FORCE_GROUP: int | None = None  # a probe's override of head_group (bench/probe_attn_tf32.py)


def head_group(heads: int, causal: bool, blocks: int) -> int:
    """The heads per group of the launch order (``_block_order``) of a kernel with ``blocks`` programs per
    head: 1 where not causal (one head's blocks after another's, which read its k and v from L2 while
    they are there). A causal block's work grows with its distance from the first one, and the blocks of a
    group start heaviest first: with one head at a time the last head's heaviest block starts among the
    last programs and runs on alone (at L=1024 the forward's 64 x 64 tiles took 1.06x as long as with
    groups of 16 heads, run 298). There the group is the smallest divisor of ``heads`` with at least
    GROUP_PROGRAMS programs (all heads where fewer)."""
    if FORCE_GROUP is not None:
        return math.gcd(FORCE_GROUP, heads)
    return _causal_group(heads, blocks, GROUP_PROGRAMS) if causal else 1


@functools.lru_cache(maxsize=256)
def _causal_group(heads: int, blocks: int, programs: int) -> int:
    return next((g for g in range(1, heads + 1) if heads % g == 0 and g * blocks >= programs), heads)


def _desc(view: torch.Tensor, block: list[int]):
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.float32)
    return TensorDescriptor(view, list(view.shape), list(view.stride()), block, layout)


def fold_scale(scale: float, relu_scale: float, squared: bool) -> tuple[bool, float]:
    """``(fold, relu_scale)``: whether a kernel takes ``scale`` with ``relu_scale`` instead of applying it
    to each score (attention v35, v36): for a positive, finite scale relu(s * scale) = scale * relu(s), so
    the output (and every gradient) takes scale (squared: scale^2) with relu_scale; a scale that is not
    positive stays with the scores."""
    if 0 < scale < math.inf:
        return True, relu_scale * (scale * scale if squared else scale)
    return False, relu_scale


# The backward kernels' fold of the scale (attention v36: ``FOLD``, as the forward's v35): compiled for
# sm_90 but not yet run on a GPU, so off; bench/probe_attn_tf32.py --kind bwd --fold-bwd 0,1 compares it.
FOLD_BWD = False

# The kernels' rings with a barrier array per tensor (attention v37: ``SPLIT``, :func:`_ring_barriers`,
# :func:`_refill`): compiled for sm_90 (CTA barriers a step: the dK/dV kernel reading copies 6 -> 3, with
# TRANS 5 -> 3, the dQ kernel 5 -> 3, the forward 4 -> 3) but not yet run on a GPU, so off;
# bench/probe_attn_tf32.py --split 0,1 compares it. Off, the kernels are compiled from the same
# instructions as before v37 (offline, 120 kernels: 12 the same PTX, 108 the same instructions with
# scalar ones in another order around a CTA barrier).
SPLIT_BARS = False


def launch(q, k, views, v, out, causal: bool, squared: bool, scale: float, relu_scale: float, block_m: int,
           block_n: int, stages: int, is_async: int, trans: int, perm: bool, wait: bool,
           run) -> None:  # fmt: skip
    """The forward on [B, H, L, D] views q, k (``views``: their row views, what :func:`usable` returned),
    out and v: where ``trans``, v itself (``views`` then holds its row view too: :func:`usable` with v),
    transposed in the kernel; else v's copy ([B, H, D, L] contiguous). The keys of ``p @ v`` are taken in
    sigma's order (attention v34, :func:`_left`) where ``trans`` (the kernel transposes v's tiles so) and
    with ``perm``, which says that v's copy is in that order (``_l_contiguous`` with ``sigma``). Launched
    through ``run(kernel, grid, key, *args, **options)`` (the launcher's ``_launch``)."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    (qv, q_rb, q_rh, q_ch), (kv, k_rb, k_rh, k_ch), *rest = views
    if trans:
        ((vv, *vh),) = rest
        v_desc = _desc(vv, [block_n, D])
    else:
        vh = (0, 0, 0)
        v_desc = _desc(v.reshape(B * H * D, Lk), [D, block_n])
    bind_cuda_context(q)
    group = head_group(B * H, causal, Lq // block_m)
    fold, relu_scale = fold_scale(scale, relu_scale, squared)
    args = (
        _desc(qv, [block_m, D]), _desc(kv, [block_n, D]), v_desc, out, out.stride(0), out.stride(1),
        out.stride(2), H, Lk, group, q_rb, q_rh, q_ch, k_rb, k_rh, k_ch, *vh, scale, relu_scale,
    )  # fmt: skip
    options = dict(HEAD_D=D, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal, SQUARED=squared,
                   WAIT=wait, ASYNC=bool(is_async), TRANS=bool(trans), PERM=bool(perm), FOLD=fold,
                   SPLIT=SPLIT_BARS and not is_async, num_warps=block_m // 16)  # fmt: skip
    if trans and block_m == 128 and D <= 64:
        # two programs an SM (96 KB of shared memory each): at most 128 registers a thread (the causal
        # kernel takes 157 without the cap, and spills 76 bytes in its diagonal loop with it)
        options["maxnreg"] = 128
    if wait:
        options["launch_pdl"] = True
    grid = (Lq // block_m * group, B * H // group)
    run(_attn_fwd_tf32_kernel, grid, (q.device, q.dtype, D, "tf32", block_m, block_n), *args, num_stages=1,
        **options)  # fmt: skip


def says_trans(tiles) -> bool:
    """Whether a kernel's tiles (BLOCK_M, BLOCK_N, STAGES, ASYNC[, TRANS[, WRITE]]) say that it transposes
    its tiles itself (attention v31, v32) instead of reading copies."""
    return len(tiles) > 4 and bool(tiles[4])


def says_write(tiles) -> bool:
    """Whether the dQ kernel's tiles (BLOCK_M, BLOCK_N, STAGES, ASYNC, TRANS, WRITE) say that it runs first
    and writes the copies of q and dout that the dK/dV kernel reads (attention v36)."""
    return len(tiles) > 5 and bool(tiles[5])


def launch_bwd(q, k, v, do, dq, dk, dv, usable_views, causal: bool, squared: bool, scale: float,
               relu_scale: float, dkdv_tiles, dq_tiles, chain: bool, signal: bool, run) -> None:  # fmt: skip
    """The backward's two kernels on [B, H, L, D] views (``usable_views``: what :func:`usable_bwd`
    returned), through ``run`` (the launcher's ``_launch``). A kernel whose tiles end in a true TRANS
    transposes its tiles of q and dout (dK/dV) or k (dQ) itself, and its copies are not given. Both
    kernels take the left operands of their last products relabelled in sigma's order (attention v34,
    :func:`_left`): the copies must be in that order too (``_l_contiguous`` with ``sigma``). With
    ``chain``, the dK/dV kernel is a dependent launch after the copies; with ``signal``, the dQ kernel is
    one after the dK/dV kernel (ops._runtime.pdl). Where the dQ kernel's tiles say WRITE
    (:func:`says_write`), it runs first and writes the copies of q and dout (given, their values unset),
    and ``chain`` makes the dK/dV kernel a dependent launch after it."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    ((qv, *qh), (kv, *kh), (vv, *vh), (dov, *doh)), (qt, dot, kt) = usable_views
    bind_cuda_context(q)
    group = head_group(B * H, causal, max(Lk // dkdv_tiles[1], Lq // dq_tiles[0]))
    fold, relu_scale = fold_scale(scale, relu_scale, squared) if FOLD_BWD else (False, relu_scale)
    write = says_write(dq_tiles)
    bm, bn, stages, is_async, *_ = dkdv_tiles
    trans = says_trans(dkdv_tiles)
    q_desc, do_desc = _desc(qv, [bm, D]), _desc(dov, [bm, D])
    qt_desc, dot_desc = (q_desc, do_desc) if trans else (_desc(qt, [D, bm]), _desc(dot, [D, bm]))
    args = (
        _desc(kv, [bn, D]), _desc(vv, [bn, D]), q_desc, do_desc, qt_desc, dot_desc, dk, dv, *dk.stride()[:3],
        *dv.stride()[:3], H, Lq, group, *kh, *vh, *qh, *doh, scale, relu_scale,
    )  # fmt: skip
    options = dict(HEAD_D=D, BLOCK_M=bm, BLOCK_N=bn, STAGES=stages, CAUSAL=causal, SQUARED=squared,
                   CHAIN=chain, ASYNC=bool(is_async), TRANS=trans, SIGNAL=signal and not chain and not write,
                   FOLD=fold, SPLIT=SPLIT_BARS, num_warps=bn // 16)  # fmt: skip
    if chain:
        options["launch_pdl"] = True
    grid = (Lk // bn * group, B * H // group)
    dkdv = (_attn_bwd_dkdv_tf32_kernel, grid, (q.device, q.dtype, D, "tf32-dkdv", bm, bn), args, options)
    bm, bn, stages, is_async, *_ = dq_tiles
    trans = says_trans(dq_tiles)
    k_desc = _desc(kv, [bn, D])
    copies = (qt, dot, qt.stride(0)) if write else (dq, dq, 0)  # (unused where not WRITE)
    args = (
        _desc(qv, [bm, D]), _desc(dov, [bm, D]), k_desc, _desc(vv, [bn, D]),
        k_desc if trans else _desc(kt, [D, bn]), dq, *dq.stride()[:3], *copies, H, Lk, group, *qh, *doh, *kh,
        *vh, scale, relu_scale,
    )  # fmt: skip
    options = dict(HEAD_D=D, BLOCK_M=bm, BLOCK_N=bn, STAGES=stages, CAUSAL=causal, SQUARED=squared,
                   WAIT_END=signal and not write, ASYNC=bool(is_async), TRANS=trans, FOLD=fold, WRITE=write,
                   SPLIT=SPLIT_BARS, num_warps=bm // 16)  # fmt: skip
    if signal and not write:
        options["launch_pdl"] = True
    grid = (Lq // bm * group, B * H // group)
    dq_launch = (_attn_bwd_dq_tf32_kernel, grid, (q.device, q.dtype, D, "tf32-dq", bm, bn), args, options)
    for kernel, grid, key, args, options in (dq_launch, dkdv) if write else (dkdv, dq_launch):
        run(kernel, grid, key, *args, num_stages=1, **options)
