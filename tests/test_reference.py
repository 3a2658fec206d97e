"""The pure-torch variants: their custom Functions (gradcheck), eps conventions and edge cases."""

from __future__ import annotations

import pytest
import torch
from crossfuse import reference as ref
from crossfuse.tolerances import relerr


def randn(shape, gen, dtype=torch.float64, mean=0.0, std=1.0):
    return (torch.randn(shape, dtype=torch.float64, generator=gen) * std + mean).to(dtype)


@pytest.mark.parametrize("fn", [ref.normal_new, ref.normal_newer], ids=["normal_new", "normal_newer"])
def test_normalise_functions_gradcheck(fn, gen):
    x = randn((4, 9), gen).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: fn(x, 1e-5), (x,))


@pytest.mark.parametrize(
    "std, eps", [(1.0, 1e-5), (1e-3, 1e-2)], ids=["std > eps", "std < eps: eps floor branch"]
)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_single_pass_layer_norm_gradcheck(std, eps, affine, gen):
    x = randn((3, 11), gen, std=std).requires_grad_(True)
    a = randn((11,), gen, mean=1.0).requires_grad_(True) if affine else None
    b = randn((11,), gen).requires_grad_(True) if affine else None
    inputs = (x, a, b) if affine else (x,)
    fn = (
        (lambda x, a, b: ref.layer_norm(x, a, b, eps))
        if affine
        else (lambda x: ref.layer_norm(x, None, None, eps))
    )
    assert torch.autograd.gradcheck(fn, inputs)


def test_variants_share_the_formula(gen):
    # all three normalise variants and the affine layernorm compute the same function in float64
    x = randn((6, 50), gen)
    y = ref.normalise_ref(x, 1e-5)
    for fn in (ref.normal_now, ref.normal_new, ref.normal_newer):
        assert relerr(fn(x, 1e-5), y) < 1e-13
    w, b = randn((50,), gen), randn((50,), gen)
    assert relerr(ref.layernorm(x, w, b, 1e-5), ref.layer_norm_ref(x, w, b, 1e-5)) < 1e-13
    assert relerr(ref.layer_norm(x, w, b, 1e-5), ref.layer_norm_maxstd_ref(x, w, b, 1e-5)) < 1e-10


def test_default_eps_is_machine_epsilon_of_the_dtype(gen):
    # the seed's eps(eltype(x)): visible on rows whose variance is comparable to eps
    x = randn((2, 8), gen, dtype=torch.float32, std=1e-3)
    expected = ref.normalise_ref(x, torch.finfo(torch.float32).eps)
    assert relerr(ref.normal_new(x), expected) < 1e-5
    assert relerr(ref.normal_new(x), ref.normalise_ref(x, 1e-5)) > 1e-2


def test_maxstd_eps_is_a_floor_on_std_not_added_to_var(gen):
    x = randn((3, 16), gen, std=1e-4)
    std = x.std(-1, correction=0, keepdim=True)
    assert torch.allclose(ref.layer_norm(x, eps=1e-2), (x - x.mean(-1, keepdim=True)) / 1e-2)
    big = randn((3, 16), gen)
    std = big.std(-1, correction=0, keepdim=True)
    assert torch.allclose(ref.layer_norm(big, eps=1e-2), (big - big.mean(-1, keepdim=True)) / std)


def test_one_feature_gives_zeros_and_finite_gradients(gen):
    x = randn((5, 1), gen, dtype=torch.float32).requires_grad_(True)
    for fn in (ref.normal_now, ref.normal_new, ref.normal_newer, ref.layernorm, ref.layer_norm):
        y = fn(x)
        assert torch.equal(y, torch.zeros_like(y)), fn.__name__
        (g,) = torch.autograd.grad(y, x, torch.randn_like(y))
        assert torch.isfinite(g).all(), fn.__name__


@pytest.mark.parametrize("fn", [ref.normal_new, ref.normal_newer, ref.layer_norm],
                         ids=["normal_new", "normal_newer", "layer_norm"])  # fmt: skip
def test_backwards_leave_the_incoming_gradient_alone(fn, gen):
    # the hand-written backwards work in place on temporaries of their own: the gradient they are given
    # (shared with other branches of the graph, or an expanded tensor from .sum()) stays as it was
    x = randn((4, 10), gen, dtype=torch.float32).requires_grad_(True)
    a = randn((4, 10), gen, dtype=torch.float32).requires_grad_(True)
    c = randn((4, 10), gen, dtype=torch.float32)
    ((a * 3 + fn(x)) * c).sum().backward()  # dy of fn is c, also a's gradient path
    assert torch.equal(a.grad, 3 * c)
    fn(x).sum().backward()  # dy an expanded (stride 0) tensor
    g = randn((4, 10), gen, dtype=torch.float32)
    g0 = g.clone()
    fn(x).backward(g)
    assert torch.equal(g, g0)


@pytest.mark.parametrize("fn", [ref.normal_new, ref.layer_norm], ids=["normal_new", "layer_norm"])
def test_differentiating_the_gradient_is_a_clear_error(fn, gen):
    x = randn((4, 10), gen).requires_grad_(True)
    y = fn(x)
    (gx,) = torch.autograd.grad(y.pow(3).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        (y.sum() + gx.square().sum()).backward()
