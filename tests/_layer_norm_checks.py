"""What the layer-norm tests share: inputs, tolerances, and the checks against the float64 reference."""

from __future__ import annotations

import crossfuse
import torch
from crossfuse.ops import layer_norm as ln_mod
from crossfuse.reference import layer_norm_ref
from crossfuse.tolerances import relerr, tolerance

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def randn(shape, dtype, device, gen, mean=0.0, std=1.0):
    return (torch.randn(shape, dtype=torch.float64, generator=gen) * std + mean).to(
        device=device, dtype=dtype
    )


# dw and db of the fused kernels are sums over rows in float32, rounded once to the parameter's dtype:
# in 16 bits their error is that rounding, flat in the row count, where the registry's "reduced"
# tolerance grows with sqrt(M) (it also covers peers that sum in 16 bits). The bounds are an ulp or two (a
# single element rounds by up to that under the interpreter, whose conversions may truncate: 4.9e-3
# seen for a one-element db in bfloat16). A row left out of the sums moves them by about 1/sqrt(M)
# (random signs): these bounds catch it up to M ~ 16000 in bfloat16, 250000 in float16.
FLOAT32_SUMS = {torch.float16: 2.0**-9, torch.bfloat16: 2.0**-7}


def ln_tol(x_dtype, kind, rows, grad_dtype=None):
    """The tolerance of a fused layer-norm output or gradient (see FLOAT32_SUMS)."""
    tol = tolerance("layer_norm", x_dtype, kind, rows)
    if kind == "reduced":
        tol = min(tol, FLOAT32_SUMS.get(grad_dtype or x_dtype, tol))
    return tol


def check_against_reference(x, weight, bias, eps=1e-5, gen=None):
    """Forward and gradients of the fused kernel vs the float64 reference, with per-dtype tolerances."""
    n = x.shape[-1]
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None for t in (x, weight, bias)]
    y = crossfuse.layer_norm(leaves[0], (n,), leaves[1], leaves[2], eps)
    dy = torch.randn(y.shape, dtype=torch.float64, generator=gen).to(device=y.device, dtype=y.dtype)
    y.backward(dy)
    refs = [t.detach().double().requires_grad_(True) if t is not None else None for t in (x, weight, bias)]
    y_ref = layer_norm_ref(refs[0], refs[1], refs[2], eps)
    y_ref.backward(dy.double())
    rows = max(1, x.numel() // n)
    assert y.dtype == x.dtype and y.shape == x.shape
    errors = {"y": (relerr(y, y_ref), tolerance("layer_norm", x.dtype, "fwd"))}
    kinds = ("bwd", "reduced", "reduced")
    for name, got, ref, kind in zip(("x", "weight", "bias"), leaves, refs, kinds, strict=True):
        if got is None:
            continue
        assert got.grad is not None and got.grad.dtype == got.dtype, name
        errors["d" + name] = (relerr(got.grad, ref.grad), ln_tol(x.dtype, kind, rows, got.grad.dtype))
    if n == 1:
        # one feature: dx is exactly 0 (y == bias whatever x is), so a relative error is undefined: the
        # kernels give 0 exactly (see _ln_bwd_tile's ONE_COL)
        errors.pop("dx")
        assert torch.equal(leaves[0].grad, torch.zeros_like(leaves[0].grad))
    bad = {k: v for k, v in errors.items() if not v[0] <= v[1]}
    assert not bad, f"relative error over tolerance (error, tolerance): {bad}"
    return errors


def check_backward_and_repeat(got, dy, x, w, w_ref, mean, rstd, grads, cfg, few=None):
    """``got`` = layer_norm_bwd(dy, x, w, mean, rstd, *grads, config=cfg, few=few) against float64 autograd
    of the reference with weight ``w_ref`` (dx, and dw/db where ``grads`` asks, else None), each within its
    tolerance; then the same call again gives the same gradients bit for bit. ``few`` None: the default
    few-rows rule."""
    m, n = x.shape
    leaves = [t.double().requires_grad_(True) for t in (x, w_ref, torch.zeros(n, device=x.device))]
    layer_norm_ref(*leaves, 1e-5).backward(dy.double())
    for i, (kind, want) in enumerate(zip(("bwd", "reduced", "reduced"), (True, *grads), strict=True)):
        if not want:
            assert got[i] is None
            continue
        tol = ln_tol(x.dtype, kind, m, got[i].dtype)
        assert relerr(got[i], leaves[i].grad) <= tol, (i, relerr(got[i], leaves[i].grad), tol)
    rule = {} if few is None else {"few": few}
    again = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, *grads, config=cfg, **rule)
    for a, b in zip(got, again, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)
