"""The launchers as ``torch.library`` custom operators, for ``torch.compile``.

``torch.compile`` cannot trace into a launcher: it makes Python decisions on strides, the tuned table
and tensor descriptors, and under the interpreter the kernel is Python that works on raw pointers. So
while ``torch.compile`` (or ``torch.export``) traces, the autograd.Functions call each launcher through
an opaque operator ``torch.ops.crossfuse.<name>`` with a fake implementation (output shapes, dtypes
and strides only); the compiled graph then calls the real launcher. Eager calls go straight to the
launchers and pay nothing for the dispatcher.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

NAMESPACE = "crossfuse"


def operator(name: str, schema: str, impl: Callable, fake: Callable) -> torch._ops.OpOverload:
    """``torch.ops.crossfuse.<name>``: ``impl`` with ``schema`` (no argument mutated), ``fake`` its
    implementation on fake tensors. Defined once per process: a second copy of a module (a benchmark's
    A/B loading an older file) reuses the first definition rather than replacing it."""
    if not hasattr(getattr(torch.ops, NAMESPACE), name):
        op = torch.library.custom_op(f"{NAMESPACE}::{name}", impl, mutates_args=(), schema=schema)
        op.register_fake(fake)
    return getattr(getattr(torch.ops, NAMESPACE), name).default


def tracing() -> bool:
    """Whether ``torch.compile``/``torch.export`` is tracing this call (then the operators stand in)."""
    return torch.compiler.is_compiling()


def distinct(*tensors):
    """``tensors`` with every repeat of an earlier one replaced by a view of it (None stays None).

    Under torch.compile an autograd.Function given one tensor in two places keeps only one place's
    gradient (torch 2.11, pytorch/pytorch#181146), or, in releases with the fix, breaks the graph there.
    Views of the tensor are distinct inputs, whose gradients autograd adds up as eager mode does."""
    seen: list[torch.Tensor] = []
    out = []
    for t in tensors:
        if t is not None and any(t is u for u in seen):
            t = t.view_as(t)
        elif t is not None:
            seen.append(t)
        out.append(t)
    return tuple(out)
