"""Triton helpers that the layer norm's forward and backward kernels share (all ``@triton.jit``)."""

from __future__ import annotations

import triton
import triton.language as tl

from ..._backend import is_interpreted


@triton.jit
def _div(x, n, IS_FP64: tl.constexpr):
    """``x / n``, correctly rounded (a plain float32 division on GPUs may be an ulp off, which a zero
    variance multiplies by 1/sqrt(eps))."""
    if IS_FP64:
        return x / n
    else:
        return tl.math.div_rn(x, n * 1.0)  # n may be a constexpr (Triton specialises N == 1)


@triton.jit
def _div_n(x, N, inv_n, POW2_N: tl.constexpr, IS_FP64: tl.constexpr):
    """``x / N`` correctly rounded: where N is a power of 2, a product by ``inv_n`` (= 1/N, then exact:
    the same result for one instruction instead of a division's dozen), else ``_div``."""
    if POW2_N:
        return x * inv_n
    else:
        return _div(x, N, IS_FP64)


@triton.jit
def _add_pairs(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


# Whether these kernels run under Triton's interpreter, as a constant the compiler folds: the interpreter
# runs a tl.reduce with a combine function of its own element by element in Python (over a minute for the
# forward of 1024x1024 float32), a tl.sum as one numpy sum
_INTERPRETED = tl.constexpr(is_interpreted(_add_pairs))


@triton.jit
def _sum2(a, b, axis: tl.constexpr):
    """``(tl.sum(a, axis), tl.sum(b, axis))`` in one reduction: one trip through shared memory and its
    barriers where two separate sums would take two (under the interpreter, two sums)."""
    if _INTERPRETED:
        return tl.sum(a, axis), tl.sum(b, axis)
    else:
        return tl.reduce((a, b), axis, _add_pairs)


@triton.jit
def _load_rows(P, stride, rows, M, cols, col_ok):
    """The [rows, cols] tile of a (M, N) array with row stride ``stride``, in its own dtype; rows past M
    and columns past N read as 0 (and move no bytes)."""
    mask = (rows < M)[:, None] & col_ok[None, :]
    return tl.load(P + rows.to(tl.int64)[:, None] * stride + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _columns(N, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr):
    """The tile's column offsets and which are inside the row (known true when N == BLOCK_N, so that the
    compiler drops the column predicates)."""
    cols = tl.arange(0, BLOCK_N)
    if EVEN_N:
        return cols, cols < BLOCK_N
    else:
        return cols, cols < N


@triton.jit
def _kept_params(W, B, cols, col_ok, acc_ty: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                 KEEP_PARAMS: tl.constexpr):  # fmt: skip
    """Weight and bias loaded once per program where KEEP_PARAMS (a program walking many tiles then needs
    no re-read, an L1/L2 round trip, before each store); placeholders where they are loaded per tile."""
    weight = cols
    bias = cols
    if KEEP_PARAMS:
        if HAS_WEIGHT:
            weight = tl.load(W + cols, mask=col_ok, other=0.0).to(acc_ty)
        if HAS_BIAS:
            bias = tl.load(B + cols, mask=col_ok, other=0.0).to(acc_ty)
    return weight, bias


@triton.jit
def _centred_moments(xc, col_ok, N, inv_n, EVEN_N: tl.constexpr, POW2_N: tl.constexpr, IS_FP64: tl.constexpr):
    """``(xc, corr, var)`` of a tile ``xc`` of rows each centred on a value near its mean: the mean is that
    value + corr (masked columns set to 0 in the returned ``xc``, out of the sums)."""
    if not EVEN_N:  # masked columns read as 0: out of the centred sums (masked rows: x = mean = 0)
        xc = tl.where(col_ok[None, :], xc, 0.0)
    sum_xc, sum_xc2 = _sum2(xc, xc * xc, 1)
    corr = _div_n(sum_xc, N, inv_n, POW2_N, IS_FP64)
    return xc, corr, tl.maximum(_div_n(sum_xc2, N, inv_n, POW2_N, IS_FP64) - corr * corr, 0.0)
