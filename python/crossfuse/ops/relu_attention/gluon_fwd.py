"""The float32 attention forward in Gluon: ``q`` and ``p`` in registers as the products' left operands.

See :mod:`.gluon_launch` for the design, the tiles and the measured reasons; the shared pieces are in
:mod:`.gluon_common`.
"""

from __future__ import annotations

from .gluon_common import gluon

if gluon is not None:
    from .gluon_common import (
        _barriers,
        _fill,
        _fill_first,
        _fill_rest,
        _griddep,
        _head_at,
        _left,
        _query_block,
        _refill,
        _release,
        _transpose,
        _v_at,
        _xt_layout,
        fence_async_shared,
        gl,
        mbarrier,
        tl,
        tma,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )

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
        chosen per block by a run-time ``if`` came out wrong from Triton 3.6 on the GPU: the
        diagonal blocks have a loop of their own instead.)"""
        descs, bars, bufs, k_row, k_col, v_row, v_col, steps, xt = ring
        slot = j % STAGES
        nxt = (j + STAGES) * BLOCK_N
        v_at = _v_at(v_row, v_col, nxt, TRANS)
        mbarrier.wait(bars.index(slot), (j // STAGES) & 1)
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
        """Key block j with the products in flight: ``sc`` holds its scores on entry; where
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
        # relabelled p (PERM) the relu's results are p itself, and computing them before
        # this wait overwrote the operand in flight (wrong outputs at L >= 1024); sc passes
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
        _fill((k_desc,), k_bars, (k_s,), j % STAGES, (k_row + nxt * BLOCK_N,), (k_col,), nxt < steps)
        if TRANS:  # v's tile of block j is in xt: its buffer takes block j + STAGES
            v_at = _v_at(v_row, v_col, nxt * BLOCK_N, TRANS)
            _fill((v_desc,), v_bars, (v_s,), j % STAGES, (v_at[0],), (v_at[1],), nxt < steps)
            p = _left(p, p_layout, True)
            b_op = xt.index(j % 2)
        else:
            v_at = _v_at(v_row, v_col, (nxt - 1) * BLOCK_N, TRANS)
            _fill((v_desc,), v_bars, (v_s,), (j + STAGES - 1) % STAGES, (v_at[0],), (v_at[1],),
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
        TRANS: gl.constexpr,  # v read as it is and transposed in shared memory: no copy
        PERM: gl.constexpr,  # p @ v's keys in sigma's order in v's copy (TRANS: always)
        FOLD: gl.constexpr,  # scale > 0 folded into relu_scale by the launcher: the scores
        # are not scaled (relu(s * scale) = scale * relu(s))
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
        bars = _barriers(STAGES)
        mbarrier.expect(q_bar, Qd.block_type.nbytes)
        tma.async_copy_global_to_shared(Qd, [q_row + start_m, q_col], q_bar, q_s)
        offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)
        zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        if ASYNC:  # k's ring under ``bars``, v's under barriers of its own
            k_bars = bars
            v_bars = _barriers(STAGES)
            for s in gl.static_range(STAGES):  # the first key blocks' tiles
                _fill((Kd,), k_bars, (k_s,), s, (k_row + s * BLOCK_N,), (k_col,), s < steps)
            if TRANS:  # v itself: nothing to wait for
                for s in gl.static_range(STAGES):
                    v_at = _v_at(v_row, v_col, s * BLOCK_N, TRANS)
                    _fill((Vd,), v_bars, (v_s,), s, (v_at[0],), (v_at[1],), s < steps)
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
                    _fill((Vd,), v_bars, (v_s,), s, (v_at[0],), (v_at[1],), s < steps)
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

        _release(bars, STAGES)
        mbarrier.invalidate(q_bar)
        offs_d = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, o_layout))
        rows = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        o_ptrs = O + b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh + rows[:, None] * stride_ol
        gl.store(o_ptrs + offs_d[None, :], acc * relu_scale)
