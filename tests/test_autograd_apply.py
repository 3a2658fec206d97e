"""The eager autograd Functions' shared pieces (crossfuse.ops._runtime.autograd)."""

from __future__ import annotations

import pytest
import torch
from crossfuse.ops._runtime.autograd import backward_once, plain_apply


def _triple(ctx, grad):
    return grad * 3


class Triple(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3

    backward = backward_once(_triple, "triple")


def _square_grad(ctx, grad):
    (x,) = ctx.saved_tensors
    return 2 * x * grad


class Square(torch.autograd.Function):  # a gradient that depends on the input it saved
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    backward = backward_once(_square_grad, "square")


def test_plain_apply_is_apply():
    # the C apply: the same graph and gradient as Function.apply (the ops' entry points refuse torch.func
    # transforms before they reach it: see the last test)
    apply = plain_apply(Triple)
    x = torch.ones(3, requires_grad=True)
    y = apply(x)
    assert type(y.grad_fn) is type(Triple.apply(x).grad_fn)
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 3.0))


def test_backward_once_refuses_a_double_backward_only_under_create_graph():
    x = torch.ones(3, requires_grad=True)
    (g,) = torch.autograd.grad(Square.apply(x).sum(), x)  # no create_graph: the plain backward
    assert torch.equal(g, torch.full((3,), 2.0)) and not g.requires_grad
    # under create_graph the gradient must refuse differentiation, asked for directly (autograd.grad, a
    # Hessian) or by a second backward, whether the incoming gradient requires grad or not: a plain loss's
    # does not, and torch's once_differentiable then gave a constant gradient, its derivative silently 0
    said = r"differentiate twice crossfuse\.square, which has no double"
    for loss in (lambda t: t.pow(2).sum(), lambda t: t.sum()):
        (g,) = torch.autograd.grad(loss(Square.apply(x)), x, create_graph=True)
        assert g.requires_grad and torch.equal(g.detach(), torch.autograd.grad(loss(x * x), x)[0])
        with pytest.raises(RuntimeError, match=said):
            torch.autograd.grad(g.sum(), x)
        with pytest.raises(RuntimeError, match=said):
            g.sum().backward()
    with pytest.raises(RuntimeError, match=said):
        torch.autograd.functional.hessian(lambda t: Square.apply(t).sum(), x)
    # a gradient that depends on nothing that requires grad (Triple's is 3 whatever x is) is constant, as
    # torch's own would be: its derivative is not asked for, but a backward through it still refuses
    (g,) = torch.autograd.grad(Triple.apply(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=r"differentiate twice crossfuse\.triple"):
        g.sum().backward()


def test_transforms_and_dual_tensors_are_refused_not_silently_dropped(device, gen):
    # vmap would hand the kernels a batched tensor; a dual tensor's tangent would be lost without a word
    import crossfuse
    import torch.autograd.forward_ad as fwd

    x = torch.randn(2, 8, device=device, generator=gen)
    q = torch.randn(1, 1, 4, 16, device=device, generator=gen)
    calls = {"layer_norm": lambda t: crossfuse.layer_norm(t, (8,)),
             "relu_attention": lambda t: crossfuse.relu_attention(t, t, t)}  # fmt: skip
    for (op, call), t in zip(calls.items(), (x, q), strict=True):
        with pytest.raises(NotImplementedError, match=f"crossfuse.{op} does not run under torch.func"):
            torch.func.vmap(call)(t.unsqueeze(0).expand(3, *t.shape))
        with pytest.raises(NotImplementedError, match=f"crossfuse.{op} does not run under torch.func"):
            torch.func.grad(lambda a, call=call: call(a).sum())(t)
        with fwd.dual_level():
            with pytest.raises(NotImplementedError, match=f"crossfuse.{op} has no forward-mode AD"):
                call(fwd.make_dual(t, torch.ones_like(t)))
            assert call(t).shape == t.shape  # a plain tensor inside a dual level: as ever
