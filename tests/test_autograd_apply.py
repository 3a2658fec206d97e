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


def test_plain_apply_is_apply_and_hands_functorch_transforms_to_the_full_apply():
    # the C apply where no functorch transform is active: the same graph and gradient as Function.apply;
    # under a transform, Function.apply itself, which refuses a Function without setup_context (the raw
    # apply would run outside the transform)
    apply = plain_apply(Triple)
    x = torch.ones(3, requires_grad=True)
    y = apply(x)
    assert type(y.grad_fn) is type(Triple.apply(x).grad_fn)
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 3.0))
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda t: apply(t).sum())(torch.ones(3))


def test_backward_once_refuses_a_double_backward_only_under_create_graph():
    x = torch.ones(3, requires_grad=True)
    (g,) = torch.autograd.grad(Triple.apply(x).sum(), x)  # no create_graph: the plain backward
    assert torch.equal(g, torch.full((3,), 3.0)) and not g.requires_grad
    # under create_graph its result must refuse differentiation, whether the incoming gradient requires
    # grad or not (a plain loss's does not: torch's once_differentiable then returned a constant gradient,
    # whose derivative came out silently zero)
    for loss in (lambda t: t.pow(2).sum(), lambda t: t.sum()):
        (g,) = torch.autograd.grad(loss(Triple.apply(x)), x, create_graph=True)
        assert g.requires_grad and torch.equal(g.detach(), torch.autograd.grad(loss(x * 3), x)[0])
        with pytest.raises(RuntimeError, match=r"differentiate twice crossfuse\.triple, which has no double"):
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
