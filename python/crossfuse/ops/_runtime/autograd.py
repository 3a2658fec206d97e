"""What both ops' eager autograd Functions share: ``apply`` without its Python layer, a backward that
refuses to be differentiated only under ``create_graph``, and the refusal of torch.func transforms and
dual tensors their eager calls check first."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.autograd.forward_ad as forward_ad
from torch._C import _functions

# whether torch.func's transforms (vmap, grad, jvp, ...) are active; with forward_ad's level of dual tensors
# (-1 outside any) what an eager call reads first, inline:
#     if forward_ad._current_level >= 0 or functorch_active(): refuse_transforms(op, *tensors)
functorch_active = torch._C._are_functorch_transforms_active


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
    ``apply`` itself. For eager calls of plain tensors with storage (the callers' keys read ``data_ptr``)
    made outside any torch.func transform, which the ops' entry points refuse first
    (:func:`refuse_transforms`)."""
    return super(torch.autograd.Function, cls).apply


def backward_once(fn: Callable, op: str) -> staticmethod:
    """``fn(ctx, *grads)`` as the backward of ``op``'s Function, which has no double backward. Under
    ``create_graph`` (grad mode on in a backward) its gradients come out of a node that raises when
    differentiated, and that node hangs on what they depend on: the incoming gradients and the saved
    tensors that require grad. A second ``backward``, ``autograd.grad`` of the gradients, a gradient
    penalty or ``torch.autograd.functional.hessian`` then reach it and fail, naming the op. torch's
    ``once_differentiable`` hangs its node on nothing but the gradients' detached copies, and only where an
    incoming gradient requires grad: ``autograd.grad`` of them said they were unused, and a Hessian came out
    silently zero. Without ``create_graph``, ``fn`` alone: no wrapper's host time."""
    message = (f"trying to differentiate twice crossfuse.{op}, which has no double backward: its gradients, "
               "taken with create_graph=True, cannot be differentiated again (a gradient penalty or a "
               "Hessian through it)").encode()  # fmt: skip

    def backward(ctx, *grads):
        if not torch.is_grad_enabled():
            return fn(ctx, *grads)
        with torch.no_grad():
            out = fn(ctx, *grads)
        outs = out if isinstance(out, tuple) else (out,)
        aliases = [t.detach().requires_grad_(True) if isinstance(t, torch.Tensor) else t for t in outs]
        links = [t for t in (*grads, *ctx.saved_tensors) if isinstance(t, torch.Tensor) and t.requires_grad]
        raised = _functions.DelayedError(message, len(aliases) + len(links))(*aliases, *links)
        raised = raised if isinstance(raised, tuple) else (raised,)  # one output: a tensor, not a tuple
        return raised[: len(aliases)] if isinstance(out, tuple) else raised[0]

    return staticmethod(backward)
