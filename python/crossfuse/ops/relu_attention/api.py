"""``crossfuse.relu_attention``: argument checks, the autograd Functions and the eager fast path.

An eager call whose arguments' key (types, shapes, strides, dtypes, devices, 16-byte alignment, flags,
scales, layout, and what selects Triton's compiled kernels) was seen before skips everything that key
already proves: the checks, the layout views, the tiles and the launch decisions. It makes one dictionary
look-up (:data:`_EAGER`), allocates its outputs and replays the launch plans of the first call with that
key (:mod:`.plans`), forward and backward, through the thin :class:`_EagerFunction`. Every other call
(a first call, one while ``torch.compile`` traces, one whose plan cannot be replayed) takes the full path:
checks, then :class:`ReLUAttentionFunction`, which calls the launchers directly in eager mode and through
the custom operators ``torch.ops.crossfuse.relu_attention_fwd``/``_bwd`` (see ``.._library``) while
tracing. Once a key's plans are known, the C++ module of ``.._runtime.native`` runs its calls before any
of this (:func:`_to_native`): a look-up, an allocation, its own autograd node and the plans' launches.
"""

from __future__ import annotations

import math

import torch

from ..._backend import check_runnable, interpreter_problem, is_interpreted
from ..._validate import (
    KERNEL_DTYPES,
    check_bool,
    check_positive_float,
    check_same_device,
    check_tensor,
    dtype_name,
)
from .. import _library
from .._runtime import direct as _direct
from .._runtime import native
from .._runtime.autograd import backward_once, forward_ad, functorch_active, plain_apply, refuse_transforms
from .config import DEFAULT, HEAD_DIMS, LAYOUTS, MAX_GRID_1, Choices
from .kernels_fwd import _relu_attn_fwd_kernel
from .launch import _backward, _forward, relu_attention_bwd, relu_attention_fwd
from .plans import _replay, steps


def _to_bhld(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A [B, H, L, D] view of a tensor in ``layout`` (no copy)."""
    return t if layout == "bhld" else t.transpose(1, 2)


def _unit_d(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _empty_in_layout(t: torch.Tensor, shape_bhld, layout: str) -> torch.Tensor:
    """A new contiguous tensor in ``layout`` (of [B, H, L, D] view ``_to_bhld(_, layout)``)."""
    B, H, L, D = shape_bhld
    shape = (B, H, L, D) if layout == "bhld" else (B, L, H, D)
    return torch.empty(shape, dtype=t.dtype, device=t.device)


def _relu_scale(relu_scale: float | None, kb: torch.Tensor) -> float:
    """``relu_scale``, 1/Lk where None (no key: any value, nothing is summed)."""
    return 1.0 / max(kb.shape[2], 1) if relu_scale is None else relu_scale


def _attention_fwd(qb, kb, vb, causal: bool, squared: bool, scale: float, relu_scale: float | None,
                   layout: str, choices: Choices = DEFAULT):  # fmt: skip
    """The forward on [B, H, L, D] views (unit stride on D), its output a new tensor in ``layout``;
    ``relu_scale`` None: 1/Lk, taken here from the keys (so torch.compile need not guard on Lk)."""
    out = _empty_in_layout(qb, qb.shape, layout)  # returned as it is, no view: in-place ops on it work
    relu_scale = _relu_scale(relu_scale, kb)
    relu_attention_fwd(qb, kb, vb, causal, squared, scale, relu_scale, out=_to_bhld(out, layout),
                       choices=choices)  # fmt: skip
    return out


def _attention_bwd(qb, kb, vb, dob, causal: bool, squared: bool, scale: float, relu_scale: float | None,
                   layout: str, choices: Choices = DEFAULT):  # fmt: skip
    """The backward on [B, H, L, D] views (unit stride on D): dq, dk, dv as new tensors in ``layout``
    (``relu_scale`` as in :func:`_attention_fwd`)."""
    dq, dk, dv = (_empty_in_layout(t, t.shape, layout) for t in (qb, kb, vb))
    relu_attention_bwd(qb, kb, vb, dob, causal, squared, scale, _relu_scale(relu_scale, kb),
                       *(_to_bhld(g, layout) for g in (dq, dk, dv)), choices=choices)  # fmt: skip
    return dq, dk, dv


# the implementations of the custom operators torch.compile sees (crossfuse.ops._library): unit stride
# on D, as the launchers need (the autograd function passes such views, a direct call may not)
def _operator_fwd(q, k, v, *flags):
    return _attention_fwd(*(_unit_d(t) for t in (q, k, v)), *flags)


def _operator_bwd(q, k, v, dout, *flags):
    return _attention_bwd(*(_unit_d(t) for t in (q, k, v, dout)), *flags)


def _full_backward(ctx, dout):
    qb, kb, vb = ctx.saved_tensors
    dob = _to_bhld(dout, ctx.args[-1])
    # while tracing, the operator fixes the strides (torch 2.6 refused .stride() in a traced backward)
    if _library.tracing():
        grads = _library.RELU_ATTENTION_BWD(qb, kb, vb, dob, *ctx.args)
    else:
        grads = _attention_bwd(qb, kb, vb, _unit_d(dob), *ctx.args, ctx.choices)
    return *grads, None, None, None, None, None, None


class ReLUAttentionFunction(torch.autograd.Function):
    """The full path: layout views, launchers (or the custom operators while tracing)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, squared, scale, relu_scale, layout, choices=DEFAULT):
        qb, kb, vb = (_unit_d(_to_bhld(t, layout)) for t in (q, k, v))
        if _library.tracing():
            out = _library.RELU_ATTENTION_FWD(qb, kb, vb, causal, squared, scale, relu_scale, layout)
        else:
            out = _attention_fwd(qb, kb, vb, causal, squared, scale, relu_scale, layout, choices)
        ctx.save_for_backward(qb, kb, vb)
        ctx.args = (causal, squared, scale, relu_scale, layout)
        ctx.choices = choices
        return out

    # no double backward: differentiating the gradients raises, never silently drops (backward_once)
    backward = backward_once(_full_backward, "relu_attention")


# whether the kernels were built for the interpreter: fixed at import, so a constant to torch.compile
_INTERPRETED = is_interpreted(_relu_attn_fwd_kernel)
_INTERPRETER_PROBLEM = interpreter_problem() if _INTERPRETED else None


def _check_attention_args(q, k, v, causal, squared, scale, relu_scale, layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    dtypes = (*KERNEL_DTYPES, torch.float64)
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name, dtypes)
        if t.dim() != 4:
            dims = "[B, H, L, D]" if layout == "bhld" else "[B, L, H, D]"
            raise ValueError(f"{name} must be 4-D ({dims}), "
                             f"got shape {list(t.shape)}")  # fmt: skip
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype; got {dtype_name(q.dtype)}, {dtype_name(k.dtype)}, "
                        f"{dtype_name(v.dtype)}")  # fmt: skip
    check_same_device(k, "k", q, "q")
    check_same_device(v, "v", q, "q")
    if q.dtype == torch.float64 and q.device.type == "cuda":
        raise TypeError("q, k, v have dtype float64: on GPUs Triton's dot has no float64; float64 runs only "
                        "under the Triton interpreter (for gradcheck); use float32, float16 or "
                        "bfloat16")  # fmt: skip
    qb, kb, vb = (_to_bhld(t, layout) for t in (q, k, v))
    (B, H, Lq, D), (Bk, Hk, Lk, Dk) = qb.shape, kb.shape
    if (Bk, Hk, Dk) != (B, H, D):
        raise ValueError(f"k's shape {list(k.shape)} does not match q's {list(q.shape)} in batch, heads or "
                         f"head dim (layout {layout!r})")  # fmt: skip
    if tuple(vb.shape) != tuple(kb.shape):
        raise ValueError(f"v's shape {list(v.shape)} must equal k's {list(k.shape)}")
    if D not in HEAD_DIMS:
        raise ValueError(f"head dim D={D} is not supported; q, k, v need D in {HEAD_DIMS}")
    if H > MAX_GRID_1:
        raise ValueError(f"at most {MAX_GRID_1} heads are supported (a grid axis holds them), got H={H}")
    if causal and Lq != Lk:
        raise ValueError(f"causal=True needs equal query and key lengths, got Lq={Lq}, Lk={Lk}")
    for name, flag in (("causal", causal), ("squared", squared)):
        check_bool(flag, name)
    if scale is not None:
        check_positive_float(scale, "scale", allow_zero=False)
    if relu_scale is not None:
        check_positive_float(relu_scale, "relu_scale")
    check_runnable(q, "q", _INTERPRETED, _INTERPRETER_PROBLEM)
    return D


class _Entry:
    """What a key of :func:`relu_attention`'s arguments decides once: the checked flags and scales, the
    output's shape, and the launch plans of the forward and (per key of dout) the backward."""

    __slots__ = ("bwd_plans", "causal", "device", "dtype", "fwd_plan", "layout", "like", "native",
                 "out_shape", "relu_scale", "scale", "squared")  # fmt: skip

    def __init__(self, q, k, v, causal, squared, scale, relu_scale, layout):
        self.causal, self.squared, self.scale, self.layout = causal, squared, scale, layout
        self.relu_scale = relu_scale  # resolved: 1/Lk where not given
        self.out_shape, self.dtype, self.device = tuple(q.shape), q.dtype, q.device
        # the output and the gradients as torch.empty_like(q, k, v) where those are contiguous (cheaper to
        # ask torch for; the same tensor as torch.empty in their shape)
        self.like = tuple(t.is_contiguous() for t in (q, k, v))
        self.fwd_plan = None
        self.bwd_plans: dict[tuple, tuple] = {}
        self.native = None if q.is_cuda else False  # the compiled path: None until tried (_to_native)

    def empty_out(self, q):
        return torch.empty_like(q) if self.like[0] else torch.empty(self.out_shape, dtype=self.dtype,
                                                                       device=self.device)  # fmt: skip

    def forward(self, q, k, v):
        out = self.empty_out(q)
        plan = self.fwd_plan
        if plan is not None:
            _replay(plan, (q, k, v, out))
            return out
        layout = self.layout
        views = [_to_bhld(t, layout) for t in (q, k, v, out)]
        self.fwd_plan = _forward(*views[:3], self.causal, self.squared, self.scale, self.relu_scale,
                                 views[3], None, DEFAULT)[1]  # fmt: skip
        return out

    def backward(self, q, k, v, dout):
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        key = (dout.shape, dout.stride(), dout.dtype, dout.data_ptr() % 16)
        grads = tuple(torch.empty_like(t) if like else torch.empty(t.shape, dtype=t.dtype, device=t.device)
                      for t, like in zip((q, k, v), self.like, strict=True))  # fmt: skip
        plan = self.bwd_plans.get(key)
        if plan is not None:
            _replay(plan, (q, k, v, dout, *grads))
            return grads
        layout = self.layout
        views = [_to_bhld(t, layout) for t in (q, k, v, dout, *grads)]
        plan = _backward(*views[:4], self.causal, self.squared, self.scale, self.relu_scale, *views[4:],
                         None, None, DEFAULT)[3]  # fmt: skip
        if plan is not None:
            if len(self.bwd_plans) >= 16:  # dout's strides vary little; a table that starts afresh
                self.bwd_plans.clear()
            self.bwd_plans[key] = plan
        return grads


def _to_native(entry: _Entry, q, k, v, causal, squared, scale, relu_scale, layout) -> None:
    """Give the C++ module (:mod:`.._runtime.native`) this call's key once its forward has a launch plan:
    the plan's program over (q, k, v, out), and the backward that records its own programs
    (:func:`_native_backward`). Marks ``entry.native`` tried either way; a plan the module cannot make
    (what :func:`.._runtime.native.program` refuses) keeps the Python path; its scratch buffers (float32's
    tf32 copies) are allocated per call by the module, in the slots after the call's tensors."""
    if entry.fwd_plan is None:
        return  # not yet: the first call records the plan
    entry.native = False
    fast = native.module()
    if fast is None or not native.hooks_quiet():
        return
    try:
        out = entry.empty_out(q)
        calls, buffers = steps(entry.fwd_plan, (q, k, v, out))
        prog = native.program(calls, [q, k, v, out, *buffers])
        if prog is None:
            return
        got = fast.add_relu_attention(q, k, v, causal, squared, scale, relu_scale, layout, prog, out,
                                      _native_backward(entry), list(buffers))  # fmt: skip
    except Exception:  # whatever recording or the module refuses: the Python path, this call unharmed
        return
    entry.native = got is not False


def _native_backward(entry: _Entry):
    """The C++ node's backward where it has no program for a gradient's layout yet: the entry's Python
    backward, and once its plan for that layout is known, the plan's program registered (offered once per
    key of the gradient)."""
    fast = native.module()
    tried: set[tuple] = set()  # the keys of the gradients whose plans were offered

    def backward(handle, q, k, v, dout, recordable):
        grads = entry.backward(q, k, v, dout)
        # only from a call whose saved tensors and gradient are as the entry's programs expect them
        # (``recordable``, which the node tells: a saved-tensor hook may have given back others)
        key = (dout.shape, dout.stride(), dout.dtype, dout.data_ptr() % 16)
        plan = entry.bwd_plans.get(key)
        if not recordable or plan is None or key in tried or not native.hooks_quiet():
            return grads
        tried.add(key)
        try:
            calls, buffers = steps(plan, (q, k, v, dout, *grads))
            prog = native.program(calls, [q, k, v, dout, *grads, *buffers])
            if prog is not None:
                fast.add_relu_attention_backward(handle, dout, prog, *grads, list(buffers))
        except Exception:  # whatever recording or the module refuses: the Python path, these grads stand
            pass
        return grads

    return backward


def _eager_backward(ctx, dout):
    return *ctx.entry.backward(*ctx.saved_tensors, dout), None


class _EagerFunction(torch.autograd.Function):
    """The eager fast path's autograd Function: an :class:`_Entry`'s forward and backward, nothing else."""

    @staticmethod
    def forward(ctx, q, k, v, entry):
        ctx.save_for_backward(q, k, v)
        ctx.entry = entry
        return entry.forward(q, k, v)

    backward = backward_once(_eager_backward, "relu_attention")


_eager_apply = plain_apply(_EagerFunction)  # the fast path's tensors are plain ones (_PLAIN)


_NATIVE = native.loaded()  # the compiled path's module once loaded (see native.module)
# key of relu_attention's arguments -> _Entry (see the module docstring)
_EAGER: dict[tuple, _Entry] = {}
MAX_ENTRIES = 1024
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # tensor types the fast path takes (no __torch_function__)


def _eager_key(q, k, v, causal, squared, scale, relu_scale, layout) -> tuple:
    """The key under which :data:`_EAGER` keeps what a call's checks and decisions found; the types of
    the flags and scales are part of it (``1 == True == 1.0`` in a dict, not to the checks), and on CUDA
    what selects the compiled kernels that the plans name (the current device, Triton's knobs)."""
    return (
        type(q), q.shape, q.stride(), q.dtype, q.device, q.data_ptr() % 16,
        type(k), k.shape, k.stride(), k.dtype, k.device, k.data_ptr() % 16,
        type(v), v.shape, v.stride(), v.dtype, v.device, v.data_ptr() % 16,
        type(causal), causal, type(squared), squared, type(scale), scale, type(relu_scale), relu_scale,
        layout, _direct.state() if q.is_cuda else None,
    )  # fmt: skip


def _fast_entry(q, k, v, causal, squared, scale, relu_scale, layout, D) -> _Entry | None:
    """A new :class:`_Entry` for checked arguments, or ``None`` where the fast path does not apply:
    tensors that are not plain, a q on another CUDA device than the current one (the full path makes it
    current: see ``on_input_device``), an empty tensor, or a tensor without unit stride on D."""
    if any(type(t) not in _PLAIN for t in (q, k, v)) or not q.numel() or not k.numel():
        return None
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        return None
    if q.device.type == "cuda" and q.device.index != torch.cuda.current_device():
        return None
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    relu_scale = _relu_scale(None if relu_scale is None else float(relu_scale), _to_bhld(k, layout))
    return _Entry(q, k, v, bool(causal), bool(squared), scale, relu_scale, layout)


def relu_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    squared: bool = False,
    scale: float | None = None,
    relu_scale: float | None = None,
    layout: str = "bhld",
) -> torch.Tensor:
    """ReLU attention ``relu_scale * act(mask(q k^T * scale)) @ v``, fused in Triton.

    ``act`` is ``relu`` (or ``relu^2`` with ``squared``); ``scale`` defaults to ``1/sqrt(D)``,
    ``relu_scale`` to ``1/Lk``. ``layout`` is ``"bhld"`` ([B, H, L, D]) or ``"blhd"`` ([B, L, H, D]);
    the output has the same layout. Differentiable in q, k and v. As torch's attention, no key (Lk = 0)
    gives zeros and no query (Lq = 0) an empty output. See :mod:`crossfuse.ops.relu_attention`.
    """
    if not _library.tracing():
        fast = _NATIVE.get("module")
        if fast is not None and not native.compiled_autograd():  # the compiled path, where it has the key
            out = fast.relu_attention(q, k, v, causal, squared, scale, relu_scale, layout)  # plain ones only
            if out is not None:
                return out
        if forward_ad._current_level >= 0 or functorch_active():  # torch.func, dual tensors: refused
            refuse_transforms("relu_attention", q, k, v)
        try:
            key = _eager_key(q, k, v, causal, squared, scale, relu_scale, layout)
            entry = _EAGER.get(key)
        except Exception:  # not tensors, unhashable flags: the full path says what is wrong
            key = entry = None
        if entry is not None:
            if entry.native is None:
                _to_native(entry, q, k, v, causal, squared, scale, relu_scale, layout)
            if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
                return _eager_apply(q, k, v, entry)
            return entry.forward(q, k, v)
    else:
        key = None
    D = _check_attention_args(q, k, v, causal, squared, scale, relu_scale, layout)
    if key is not None:
        entry = _fast_entry(q, k, v, causal, squared, scale, relu_scale, layout, D)
        if entry is not None:
            if len(_EAGER) >= MAX_ENTRIES:
                _EAGER.clear()
            _EAGER[key] = entry
            if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
                return _eager_apply(q, k, v, entry)
            return entry.forward(q, k, v)
    return relu_attention_with(q, k, v, causal, squared, scale, relu_scale, layout, checked=D)


def relu_attention_with(q, k, v, causal: bool = False, squared: bool = False, scale: float | None = None,
                        relu_scale: float | None = None, layout: str = "bhld", *, choices: Choices = DEFAULT,
                        checked: int | None = None) -> torch.Tensor:  # fmt: skip
    """:func:`relu_attention` on the full path, with the launchers' rules fixed by ``choices`` (tests,
    probes); ``checked``: the head dim, where the arguments were checked already."""
    if checked is None:
        checked = _check_attention_args(q, k, v, causal, squared, scale, relu_scale, layout)
    D = checked
    causal, squared = bool(causal), bool(squared)  # numpy's bools too
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    relu_scale = None if relu_scale is None else float(relu_scale)  # None: 1/Lk (see _attention_fwd)
    if _library.tracing():  # q, k, v given as one tensor (self-attention on shared inputs): see distinct
        q, k, v = _library.distinct(q, k, v)
        return ReLUAttentionFunction.apply(q, k, v, causal, squared, scale, relu_scale, layout)
    return ReLUAttentionFunction.apply(q, k, v, causal, squared, scale, relu_scale, layout, choices)


def clear_eager() -> None:
    """Forget every key the fast path has seen, and the compiled path's programs (tests)."""
    _EAGER.clear()
    native.clear("relu_attention")
