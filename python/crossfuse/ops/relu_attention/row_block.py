"""A baseline peer: ReLU attention the way the seed notebook computes it, written here.

Each program takes a block of query rows of one (batch, head) and walks the keys in blocks of the same
size, once: scores, mask, relu (or its square), and the product with the values summed into the block's
output. The backward is one kernel: program i takes block i as queries (its dq, over the key blocks) and
as keys (its dk and dv, over the query blocks). Blocks of min(L, 64) rows (16 at least, as the dots
need), 4 warps, no software pipelining, no tile of the head dim, float32 dots on tf32: the notebook's
launch. Where a GPU's shared memory cannot hold a program's tiles (the backward at D=256 asks for 384 KB
on 64-row blocks; a Hopper has 227 KB), the blocks are halved until it can (:func:`_launch`). crossfuse's
own kernels (:mod:`.launch`) are measured against it; it is not used by them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from ..._validate import check_attention_args
from .config import HEAD_DIMS

NUM_WARPS = 4


@triton.jit
def _key_block(k_ptr, v_ptr, q, rows, cols, start, bh, LK, scale, D: tl.constexpr, BLOCK: tl.constexpr,
               CAUSAL: tl.constexpr):  # fmt: skip
    """The keys and values of the block from ``start``, the query rows ``rows``' scores against them
    (``q`` those rows), and where a score counts (a key there, and not after the query when causal)."""
    keys = start + tl.arange(0, BLOCK)
    at = bh * LK * D + keys[:, None] * D + cols[None, :]
    k = tl.load(k_ptr + at, mask=(keys < LK)[:, None], other=0.0)
    v = tl.load(v_ptr + at, mask=(keys < LK)[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k)) * scale
    keep = (keys < LK)[None, :]
    if CAUSAL:
        keep = keep & (rows[:, None] >= keys[None, :])
    return k, v, s, keep


@triton.jit
def _row_block_fwd_kernel(q_ptr, k_ptr, v_ptr, out_ptr, LQ, LK, scale, relu_scale,
                          D: tl.constexpr, BLOCK: tl.constexpr, CAUSAL: tl.constexpr,
                          SQUARED: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, D)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    q = tl.load(q_ptr + bh * LQ * D + rows[:, None] * D + cols[None, :], mask=(rows < LQ)[:, None], other=0.0)
    acc = tl.zeros((BLOCK, D), dtype=tl.float32)
    hi = tl.minimum((pid + 1) * BLOCK, LK) if CAUSAL else LK
    for start in range(0, hi, BLOCK):
        _k, v, s, keep = _key_block(k_ptr, v_ptr, q, rows, cols, start, bh, LK, scale, D, BLOCK, CAUSAL)
        p = tl.where(keep & (s > 0), s, 0.0)
        if SQUARED:
            p = p * p
        acc += tl.dot(p.to(v.dtype), v)
    out = (acc * relu_scale).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + bh * LQ * D + rows[:, None] * D + cols[None, :], out, mask=(rows < LQ)[:, None])


@triton.jit
def _row_block_bwd_kernel(q_ptr, k_ptr, v_ptr, do_ptr, dq_ptr, dk_ptr, dv_ptr, LQ, LK, scale, relu_scale,
                          D: tl.constexpr, BLOCK: tl.constexpr, CAUSAL: tl.constexpr,
                          SQUARED: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, D)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    if pid * BLOCK < LQ:  # block i as queries: dq_i = scale * sum_j ds_ij k_j
        qat = bh * LQ * D + rows[:, None] * D + cols[None, :]
        q = tl.load(q_ptr + qat, mask=(rows < LQ)[:, None], other=0.0)
        do = tl.load(do_ptr + qat, mask=(rows < LQ)[:, None], other=0.0)
        dq = tl.zeros((BLOCK, D), dtype=tl.float32)
        hi = tl.minimum((pid + 1) * BLOCK, LK) if CAUSAL else LK
        for start in range(0, hi, BLOCK):
            kj, vj, s, keep = _key_block(k_ptr, v_ptr, q, rows, cols, start, bh, LK, scale, D, BLOCK, CAUSAL)
            dp = tl.dot(do, tl.trans(vj)) * relu_scale
            ds = tl.where(keep & (s > 0), 2 * s * dp if SQUARED else dp, 0.0)
            dq += tl.dot(ds.to(kj.dtype), kj)
        tl.store(dq_ptr + qat, (dq * scale).to(dq_ptr.dtype.element_ty), mask=(rows < LQ)[:, None])
    if pid * BLOCK < LK:  # block i as keys: dk_i = scale * sum_j ds_ji q_j, dv_i = sum_j p_ji do_j
        kat = bh * LK * D + rows[:, None] * D + cols[None, :]
        k = tl.load(k_ptr + kat, mask=(rows < LK)[:, None], other=0.0)
        v = tl.load(v_ptr + kat, mask=(rows < LK)[:, None], other=0.0)
        dk = tl.zeros((BLOCK, D), dtype=tl.float32)
        dv = tl.zeros((BLOCK, D), dtype=tl.float32)
        lo = pid * BLOCK if CAUSAL else 0
        for start in range(lo, LQ, BLOCK):
            queries = start + tl.arange(0, BLOCK)
            qat = bh * LQ * D + queries[:, None] * D + cols[None, :]
            qj = tl.load(q_ptr + qat, mask=(queries < LQ)[:, None], other=0.0)
            doj = tl.load(do_ptr + qat, mask=(queries < LQ)[:, None], other=0.0)
            s = tl.dot(qj, tl.trans(k)) * scale  # [queries, keys]
            keep = (queries < LQ)[:, None] & (rows < LK)[None, :]
            if CAUSAL:
                keep = keep & (queries[:, None] >= rows[None, :])
            live = keep & (s > 0)
            p = tl.where(live, s, 0.0)
            if SQUARED:
                p = p * p
            dv += tl.dot(tl.trans(p.to(doj.dtype)), doj)
            dp = tl.dot(doj, tl.trans(v)) * relu_scale
            ds = tl.where(live, 2 * s * dp if SQUARED else dp, 0.0)
            dk += tl.dot(tl.trans(ds.to(qj.dtype)), qj)
        tl.store(dk_ptr + kat, (dk * scale).to(dk_ptr.dtype.element_ty), mask=(rows < LK)[:, None])
        tl.store(dv_ptr + kat, (dv * relu_scale).to(dv_ptr.dtype.element_ty), mask=(rows < LK)[:, None])


MIN_BLOCK, MAX_BLOCK = 16, 64  # rows of a block: the dots' smallest operand; the notebook's block
# (kernel, D, device) -> the rows of a block that fit that GPU's shared memory, where fewer than MAX_BLOCK
_BLOCK_THAT_FITS: dict[tuple, int] = {}


def _block(lq: int, lk: int) -> int:
    return max(MIN_BLOCK, min(MAX_BLOCK, triton.next_power_of_2(max(lq, lk, 1))))


def _launch(kernel, q, k, tensors: tuple, scalars: tuple, causal: bool, squared: bool) -> None:
    """``kernel`` on blocks of ``_block`` rows, or of fewer where Triton refuses the launch for its shared
    memory (``OutOfResources``, before anything runs): then halved, down to MIN_BLOCK, and remembered for
    the kernel, head dim and device. The grid takes a program per block of the longer length."""
    B, H, LQ, D = q.shape
    LK = k.shape[2]
    slot = (kernel, D, q.device)
    block = min(_block(LQ, LK), _BLOCK_THAT_FITS.get(slot, MAX_BLOCK))
    while True:
        grid = (triton.cdiv(max(LQ, LK), block), B * H)
        try:
            kernel[grid](*tensors, LQ, LK, *scalars, D=D, BLOCK=block, CAUSAL=causal, SQUARED=squared,
                         num_warps=NUM_WARPS, num_stages=1)  # fmt: skip
            return
        except OutOfResources as exc:
            if exc.name != "shared memory" or block <= MIN_BLOCK:
                raise
            block //= 2
            _BLOCK_THAT_FITS[slot] = block


class _RowBlockAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, squared, scale, relu_scale):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out = torch.empty_like(q)
        if out.numel() and k.shape[2]:
            _launch(_row_block_fwd_kernel, q, k, (q, k, v, out), (scale, relu_scale), causal, squared)
        else:
            out.zero_()
        ctx.save_for_backward(q, k, v)
        ctx.args = (causal, squared, scale, relu_scale)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        causal, squared, scale, relu_scale = ctx.args
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        if q.numel() and k.shape[2]:
            grads = (q, k, v, dout.contiguous(), dq, dk, dv)
            _launch(_row_block_bwd_kernel, q, k, grads, (scale, relu_scale), causal, squared)
        return dq, dk, dv, None, None, None, None


def relu_attention_row_block(q, k, v, causal: bool = False, squared: bool = False, scale=None,
                             relu_scale=None) -> torch.Tensor:  # fmt: skip
    """``relu_scale * act(mask(q k^T * scale)) @ v`` on [B, H, L, D] float32 tensors (the notebook's dtype,
    the one it is measured in) by the seed notebook's algorithm (see the module docstring); D one of
    HEAD_DIMS."""
    check_attention_args(q, k, v, causal, squared, scale, relu_scale)
    if q.dtype != torch.float32:
        raise TypeError(f"q must be float32 (a baseline of the notebook's float32 kernel), got {q.dtype}")
    d = q.shape[-1]
    if d not in HEAD_DIMS:
        raise ValueError(f"q's head dim must be one of {HEAD_DIMS}, got {d}")
    from ...reference.attention import attention_scales

    scale, relu_scale = attention_scales(d, k.shape[-2], scale, relu_scale)
    return _RowBlockAttention.apply(q, k, v, bool(causal), bool(squared), scale, relu_scale)
