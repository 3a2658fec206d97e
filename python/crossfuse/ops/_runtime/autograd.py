"""What both ops' eager autograd Functions share: ``apply`` without its Python layer, and a backward that
takes ``once_differentiable``'s wrapper only where it matters."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.autograd.forward_ad as forward_ad
from torch._C import _functions

# whether torch.func's transforms (vmap, grad, jvp, ...) are active: with the level of forward_ad's dual
# tensors (-1 outside any), what an eager call reads first (two reads: about 0.05 us)
functorch_active = torch._C._are_functorch_transforms_active


def transforms_in_play() -> bool:
    """Whether a torch.func transform or a forward-mode AD level is active (then :func:`refuse_transforms`
    decides); cheap enough for every eager call."""
    return forward_ad._current_level >= 0 or functorch_active()


def refuse_transforms(op: str, *tensors) -> None:
    """Raise where ``op``'s call would run under a torch.func transform, or take a dual tensor (forward-mode
    AD): its kernels and hand-written backward would return a result without the batch dimension or the
    tangent, silently or through an error of torch's internals."""
    if functorch_active():
        raise NotImplementedError(
            f"crossfuse.{op} does not run under torch.func transforms (vmap, grad, jacrev, jvp, ...): it has "
            "a hand-written reverse-mode backward only; use torch.autograd, or torch's own op there"
        )
    for t in tensors:
        if isinstance(t, torch.Tensor) and forward_ad.unpack_dual(t).tangent is not None:
            raise NotImplementedError(
                f"crossfuse.{op} has no forward-mode AD (jvp): an input is a dual tensor of "
                "torch.autograd.forward_ad; use reverse-mode autograd, or torch's own op there"
            )


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


def backward_once(fn: Callable, op: str) -> staticmethod:
    """``fn(ctx, *grads)`` as the backward of ``op``'s Function, which has no double backward. Under
    ``create_graph`` (grad mode on in a backward) its gradients come out requiring grad through a node that
    raises when differentiated: a gradient penalty or a Hessian then fails, naming the op. torch's
    ``once_differentiable`` does so only where an incoming gradient requires grad; from a loss's plain
    backward (``autograd.grad(loss, x, create_graph=True)``) its gradients came out constant, and their
    derivatives silently zero. Without ``create_graph``, ``fn`` alone: no wrapper's host time."""
    message = (f"trying to differentiate twice crossfuse.{op}, which has no double backward: its gradients, "
               "taken with create_graph=True, cannot be differentiated again (a gradient penalty or a "
               "Hessian through it)").encode()  # fmt: skip

    def backward(ctx, *grads):
        if not torch.is_grad_enabled():
            return fn(ctx, *grads)
        with torch.no_grad():
            out = fn(ctx, *grads)
        # aliases that require grad, each behind the node that raises (as once_differentiable makes them)
        outs = out if isinstance(out, tuple) else (out,)
        aliases = [t.detach().requires_grad_(True) if isinstance(t, torch.Tensor) else t for t in outs]
        raised = _functions.DelayedError(message, len(aliases))(*aliases)  # one output: a tensor, not a tuple
        return raised if isinstance(out, tuple) == isinstance(raised, tuple) else (raised,)

    return staticmethod(backward)
