"""What both ops' eager autograd Functions share: ``apply`` without its Python layer, and a backward that
takes ``once_differentiable``'s wrapper only where it matters."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd.function import once_differentiable


def plain_apply(cls: type[torch.autograd.Function]) -> Callable:
    """``cls.apply`` without ``Function.apply``'s Python layer (functorch's transforms, ``setup_context``'s
    defaults, unwrapping tensors of finished transforms), which costs more host time than a launch: the C
    ``apply`` itself while no functorch transform is active, ``cls.apply`` otherwise. For calls whose
    tensors are plain ones with storage (the callers' keys read ``data_ptr``), so that no tensor of a
    finished transform needs unwrapping."""
    raw = super(torch.autograd.Function, cls).apply
    full = cls.apply
    active = torch._C._are_functorch_transforms_active

    def apply(*args):
        return full(*args) if active() else raw(*args)

    return apply


def backward_once(fn: Callable) -> staticmethod:
    """``fn(ctx, *grads)`` as a Function's backward: with ``once_differentiable``'s wrapper only where grad
    mode is on, which in a backward means ``create_graph``. There is no double backward, and the wrapper
    makes differentiating the gradients raise rather than silently give zeros; without ``create_graph``
    it would only cost host time."""
    once = once_differentiable(fn)

    def backward(ctx, *grads):
        if torch.is_grad_enabled():
            return once(ctx, *grads)
        return fn(ctx, *grads)

    return staticmethod(backward)
