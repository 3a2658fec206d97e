"""Triton building blocks shared by the attention's forward and backward kernels."""

from __future__ import annotations

import triton
import triton.language as tl


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
def _tile(desc, b, h, start, ROWS: tl.constexpr, HEAD_D: tl.constexpr):
    """A [ROWS, HEAD_D] tile of head (b, h) from row ``start`` of a rank-4 [B, H, L, D] descriptor."""
    return desc.load([b, h, start, 0]).reshape([ROWS, HEAD_D])
