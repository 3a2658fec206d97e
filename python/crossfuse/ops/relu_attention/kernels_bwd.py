"""The attention backward in Triton: the dK/dV and dQ kernels, with pointers and with tensor descriptors."""

from __future__ import annotations

import triton
import triton.language as tl

from .._runtime import pdl as _gdc
from .kernels_common import _dot, _dot_acc, _dscores, _relu_to_bf16, _tile


@triton.jit
def _dkdv_range(
    dk,
    dv,
    k,  # (BLOCK_N, HEAD_D) key tile
    v,  # (BLOCK_N, HEAD_D) value tile
    Q,  # query base of this (batch, head)
    DO,  # output-gradient base of this (batch, head)
    QC,  # with TRANS_COPIES: q and dout again, element (m, d) at QC + m + d*stride_qcd: queries
    DOC,  # contiguous, the layout tf32 tensor cores read for the products that sum over queries
    stride_ql,
    stride_dol,
    stride_qcd,
    stride_docd,
    offs_n,
    lo,
    hi,
    Lq,
    scale,
    BLOCK_M: tl.constexpr,
    HEAD_D: tl.constexpr,
    CAUSAL_MASK: tl.constexpr,
    MASK_M: tl.constexpr,
    SQUARED: tl.constexpr,
    UPCAST: tl.constexpr,
    TRANS_COPIES: tl.constexpr,
    RELU_CVT: tl.constexpr = False,  # p by _relu_to_bf16, ds without the scale (the caller applies it)
):
    offs_d = tl.arange(0, HEAD_D)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        if MASK_M:
            qt = tl.load(
                Q + offs_m[None, :] * stride_ql + offs_d[:, None], mask=offs_m[None, :] < Lq, other=0.0
            )
            do = tl.load(
                DO + offs_m[:, None] * stride_dol + offs_d[None, :], mask=offs_m[:, None] < Lq, other=0.0
            )
        else:
            qt = tl.load(Q + offs_m[None, :] * stride_ql + offs_d[:, None])
            do = tl.load(DO + offs_m[:, None] * stride_dol + offs_d[None, :])
        st = _dot(k, qt, UPCAST)  # (BLOCK_N, BLOCK_M): scores transposed
        dpt = _dot(v, tl.trans(do), UPCAST)  # (dout @ v^T)^T
        if RELU_CVT:
            dst = tl.where(st > 0.0, dpt, 0.0)
            pt = _relu_to_bf16(st)
        elif SQUARED:  # _act and _dscores written out: the helpers would reorder the compiled instructions
            at = tl.maximum(st * scale, 0.0, propagate_nan=tl.PropagateNan.ALL)
            dst = dpt * (2.0 * scale) * at
            pt = at * at
        else:
            at = tl.maximum(st * scale, 0.0, propagate_nan=tl.PropagateNan.ALL)
            dst = tl.where(st > 0.0, dpt * scale, 0.0)
            pt = at
        if CAUSAL_MASK:
            visible = offs_m[None, :] >= offs_n[:, None]
            pt = tl.where(visible, pt, 0.0)
            dst = tl.where(visible, dst, 0.0)
        if TRANS_COPIES:
            if MASK_M:
                q_mk = tl.load(QC + offs_m[:, None] + offs_d[None, :] * stride_qcd, mask=offs_m[:, None] < Lq,
                               other=0.0)  # fmt: skip
                do_mk = tl.load(DOC + offs_m[:, None] + offs_d[None, :] * stride_docd,
                                mask=offs_m[:, None] < Lq, other=0.0)  # fmt: skip
            else:
                q_mk = tl.load(QC + offs_m[:, None] + offs_d[None, :] * stride_qcd)
                do_mk = tl.load(DOC + offs_m[:, None] + offs_d[None, :] * stride_docd)
        else:
            q_mk = tl.trans(qt)
            do_mk = do
        dv = _dot_acc(pt.to(do.dtype), do_mk, dv, UPCAST)
        dk = _dot_acc(dst.to(qt.dtype), q_mk, dk, UPCAST)
    return dk, dv


@triton.jit
def _dkdv_tile(Q, K, V, DO, DK, DV, QC, DOC, stride_ql, stride_kl, stride_vl, stride_dol, stride_dkl,
               stride_dvl, stride_qcd, stride_docd, pid_n, Lq, Lk, scale, relu_scale, HEAD_D: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, SQUARED: tl.constexpr,
               EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, IS_FP64: tl.constexpr, UPCAST: tl.constexpr,
               TRANS_COPIES: tl.constexpr, RELU_CVT: tl.constexpr, PEEL: tl.constexpr):  # fmt: skip
    """Key block ``pid_n`` of one (batch, head): the pointers point at that pair's rows."""
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_D)
    if EVEN_N:
        k = tl.load(K + offs_n[:, None] * stride_kl + offs_d[None, :])
        v = tl.load(V + offs_n[:, None] * stride_vl + offs_d[None, :])
    else:
        k = tl.load(K + offs_n[:, None] * stride_kl + offs_d[None, :], mask=offs_n[:, None] < Lk, other=0.0)
        v = tl.load(V + offs_n[:, None] * stride_vl + offs_d[None, :], mask=offs_n[:, None] < Lk, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_D], dtype=tl.float64 if IS_FP64 else tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_D], dtype=tl.float64 if IS_FP64 else tl.float32)
    if CAUSAL:
        # queries [start, start+BLOCK_N) straddle the diagonal: mask; later queries see all keys
        start = pid_n * BLOCK_N
        mid = tl.minimum(start + BLOCK_N, Lq)
        dk, dv = _dkdv_range(dk, dv, k, v, Q, DO, QC, DOC, stride_ql, stride_dol, stride_qcd, stride_docd,
                             offs_n, start, mid, Lq, scale, BLOCK_M, HEAD_D, True, not EVEN_M, SQUARED,
                             UPCAST, TRANS_COPIES, RELU_CVT)  # fmt: skip
        dk, dv = _dkdv_range(dk, dv, k, v, Q, DO, QC, DOC, stride_ql, stride_dol, stride_qcd, stride_docd,
                             offs_n, mid, Lq, Lq, scale, BLOCK_M, HEAD_D, False, not EVEN_M, SQUARED, UPCAST,
                             TRANS_COPIES, RELU_CVT)  # fmt: skip
    else:
        first = 0
        if PEEL:  # see _peel
            first = tl.minimum(BLOCK_M, Lq)
            dk, dv = _dkdv_range(dk, dv, k, v, Q, DO, QC, DOC, stride_ql, stride_dol, stride_qcd, stride_docd,
                                 offs_n, 0, first, Lq, scale, BLOCK_M, HEAD_D, False, not EVEN_M, SQUARED,
                                 UPCAST, TRANS_COPIES, RELU_CVT)  # fmt: skip
        dk, dv = _dkdv_range(dk, dv, k, v, Q, DO, QC, DOC, stride_ql, stride_dol, stride_qcd, stride_docd,
                             offs_n, first, Lq, Lq, scale, BLOCK_M, HEAD_D, False, not EVEN_M, SQUARED,
                             UPCAST, TRANS_COPIES, RELU_CVT)  # fmt: skip
    if RELU_CVT:
        relu_scale = relu_scale * scale
    dk_ptrs = DK + offs_n[:, None] * stride_dkl + offs_d[None, :]
    dv_ptrs = DV + offs_n[:, None] * stride_dvl + offs_d[None, :]
    if EVEN_N:
        tl.store(dk_ptrs, (dk * relu_scale).to(DK.dtype.element_ty))
        tl.store(dv_ptrs, (dv * relu_scale).to(DV.dtype.element_ty))
    else:
        tl.store(dk_ptrs, (dk * relu_scale).to(DK.dtype.element_ty), mask=offs_n[:, None] < Lk)
        tl.store(dv_ptrs, (dv * relu_scale).to(DV.dtype.element_ty), mask=offs_n[:, None] < Lk)


@triton.jit
def _relu_attn_bwd_dkdv_kernel(
    Q, K, V, DO,  # (B, H, L, HEAD_D) each, through strides; unit stride on D
    DK, DV,  # out, (B, H, Lk, HEAD_D)
    QC, DOC,  # with TRANS_COPIES: copies of q and dout with unit stride on L (else q, dout again, unused)
    stride_qb, stride_qh, stride_ql,
    stride_kb, stride_kh, stride_kl,
    stride_vb, stride_vh, stride_vl,
    stride_dob, stride_doh, stride_dol,
    stride_dkb, stride_dkh, stride_dkl,
    stride_dvb, stride_dvh, stride_dvl,
    stride_qcb, stride_qch, stride_qcd,
    stride_docb, stride_doch, stride_docd,
    H, Lq, Lk,
    scale,
    relu_scale,
    HEAD_D: tl.constexpr,
    BLOCK_M: tl.constexpr,  # query rows per step
    BLOCK_N: tl.constexpr,  # keys owned by a program
    CAUSAL: tl.constexpr,
    SQUARED: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    IS_FP64: tl.constexpr,
    UPCAST: tl.constexpr,
    TRANS_COPIES: tl.constexpr,
    GDC: tl.constexpr = False,  # grid dependency control: the dQ kernel may start as this one ends
    RELU_CVT: tl.constexpr = False,  # bf16, not squared, compiled: see _relu_to_bf16
    PEEL: tl.constexpr = False,  # non-causal: the first query block in a loop of its own (see _peel)
    FOLD: tl.constexpr = False,  # causal: each program takes key blocks x and n-1-x (see _fold)
    WAIT: tl.constexpr = False,  # a dependent launch after the copies: wait for them first (_gdc)
):  # fmt: skip
    # waits before it signals: the dQ kernel, which reads k's copy, then starts after the copies completed
    _gdc.wait_for_previous(WAIT)
    _gdc.launch_dependents(GDC)
    pid_n = tl.program_id(0)  # causal: low key blocks see the most queries; they go first
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    Q += b * stride_qb + h * stride_qh
    K += b * stride_kb + h * stride_kh
    V += b * stride_vb + h * stride_vh
    DO += b * stride_dob + h * stride_doh
    DK += b * stride_dkb + h * stride_dkh
    DV += b * stride_dvb + h * stride_dvh
    QC += b * stride_qcb + h * stride_qch
    DOC += b * stride_docb + h * stride_doch
    _dkdv_tile(Q, K, V, DO, DK, DV, QC, DOC, stride_ql, stride_kl, stride_vl, stride_dol, stride_dkl,
               stride_dvl, stride_qcd, stride_docd, pid_n, Lq, Lk, scale, relu_scale, HEAD_D, BLOCK_M,
               BLOCK_N, CAUSAL, SQUARED, EVEN_M, EVEN_N, IS_FP64, UPCAST, TRANS_COPIES, RELU_CVT,
               PEEL)  # fmt: skip
    if FOLD:
        light = tl.cdiv(Lk, BLOCK_N) - 1 - pid_n
        if light > pid_n:  # the light block paired with this heavy one (none for the middle)
            _dkdv_tile(Q, K, V, DO, DK, DV, QC, DOC, stride_ql, stride_kl, stride_vl, stride_dol, stride_dkl,
                       stride_dvl, stride_qcd, stride_docd, light, Lq, Lk, scale, relu_scale, HEAD_D, BLOCK_M,
                       BLOCK_N, CAUSAL, SQUARED, EVEN_M, EVEN_N, IS_FP64, UPCAST, TRANS_COPIES, RELU_CVT,
                       PEEL)  # fmt: skip


@triton.jit
def _dq_range(
    dq,
    q,  # (BLOCK_M, HEAD_D) query tile
    do,  # (BLOCK_M, HEAD_D) output-gradient tile
    K,
    V,
    KC,  # with TRANS_COPIES: k again, element (n, d) at KC + n + d*stride_kcd (keys contiguous)
    stride_kl,
    stride_vl,
    stride_kcd,
    offs_m,
    lo,
    hi,
    Lk,
    scale,
    BLOCK_N: tl.constexpr,
    HEAD_D: tl.constexpr,
    CAUSAL_MASK: tl.constexpr,
    MASK_N: tl.constexpr,
    SQUARED: tl.constexpr,
    UPCAST: tl.constexpr,
    TRANS_COPIES: tl.constexpr,
    RELU_CVT: tl.constexpr = False,  # ds without the scale (the caller applies it)
):
    offs_d = tl.arange(0, HEAD_D)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if MASK_N:
            kt = tl.load(
                K + offs_n[None, :] * stride_kl + offs_d[:, None], mask=offs_n[None, :] < Lk, other=0.0
            )
            vt = tl.load(
                V + offs_n[None, :] * stride_vl + offs_d[:, None], mask=offs_n[None, :] < Lk, other=0.0
            )
        else:
            kt = tl.load(K + offs_n[None, :] * stride_kl + offs_d[:, None])
            vt = tl.load(V + offs_n[None, :] * stride_vl + offs_d[:, None])
        if RELU_CVT:
            ds = tl.where(_dot(q, kt, UPCAST) > 0.0, _dot(do, vt, UPCAST), 0.0)
        else:
            ds = _dscores(_dot(q, kt, UPCAST), _dot(do, vt, UPCAST), scale, SQUARED)
        if CAUSAL_MASK:
            ds = tl.where(offs_m[:, None] >= offs_n[None, :], ds, 0.0)
        if TRANS_COPIES:
            if MASK_N:
                k_nk = tl.load(KC + offs_n[:, None] + offs_d[None, :] * stride_kcd, mask=offs_n[:, None] < Lk,
                               other=0.0)  # fmt: skip
            else:
                k_nk = tl.load(KC + offs_n[:, None] + offs_d[None, :] * stride_kcd)
        else:
            k_nk = tl.trans(kt)
        dq = _dot_acc(ds.to(kt.dtype), k_nk, dq, UPCAST)
    return dq


@triton.jit
def _dq_tile(Q, K, V, DO, DQ, KC, stride_ql, stride_kl, stride_vl, stride_dol, stride_dql, stride_kcd, pid_m,
             Lq, Lk, scale, relu_scale, HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             CAUSAL: tl.constexpr, SQUARED: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
             IS_FP64: tl.constexpr, UPCAST: tl.constexpr, TRANS_COPIES: tl.constexpr, RELU_CVT: tl.constexpr,
             PEEL: tl.constexpr):  # fmt: skip
    """Query block ``pid_m`` of one (batch, head): the pointers point at that pair's rows."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    if EVEN_M:
        q = tl.load(Q + offs_m[:, None] * stride_ql + offs_d[None, :])
        do = tl.load(DO + offs_m[:, None] * stride_dol + offs_d[None, :])
    else:
        q = tl.load(Q + offs_m[:, None] * stride_ql + offs_d[None, :], mask=offs_m[:, None] < Lq, other=0.0)
        do = tl.load(
            DO + offs_m[:, None] * stride_dol + offs_d[None, :], mask=offs_m[:, None] < Lq, other=0.0
        )
    dq = tl.zeros([BLOCK_M, HEAD_D], dtype=tl.float64 if IS_FP64 else tl.float32)
    if CAUSAL:
        diag = pid_m * BLOCK_M
        dq = _dq_range(dq, q, do, K, V, KC, stride_kl, stride_vl, stride_kcd, offs_m, 0, diag, Lk, scale,
                       BLOCK_N, HEAD_D, False, False, SQUARED, UPCAST, TRANS_COPIES, RELU_CVT)  # fmt: skip
        hi = tl.minimum(diag + BLOCK_M, Lk)
        dq = _dq_range(dq, q, do, K, V, KC, stride_kl, stride_vl, stride_kcd, offs_m, diag, hi, Lk, scale,
                       BLOCK_N, HEAD_D, True, not EVEN_N, SQUARED, UPCAST, TRANS_COPIES,
                       RELU_CVT)  # fmt: skip
    else:
        first = 0
        if PEEL:  # see _peel
            first = tl.minimum(BLOCK_N, Lk)
            dq = _dq_range(dq, q, do, K, V, KC, stride_kl, stride_vl, stride_kcd, offs_m, 0, first, Lk, scale,
                           BLOCK_N, HEAD_D, False, not EVEN_N, SQUARED, UPCAST, TRANS_COPIES,
                           RELU_CVT)  # fmt: skip
        dq = _dq_range(dq, q, do, K, V, KC, stride_kl, stride_vl, stride_kcd, offs_m, first, Lk, Lk, scale,
                       BLOCK_N, HEAD_D, False, not EVEN_N, SQUARED, UPCAST, TRANS_COPIES,
                       RELU_CVT)  # fmt: skip
    if RELU_CVT:
        relu_scale = relu_scale * scale
    dq_ptrs = DQ + offs_m[:, None] * stride_dql + offs_d[None, :]
    if EVEN_M:
        tl.store(dq_ptrs, (dq * relu_scale).to(DQ.dtype.element_ty))
    else:
        tl.store(dq_ptrs, (dq * relu_scale).to(DQ.dtype.element_ty), mask=offs_m[:, None] < Lq)


@triton.jit
def _relu_attn_bwd_dq_kernel(
    Q, K, V, DO,  # (B, H, L, HEAD_D) each, through strides; unit stride on D
    DQ,  # out, (B, H, Lq, HEAD_D)
    KC,  # with TRANS_COPIES: a copy of k with unit stride on L (else k again, unused)
    stride_qb, stride_qh, stride_ql,
    stride_kb, stride_kh, stride_kl,
    stride_vb, stride_vh, stride_vl,
    stride_dob, stride_doh, stride_dol,
    stride_dqb, stride_dqh, stride_dql,
    stride_kcb, stride_kch, stride_kcd,
    H, Lq, Lk,
    scale,
    relu_scale,
    HEAD_D: tl.constexpr,
    BLOCK_M: tl.constexpr,  # queries owned by a program
    BLOCK_N: tl.constexpr,  # keys per step
    CAUSAL: tl.constexpr,
    SQUARED: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    IS_FP64: tl.constexpr,
    UPCAST: tl.constexpr,
    TRANS_COPIES: tl.constexpr,
    GDC: tl.constexpr = False,  # a dependent launch after the dK/dV kernel: wait for it at the end
    RELU_CVT: tl.constexpr = False,  # as the dK/dV kernel's
    PEEL: tl.constexpr = False,  # non-causal: the first key block in a loop of its own (see _peel)
    FOLD: tl.constexpr = False,  # causal: each program takes query blocks n-1-x and x (see _fold)
):  # fmt: skip
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    Q += b * stride_qb + h * stride_qh
    K += b * stride_kb + h * stride_kh
    V += b * stride_vb + h * stride_vh
    DO += b * stride_dob + h * stride_doh
    DQ += b * stride_dqb + h * stride_dqh
    KC += b * stride_kcb + h * stride_kch
    if FOLD:
        pid_m = tl.cdiv(Lq, BLOCK_M) - 1 - tl.program_id(0)
    else:
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # heaviest (causal) query blocks first
    _dq_tile(Q, K, V, DO, DQ, KC, stride_ql, stride_kl, stride_vl, stride_dol, stride_dql, stride_kcd, pid_m,
             Lq, Lk, scale, relu_scale, HEAD_D, BLOCK_M, BLOCK_N, CAUSAL, SQUARED, EVEN_M, EVEN_N, IS_FP64,
             UPCAST, TRANS_COPIES, RELU_CVT, PEEL)  # fmt: skip
    if FOLD:
        if tl.program_id(0) < pid_m:  # the light block paired with this heavy one (none for the middle)
            _dq_tile(Q, K, V, DO, DQ, KC, stride_ql, stride_kl, stride_vl, stride_dol, stride_dql, stride_kcd,
                     tl.program_id(0), Lq, Lk, scale, relu_scale, HEAD_D, BLOCK_M, BLOCK_N, CAUSAL, SQUARED,
                     EVEN_M, EVEN_N, IS_FP64, UPCAST, TRANS_COPIES, RELU_CVT, PEEL)  # fmt: skip
    _gdc.wait_for_previous(GDC)  # complete after the dK/dV kernel (whose results this one does not read)

# ----------------------------------------------------------------------------------------------------
# The same kernels reading and writing through tensor descriptors (TMA on Hopper and later)
#
# Each [B, H, L, D] tensor is a rank-4 descriptor over its own strides, a tile a [1, 1, rows, D] box.
# The copy engine fills rows past L with zeros and clips stores there, so the tails need no masks: a
# zero query or key row scores 0, and relu(0) = 0 adds nothing (the same reason the pointer kernels can
# load padding as 0). (Triton 3.6's warp specialization of these loops on Hopper gave wrong forward
# outputs and failed to compile causal kernels.)
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _dkdv_tma_range(dk, dv, k, v, Qd, DOd, b, h, offs_n, lo, hi, scale, BLOCK_M: tl.constexpr,
                    HEAD_D: tl.constexpr, CAUSAL_MASK: tl.constexpr, SQUARED: tl.constexpr,
                    RELU_CVT: tl.constexpr):  # fmt: skip
    for start_m in range(lo, hi, BLOCK_M):
        q = _tile(Qd, b, h, start_m, BLOCK_M, HEAD_D)
        do = _tile(DOd, b, h, start_m, BLOCK_M, HEAD_D)
        st = tl.dot(k, q.T)  # (BLOCK_N, BLOCK_M): scores transposed
        dpt = tl.dot(v, do.T)  # (dout @ v^T)^T
        if RELU_CVT:  # as in _dkdv_range
            dst = tl.where(st > 0.0, dpt, 0.0)
            pt = _relu_to_bf16(st)
        elif SQUARED:
            at = tl.maximum(st * scale, 0.0, propagate_nan=tl.PropagateNan.ALL)
            dst = dpt * (2.0 * scale) * at
            pt = at * at
        else:
            at = tl.maximum(st * scale, 0.0, propagate_nan=tl.PropagateNan.ALL)
            dst = tl.where(st > 0.0, dpt * scale, 0.0)
            pt = at
        if CAUSAL_MASK:
            offs_m = start_m + tl.arange(0, BLOCK_M)
            visible = offs_m[None, :] >= offs_n[:, None]
            pt = tl.where(visible, pt, 0.0)
            dst = tl.where(visible, dst, 0.0)
        dv = tl.dot(pt.to(do.dtype), do, dv)
        dk = tl.dot(dst.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def _relu_attn_bwd_dkdv_tma_kernel(
    Qd, Kd, Vd, DOd, DKd, DVd,  # rank-4 descriptors over [B, H, L, HEAD_D]
    H, Lq, scale, relu_scale,
    HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    SQUARED: tl.constexpr,
    GDC: tl.constexpr = False,  # grid dependency control: the dQ kernel may start as this one ends
    RELU_CVT: tl.constexpr = False,  # see the pointer kernel
):  # fmt: skip
    _gdc.launch_dependents(GDC)
    pid_n = tl.program_id(0)  # causal: low key blocks see the most queries; they go first
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = _tile(Kd, b, h, start_n, BLOCK_N, HEAD_D)
    v = _tile(Vd, b, h, start_n, BLOCK_N, HEAD_D)
    dk = tl.zeros([BLOCK_N, HEAD_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_D], dtype=tl.float32)
    if CAUSAL:
        mid = tl.minimum(start_n + BLOCK_N, Lq)
        dk, dv = _dkdv_tma_range(dk, dv, k, v, Qd, DOd, b, h, offs_n, start_n, mid, scale, BLOCK_M, HEAD_D,
                                 True, SQUARED, RELU_CVT)  # fmt: skip
        dk, dv = _dkdv_tma_range(dk, dv, k, v, Qd, DOd, b, h, offs_n, mid, Lq, scale, BLOCK_M, HEAD_D, False,
                                 SQUARED, RELU_CVT)  # fmt: skip
    else:
        dk, dv = _dkdv_tma_range(dk, dv, k, v, Qd, DOd, b, h, offs_n, 0, Lq, scale, BLOCK_M, HEAD_D, False,
                                 SQUARED, RELU_CVT)  # fmt: skip
    if RELU_CVT:
        relu_scale = relu_scale * scale
    DKd.store([b, h, start_n, 0], (dk * relu_scale).to(DKd.dtype).reshape([1, 1, BLOCK_N, HEAD_D]))
    DVd.store([b, h, start_n, 0], (dv * relu_scale).to(DVd.dtype).reshape([1, 1, BLOCK_N, HEAD_D]))


@triton.jit
def _dq_tma_range(dq, q, do, Kd, Vd, b, h, offs_m, lo, hi, scale, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr,
                  CAUSAL_MASK: tl.constexpr, SQUARED: tl.constexpr, RELU_CVT: tl.constexpr):  # fmt: skip
    for start_n in range(lo, hi, BLOCK_N):
        k = _tile(Kd, b, h, start_n, BLOCK_N, HEAD_D)
        v = _tile(Vd, b, h, start_n, BLOCK_N, HEAD_D)
        if RELU_CVT:  # as in _dq_range
            ds = tl.where(tl.dot(q, k.T) > 0.0, tl.dot(do, v.T), 0.0)
        else:
            ds = _dscores(tl.dot(q, k.T), tl.dot(do, v.T), scale, SQUARED)
        if CAUSAL_MASK:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            ds = tl.where(offs_m[:, None] >= offs_n[None, :], ds, 0.0)
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def _relu_attn_bwd_dq_tma_kernel(
    Qd, Kd, Vd, DOd, DQd,  # rank-4 descriptors over [B, H, L, HEAD_D]
    H, Lk, scale, relu_scale,
    HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    SQUARED: tl.constexpr,
    GDC: tl.constexpr = False,  # a dependent launch after the dK/dV kernel: wait for it at the end
    RELU_CVT: tl.constexpr = False,  # see the pointer kernel
):  # fmt: skip
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = _tile(Qd, b, h, start_m, BLOCK_M, HEAD_D)
    do = _tile(DOd, b, h, start_m, BLOCK_M, HEAD_D)
    dq = tl.zeros([BLOCK_M, HEAD_D], dtype=tl.float32)
    if CAUSAL:
        dq = _dq_tma_range(dq, q, do, Kd, Vd, b, h, offs_m, 0, start_m, scale, BLOCK_N, HEAD_D, False,
                           SQUARED, RELU_CVT)  # fmt: skip
        dq = _dq_tma_range(dq, q, do, Kd, Vd, b, h, offs_m, start_m, tl.minimum(start_m + BLOCK_M, Lk), scale,
                           BLOCK_N, HEAD_D, True, SQUARED, RELU_CVT)  # fmt: skip
    else:
        dq = _dq_tma_range(dq, q, do, Kd, Vd, b, h, offs_m, 0, Lk, scale, BLOCK_N, HEAD_D, False, SQUARED,
                           RELU_CVT)  # fmt: skip
    if RELU_CVT:
        relu_scale = relu_scale * scale
    DQd.store([b, h, start_m, 0], (dq * relu_scale).to(DQd.dtype).reshape([1, 1, BLOCK_M, HEAD_D]))
    _gdc.wait_for_previous(GDC)  # complete after the dK/dV kernel (whose results this one does not read)
