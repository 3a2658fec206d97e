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

    backward = backward_once(_triple)


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
    # a gradient that itself requires grad reaches the backward: its result must refuse differentiation
    (g,) = torch.autograd.grad(Triple.apply(x).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        g.sum().backward()
