"""ReLU attention in Triton, flash-style: forward and backward with no L x L tensor.

Formula (per batch and head; ``q`` is Lq x D, ``k`` and ``v`` are Lk x D)::

    s   = q @ k^T                                  (float32 accumulation)
    a   = relu(s * scale)                          scale = 1/sqrt(D) by default, must be > 0
    p   = a            or   a^2  (squared=True)
    p   = 0 where causal and key j > query i       (causal needs Lq == Lk)
    out = relu_scale * p @ v                       relu_scale = 1/Lk by default

Gradient (with ``dp = relu_scale * dout @ v^T``)::

    dv = relu_scale * p^T @ dout
    ds = dp * scale * [s > 0]         or   dp * 2 * a * scale   (squared)
    dq = ds @ k,   dk = ds^T @ q

relu's derivative at a score of exactly 0 is taken as 0 (torch's ``relu`` convention; masked and
padded scores are 0 and get no gradient). With ``squared`` the derivative at 0 is 0 either way.

Design: unlike softmax attention there is no running max and no normaliser, so a query block simply
accumulates ``p @ v`` over key blocks in float32 and scales once at the end. Grid = (query blocks,
batch*heads), heaviest causal blocks first; key/value blocks are streamed; causal blocks above the
diagonal are never visited (the loop bounds skip them), and only the diagonal blocks pay for the mask.
So that causal kernels do not end on heavy blocks started last, float32's give each program a heavy
block and its light mirror (``_fold``), and the 16-bit D=64 forward of long sequences takes its last
(batch, head) pairs as one group, heaviest blocks first (``_causal_order``).
The backward runs two kernels: dK/dV (a program owns a key block and streams query blocks) and dQ (a
program owns a query block and streams key blocks), recomputing the scores: no atomics, deterministic.
On compute capability 9+ the dQ kernel is a programmatic dependent launch: it starts on the SMs the
dK/dV kernel's last programs leave and waits for that kernel only at its end (``_gdc``).
On Hopper and later, where the tuned table says ``tma``, 16-bit tensors with 16-byte-aligned strides go
through copies of the three kernels that load and store through tensor descriptors (the copy engine, TMA;
see ``_tma_usable``): same math, tails zero-filled by the hardware instead of masked.
Compiled bfloat16 relu (not squared) rounds relu(s) to bf16 in one instruction per pair of scores
(``_relu_to_bf16``) and applies ``scale`` to the float32 accumulators instead (relu(s * scale) = scale *
relu(s) for scale > 0; ds likewise), 1.02-1.23x faster on the H200 than a multiply, a max and a convert
per score (bench/results/h200/NOTES.md, attention v16).
The float32 path uses tf32 tensor cores on GPUs (Triton's default for float32 dots); the products summed
over the sequence read copies of their operands with unit stride on L (v in the forward; q, dout, k in the
backward, made before both kernels, in one launch where Lq == Lk; see ``_tf32_copies``), one pass over
each, so float32 needs up to three extra input-sized buffers while the backward runs. On compute
capability 9+ the kernel after a copy (the forward; the dK/dV kernel) is a dependent launch that waits for
the copy at its start (attention v22). There, with Triton 3.6, the float32 forward is a Gluon kernel
(``_attn_tf32``, attention v26) that keeps q and p in registers as the products' left operands, which
Triton keeps in shared memory for 32-bit types, where lengths are multiples of its tiles (``TF32_FWD``);
so is the float32 backward (attention v27: k, v and the transposed p and ds of the dK/dV kernel, q, dout and
ds of the dQ kernel in registers; each product overlapping the elementwise work before the next; tiles
``TF32_BWD``). Their causal blocks start heaviest first across groups of heads (attention v30,
``_attn_tf32.head_group``). Where their entries say TRANS, the Gluon forward reads v itself and
transposes its tiles in shared memory instead of waiting for v's copy (attention v31; all but long
non-causal sequences), and so does the causal backward with q, dout and k (v32; sequences up to
``SHORT_L``): no copies there.
A call whose shapes, strides, dtypes, alignment, flags and tiles match an earlier call's replays that
call's launches (``_planned``, attention v24).
Under torch.compile the autograd function calls the launchers through custom operators
(``torch.ops.crossfuse.relu_attention_fwd``/``_bwd``, see ``_library``), which the tracer does not enter.

Limits: D in {16, 32, 64, 128, 256}; any Lq, Lk >= 1 (tails masked); Lq != Lk only when not causal;
float32, float16, bfloat16 (float64 only under the interpreter, for gradcheck); layouts ``"bhld"`` ([B, H,
L, D], SDPA's) and ``"blhd"`` ([B, L, H, D]) read through strides, no copies, as long as the last dim
is contiguous.
"""

from __future__ import annotations

import math
import threading
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable
from triton.runtime.errors import OutOfResources

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton before 3.4: the pointer kernels only
    TensorDescriptor = None

from .. import _tuning
from .._backend import check_runnable, interpreter_problem, is_interpreted, quiet_interpreter
from .._validate import (
    KERNEL_DTYPES,
    check_bool,
    check_positive_float,
    check_same_device,
    check_tensor,
    dtype_name,
)
from . import _attn_tf32, _library
from ._runtime import direct as _direct
from ._runtime import pdl as _gdc
from ._runtime.device import bind_cuda_context, compute_capability_major, on_input_device

HEAD_DIMS = (16, 32, 64, 128, 256)
LAYOUTS = ("bhld", "blhd")


# ----------------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr):
    """``a @ b``; with UPCAST the operands go to float32 first (the Triton interpreter multiplies bfloat16
    operands as raw 16-bit integers; the GPU path never sets UPCAST)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        return tl.dot(a, b)


@triton.jit
def _dot_acc(a, b, acc, UPCAST: tl.constexpr):
    """``acc + a @ b`` (see :func:`_dot`)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _act(s, scale, SQUARED: tl.constexpr):
    """``p`` from the scores ``s``: relu(s * scale), squared with SQUARED. NaN stays NaN, as in torch.relu
    (``tl.maximum`` would return 0 for it: a NaN query or key would vanish from the output)."""
    a = tl.maximum(s * scale, 0.0, propagate_nan=tl.PropagateNan.ALL)
    if SQUARED:
        return a * a
    else:
        return a


@triton.jit
def _relu_to_bf16(s):
    """relu(s) rounded to bfloat16, two elements per instruction (``cvt.rn.relu.bf16x2.f32``, sm_80+):
    one instruction per pair where ``_act`` and a conversion take five. No scale: relu(s * scale) =
    scale * relu(s) for scale > 0, so the caller applies it once, to the output."""
    return tl.inline_asm_elementwise("cvt.rn.relu.bf16x2.f32 $0, $2, $1;", "=r,r,r", [s], dtype=tl.bfloat16,
                                     is_pure=True, pack=2)  # fmt: skip


@triton.jit
def _dscores(s, dp, scale, SQUARED: tl.constexpr):
    """``ds`` from the scores ``s`` and ``dp``: dp * scale * [s > 0], or dp * 2 * relu(s * scale) * scale."""
    if SQUARED:
        return dp * (2.0 * scale) * tl.maximum(s * scale, 0.0)
    else:
        return tl.where(s > 0.0, dp * scale, 0.0)


@triton.jit
def _block_order(GROUP, FIRST):
    """``(pid_m, pid_bh)``: this program's query block and (batch, head) pair. The (blocks, B·H) grid is
    taken in launch order: the first FIRST pairs one after another, then GROUP pairs at a time, and within
    a group the heaviest causal blocks of all its pairs first, so that the kernel ends on light blocks.
    GROUP = 1 is one pair after another."""
    n_m = tl.num_programs(0)
    lin = tl.program_id(1) * n_m + tl.program_id(0)
    if lin < FIRST * n_m:
        return n_m - 1 - lin % n_m, lin // n_m
    lin -= FIRST * n_m
    g = lin // (GROUP * n_m)
    r = lin % (GROUP * n_m)
    heads = tl.minimum(GROUP, tl.num_programs(1) - FIRST - g * GROUP)
    return n_m - 1 - r // heads, FIRST + g * GROUP + r % heads


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
# The same three kernels reading and writing through tensor descriptors (TMA on Hopper and later)
#
# Each [B, H, L, D] tensor is a rank-4 descriptor over its own strides, a tile a [1, 1, rows, D] box.
# The copy engine fills rows past L with zeros and clips stores there, so the tails need no masks: a
# zero query or key row scores 0, and relu(0) = 0 adds nothing (the same reason the pointer kernels can
# load padding as 0). (Triton 3.6's warp specialization of these loops on Hopper was tried in run 26:
# it gave wrong forward outputs and failed to compile causal kernels; see bench/results/h200/NOTES.md.)
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _tile(desc, b, h, start, ROWS: tl.constexpr, HEAD_D: tl.constexpr):
    return desc.load([b, h, start, 0]).reshape([ROWS, HEAD_D])


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


# ----------------------------------------------------------------------------------------------------
# Launch heuristics: the one place tile shapes, warps and stages are chosen
# ----------------------------------------------------------------------------------------------------


class AttnConfig(NamedTuple):
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    tma: bool = False  # tensor descriptors (the *_tma_kernel's) where _tma_usable allows, else pointers


# Sequences up to SHORT_L use the "short" entries of TUNED where there are any: with 16k tokens a
# short sequence has many (batch, head) pairs and few blocks per pair, so its fastest tiles can differ.
SHORT_L = 2048

# Measured on the H200 by bench/tune.py (bench/results/h200/tuning_run*.csv): bf16 at 16k tokens, D=64
# at L=4096 in run 1; D=128 in run 7 (at L=4096, "long", and L=1024, "short"), where the run-1 backward
# stayed (the full sessions measured it faster than the pair of run-7 winners, each of which had been
# timed with the other kernel at its old default); float32 (tf32 dots, reading the copies of
# _tf32_copies) at the seed's shapes (B=4, H=16, L=4096 long, L=1024 short) in run 21, the non-causal ones
# again in run 133 once _peel had removed their serialized products, the short causal dK/dV in run 143
# once _fold gave its programs two blocks each. (kind, D, element
# bytes, causal, long sequence) -> config (float16
# shares the 2-byte rows; dkdv and dq are scored as the whole backward, 2.5x the forward's FLOPs, with
# the other kernel at its default). A missing entry falls back to the other length's entry, then to the
# rule in attention_config.
TUNED: dict[tuple[str, int, int, bool, bool], AttnConfig] = {
    # bf16 kernels reading through tensor descriptors (tma=True) won these keys in run 26 (pointer
    # kernel's best in the same run in brackets) and the full D=128 dK/dV key in run 92; the others keep
    # the pointer kernels of runs 1, 7, 23
    ("dkdv", 64, 2, False, True): AttnConfig(64, 64, 4, 3, tma=True),  # 471 TFLOP/s (run 26; 451)
    ("dkdv", 64, 2, False, False): AttnConfig(64, 64, 4, 3, tma=True),  # 407 TFLOP/s (run 26; 388)
    ("dkdv", 64, 2, True, True): AttnConfig(64, 64, 4, 3, tma=True),  # 443 TFLOP/s (run 26; 387)
    ("dkdv", 64, 2, True, False): AttnConfig(32, 64, 4, 3, tma=True),  # 315 TFLOP/s (run 26; 296)
    ("dq", 64, 2, False, True): AttnConfig(128, 64, 8, 3, tma=True),  # 484 TFLOP/s (run 26; 441)
    ("dq", 64, 2, False, False): AttnConfig(128, 64, 8, 3, tma=True),  # 428 TFLOP/s (run 26; 387)
    ("dq", 64, 2, True, True): AttnConfig(128, 64, 4, 3, tma=True),  # 421 TFLOP/s (run 26; 416)
    ("dq", 64, 2, True, False): AttnConfig(64, 64, 4, 3, tma=True),  # 309 TFLOP/s (run 26; 297)
    # the forwards re-swept with v16 (run 107; the code's entry in the same run in brackets)
    ("fwd", 64, 2, False, True): AttnConfig(128, 64, 8, 4),  # 802 TFLOP/s (run 107; 705)
    ("fwd", 64, 2, False, False): AttnConfig(128, 64, 4, 3, tma=True),  # 638 TFLOP/s (run 107, L=1024)
    ("fwd", 64, 2, True, True): AttnConfig(128, 64, 4, 3, tma=True),  # 699 TFLOP/s (run 107; 682)
    ("fwd", 64, 2, True, False): AttnConfig(128, 64, 4, 3, tma=True),  # 435 TFLOP/s (run 107; 423)
    # the descriptor kernel with 4 stages (192 KB of shared memory, still one program per SM): the whole
    # backward 1.014x, 1.016x, 1.036x the pointer kernel of run 1 at L=1024, 4096, 16384 (run 92)
    ("dkdv", 128, 2, False, True): AttnConfig(64, 128, 8, 4, tma=True),  # 537 TFLOP/s bwd, L=16384 (run 92)
    ("dkdv", 128, 2, True, True): AttnConfig(64, 128, 8, 3, tma=True),  # 476 TFLOP/s (run 26; 468)
    ("dkdv", 128, 2, True, False): AttnConfig(64, 64, 4, 2, tma=True),  # 340 TFLOP/s (run 26; 332)
    ("dq", 128, 2, False, True): AttnConfig(128, 64, 8, 3, tma=True),  # 537 TFLOP/s (run 26; 526)
    ("dq", 128, 2, False, False): AttnConfig(128, 64, 8, 3, tma=True),  # 439 TFLOP/s (run 26; 429)
    ("dq", 128, 2, True, True): AttnConfig(128, 64, 8, 3, tma=True),  # 477 TFLOP/s (run 26; 467)
    ("dq", 128, 2, True, False): AttnConfig(128, 32, 8, 3, tma=True),  # 337 TFLOP/s (run 26; 330)
    # full D=128: run 107's winner (128x64, 4 warps, 2 stages: 777 and 617 TFLOP/s) spills 324 bytes per
    # thread (sm_90 compile here) for 1-2% over these: kept out
    ("fwd", 128, 2, False, True): AttnConfig(64, 64, 4, 3),  # 765 TFLOP/s (run 107)
    ("fwd", 128, 2, True, True): AttnConfig(64, 64, 4, 3, tma=True),  # 656 TFLOP/s (run 107; 642)
    ("fwd", 128, 2, False, False): AttnConfig(64, 64, 4, 3),  # 610 TFLOP/s (run 107)
    ("fwd", 128, 2, True, False): AttnConfig(64, 64, 4, 3, tma=True),  # 449 TFLOP/s (run 107; the same)
    ("dkdv", 64, 4, False, True): AttnConfig(32, 128, 8, 3),  # 173 TFLOP/s (run 133, with PEEL; 16x128: 162)
    ("dkdv", 64, 4, False, False): AttnConfig(32, 128, 8, 3),  # 113 TFLOP/s (run 133, with PEEL; 16x128: 110)
    ("dkdv", 64, 4, True, True): AttnConfig(64, 128, 8, 2),  # 149 TFLOP/s (run 21)
    ("dkdv", 64, 4, True, False): AttnConfig(32, 128, 8, 3),  # 99 TFLOP/s (run 143, with FOLD; 32x64: 94)
    ("dq", 64, 4, False, True): AttnConfig(128, 64, 8, 3),  # 147 TFLOP/s (run 21)
    ("dq", 64, 4, False, False): AttnConfig(128, 64, 8, 3),  # 104 TFLOP/s (run 21)
    ("dq", 64, 4, True, True): AttnConfig(128, 64, 8, 3),  # 149 TFLOP/s (run 21)
    ("dq", 64, 4, True, False): AttnConfig(128, 64, 8, 3),  # 69 TFLOP/s (run 21)
    ("fwd", 64, 4, False, True): AttnConfig(64, 64, 4, 3),  # 270 TFLOP/s (run 133, with PEEL; 128x32: 255)
    ("fwd", 64, 4, False, False): AttnConfig(128, 32, 8, 4),  # 153 TFLOP/s (run 21)
    ("fwd", 64, 4, True, True): AttnConfig(64, 64, 4, 3),  # 214 TFLOP/s (run 21)
    ("fwd", 64, 4, True, False): AttnConfig(64, 64, 4, 3),  # 97 TFLOP/s (run 21)
}

TUNED.update(_tuning.attention_overrides(AttnConfig))  # CROSSFUSE_TUNED_CONFIGS, when set


def attention_config(
    kind: str, d: int, dtype: torch.dtype, causal: bool, interpreted: bool = False, length: int | None = None
) -> AttnConfig:
    """Tiles for ``kind`` in ``("fwd", "dkdv", "dq")``; ``length`` is max(Lq, Lk) when known. Causal
    kernels need BLOCK_M and BLOCK_N to divide each other (fwd/dq: BLOCK_N | BLOCK_M; dkdv: BLOCK_M |
    BLOCK_N)."""
    if interpreted:  # the interpreter runs tiles as numpy arrays: few, large programs are fastest
        return AttnConfig(32, 32, 4, 1)
    esize = dtype.itemsize
    long = length is None or length > SHORT_L
    tuned = TUNED.get((kind, d, esize, causal, long), TUNED.get((kind, d, esize, causal, not long)))
    if tuned is not None:
        return tuned
    big = d * esize >= 256  # D=128 in 16 bits, D=64 in fp32, or larger
    if kind == "fwd":
        if d * esize >= 512:
            return AttnConfig(64, 32, 4, 2)
        return AttnConfig(128, 64, 8 if big else 4, 3)
    if kind == "dkdv":
        if d * esize >= 1024:  # D=256 in float32: its copies of q and dout (see _tf32_copies) need room
            return AttnConfig(16, 32, 4, 2)
        if d * esize >= 512:
            return AttnConfig(16, 64, 4, 2)
        return AttnConfig(32, 128 if not big else 64, 8 if big else 4, 3)
    if kind == "dq":
        if d * esize >= 1024:
            return AttnConfig(32, 16, 4, 2)
        if d * esize >= 512:
            return AttnConfig(64, 16, 4, 2)
        return AttnConfig(128 if not big else 64, 32, 8 if big else 4, 3)
    raise ValueError(f"kind must be 'fwd', 'dkdv' or 'dq', got {kind!r}")


@triton.jit
def _l_major_copy_kernel(
    X0, X1, X2,  # (B, H, L, D) each, through strides: the T tensors copied (the unused ones: X0 again)
    Y,  # out: (T, B, H, D, L) contiguous, i.e. each X's elements with unit stride on L
    stride_0b, stride_0h, stride_0l, stride_0d,
    stride_1b, stride_1h, stride_1l, stride_1d,
    stride_2b, stride_2h, stride_2l, stride_2d,
    H, L, D,
    T: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GDC: tl.constexpr = False,  # the kernel after it may be a dependent launch that waits for it (_gdc)
    SIGMA: tl.constexpr = False,  # L's indices in sigma's order within each 8 (L a multiple of 8; v34)
):  # fmt: skip
    _gdc.launch_dependents(GDC)
    # a [BLOCK_L, BLOCK_D] tile read along D and written along L: Triton gives the load and the store
    # each a coalesced layout and moves the tile between them through shared memory. The grid's first
    # axis runs over (tensor, batch, head)
    pid = tl.program_id(0)
    pairs = tl.num_programs(0) // T
    t = pid // pairs
    pid_bh = pid % pairs
    X, sb, sh, sl, sd = X0, stride_0b, stride_0h, stride_0l, stride_0d
    if T > 1:
        if t == 1:
            X, sb, sh, sl, sd = X1, stride_1b, stride_1h, stride_1l, stride_1d
    if T > 2:
        if t == 2:
            X, sb, sh, sl, sd = X2, stride_2b, stride_2h, stride_2l, stride_2d
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_l = (tl.program_id(1) * BLOCK_L + tl.arange(0, BLOCK_L)).to(tl.int64)
    offs_d = (tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)).to(tl.int64)
    ok = (offs_l[:, None] < L) & (offs_d[None, :] < D)
    if SIGMA:  # place l' = 8g + sigma(c) takes row 8g + c: c = (l' % 8 >> 2) | (l' % 4 << 1)
        rows = (offs_l & ~7) | ((offs_l & 7) >> 2) | ((offs_l & 3) << 1)
    else:
        rows = offs_l
    x = tl.load(X + b * sb + h * sh + rows[:, None] * sl + offs_d[None, :] * sd, mask=ok)
    Y += pid.to(tl.int64) * D * L
    tl.store(Y + offs_d[None, :] * L + offs_l[:, None], x, mask=ok)


# ----------------------------------------------------------------------------------------------------
# Launchers: [B, H, L, D] views in (any strides with unit D stride), kernels out
# ----------------------------------------------------------------------------------------------------


# (kernel, device, dtype, D, config) -> the pipeline stages that fit that GPU's shared memory, where fewer
# than the config's (see _launch)
_STAGES_THAT_FIT: dict[tuple, int] = {}


def _launch(kernel, grid, key: tuple, *args, **options) -> None:
    """``kernel[grid](*args, **options)``. The tables were tuned on an H200 (227 KB of shared memory per
    program; a D=128 backward step takes up to 192 KB); on a GPU with less, Triton refuses a launch whose
    stages do not fit (``OutOfResources``, before anything runs), so the launch is retried with one stage
    fewer, down to one, and the stages that fit are remembered under ``(kernel, *key)``. A launch Triton
    has compiled before goes straight to the compiled kernel (:mod:`._runtime.direct`)."""
    direct = _direct.key(kernel, args, options)  # the compiled kernel, launched again without dispatch
    _record(direct, grid, args)
    if direct is not None and _direct.launch(direct, grid, args):
        return
    slot = (kernel, *key)
    asked = dict(options)
    stages = _STAGES_THAT_FIT.get(slot, options.pop("num_stages"))
    while True:
        try:
            compiled = kernel[grid](*args, num_stages=stages, **options)
            _direct.remember(direct, kernel, args, asked, compiled)
            return
        except OutOfResources as exc:
            if exc.name != "shared memory" or stages <= 1:
                raise
            stages -= 1
            _STAGES_THAT_FIT[slot] = stages


# Launch plans (attention v24). A call of a launcher decides its kernels, tiles, grids and arguments from
# its tensors' shapes, strides, dtypes and alignment, its flags and tiles; at the shapes where the host
# sets the pace (16x32x1024x64 causal: about 0.65 ms of GPU work for a forward+backward) those decisions
# and the launch keys cost as much host time as the launches. A call records its launches (_launch);
# where they went straight into compiled kernels (crossfuse.ops._runtime.direct) and took no tensor but the
# call's own, they are kept under everything the decisions read, and a later call with the same key
# builds the descriptors over its own tensors and makes the same launches.
MAX_PLANS = 1024  # plans kept at most (ints and floats are part of their keys: a table that starts afresh)
PLANNING = True  # False: every call decides its launches afresh (the tests, which steer those decisions)
_PLANS: dict[tuple, tuple] = {}
_RECORDING = threading.local()


class _Desc(NamedTuple):
    """In a plan's arguments: a descriptor over the call's tensor ``index`` (see _desc)."""

    index: int
    shape: list
    strides: list
    block: list


class _Tensor(NamedTuple):
    """In a plan's arguments: the call's tensor ``index`` itself (the pointer kernels)."""

    index: int


def _record(slot: tuple | None, grid, args: tuple) -> None:
    """Where a launch plan is in the making on this thread (_planned), note a launch: its compiled kernel's
    slot (``None`` for one that cannot be replayed), grid and arguments."""
    launches = getattr(_RECORDING, "launches", None)
    if launches is not None:
        launches.append((slot, grid, args))


def _plan_key(kind: str, tensors: tuple, *decided) -> tuple | None:
    """The key of a launcher's call on ``tensors``: ``kind``, what else decides it (flags, scales, tiles),
    each tensor's shape, strides, dtype and 16-byte alignment, and what selects the compiled kernels
    (``_direct.state``); ``None`` where launches go through Triton's dispatch."""
    now = _direct.state() if PLANNING else None
    if now is None:
        return None
    return (kind, now, *decided, *[(t.shape, t.stride(), t.dtype, t.data_ptr() % 16 == 0) for t in tensors])


def _replay(plan: tuple, tensors: tuple) -> bool:
    """Make the launches of ``plan`` on ``tensors``; False, launching nothing, where a kernel it names is
    no longer kept (``_direct``'s table started afresh)."""
    if not all(_direct.remembered(slot) for slot, _, _ in plan):
        return False
    bind_cuda_context(tensors[0])  # before descriptors are filled (see bind_cuda_context)
    for slot, grid, template in plan:
        args = list(template)
        for i, a in enumerate(template):
            if type(a) is _Desc:
                args[i] = _direct.descriptor(tensors[a.index], a.shape, a.strides, a.block)
            elif type(a) is _Tensor:
                args[i] = tensors[a.index]
        _direct.launch(slot, grid, tuple(args))
    return True


def _make_plan(launches: list, tensors: tuple) -> tuple | None:
    """A plan from the recorded ``launches`` of a call on ``tensors``, or ``None`` where one of them had no
    key or took a tensor that is not one of ``tensors`` (float32's copies, say), or where one tensor was
    given twice (its places could not be told apart: another call may pass two tensors there)."""
    if len({id(t) for t in tensors}) < len(tensors):
        return None
    plan = []
    for slot, grid, args in launches:
        if slot is None or not _direct.remembered(slot):
            return None
        template = []
        for a in args:  # (a None argument is a value like any other: only a tensor not found is refused)
            if isinstance(a, torch.Tensor):
                index = next((i for i, t in enumerate(tensors) if t is a), None)
                if index is None:
                    return None
                a = _Tensor(index)
            elif type(a) is TensorDescriptor:
                index = next((i for i, t in enumerate(tensors) if t is a.base), None)
                if index is None:
                    return None
                a = _Desc(index, a.shape, a.strides, a.block_shape)
            template.append(a)
        plan.append((slot, grid, tuple(template)))
    return tuple(plan) if plan else None


def _planned(key: tuple | None, tensors: tuple, launch, *args) -> None:
    """``launch(*tensors, *args)``, or the plan kept under ``key`` from an earlier call."""
    if key is None:
        launch(*tensors, *args)
        return
    plan = _PLANS.get(key)
    if plan is not None and _replay(plan, tensors):
        return
    _RECORDING.launches = launches = []
    try:
        launch(*tensors, *args)
    finally:
        _RECORDING.launches = None
    plan = _make_plan(launches, tensors)
    if plan is not None:
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan


# CUDA's limit on a grid's second axis, where every attention kernel puts the (batch, head) pairs
MAX_GRID_1 = 65535


def _batch_slices(B: int, H: int) -> list[slice]:
    """Slices of the batch whose (batch, head) pairs fit on a grid's second axis (H <= MAX_GRID_1)."""
    step = max(1, MAX_GRID_1 // H)
    return [slice(b, min(b + step, B)) for b in range(0, B, step)]


def _bhld_strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _bh_d_strides(t: torch.Tensor) -> tuple[int, int, int]:
    """Batch, head and D strides (of a copy with unit stride on L)."""
    return t.stride(0), t.stride(1), t.stride(3)


@quiet_interpreter
@on_input_device
def relu_attention_fwd(q, k, v, causal: bool, squared: bool, scale: float, relu_scale: float, out=None,
                       config: AttnConfig | None = None):  # fmt: skip
    """Forward on [B, H, L, D] views (unit stride on D; ``v`` may have unit stride on L instead).
    ``out`` (same view convention) is allocated when not given; ``config`` overrides
    :func:`attention_config` (for tuning)."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    if out is None:
        out = torch.empty((B, H, Lq, D), dtype=q.dtype, device=q.device)
    if B * H > MAX_GRID_1:  # more (batch, head) pairs than a grid's second axis holds: batch slices
        for b in _batch_slices(B, H):
            relu_attention_fwd(q[b], k[b], v[b], causal, squared, scale, relu_scale, out[b], config)
        return out
    interp = is_interpreted(_relu_attn_fwd_kernel)
    cfg = config or attention_config("fwd", D, q.dtype, causal, interp, max(Lq, Lk))
    tensors = (q, k, v, out)
    key = None if interp else _plan_key("fwd", tensors, causal, squared, scale, relu_scale, cfg)
    _planned(key, tensors, _fwd_launches, causal, squared, scale, relu_scale, cfg, interp)
    return out


def _fwd_launches(q, k, v, out, causal, squared, scale, relu_scale, cfg, interp) -> None:
    """The forward's launches (see :func:`relu_attention_fwd`) with tiles ``cfg``."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    grid = (triton.cdiv(Lq, cfg.block_m), B * H)
    key = (q.device, q.dtype, D, cfg)
    relu_cvt = _relu_cvt(interp, squared, q.dtype)
    if cfg.tma and _tma_usable(interp, q, k, v, out):
        order = _causal_order(k, causal)
        bind_cuda_context(q)
        _launch(
            _relu_attn_fwd_tma_kernel, grid, key,
            _desc(q, cfg.block_m), _desc(k, cfg.block_n), _desc(v, cfg.block_n), _desc(out, cfg.block_m),
            H, Lk, scale, relu_scale, *order, HEAD_D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            CAUSAL=causal, SQUARED=squared, RELU_CVT=relu_cvt, GROUPED=order[0] > 1, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )  # fmt: skip
        return
    chain = {}
    if _tf32_copies(q.dtype, interp):
        tiles = TF32_FWD.get((causal, max(Lq, Lk) > SHORT_L))
        views = _attn_tf32.usable(q, k, interp, *tiles[:2], v=v) if tiles and tiles[4] else None
        if views:  # v's tiles transposed in the kernel (attention v31), in sigma's order (v34): no copy
            _attn_tf32.launch(q, k, views, v, out, causal, squared, scale, relu_scale, *tiles, False, False,
                              _launch)  # fmt: skip
            return
        # p @ v sums over keys (see _tf32_copies); where the GPU allows, the kernel is a dependent launch
        # whose programs take the SMs the copy's last programs leave and wait for the copy at their start.
        # The Gluon kernel takes the keys of v's copy in sigma's order (attention v34); a v with unit
        # stride on L already is read as it is, the keys in their order
        gdc = _gdc.usable(q, interp)
        views = _attn_tf32.usable(q, k, interp, *tiles[:2]) if tiles else None
        perm = views is not None and v.stride(2) != 1
        (v,) = _l_contiguous(v, signal=gdc, sigma=perm)
        chain = dict(WAIT=True, launch_pdl=True) if gdc else {}
        vt = v.transpose(2, 3)  # [B, H, D, L]
        if views and vt.is_contiguous():
            _attn_tf32.launch(q, k, views, vt, out, causal, squared, scale, relu_scale, *tiles[:4], 0, perm,
                              gdc, _launch)  # fmt: skip
            return
    fold = _fold(q.dtype, causal)
    _launch(
        _relu_attn_fwd_kernel, _folded(grid, fold), key,
        q, k, v, out, *_bhld_strides(q), *_bhld_strides(k), *_bhld_strides(v), v.stride(3),
        *_bhld_strides(out), H, Lq, Lk, scale, relu_scale,
        HEAD_D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal, SQUARED=squared,
        EVEN_M=Lq % cfg.block_m == 0, EVEN_N=Lk % cfg.block_n == 0, IS_FP64=q.dtype == torch.float64,
        UPCAST=interp and q.dtype == torch.bfloat16, RELU_CVT=relu_cvt, PEEL=_peel(q.dtype, causal),
        FOLD=fold, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **chain,
    )  # fmt: skip


# The float32 forward in Gluon (crossfuse.ops._attn_tf32, attention v26; ASYNC: v30; TRANS, v's tiles
# transposed in the kernel instead of copied: v31): (causal, long sequence) -> (BLOCK_M, BLOCK_N, STAGES,
# ASYNC, TRANS); where its tiles do not divide the lengths (or TF32_FWD is empty), Triton's kernel runs.
# Measured against Triton's float32 forward at the seed's shapes (run 288,
# bench/probe_attn_tf32.py, each with v's copy): 128x64 on 8 warps with 2 buffers 1.17, 1.16, 1.13x (full,
# L = 1024, 2048, 4096), 1.04, 1.10x (causal, L = 2048, 4096); 64x64 on 4 warps with 3 buffers 1.055x at
# L=1024 causal, where 128x64 ran 0.98x. With v30's launch order (run 299, the causal rows): 64x64 with 3
# buffers and ASYNC 1.189, 1.144x (L = 1024, 2048; 128x64 1.182, 1.161x), 128x64 1.156x at L=4096. ASYNC
# against the synchronous form at the same tile (run 297): 0.96-1.02x at 64x64 with 3 buffers (the gains
# at the causal rows), 0.75-0.81x at 128x64 with 2 (one program an SM: 180 registers). TRANS (run 303,
# against each entry before it in the same run): 128x64 with 2 buffers 1.063x at L=1024 full, 1.043x at
# L=1024 causal (against 64x64 ASYNC with v's copy), 0.98x at L=2048 full, 0.95-0.96x at L=4096; 64x64
# tiles with TRANS 0.82-0.97x (4 warps transpose each tile where 128-row tiles have 8). At L=2048 causal
# 128x64 with v's copy ran 1.159x, 64x64 ASYNC 1.144x (run 303; 1.161 and 1.144 in run 299). With the
# transposition's stores free of bank conflicts (attention v33, run 307), TRANS against v's copy at
# 128x64: 1.311 against 1.196x (L=1024 full), 1.280 against 1.182x (causal), 1.221 against 1.193x
# (L=2048 full), 1.224 against 1.158x (causal), 1.170 against 1.146x (L=4096 causal), 1.135 against
# 1.143x (L=4096 full: v's copy kept there). With p relabelled instead of moved between lanes (attention
# v34, v's keys in sigma's order; run 312), TRANS against v's copy at 128x64: 1.447 against 1.336x (L=1024
# full), 1.455 against 1.067x (causal: the copy's causal kernel takes 138 registers, one program an SM),
# 1.358 against 1.386x (L=2048 full: one entry holds up to L=2048), 1.386 against 1.061x (causal), 1.269
# against 1.359x (L=4096 full), 1.325 against 1.052x (L=4096 causal).
TF32_FWD: dict[tuple[bool, bool], tuple[int, int, int, int, int]] = {
    (False, False): (128, 64, 2, 0, 1),
    (False, True): (128, 64, 2, 0, 0),
    (True, False): (128, 64, 2, 0, 1),
    (True, True): (128, 64, 2, 0, 1),
}


# The float32 backward in Gluon (crossfuse.ops._attn_tf32, attention v27): (causal, long sequence) ->
# ((BLOCK_M, BLOCK_N, STAGES, ASYNC[, TRANS]) of the dK/dV kernel, the same of the dQ kernel[, WRITE]);
# where the tiles do not divide the lengths (or TF32_BWD is empty), Triton's kernels run. TRANS (attention
# v32): the kernel transposes its tiles of q and dout (dK/dV) or k (dQ) in shared memory instead of reading
# their copies. WRITE (attention v36, the dQ kernel with TRANS, the dK/dV kernel without): the dQ kernel
# runs first and writes the copies of q and dout as it loads its own tiles of them, in place of the copy
# kernel's pass over both (11% of the L=1024 full backward, run 310); compiled for sm_90, not yet run on a
# GPU, so in no entry. Measured against Triton's float32 backward at the seed's shapes (run 291,
# bench/probe_attn_tf32.py --kind bwd, both with the copies):
# 1.239, 1.254 (full, L = 1024, 2048), 1.230 (full, L=4096), 1.190, 1.197 (causal, L = 1024, 2048),
# 1.157 (causal, L=4096); in run 293 1.239, 1.221, 1.191, 1.184, 1.178, 1.134; the synchronous products
# (ASYNC 0) 1.12-1.20 (run 291). TRANS in both kernels (run 305): 1.293 at L=1024 causal with 3 buffers
# and 64x64 dQ tiles, against 1.235 for the entry before; in the dK/dV kernel alone 1.263, in the dQ
# kernel alone 1.223; at L=1024 full 1.06-1.16 against 1.248, and below the entries at every longer row
# (the dK/dV kernel transposes two tiles a step on 4 warps). Without TRANS, at L=2048 causal, the 3-buffer
# tiles ran 1.177 and 1.191 against 1.178 and 1.197 (runs 293, 291). With the transposition's stores free
# of bank conflicts (v33, run 307), TRANS in both kernels with 3 buffers and 64x64 dQ tiles: 1.393 against
# 1.241 (L=1024 causal), 1.247 against 1.188 (L=2048 causal), 1.137 against 1.140 (L=4096 causal); at the
# full rows 1.05-1.20 against 1.20-1.25 (copies kept there). With the left operands relabelled (attention
# v34, the copies and transposed tiles in sigma's order; run 312): the full rows' (32, 64, 2, 1), (64, 64,
# 2, 1) 1.375, 1.413, 1.423x (L = 1024, 2048, 4096; at L=4096 64x32 dQ tiles 1.380 against 1.402 in run
# 311); the short causal entry 1.455x (L=1024) and 1.293x (L=2048, where the dQ kernel alone with TRANS ran
# 1.308-1.333x); at L=4096 causal the dQ kernel with TRANS and the dK/dV kernel reading copies 1.258 and
# 1.269x (64x32 and 64x64 dQ tiles) against 1.168-1.211x for the others. With 128-key dK/dV tiles on 8
# warps, both kernels with TRANS (run 313): 1.439, 1.366, 1.274x at the causal rows (L = 1024, 2048,
# 4096) against 1.447, 1.304 and 1.204x for the 64-key short causal entry and the copies' tiles; the full
# rows' (32, 64, 2, 1), (64, 64, 2, 1) 1.368, 1.413, 1.403x against 1.323, 1.283, 1.251x.
TF32_BWD: dict[tuple[bool, bool], tuple[tuple[int, ...], tuple[int, ...]]] = {
    (False, False): ((32, 64, 2, 1), (64, 64, 2, 1)),
    (False, True): ((32, 64, 2, 1), (64, 64, 2, 1)),
    (True, False): ((64, 128, 2, 1, 1), (64, 64, 2, 1, 1)),
    (True, True): ((64, 128, 2, 1, 1), (64, 64, 2, 1, 1)),
}


def _relu_cvt(interp: bool, squared: bool, dtype: torch.dtype) -> bool:
    """Whether the kernels take relu's bf16 operands from ``_relu_to_bf16`` and apply ``scale`` to their
    outputs: compiled bfloat16 relu (not squared: relu(s)^2 has no one-instruction form)."""
    return not interp and not squared and dtype == torch.bfloat16


def _tma_usable(interp: bool, *tensors: torch.Tensor) -> bool:
    """Whether the descriptor kernels can read and write ``tensors`` ([B, H, L, D] views): 16-bit types
    on a GPU with a copy engine for tensors (compute capability 9+; any dtype under the interpreter),
    D <= 128 (a box row of at most 256 bytes), 16-byte aligned base and strides, unit stride on D, no
    empty dimension. These are the checks of Triton's ``TensorDescriptor``, which :func:`_desc` skips."""
    if TensorDescriptor is None:
        return False
    t0 = tensors[0]
    if not interp:
        if t0.device.type != "cuda" or t0.dtype not in (torch.bfloat16, torch.float16):
            return False
        if compute_capability_major(t0) < 9:
            return False
    if t0.shape[3] > 128:
        return False
    esize = t0.element_size()
    for t in tensors:
        s0, s1, s2, s3 = t.stride()
        if s3 != 1 or t.data_ptr() % 16 or min(s0, s1, s2) <= 0 or (s0 | s1 | s2) * esize % 16:
            return False
        if not t.numel():  # a descriptor's dims must be positive; the pointer kernels take empty tensors
            return False
    return True


def _desc(t: torch.Tensor, rows: int):
    """A rank-4 tensor descriptor over the [B, H, L, D] view ``t``, boxes of ``rows`` x D. The launcher
    calls ``bind_cuda_context`` first: Triton fills the descriptor before it makes a context current."""
    return _direct.descriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, t.shape[3]])


L_MAJOR_TILE = (64, 64, 4)  # BLOCK_L, BLOCK_D, warps of _l_major_copy_kernel


def _l_contiguous(*tensors: torch.Tensor, signal: bool = False,
                  sigma: bool = False) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """[B, H, L, D] views with unit stride on L of ``tensors``: each tensor itself when it has one, else a
    copy ([B, H, D, L] contiguous, seen transposed). Tensors of one shape, dtype and device are copied
    three at a time by one launch into one buffer (which lives as long as any of its copies). The copy is a
    Triton kernel: torch's ``contiguous()`` of the transposed view moved about 1 TB/s on the H200 at the
    seed's float32 shapes, a third of a plain copy's rate (run 136), and the copies were then 30% of the
    float32 forward at L=1024. With ``signal``, the copy kernel lets a dependent launch after it start
    (:mod:`._gdc`); that kernel must wait for it before reading the copies. With ``sigma`` (for the float32
    Gluon kernels, attention v34; L a multiple of 8) every tensor is copied, the indices along L of each
    group of 8 in the order of ``crossfuse.ops._attn_tf32._sigma``: place ``8g + sigma(c)`` holds row
    ``8g + c``."""
    out = list(tensors)
    todo = [i for i, t in enumerate(tensors) if sigma or t.stride(2) != 1]
    while todo:
        kind = _copy_kind(tensors[todo[0]])
        group = [i for i in todo if _copy_kind(tensors[i]) == kind][:3]
        todo = [i for i in todo if i not in group]
        for i, c in zip(group, _l_major_copies([tensors[i] for i in group], signal, sigma), strict=True):
            out[i] = c
    return tuple(out)


def _copies_to_write(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two [B, H, L, D] views with unit stride on L ([B, H, D, L] contiguous, in one buffer) of q's shape,
    dtype and device, their values unset: the copies of q and dout that a float32 Gluon dQ kernel with
    WRITE writes (attention v36; the tests fill them with NaN, so that an element read before it is
    written shows)."""
    B, H, L, D = q.shape
    return tuple(y.transpose(2, 3) for y in q.new_empty((2, B, H, D, L)).unbind(0))


def sigma_rows(length: int, device=None) -> torch.Tensor:
    """The rows that places ``0 .. length - 1`` of a copy in sigma's order hold (see :func:`_l_contiguous`):
    ``8g + c`` for place ``8g + sigma(c)``, sigma(b0 + 2 b1 + 4 b2) = b1 + 2 b2 + 4 b0."""
    at = torch.arange(length, device=device)
    return (at & ~7) | ((at & 7) >> 2) | ((at & 3) << 1)


def _copy_kind(t: torch.Tensor) -> tuple:
    return t.shape, t.dtype, t.device


def _l_major_copies(ts: list[torch.Tensor], signal: bool = False, sigma: bool = False) -> list[torch.Tensor]:
    """One to three tensors of one [B, H, L, D] shape copied with unit stride on L (see _l_contiguous)."""
    B, H, L, D = ts[0].shape
    if sigma and L % 8:
        raise ValueError(f"a copy in sigma's order needs a length that is a multiple of 8, got {L}")
    block_l, block_d, warps = L_MAJOR_TILE
    block_d = min(block_d, triton.next_power_of_2(D))
    grid = (len(ts) * B * H, triton.cdiv(L, block_l), triton.cdiv(D, block_d))
    if grid[1] > 65535:  # a grid's second axis is at most 65535 programs: torch's copy beyond that
        if sigma:
            ts = [t[:, :, sigma_rows(L, t.device)] for t in ts]
        return [t.transpose(2, 3).contiguous().transpose(2, 3) for t in ts]
    out = torch.empty((len(ts), B, H, D, L), dtype=ts[0].dtype, device=ts[0].device)
    if out.numel():
        _record(None, grid, ())  # not through _launch: no plan
        xs = [*ts, ts[0], ts[0]][:3]
        args = (*xs, out, *(s for x in xs for s in x.stride()), H, L, D)
        options = dict(T=len(ts), BLOCK_L=block_l, BLOCK_D=block_d, GDC=signal, SIGMA=sigma, num_warps=warps)
        _direct.run(_l_major_copy_kernel, grid, args, options)
    return [y.transpose(2, 3) for y in out.unbind(0)]


# The causal forward's last (batch, head) pairs, as many as hold this many bytes of keys and values, are
# ordered as one group (_block_order): the heaviest query blocks of all of them first, so that the kernel
# ends on light blocks instead of on the last pair's heavy ones. 16-bit D=64 sequences longer than
# SHORT_L only (attention v21, runs 147-149: the D=64 forward 1.00-1.06x; D=128 0.95-1.01x, not used).
CAUSAL_TAIL_BYTES = 16 << 20


def _causal_order(k: torch.Tensor, causal: bool) -> tuple[int, int]:
    """``(GROUP, FIRST)`` of the descriptor forward's program order (see CAUSAL_TAIL_BYTES): the first
    FIRST pairs one after another, the last GROUP pairs as one group; ``(1, 0)`` is one pair after
    another."""
    B, H, Lk, D = k.shape
    if not causal or D != 64 or k.element_size() != 2 or Lk <= SHORT_L:
        return 1, 0
    group = max(1, min(B * H, CAUSAL_TAIL_BYTES // (2 * Lk * D * k.element_size())))
    return group, B * H - group


def _fold(dtype: torch.dtype, causal: bool) -> bool:
    """Whether the causal pointer kernels' programs each take two blocks (``FOLD``): the forward's and the
    dQ kernel's query blocks ``n-1-x`` and ``x``, the dK/dV kernel's key blocks ``x`` and ``n-1-x``, so
    that every program does the same work (n + 1 blocks' steps; the middle block of an odd n alone) where
    one block per program does 1 to n
    and the kernel ends on the heavy blocks that started last. float32 only: at the seed's shapes the
    forward took 1.02-1.11x (run 141); the bf16 forward moved 0.95-1.02x, within its spread
    (bench/results/h200/NOTES.md, attention v19)."""
    return causal and dtype == torch.float32


def _folded(grid: tuple[int, int], fold: bool) -> tuple[int, int]:
    """The (blocks, B*H) grid with two blocks per program along its first axis where ``fold``."""
    return (triton.cdiv(grid[0], 2), grid[1]) if fold else grid


def _peel(dtype: torch.dtype, causal: bool) -> bool:
    """Whether a kernel's non-causal loop takes its first block in a loop of its own (``PEEL``): float32
    only. Compiled for sm_90 (Triton 3.6), the float32 kernels' non-causal loops, whose accumulators start
    at zero before the loop, make ptxas serialize their tf32 ``wgmma`` instructions (warning C7515:
    "non wgmma instructions defining accumulator registers of a wgmma between start and end of the
    pipeline stage"); with the first block in a loop of its own, the main loop starts from that loop's
    result and every float32 kernel compiles without it, as the causal ones (two loops) already did.
    The 16-bit kernels compile without the warning either way. Correct for any length (either loop may
    run no step)."""
    return dtype == torch.float32 and not causal


def _tf32_copies(dtype: torch.dtype, interp: bool) -> bool:
    """float32 dots run on tf32 tensor cores, which read both operands of a product K-major (summed
    dimension contiguous in memory). Products summed over L (``p @ v``; ``p^T @ dout``, ``ds^T @ q``,
    ``ds @ k`` in the backward) then need copies with unit stride on L: without them Triton transposes
    every tile with 4-byte copies into shared memory, at about half the speed (bench/results/h200/NOTES.md).
    16-bit types have transposing tensor-core loads and need none."""
    return dtype == torch.float32 and not interp


@quiet_interpreter
@on_input_device
def relu_attention_bwd(q, k, v, do, causal: bool, squared: bool, scale: float, relu_scale: float,
                       dq=None, dk=None, dv=None, configs: tuple | None = None,
                       trans_copies: bool | None = None):  # fmt: skip
    """Backward on [B, H, L, D] views: returns ``(dq, dk, dv)`` (allocated when not given);
    ``configs = (dkdv_config, dq_config)`` overrides :func:`attention_config` (for tuning);
    ``trans_copies`` (default: float32 on GPUs) reads q, dout and k for the products summed over L from
    copies with unit stride on L (see :func:`_tf32_copies`). ``scale`` must be positive (as the public
    API checks): the kernels take relu's derivative from the sign of the unscaled scores."""
    if not 0 < scale < math.inf:  # NaN too
        raise ValueError(f"scale must be a finite number > 0 for the backward, got {scale}: its kernels take "
                         "relu's derivative from the sign of the unscaled scores")  # fmt: skip
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    dq = torch.empty((B, H, Lq, D), dtype=q.dtype, device=q.device) if dq is None else dq
    dk = torch.empty((B, H, Lk, D), dtype=k.dtype, device=k.device) if dk is None else dk
    dv = torch.empty((B, H, Lk, D), dtype=v.dtype, device=v.device) if dv is None else dv
    if B * H > MAX_GRID_1:  # as in relu_attention_fwd
        for b in _batch_slices(B, H):
            relu_attention_bwd(q[b], k[b], v[b], do[b], causal, squared, scale, relu_scale,
                               dq[b], dk[b], dv[b], configs, trans_copies)  # fmt: skip
        return dq, dk, dv
    interp = is_interpreted(_relu_attn_bwd_dkdv_kernel)
    copies = _tf32_copies(q.dtype, interp) if trans_copies is None else trans_copies
    cfg_dkdv = configs[0] if configs else attention_config("dkdv", D, q.dtype, causal, interp, max(Lq, Lk))
    cfg_dq = configs[1] if configs else attention_config("dq", D, q.dtype, causal, interp, max(Lq, Lk))
    tensors = (q, k, v, do, dq, dk, dv)
    decided = (causal, squared, scale, relu_scale, cfg_dkdv, cfg_dq, copies)
    key = None if interp else _plan_key("bwd", tensors, *decided)
    _planned(key, tensors, _bwd_launches, *decided, interp)
    return dq, dk, dv


def _bwd_launches(q, k, v, do, dq, dk, dv, causal, squared, scale, relu_scale, cfg_dkdv, cfg_dq, copies,
                  interp) -> None:  # fmt: skip
    """The backward's launches (see :func:`relu_attention_bwd`) with tiles ``cfg_dkdv`` and ``cfg_dq``."""
    tma = (cfg_dkdv.tma or cfg_dq.tma) and not copies and _tma_usable(interp, q, k, v, do, dq, dk, dv)
    common = (causal, squared, scale, relu_scale, interp, copies)
    # float32's copies (q and dout for the dK/dV kernel, k for the dQ kernel) in one launch up front, so
    # that nothing runs between the two kernels (the three copies live together: one more than if k's
    # came after the dK/dV kernel)
    gdc = _gdc.usable(q, interp)
    if copies:  # the Gluon kernels where their tiles fit
        tiles = TF32_BWD.get((causal, max(q.shape[2], k.shape[2]) > SHORT_L))
        if tiles and _attn_tf32.usable_bwd(q, k, v, do, None, (dq, dk, dv), interp, *tiles):
            # a kernel whose tiles say TRANS transposes its tiles itself (attention v32); the others'
            # copies are made, in one launch, in sigma's order (attention v34: every kernel relabels its
            # left operands)
            if _attn_tf32.says_write(tiles[1]):  # the dQ kernel writes q's and dout's copies (v36)
                cs = (*_copies_to_write(q), None)
                chain = gdc
            else:
                trans = [_attn_tf32.says_trans(t) for t in tiles]
                wanted = [t for t, own in ((q, trans[0]), (do, trans[0]), (k, trans[1])) if not own]
                made = iter(_l_contiguous(*wanted, signal=gdc, sigma=True))
                cs = tuple(None if own else next(made) for own in (trans[0], trans[0], trans[1]))
                chain = gdc and bool(wanted)
            found = _attn_tf32.usable_bwd(q, k, v, do, cs, (dq, dk, dv), interp, *tiles)
            if found:
                _attn_tf32.launch_bwd(q, k, v, do, dq, dk, dv, found, causal, squared, scale, relu_scale,
                                      *tiles, chain, gdc, _launch)  # fmt: skip
                return
    qc, doc, kc = _l_contiguous(q, do, k, signal=gdc) if copies else (q, do, k)
    # the two kernels are independent (each reads q, k, v and dout only): where the GPU allows, the dQ
    # kernel is a programmatic dependent launch that starts on the SMs the dK/dV kernel's last programs
    # leave, and waits for that kernel only at its end (_gdc); after float32's copies, the dK/dV kernel
    # is one too, waiting for the copies at its start
    order = dict(GDC=gdc, WAIT=True, launch_pdl=True) if copies and gdc else dict(GDC=gdc)
    _bwd_dkdv(q, k, v, do, dk, dv, qc, doc, cfg_dkdv, tma and cfg_dkdv.tma, *common, order=order)
    _bwd_dq(q, k, v, do, dq, kc, cfg_dq, tma and cfg_dq.tma, *common,
            order=dict(GDC=True, launch_pdl=True) if gdc else {})  # fmt: skip


def _qkvdo_strides(q, k, v, do) -> tuple[int, ...]:
    return (*_bhld_strides(q), *_bhld_strides(k), *_bhld_strides(v), *_bhld_strides(do))


def _bwd_dkdv(q, k, v, do, dk, dv, qc, doc, cfg, tma, causal, squared, scale, relu_scale, interp, copies,
              order):  # fmt: skip
    """The dK/dV kernel, through tensor descriptors with ``tma`` (see :func:`relu_attention_bwd`); with
    ``copies``, ``qc`` and ``doc`` are q and dout with unit stride on L; ``order``: its grid dependency
    control (``GDC``)."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    grid = (triton.cdiv(Lk, cfg.block_n), B * H)
    key = (q.device, q.dtype, D, cfg)
    relu_cvt = _relu_cvt(interp, squared, q.dtype)
    if tma:
        bind_cuda_context(q)
        _launch(
            _relu_attn_bwd_dkdv_tma_kernel, grid, key,
            _desc(q, cfg.block_m), _desc(k, cfg.block_n), _desc(v, cfg.block_n), _desc(do, cfg.block_m),
            _desc(dk, cfg.block_n), _desc(dv, cfg.block_n), H, Lq, scale, relu_scale,
            HEAD_D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal, SQUARED=squared,
            RELU_CVT=relu_cvt, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **order,
        )  # fmt: skip
        return
    fold = _fold(q.dtype, causal)
    _launch(
        _relu_attn_bwd_dkdv_kernel, _folded(grid, fold), key,
        q, k, v, do, dk, dv, qc, doc, *_qkvdo_strides(q, k, v, do), *_bhld_strides(dk), *_bhld_strides(dv),
        *_bh_d_strides(qc), *_bh_d_strides(doc), H, Lq, Lk, scale, relu_scale,
        HEAD_D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal, SQUARED=squared,
        EVEN_M=Lq % cfg.block_m == 0, EVEN_N=Lk % cfg.block_n == 0, IS_FP64=q.dtype == torch.float64,
        UPCAST=interp and q.dtype == torch.bfloat16, TRANS_COPIES=copies, RELU_CVT=relu_cvt,
        PEEL=_peel(q.dtype, causal), FOLD=fold, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **order,
    )  # fmt: skip


def _bwd_dq(q, k, v, do, dq, kc, cfg, tma, causal, squared, scale, relu_scale, interp, copies, order):
    """The dQ kernel, through tensor descriptors with ``tma`` (see :func:`relu_attention_bwd`); with
    ``copies``, ``kc`` is k with unit stride on L; ``order``: its grid dependency control (``GDC``,
    ``launch_pdl``)."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    grid = (triton.cdiv(Lq, cfg.block_m), B * H)
    key = (q.device, q.dtype, D, cfg)
    relu_cvt = _relu_cvt(interp, squared, q.dtype)
    if tma:
        bind_cuda_context(q)
        _launch(
            _relu_attn_bwd_dq_tma_kernel, grid, key,
            _desc(q, cfg.block_m), _desc(k, cfg.block_n), _desc(v, cfg.block_n), _desc(do, cfg.block_m),
            _desc(dq, cfg.block_m), H, Lk, scale, relu_scale,
            HEAD_D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal, SQUARED=squared,
            RELU_CVT=relu_cvt, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **order,
        )  # fmt: skip
        return
    fold = _fold(q.dtype, causal)
    _launch(
        _relu_attn_bwd_dq_kernel, _folded(grid, fold), key,
        q, k, v, do, dq, kc, *_qkvdo_strides(q, k, v, do), *_bhld_strides(dq), *_bh_d_strides(kc), H, Lq, Lk,
        scale, relu_scale,
        HEAD_D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal, SQUARED=squared,
        EVEN_M=Lq % cfg.block_m == 0, EVEN_N=Lk % cfg.block_n == 0, IS_FP64=q.dtype == torch.float64,
        UPCAST=interp and q.dtype == torch.bfloat16, TRANS_COPIES=copies, RELU_CVT=relu_cvt,
        PEEL=_peel(q.dtype, causal), FOLD=fold, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **order,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------------
# autograd.Function and the functional entry point
# ----------------------------------------------------------------------------------------------------


def _to_bhld(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A [B, H, L, D] view of a tensor in ``layout`` (no copy)."""
    return t if layout == "bhld" else t.transpose(1, 2)


def _unit_d(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _empty_in_layout(t: torch.Tensor, shape_bhld, layout: str) -> torch.Tensor:
    """A new contiguous tensor in ``layout`` (of [B, H, L, D] view ``_to_bhld(_, layout)``)."""
    B, H, L, D = shape_bhld
    shape = (B, H, L, D) if layout == "bhld" else (B, L, H, D)
    return torch.empty(shape, dtype=t.dtype, device=t.device)


def _attention_fwd(qb, kb, vb, causal: bool, squared: bool, scale: float, relu_scale: float | None,
                   layout: str):  # fmt: skip
    """The forward on [B, H, L, D] views (unit stride on D), its output a new tensor in ``layout``;
    ``relu_scale`` None: 1/Lk, taken here from the keys (so torch.compile need not guard on Lk)."""
    out = _empty_in_layout(qb, qb.shape, layout)  # returned as it is, no view: in-place ops on it work
    relu_scale = _relu_scale(relu_scale, kb)
    relu_attention_fwd(qb, kb, vb, causal, squared, scale, relu_scale, out=_to_bhld(out, layout))
    return out


def _attention_bwd(qb, kb, vb, dob, causal: bool, squared: bool, scale: float, relu_scale: float | None,
                   layout: str):  # fmt: skip
    """The backward on [B, H, L, D] views (unit stride on D): dq, dk, dv as new tensors in ``layout``
    (``relu_scale`` as in :func:`_attention_fwd`)."""
    dq, dk, dv = (_empty_in_layout(t, t.shape, layout) for t in (qb, kb, vb))
    relu_attention_bwd(qb, kb, vb, dob, causal, squared, scale, _relu_scale(relu_scale, kb),
                       *(_to_bhld(g, layout) for g in (dq, dk, dv)))  # fmt: skip
    return dq, dk, dv


def _relu_scale(relu_scale: float | None, kb: torch.Tensor) -> float:
    return 1.0 / kb.shape[2] if relu_scale is None else relu_scale


# the implementations of the custom operators torch.compile sees (crossfuse.ops._library): unit stride
# on D, as the launchers need (the autograd function passes such views, a direct call may not)
def _operator_fwd(q, k, v, *flags):
    return _attention_fwd(*(_unit_d(t) for t in (q, k, v)), *flags)


def _operator_bwd(q, k, v, dout, *flags):
    return _attention_bwd(*(_unit_d(t) for t in (q, k, v, dout)), *flags)


class ReLUAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, squared, scale, relu_scale, layout):
        qb, kb, vb = (_unit_d(_to_bhld(t, layout)) for t in (q, k, v))
        fwd = _library.RELU_ATTENTION_FWD if _library.tracing() else _attention_fwd
        out = fwd(qb, kb, vb, causal, squared, scale, relu_scale, layout)
        ctx.save_for_backward(qb, kb, vb)
        ctx.args = (causal, squared, scale, relu_scale, layout)
        return out

    @staticmethod
    @once_differentiable  # no double backward: differentiating the gradients raises, never silently drops
    def backward(ctx, dout):
        qb, kb, vb = ctx.saved_tensors
        dob = _to_bhld(dout, ctx.args[-1])
        # while tracing, the operator fixes the strides (torch 2.6 refused .stride() in a traced backward)
        if _library.tracing():
            grads = _library.RELU_ATTENTION_BWD(qb, kb, vb, dob, *ctx.args)
        else:
            grads = _attention_bwd(qb, kb, vb, _unit_d(dob), *ctx.args)
        return *grads, None, None, None, None, None


# whether the kernels were built for the interpreter: fixed at import, so a constant to torch.compile
_INTERPRETED = is_interpreted(_relu_attn_fwd_kernel)
_INTERPRETER_PROBLEM = interpreter_problem() if _INTERPRETED else None


def _check_attention_args(q, k, v, causal, squared, scale, relu_scale, layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    dtypes = (*KERNEL_DTYPES, torch.float64)
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name, dtypes)
        if t.dim() != 4:
            dims = "[B, H, L, D]" if layout == "bhld" else "[B, L, H, D]"
            raise ValueError(f"{name} must be 4-D ({dims}), "
                             f"got shape {list(t.shape)}")  # fmt: skip
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype; got {dtype_name(q.dtype)}, {dtype_name(k.dtype)}, "
                        f"{dtype_name(v.dtype)}")  # fmt: skip
    check_same_device(k, "k", q, "q")
    check_same_device(v, "v", q, "q")
    if q.dtype == torch.float64 and q.device.type == "cuda":
        raise TypeError("q, k, v have dtype float64: on GPUs Triton's dot has no float64; float64 runs only "
                        "under the Triton interpreter (for gradcheck); use float32, float16 or "
                        "bfloat16")  # fmt: skip
    qb, kb, vb = (_to_bhld(t, layout) for t in (q, k, v))
    (B, H, Lq, D), (Bk, Hk, Lk, Dk) = qb.shape, kb.shape
    if (Bk, Hk, Dk) != (B, H, D):
        raise ValueError(f"k's shape {list(k.shape)} does not match q's {list(q.shape)} in batch, heads or "
                         f"head dim (layout {layout!r})")  # fmt: skip
    if tuple(vb.shape) != tuple(kb.shape):
        raise ValueError(f"v's shape {list(v.shape)} must equal k's {list(k.shape)}")
    if D not in HEAD_DIMS:
        raise ValueError(f"head dim D={D} is not supported; q, k, v need D in {HEAD_DIMS}")
    if Lk < 1:
        raise ValueError(f"k and v need at least one key (Lk={Lk})")
    if H > MAX_GRID_1:
        raise ValueError(f"at most {MAX_GRID_1} heads are supported (a grid axis holds them), got H={H}")
    if causal and Lq != Lk:
        raise ValueError(f"causal=True needs equal query and key lengths, got Lq={Lq}, Lk={Lk}")
    for name, flag in (("causal", causal), ("squared", squared)):
        check_bool(flag, name)
    if scale is not None:
        check_positive_float(scale, "scale", allow_zero=False)
    if relu_scale is not None:
        check_positive_float(relu_scale, "relu_scale")
    check_runnable(q, "q", _INTERPRETED, _INTERPRETER_PROBLEM)
    return D


def relu_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    squared: bool = False,
    scale: float | None = None,
    relu_scale: float | None = None,
    layout: str = "bhld",
) -> torch.Tensor:
    """ReLU attention ``relu_scale * act(mask(q k^T * scale)) @ v``, fused in Triton.

    ``act`` is ``relu`` (or ``relu^2`` with ``squared``); ``scale`` defaults to ``1/sqrt(D)``,
    ``relu_scale`` to ``1/Lk``. ``layout`` is ``"bhld"`` ([B, H, L, D]) or ``"blhd"`` ([B, L, H, D]);
    the output has the same layout. Differentiable in q, k and v. See the module docstring.
    """
    D = _check_attention_args(q, k, v, causal, squared, scale, relu_scale, layout)
    causal, squared = bool(causal), bool(squared)  # numpy's bools too
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    relu_scale = None if relu_scale is None else float(relu_scale)  # None: 1/Lk (see _attention_fwd)
    if _library.tracing():  # q, k, v given as one tensor (self-attention on shared inputs): see distinct
        q, k, v = _library.distinct(q, k, v)
    return ReLUAttentionFunction.apply(q, k, v, causal, squared, scale, relu_scale, layout)
