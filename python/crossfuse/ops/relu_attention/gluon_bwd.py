"""The float32 attention backward in Gluon: the dK/dV kernel and the dQ kernel, left operands in registers.

See :mod:`.gluon_launch` for the design, the tiles and the measured reasons; the shared pieces are in
:mod:`.gluon_common`.
"""

from __future__ import annotations

from .gluon_common import gluon

if gluon is not None:
    from .gluon_common import (
        _barriers,
        _block_order,
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
        _xt_layout,
        fence_async_shared,
        gl,
        mbarrier,
        tl,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )


    @gluon.jit
    def _operands(Ad, Bd, a_at, b_at, layout: gl.constexpr):
        """The tiles at ``a_at`` of ``Ad`` and at ``b_at`` of ``Bd`` (descriptors of one box shape) in
        registers, in the left-operand layout ``layout``. Their shared memory is free once they are
        loaded: the caller allocates its buffers for the loop after this."""
        a_s = gl.allocate_shared_memory(Ad.dtype, Ad.block_type.shape, Ad.layout)
        b_s = gl.allocate_shared_memory(Bd.dtype, Bd.block_type.shape, Bd.layout)
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        mbarrier.expect(bar, Ad.block_type.nbytes + Bd.block_type.nbytes)
        tma.async_copy_global_to_shared(Ad, a_at, bar, a_s)
        tma.async_copy_global_to_shared(Bd, b_at, bar, b_s)
        mbarrier.wait(bar, 0)
        mbarrier.invalidate(bar)
        return a_s.load(layout), b_s.load(layout)

    @gluon.jit
    def _dq_step(dq, q, do, zero, j, ring, offs_m, scale, s_layout: gl.constexpr, ds_layout: gl.constexpr,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, SQUARED: gl.constexpr, MASKED: gl.constexpr,
                 ASYNC: gl.constexpr, TRANS: gl.constexpr):  # fmt: skip
        """Key block j of the dQ kernel: its scores and ``dp``, ``dq += ds @ k`` (k's copy; where TRANS,
        k's tile transposed into ``kx`` while the scores run); then its buffers take key block j + STAGES."""
        descs, bars, bufs, k_row, k_col, v_row, v_col, kt_row, steps, kx = ring
        slot = j % STAGES
        mbarrier.wait(bars.index(slot), (j // STAGES) & 1)
        if ASYNC:  # dp's product runs while the scores' relu is taken
            sc = warpgroup_mma(q, bufs[0].index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
            dp = warpgroup_mma(do, bufs[1].index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
            if TRANS:  # kx: the last product to read it (block j - 1's) was done before its end's barrier
                _transpose(bufs[0].index(slot), kx, gl.num_warps())
            sc = warpgroup_mma_wait(num_outstanding=1, deps=(sc,))
            if SQUARED:
                a = gl.maximum(sc * scale, 0.0)
                dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp,))
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
        H, Lk, GROUP,
        q_rb, q_rh, q_ch, do_rb, do_rh, do_ch, k_rb, k_rh, k_ch, v_rb, v_rh, v_ch,  # heads in the 2-D views
        scale, relu_scale,
        HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
        CAUSAL: gl.constexpr, SQUARED: gl.constexpr,
        WAIT_END: gl.constexpr,  # a dependent launch after the dK/dV kernel: complete after it
        ASYNC: gl.constexpr,  # the scores' relu taken while dp's product runs
        TRANS: gl.constexpr,  # k's tiles transposed in shared memory: no copy (KTd unused)
    ):  # fmt: skip
        WARPS: gl.constexpr = gl.num_warps()
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                           instr_shape=[16, BLOCK_N, 8])  # fmt: skip
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                           instr_shape=[16, HEAD_D, 8])  # fmt: skip
        q_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=1)
        ds_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=1)

        pid_bh, b, h, start_m, steps = _query_block(H, Lk, GROUP, BLOCK_M, BLOCK_N, CAUSAL)
        q_row, q_col = _head_at(b, h, q_rb, q_rh, q_ch)
        do_row, do_col = _head_at(b, h, do_rb, do_rh, do_ch)
        q, do = _operands(Qd, DOd, [q_row + start_m, q_col], [do_row + start_m, do_col], q_layout)

        k_s = gl.allocate_shared_memory(Kd.dtype, [STAGES, BLOCK_N, HEAD_D], Kd.layout)
        v_s = gl.allocate_shared_memory(Vd.dtype, [STAGES, BLOCK_N, HEAD_D], Vd.layout)
        if TRANS:
            kx = gl.allocate_shared_memory(gl.float32, [HEAD_D, BLOCK_N], _xt_layout(BLOCK_N))
        else:
            kt_s = gl.allocate_shared_memory(KTd.dtype, [STAGES, HEAD_D, BLOCK_N], KTd.layout)
            kx = kt_s  # unused
        bars = _barriers(STAGES)
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
                              SQUARED, False, ASYNC, TRANS)  # fmt: skip
            for j in range(n_full, steps):
                dq = _dq_step(dq, q, do, zero, j, ring, offs_m, scale, s_layout, ds_layout, BLOCK_N, STAGES,
                              SQUARED, True, ASYNC, TRANS)  # fmt: skip
        else:
            for j in range(steps):
                dq = _dq_step(dq, q, do, zero, j, ring, offs_m, scale, s_layout, ds_layout, BLOCK_N, STAGES,
                              SQUARED, False, ASYNC, TRANS)  # fmt: skip

        _release(bars, STAGES)
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
                   TRANS: gl.constexpr):  # fmt: skip
        """Query block ``first + j`` of the dK/dV kernel: the block's scores and ``dp`` transposed,
        ``dv += p^T @ dout`` and ``dk += ds^T @ q`` (dout's and q's copies; where TRANS, q's and dout's
        tiles transposed into ``qx`` and ``dox`` while the scores run); then its buffers take query block
        ``first + j + STAGES``."""
        descs, bars, bufs, q_row, q_col, do_row, do_col, t_row, first, steps, qx, dox = ring
        slot = j % STAGES
        mbarrier.wait(bars.index(slot), (j // STAGES) & 1)
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
        TRANS: gl.constexpr,  # q's and dout's tiles transposed in shared memory: no copies
        # (QTd, DOTd unused)
        SIGNAL: gl.constexpr,  # not a dependent launch, but the dQ kernel after it is (ops._runtime.pdl)
    ):  # fmt: skip
        WARPS: gl.constexpr = gl.num_warps()
        st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                            instr_shape=[16, BLOCK_M, 8])  # fmt: skip
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                           instr_shape=[16, HEAD_D, 8])  # fmt: skip
        k_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=st_layout, k_width=1)
        pt_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=1)

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
        k, v = _operands(Kd, Vd, [k_row + start_n, k_col], [v_row + start_n, v_col], k_layout)

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
        bars = _barriers(STAGES)
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
                                    STAGES, SQUARED, True, ASYNC, TRANS)  # fmt: skip
            for j in range(n_diag, steps):
                dk, dv = _dkdv_step(dk, dv, k, v, zero, j, ring, offs_n, scale, st_layout, pt_layout, BLOCK_M,
                                    STAGES, SQUARED, False, ASYNC, TRANS)  # fmt: skip
        else:
            for j in range(steps):
                dk, dv = _dkdv_step(dk, dv, k, v, zero, j, ring, offs_n, scale, st_layout, pt_layout, BLOCK_M,
                                    STAGES, SQUARED, False, ASYNC, TRANS)  # fmt: skip

        _release(bars, STAGES)
        offs_d = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, o_layout))
        rows = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, o_layout))
        dk_ptrs = DK + b.to(gl.int64) * stride_dkb + h.to(gl.int64) * stride_dkh + rows[:, None] * stride_dkl
        dv_ptrs = DV + b.to(gl.int64) * stride_dvb + h.to(gl.int64) * stride_dvh + rows[:, None] * stride_dvl
        gl.store(dk_ptrs + offs_d[None, :], dk * relu_scale)
        gl.store(dv_ptrs + offs_d[None, :], dv * relu_scale)
