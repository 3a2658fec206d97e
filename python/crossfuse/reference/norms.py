"""Pure-torch normalisation variants: the Julia package's variants, written again in torch.

Three ops, named by what they compute (the same names and formulas as the Julia package ``CrossFuse``):

* ``normalise``: ``(x - mean) / sqrt(var + eps)`` over the last dim, biased variance, no affine part;
  ``eps`` defaults to the machine epsilon of x's dtype (the seed's ``eps(eltype(x))``).
  Implementations: :func:`normal_now`, :func:`normal_new`, :func:`normal_newer`.
* ``layer_norm``: torch's affine layer norm ``(x - mean) / sqrt(var + eps) * w + b``, ``eps=1e-5``.
  Implementation here: :func:`layernorm` (NNlib-style, plain autograd).
* ``layer_norm_maxstd``: ``alpha * (x - mean) / max(std, eps) + beta`` with ``std`` from a single pass
  over sum and sum of squares, ``eps=1e-5`` (NeuralAttentionlib-style). Implementation:
  :func:`layer_norm`. A different eps convention from torch's: it is its own op.

Float64 references for all three: :func:`normalise_ref`, :func:`layer_norm_ref`,
:func:`layer_norm_maxstd_ref` (two-pass, in float64 whatever the input dtype).

Arguments are checked as ``crossfuse.layer_norm`` checks them (``crossfuse._validate``): a
TypeError/ValueError naming the argument; only the kernels' limit on a row's length does not apply.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .._validate import check_norm_args


def _default_eps(x: torch.Tensor, eps: float | None) -> float:
    return torch.finfo(x.dtype).eps if eps is None else float(eps)


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Statistics dtype: float32 for 16-bit inputs, else the input's own."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# ----------------------------------------------------------------------------------------------------
# float64 references
# ----------------------------------------------------------------------------------------------------


def normalise_ref(x: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the last dim, computed in float64 (returns float64)."""
    check_norm_args(x, {}, eps, eps_may_be_none=True)
    eps = _default_eps(x, eps)
    x = x.double()
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).square().mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps)


def layer_norm_ref(x, weight=None, bias=None, eps: float = 1e-5) -> torch.Tensor:
    """torch's layer norm over the last dim in float64: ``normalise(x) * weight + bias``."""
    check_norm_args(x, {"weight": weight, "bias": bias}, eps)
    y = normalise_ref(x, eps)
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y


def layer_norm_maxstd_ref(x, alpha=None, beta=None, eps: float = 1e-5) -> torch.Tensor:
    """``alpha * (x - mean) / max(std, eps) + beta`` in float64, two-pass statistics."""
    check_norm_args(x, {"alpha": alpha, "beta": beta}, eps)
    x = x.double()
    mean = x.mean(-1, keepdim=True)
    # max(std, eps) as sqrt(max(var, eps^2)): the same value, and a zero (not 0 * inf) gradient where
    # the floor is active, e.g. a zero variance
    sigma = (x - mean).square().mean(-1, keepdim=True).clamp(min=eps * eps).sqrt()
    y = (x - mean) / sigma
    if alpha is not None:
        y = y * alpha.double()
    if beta is not None:
        y = y + beta.double()
    return y


# ----------------------------------------------------------------------------------------------------
# normalise: normal_now, normal_new, normal_newer
# ----------------------------------------------------------------------------------------------------


def normal_now(x: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)``: mean, then var with that mean, then a sqrt per element.

    The plain form (what Flux's LayerNorm does); differentiated by torch's autograd, which keeps
    several (M, N) intermediates for the backward. 16-bit inputs are computed in float32 (as every
    variant here is), so the variants differ in memory and speed, not in precision.
    """
    check_norm_args(x, {}, eps, eps_may_be_none=True)
    eps = _default_eps(x, eps)
    xa = x.to(_acc_dtype(x.dtype))
    mean = xa.mean(-1, keepdim=True)
    var = (xa - mean).square().mean(-1, keepdim=True)
    return ((xa - mean) / torch.sqrt(var + eps)).to(x.dtype)


class _NormaliseFunction(torch.autograd.Function):
    """``y = (x - mean) * istd`` with the seed's memory-saving backward.

    Backward, with ``c = x - mean`` and sums over the normalised dim::

        dx = istd * (dy - sum(dy)/N - y * istd * sum(dy * c)/N)

    computed in one (M, N) temporary: ``tmp = dy * c`` is reduced, then overwritten with ``dx``.
    Saves ``x``, ``y`` and the (M, 1) ``mean`` and ``istd``.
    """

    @staticmethod
    def forward(ctx, x, eps, welford):
        acc = _acc_dtype(x.dtype)
        xa = x.to(acc)
        if welford:
            var, mean = torch.var_mean(xa, dim=-1, keepdim=True, correction=0)
        else:
            mean = xa.mean(-1, keepdim=True)
            var = (xa - mean).square().mean(-1, keepdim=True)
        istd = torch.rsqrt(var + eps)
        y = ((xa - mean) * istd).to(x.dtype)
        ctx.save_for_backward(x, y, mean, istd)
        return y

    @staticmethod
    @once_differentiable  # a hand-written first derivative: differentiating it again raises
    def backward(ctx, dy):
        x, y, mean, istd = ctx.saved_tensors
        inv_n = 1.0 / x.shape[-1]
        acc = mean.dtype
        tmp = torch.sub(x, mean, out=torch.empty(x.shape, dtype=acc, device=x.device))
        tmp.mul_(dy)  # tmp = dy * (x - mean)
        s_dy = dy.sum(-1, keepdim=True, dtype=acc)
        s_tmp = tmp.sum(-1, keepdim=True)
        torch.mul(y, istd * s_tmp * inv_n, out=tmp)  # tmp is reused for dx from here on
        tmp.neg_().add_(dy).sub_(s_dy * inv_n).mul_(istd)
        return tmp.to(x.dtype), None, None


def normal_new(x: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """``(x - mean) * istd`` with ``istd = 1 / sqrt(var + eps)``: one rsqrt per row, not per element.

    Mean then var (two passes). A custom autograd.Function whose backward uses one (M, N) temporary
    (see ``_NormaliseFunction``): the seed's memory trick.
    """
    check_norm_args(x, {}, eps, eps_may_be_none=True)
    return _NormaliseFunction.apply(x, _default_eps(x, eps), False)


def normal_newer(x: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """As :func:`normal_new`, with one-pass Welford statistics (``torch.var_mean``)."""
    check_norm_args(x, {}, eps, eps_may_be_none=True)
    return _NormaliseFunction.apply(x, _default_eps(x, eps), True)


# ----------------------------------------------------------------------------------------------------
# layer_norm (affine, torch convention): layernorm
# ----------------------------------------------------------------------------------------------------


def layernorm(x, weight=None, bias=None, eps: float = 1e-5) -> torch.Tensor:
    """NNlib-style affine layer norm: ``(x - mean) / sqrt(var + eps) * weight + bias`` over the last dim.

    Written with plain torch ops (mean, var, sqrt) and differentiated by autograd: the naive form.
    """
    check_norm_args(x, {"weight": weight, "bias": bias}, eps)
    acc = _acc_dtype(x.dtype)
    xa = x.to(acc)
    mean = xa.mean(-1, keepdim=True)
    var = xa.var(-1, keepdim=True, correction=0)
    y = (xa - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight.to(acc)
    if bias is not None:
        y = y + bias.to(acc)
    return y.to(x.dtype)


# ----------------------------------------------------------------------------------------------------
# layer_norm_maxstd (single pass, max(std, eps)): layer_norm
# ----------------------------------------------------------------------------------------------------


class _LayerNormMaxStdFunction(torch.autograd.Function):
    """Single-pass ``alpha * (x - mean) / max(std, eps) + beta`` and its memory-saving backward.

    Forward: ``s1 = sum(x)``, ``s2 = sum(x * x)`` in one pass; ``mean = s1/N``;
    ``std = sqrt(max(fma(mean, -mean, s2/N), 0))``; ``sigma = max(std, eps)``; ``n = (x - mean)/sigma``.
    Backward with ``g = dy * alpha``: where ``std >= eps``,
    ``dx = (g - mean(g) - n * mean(g * n)) / sigma``; where ``std < eps`` the denominator is the
    constant ``eps`` and ``dx = (g - mean(g)) / eps``. ``dalpha = sum(dy * n)``, ``dbeta = sum(dy)``
    over rows. Saves ``n`` and the (M, 1) ``sigma``.
    """

    @staticmethod
    def forward(ctx, x, alpha, beta, eps):
        acc = _acc_dtype(x.dtype)
        xa = x.to(acc)
        inv_n = 1.0 / x.shape[-1]
        mean = xa.sum(-1, keepdim=True) * inv_n
        ex2 = torch.linalg.vecdot(xa, xa, dim=-1).unsqueeze(-1) * inv_n
        var = torch.addcmul(ex2, mean, mean, value=-1.0).clamp_(min=0.0)  # fma(mean, -mean, E[x^2])
        sigma = var.sqrt_().clamp_(min=eps)
        n = (xa - mean) / sigma
        y = n
        if alpha is not None:
            y = y * alpha.to(acc)
        if beta is not None:
            y = y + beta.to(acc)
        ctx.save_for_backward(n, sigma, alpha)
        ctx.eps = eps
        ctx.beta_dtype = None if beta is None else beta.dtype
        return y.to(x.dtype)

    @staticmethod
    @once_differentiable  # a hand-written first derivative: differentiating it again raises
    def backward(ctx, dy):
        n, sigma, alpha = ctx.saved_tensors
        acc = n.dtype
        lead = tuple(range(dy.dim() - 1))
        dalpha = (dy * n).sum(lead).to(alpha.dtype) if ctx.needs_input_grad[1] else None
        dbeta = dy.sum(lead, dtype=acc).to(ctx.beta_dtype) if ctx.needs_input_grad[2] else None
        dx = None
        if ctx.needs_input_grad[0]:
            # the one (M, N) temporary, changed in place below: a copy even where dy has acc's dtype
            g = dy.to(acc, copy=True) if alpha is None else dy * alpha.to(acc)
            g_mean = g.mean(-1, keepdim=True)
            gn_mean = torch.linalg.vecdot(g, n, dim=-1).unsqueeze(-1) / n.shape[-1]
            gn_mean = torch.where(sigma > ctx.eps, gn_mean, 0.0)  # max(std, eps) is flat below eps
            g.sub_(g_mean).sub_(n * gn_mean).div_(sigma)
            dx = g.to(dy.dtype)
        return dx, dalpha, dbeta, None


def layer_norm(x, alpha=None, beta=None, eps: float = 1e-5) -> torch.Tensor:
    """NeuralAttentionlib-style single-pass layer norm: ``alpha * (x - mean) / max(std, eps) + beta``.

    Statistics from one pass over ``sum(x)`` and ``sum(x^2)`` (``var = E[x^2] - mean^2`` with an fma),
    in float32 for 16-bit inputs: fast, but it loses precision when ``|mean| >> std`` (the
    cancellation in ``E[x^2] - mean^2``). ``eps`` is a floor on the std, not added to the variance.
    """
    check_norm_args(x, {"alpha": alpha, "beta": beta}, eps)
    return _LayerNormMaxStdFunction.apply(x, alpha, beta, float(eps))
