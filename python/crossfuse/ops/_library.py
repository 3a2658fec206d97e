"""The launchers as ``torch.library`` custom operators, for ``torch.compile`` and ``torch.export``.

``torch.compile`` cannot trace into a launcher: it makes Python decisions on strides, the tuned table
and tensor descriptors, and under the interpreter the kernel is Python that works on raw pointers. So
while ``torch.compile`` (or ``torch.export``) traces, the autograd.Functions call each launcher through
an opaque operator ``torch.ops.crossfuse.<name>`` with a fake implementation (output shapes, dtypes
and strides only); the compiled graph then calls the real launcher. Eager calls go straight to the
launchers and pay nothing for the dispatcher.

The operators are defined here, at ``import crossfuse``, without importing Triton (their
implementations import the op modules when first called), so that a program saved by ``torch.export``
loads after a plain ``import crossfuse``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch


def _calls(module: str, name: str) -> Callable:
    """A function calling ``crossfuse.ops.<module>.<name>``, imported at the first call."""

    def impl(*args):
        return getattr(importlib.import_module(f"crossfuse.ops.{module}"), name)(*args)

    return impl


def _operator(name: str, schema: str, impl: Callable, fake: Callable) -> torch._ops.OpOverload:
    op = torch.library.custom_op(f"crossfuse::{name}", impl, mutates_args=(), schema=schema)
    op.register_fake(fake)
    return getattr(torch.ops.crossfuse, name).default


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the layer norm's mean and rstd (and its accumulators) for inputs of ``dtype``."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _ln_fwd_fake(x, weight, bias, eps):
    M, N = x.shape
    stats = stats_dtype(x.dtype)
    return x.new_empty((M, N)), x.new_empty((M,), dtype=stats), x.new_empty((M,), dtype=stats)


def _ln_fwd_shaped_fake(x, shape, weight, bias, eps):
    M = x.shape[0]
    stats = stats_dtype(x.dtype)
    return x.new_empty(shape), x.new_empty((M,), dtype=stats), x.new_empty((M,), dtype=stats)


def _ln_bwd_fake(dy, x, weight, mean, rstd, compute_dw, compute_db):
    N = x.shape[1]
    param_dtype = weight.dtype if weight is not None else x.dtype
    dw = x.new_empty((N,), dtype=param_dtype) if compute_dw else None
    db = x.new_empty((N,), dtype=param_dtype) if compute_db else None
    return x.new_empty(x.shape), dw, db


def _in_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A new tensor in ``layout`` ("bhld" or "blhd") shaped like the [B, H, L, D] view ``t``."""
    return t.new_empty(t.shape if layout == "bhld" else t.transpose(1, 2).shape)


def _attn_fwd_fake(q, k, v, causal, squared, scale, relu_scale, layout):
    return _in_layout(q, layout)


def _attn_bwd_fake(q, k, v, dout, causal, squared, scale, relu_scale, layout):
    return tuple(_in_layout(t, layout) for t in (q, k, v))


# (M, N) rows in, (M, N) y out: what the autograd function called until it took layer_norm_fwd_shaped,
# kept so that programs torch.export saved with it still load
LAYER_NORM_FWD = _operator(
    "layer_norm_fwd", "(Tensor x, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)",
    _calls("layer_norm.api", "_operator_fwd"), _ln_fwd_fake,
)  # fmt: skip
# (M, N) rows in, y allocated in `shape` (the input's shape, M·N elements) out: a tensor of its own, not
# a view of an (M, N) one, so that in-place ops after the layer norm work under torch.compile too
LAYER_NORM_FWD_SHAPED = _operator(
    "layer_norm_fwd_shaped",
    "(Tensor x, SymInt[] shape, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)",
    _calls("layer_norm.api", "_operator_fwd_shaped"), _ln_fwd_shaped_fake,
)  # fmt: skip
LAYER_NORM_BWD = _operator(
    "layer_norm_bwd",
    "(Tensor dy, Tensor x, Tensor? weight, Tensor mean, Tensor rstd, bool compute_dw, bool compute_db) "
    "-> (Tensor, Tensor?, Tensor?)",
    _calls("layer_norm.api", "_operator_bwd"), _ln_bwd_fake,
)  # fmt: skip
# relu_scale None: 1/Lk, taken inside from the keys (a float would be a value torch.compile guards on)
_FLAGS = "bool causal, bool squared, float scale, float? relu_scale, str layout"
RELU_ATTENTION_FWD = _operator(
    "relu_attention_fwd", f"(Tensor q, Tensor k, Tensor v, {_FLAGS}) -> Tensor",
    _calls("relu_attention.api", "_operator_fwd"), _attn_fwd_fake,
)  # fmt: skip
RELU_ATTENTION_BWD = _operator(
    "relu_attention_bwd",
    f"(Tensor q, Tensor k, Tensor v, Tensor dout, {_FLAGS}) -> (Tensor, Tensor, Tensor)",
    _calls("relu_attention.api", "_operator_bwd"), _attn_bwd_fake,
)  # fmt: skip


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
