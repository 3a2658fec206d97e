"""The attention forward in Triton: a pointer kernel (any strides, masked tails) and a descriptor kernel."""

from __future__ import annotations

import triton
import triton.language as tl

from .._runtime import pdl as _gdc
from .kernels_common import _act, _block_order, _dot, _dot_acc, _relu_to_bf16, _tile


@triton.jit
def _fwd_range(
    acc,
    q,  # (BLOCK_M, HEAD_D) query tile
    K,  # key base of this (batch, head); rows stride_kl apart
    V,  # value base of this (batch, head); element (n, d) at V + n*stride_vl + d*stride_vd
    stride_kl,
    stride_vl,
    stride_vd,
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
    RELU_CVT: tl.constexpr = False,  # p = _relu_to_bf16(s), unscaled (the caller scales the output)
):
    offs_d = tl.arange(0, HEAD_D)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if MASK_N:
            kt = tl.load(
                K + offs_n[None, :] * stride_kl + offs_d[:, None], mask=offs_n[None, :] < Lk, other=0.0
            )
            v = tl.load(
                V + offs_n[:, None] * stride_vl + offs_d[None, :] * stride_vd,
                mask=offs_n[:, None] < Lk,
                other=0.0,
            )
        else:
            kt = tl.load(K + offs_n[None, :] * stride_kl + offs_d[:, None])
            v = tl.load(V + offs_n[:, None] * stride_vl + offs_d[None, :] * stride_vd)
        # padded keys load as 0: their score is 0, their p is 0
        if RELU_CVT:
            p = _relu_to_bf16(_dot(q, kt, UPCAST))
        else:
            p = _act(_dot(q, kt, UPCAST), scale, SQUARED)
        if CAUSAL_MASK:
            p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
        acc = _dot_acc(p.to(v.dtype), v, acc, UPCAST)
    return acc


@triton.jit
def _fwd_tile(Q, K, V, O, stride_ql, stride_kl, stride_vl, stride_vd, stride_ol, pid_m, Lq, Lk, scale,
              relu_scale, HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, SQUARED: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
              IS_FP64: tl.constexpr, UPCAST: tl.constexpr, RELU_CVT: tl.constexpr,
              PEEL: tl.constexpr):  # fmt: skip
    """Query block ``pid_m`` of one (batch, head): Q, K, V, O point at that pair's rows."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    q_ptrs = Q + offs_m[:, None] * stride_ql + offs_d[None, :]
    if EVEN_M:
        q = tl.load(q_ptrs)
    else:
        q = tl.load(q_ptrs, mask=offs_m[:, None] < Lq, other=0.0)
    acc = tl.zeros([BLOCK_M, HEAD_D], dtype=tl.float64 if IS_FP64 else tl.float32)
    if CAUSAL:
        # keys [0, pid_m*BLOCK_M) are visible to every row: no mask; then the diagonal blocks
        diag = pid_m * BLOCK_M
        acc = _fwd_range(acc, q, K, V, stride_kl, stride_vl, stride_vd, offs_m, 0, diag, Lk, scale,
                         BLOCK_N, HEAD_D, False, False, SQUARED, UPCAST, RELU_CVT)  # fmt: skip
        hi = tl.minimum(diag + BLOCK_M, Lk)
        acc = _fwd_range(acc, q, K, V, stride_kl, stride_vl, stride_vd, offs_m, diag, hi, Lk, scale,
                         BLOCK_N, HEAD_D, True, not EVEN_N, SQUARED, UPCAST, RELU_CVT)  # fmt: skip
    else:
        first = 0
        if PEEL:  # see _peel
            first = tl.minimum(BLOCK_N, Lk)
            acc = _fwd_range(acc, q, K, V, stride_kl, stride_vl, stride_vd, offs_m, 0, first, Lk, scale,
                             BLOCK_N, HEAD_D, False, not EVEN_N, SQUARED, UPCAST, RELU_CVT)  # fmt: skip
        acc = _fwd_range(acc, q, K, V, stride_kl, stride_vl, stride_vd, offs_m, first, Lk, Lk, scale,
                         BLOCK_N, HEAD_D, False, not EVEN_N, SQUARED, UPCAST, RELU_CVT)  # fmt: skip
    if RELU_CVT:
        relu_scale = relu_scale * scale
    out = (acc * relu_scale).to(O.dtype.element_ty)
    o_ptrs = O + offs_m[:, None] * stride_ol + offs_d[None, :]
    if EVEN_M:
        tl.store(o_ptrs, out)
    else:
        tl.store(o_ptrs, out, mask=offs_m[:, None] < Lq)


@triton.jit
def _relu_attn_fwd_kernel(
    Q,  # (B, H, Lq, HEAD_D) through strides stride_qb, stride_qh, stride_ql; unit stride on D
    K,  # (B, H, Lk, HEAD_D)
    V,  # (B, H, Lk, HEAD_D): unit stride on D, or on L (a transposed copy, for float32: see the launcher)
    O,  # out, (B, H, Lq, HEAD_D)
    stride_qb, stride_qh, stride_ql,
    stride_kb, stride_kh, stride_kl,
    stride_vb, stride_vh, stride_vl, stride_vd,
    stride_ob, stride_oh, stride_ol,
    H, Lq, Lk,
    scale,
    relu_scale,
    HEAD_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    SQUARED: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    IS_FP64: tl.constexpr,
    UPCAST: tl.constexpr,
    RELU_CVT: tl.constexpr = False,  # bf16, not squared, compiled: see _relu_to_bf16
    PEEL: tl.constexpr = False,  # non-causal: the first key block in a loop of its own (see _peel)
    FOLD: tl.constexpr = False,  # causal: each program takes query blocks n-1-x and x (see _fold)
    WAIT: tl.constexpr = False,  # a dependent launch after v's copy: wait for it first (_gdc)
):  # fmt: skip
    _gdc.wait_for_previous(WAIT)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    Q += b * stride_qb + h * stride_qh
    K += b * stride_kb + h * stride_kh
    V += b * stride_vb + h * stride_vh
    O += b * stride_ob + h * stride_oh
    if FOLD:
        pid_m = tl.cdiv(Lq, BLOCK_M) - 1 - tl.program_id(0)
    else:
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # heaviest (causal) query blocks first
    _fwd_tile(Q, K, V, O, stride_ql, stride_kl, stride_vl, stride_vd, stride_ol, pid_m, Lq, Lk, scale,
              relu_scale, HEAD_D, BLOCK_M, BLOCK_N, CAUSAL, SQUARED, EVEN_M, EVEN_N, IS_FP64, UPCAST,
              RELU_CVT, PEEL)  # fmt: skip
    if FOLD:
        if tl.program_id(0) < pid_m:  # the light block paired with this heavy one (none for the middle)
            _fwd_tile(Q, K, V, O, stride_ql, stride_kl, stride_vl, stride_vd, stride_ol, tl.program_id(0), Lq,
                      Lk, scale, relu_scale, HEAD_D, BLOCK_M, BLOCK_N, CAUSAL, SQUARED, EVEN_M, EVEN_N,
                      IS_FP64, UPCAST, RELU_CVT, PEEL)  # fmt: skip

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
def _fwd_tma_range(acc, q, Kd, Vd, b, h, offs_m, lo, hi, scale, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr,
                   CAUSAL_MASK: tl.constexpr, SQUARED: tl.constexpr, RELU_CVT: tl.constexpr):  # fmt: skip
    for start_n in range(lo, hi, BLOCK_N):
        k = _tile(Kd, b, h, start_n, BLOCK_N, HEAD_D)
        if RELU_CVT:
            p = _relu_to_bf16(tl.dot(q, k.T))
        else:
            p = _act(tl.dot(q, k.T), scale, SQUARED)
        if CAUSAL_MASK:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
        v = _tile(Vd, b, h, start_n, BLOCK_N, HEAD_D)
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc


@triton.jit
def _relu_attn_fwd_tma_kernel(
    Qd, Kd, Vd, Od,  # rank-4 descriptors over [B, H, L, HEAD_D]: boxes [1, 1, BLOCK_M or BLOCK_N, HEAD_D]
    H, Lk, scale, relu_scale,
    GROUP, FIRST,  # the program order where GROUPED (_block_order, _causal_order)
    HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    SQUARED: tl.constexpr, RELU_CVT: tl.constexpr = False,  # see the pointer kernel
    GROUPED: tl.constexpr = False,  # causal: the last pairs' blocks in one group (_causal_order)
):  # fmt: skip
    if GROUPED:
        pid_m, pid_bh = _block_order(GROUP, FIRST)
    else:
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # heaviest (causal) query blocks first
        pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = _tile(Qd, b, h, start_m, BLOCK_M, HEAD_D)
    acc = tl.zeros([BLOCK_M, HEAD_D], dtype=tl.float32)
    if CAUSAL:
        acc = _fwd_tma_range(acc, q, Kd, Vd, b, h, offs_m, 0, start_m, scale, BLOCK_N, HEAD_D, False,
                             SQUARED, RELU_CVT)  # fmt: skip
        acc = _fwd_tma_range(acc, q, Kd, Vd, b, h, offs_m, start_m, tl.minimum(start_m + BLOCK_M, Lk), scale,
                             BLOCK_N, HEAD_D, True, SQUARED, RELU_CVT)  # fmt: skip
    else:
        acc = _fwd_tma_range(acc, q, Kd, Vd, b, h, offs_m, 0, Lk, scale, BLOCK_N, HEAD_D, False, SQUARED,
                             RELU_CVT)  # fmt: skip
    if RELU_CVT:
        relu_scale = relu_scale * scale
    Od.store([b, h, start_m, 0], (acc * relu_scale).to(Od.dtype).reshape([1, 1, BLOCK_M, HEAD_D]))
