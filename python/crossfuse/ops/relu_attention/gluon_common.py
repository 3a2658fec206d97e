"""Gluon building blocks shared by the float32 attention kernels (:mod:`.gluon_fwd`, :mod:`.gluon_bwd`).

The float32 kernels keep the left operand of every tf32 product in registers, which Triton keeps in
shared memory for 32-bit types (see :mod:`.gluon_launch` for the design and the measured reasons). What
they share: the launch order of their blocks (:func:`_block_order`), the rings of shared-memory buffers
that the copy engine (TMA) fills under one mbarrier per slot (:func:`_fill`, :func:`_refill`), the grid
dependency control of dependent launches (:func:`_griddep`), and the relabelling of an accumulator as the
next product's left operand (:func:`_left`, :func:`_sigma`) with the matching in-kernel transposition of a
tile (:func:`_transpose`).
"""

from __future__ import annotations

import triton.language as tl  # noqa: F401  (tl.PropagateNan in the kernels)

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: F401 (for gluon_fwd, gluon_bwd)
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: F401 (gluon_launch)
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
    def _fill_rest(descs, bars, bufs, slot, at_rows, at_cols, ok, FIRST: gl.constexpr):
        """Buffer ``slot`` of the ring's tensors from the FIRST-th on takes its tile (``descs[i]`` at
        ``[at_rows[i], at_cols[i]]``) under ``bars[slot]``, whose bytes :func:`_fill_first` expected;
        nothing where not ``ok``."""
        for i in gl.static_range(FIRST, len(descs)):
            tma.async_copy_global_to_shared(descs[i], [at_rows[i], at_cols[i]], bars.index(slot),
                                            bufs[i].index(slot), pred=ok)  # fmt: skip

    @gluon.jit
    def _fill_first(descs, bars, bufs, slot, at_rows, at_cols, ok, FIRST: gl.constexpr):
        """``bars[slot]`` expects the tiles of all the ring's tensors (boxes of one size); those of the
        first FIRST come now (:func:`_fill_rest`), the others' by a call of ``_fill_rest`` later (a
        dependent launch issues its loads of the earlier kernel's results after it waits for that)."""
        nbytes: gl.constexpr = descs[0].block_type.nbytes * len(descs)
        mbarrier.expect(bars.index(slot), nbytes, pred=ok)
        _fill_rest(descs[:FIRST], bars, bufs, slot, at_rows, at_cols, ok, 0)

    @gluon.jit
    def _fill(descs, bars, bufs, slot, at_rows, at_cols, ok):
        """Buffer ``slot`` of each of the ring's tensors (boxes of one size) takes its tile (``descs[i]`` at
        ``[at_rows[i], at_cols[i]]``), all under ``bars[slot]``; nothing where not ``ok``."""
        _fill_first(descs, bars, bufs, slot, at_rows, at_cols, ok, len(descs))

    @gluon.jit
    def _refill(descs, bars, bufs, slot, at_rows, at_cols, ok):
        """Once every warp is done with buffer ``slot`` (a CTA barrier here), its tiles of the ring's
        tensors are refilled (:func:`_fill`)."""
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
        index ``8g + 4b2 + 2b1 + b0`` moves to ``8g + 4b0 + 2b2 + b1``. A relabelling: no
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
        into ``xt_buf``: each thread takes 4 consecutive rows of one column and stores them
        as one 16-byte vector along the rows of xt. Consecutive lanes take consecutive columns: the 8
        lanes of each quarter of a warp's store write 8 rows of xt, which the 128-byte swizzle puts in
        distinct banks (with the rows of a column on consecutive lanes, two lanes shared each bank),
        and Triton 3.6 reads the tile with ``ldmatrix`` (16 scalar loads a thread before). xt's columns are
        in sigma's order (:func:`_sigma`; the product's left operand from :func:`_left` with
        PERM): the tile is read in the layout whose sigma is the store's. The caller fences
        (``fence_async_shared``) and waits for every warp before a product reads xt."""
        layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[4, 1], threads_per_warp=[2, 16],
                                                warps_per_cta=[WARPS, 1], order=[1, 0])  # fmt: skip
        ROWS: gl.constexpr = buf.shape[0]
        COLS: gl.constexpr = buf.shape[1]
        tile = buf.load(_rows_by_sigma(ROWS, COLS, WARPS))
        tile = gl.convert_layout(_sigma(tile, 0), layout, assert_trivial=True)
        xt_buf.store(gl.permute(tile, [1, 0]))
