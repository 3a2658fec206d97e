"""``crossfuse.layer_norm``: the functional entry point, its argument checks and its autograd.Function.

An eager call is a dictionary look-up and the launches: everything that depends only on the arguments'
shapes, strides, dtypes, devices, 16-byte alignment, ``normalized_shape`` and ``eps`` (the checks, the
rows' layout, the forward's plan) is kept in a :class:`Call` under that key, and the backward's plans in
it under the gradient's layout and the gradients asked. Once a key's launches go straight to their
kernels, its programs are recorded into the C++ module of :mod:`crossfuse.ops._runtime.native`, which then
serves the key's calls without this module's Python (:func:`_to_native`). While ``torch.compile`` or
``torch.export`` traces, the autograd.Function calls the launchers through the custom operators of
:mod:`crossfuse.ops._library` instead, which the tracer does not enter.
"""

from __future__ import annotations

import math
import numbers
import operator

import torch

from ..._backend import check_runnable, interpreter_problem
from ..._validate import KERNEL_DTYPES, check_positive_float, check_same_device, check_tensor
from .. import _library
from .._runtime import native
from .._runtime.autograd import backward_once, forward_ad, functorch_active, plain_apply, refuse_transforms
from .config import MAX_N
from .launch import FWD_PLANS, INTERPRETED, FwdPlan, layer_norm_fwd, tensor_key
from .launch_bwd import BWD_PLANS, BwdPlan, layer_norm_bwd
from .plan import PlanCache

SUPPORTED_DTYPES = (*KERNEL_DTYPES, torch.float64)


# ----------------------------------------------------------------------------------------------------
# the implementations of the custom operators torch.compile sees (crossfuse.ops._library)
# ----------------------------------------------------------------------------------------------------


def _operator_fwd(x, weight, bias, eps):
    # rows with unit column stride, as the launchers need: a direct call of the operator may not pass them
    return layer_norm_fwd(_rows(x, x.shape[1]), weight, bias, eps)


def _operator_fwd_shaped(x, shape, weight, bias, eps):
    """The forward on (M, N) rows ``x``, ``y`` allocated in ``shape`` (the input's shape): a tensor of its
    own, not a view of an (M, N) one, so that in-place ops on it work. Returns ``(y, mean, rstd)``."""
    x2 = _rows(x, x.shape[1])
    y = torch.empty(shape, dtype=x.dtype, device=x.device)
    _, mean, rstd = layer_norm_fwd(x2, weight, bias, eps, out=y.view(x2.shape))
    return y, mean, rstd


def _operator_bwd(dy, x, *rest):
    return layer_norm_bwd(_rows(dy, dy.shape[1]), _rows(x, x.shape[1]), *rest)


# ----------------------------------------------------------------------------------------------------
# the eager calls' plans
# ----------------------------------------------------------------------------------------------------


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """(M, n) view of ``t`` (a copy only when no view with unit column stride exists)."""
    t2 = t.reshape(-1, n)
    return t2 if t2.stride(-1) == 1 or n == 1 else t2.contiguous()


def _same_memory(t: torch.Tensor, rows: torch.Tensor) -> bool:
    """Whether ``rows`` (``_rows(t, n)``) reads ``t``'s own memory: then a kernel given ``t`` with the rows'
    strides reads the rows (a view keeps the first element's address)."""
    same_storage = rows.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    return rows.data_ptr() == t.data_ptr() and same_storage


def _unit_stride(p: torch.Tensor | None) -> torch.Tensor | None:
    """A weight or bias as the kernels read it: ``p + col``, so unit stride (a copy of a strided or
    expanded one)."""
    return None if p is None else p.reshape(-1).contiguous()


class Call:
    """What the calls with one key need: the checked row length, whether the kernels read the input, weight
    and bias as given (else a copy each call: rows without a view of unit column stride, strided
    parameters), the forward's plan, and the backward's plans by the gradient's layout and the gradients
    asked."""

    __slots__ = (
        "bwd", "copy_b", "copy_w", "copy_x", "db_dtype", "eps", "fwd", "n", "native", "param_dtype",
        "param_shape", "y_like",
    )  # fmt: skip

    def __init__(self, x, n, param_shape, weight, bias, eps):
        self.n, self.eps = n, eps
        self.param_shape = param_shape
        x2 = _rows(x, n)
        self.y_like = x.is_contiguous()  # y as torch.empty_like(x): contiguous (cheaper to ask torch for)
        self.copy_x = not _same_memory(x, x2)
        w, b = _unit_stride(weight), _unit_stride(bias)
        self.copy_w = weight is not None and not weight.is_contiguous()
        self.copy_b = bias is not None and not bias.is_contiguous()
        self.param_dtype = weight.dtype if weight is not None else x.dtype
        # db is summed in the weight's dtype (x's without weight), then given in the bias's
        self.db_dtype = bias.dtype if bias is not None and bias.dtype != self.param_dtype else None
        self.fwd = FwdPlan(x2, n, w, b, eps, None)  # y: contiguous, in x's shape
        self.bwd: dict = {}
        # the compiled path (see _to_native): None until tried, then whether it took this call's key; only
        # for calls that need no copies and whose gradients come in the parameters' own dtype
        simple = not (self.copy_x or self.copy_w or self.copy_b) and self.y_like and self.db_dtype is None
        self.native = None if simple and x.is_cuda else False

    def forward(self, x, weight, bias):
        """``(y, x, w, stats)``: y in x's shape, and what the backward reads (x or its rows' copy, the weight
        as the kernels read it, the mean and rstd in one tensor: see FwdPlan.run)."""
        if self.y_like:
            y = torch.empty_like(x)
        else:
            y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if self.copy_x:
            x = _rows(x, self.n)
        w = _unit_stride(weight) if self.copy_w else weight
        b = _unit_stride(bias) if self.copy_b else bias
        stats = self.fwd(x, y, w, b, True)
        return y, x, w, stats

    def backward_plan(self, dy, x, w, x_shape, need_dw: bool, need_db: bool) -> tuple:
        """``(whether dy's rows are a copy, the BwdPlan)`` for this gradient's layout and gradients asked."""
        key = (dy.stride(), dy.dtype, dy.data_ptr() % 16 == 0, need_dw, need_db)  # dy's shape: y's
        entry = self.bwd.get(key)
        if entry is None:
            dy2 = _rows(dy, self.n)
            # dx like the saved x where that is x itself, contiguous (the plan's key fixes x's layout)
            dx_like = x.is_contiguous() and x.shape == x_shape
            plan = BwdPlan(dy2, x.reshape(-1, self.n), w, need_dw, need_db, None, x_shape, self.param_shape,
                           dx_like=dx_like)  # fmt: skip
            entry = self.bwd[key] = (not _same_memory(dy, dy2), plan)
        return entry

    def backward(self, dy, x, w, stats, x_shape, need_dw: bool, need_db: bool):
        """``(dx, dw, db)`` of the forward that saved ``x``, ``w`` and ``stats``: dx in ``x_shape``, dw and db
        in normalized_shape (None where not asked)."""
        copy_dy, plan = self.backward_plan(dy, x, w, x_shape, need_dw, need_db)
        mean, rstd = self.fwd.split(stats, plan.ready)  # addresses once the plan is ready (BwdPlan.run)
        dx, dw, db = plan(_rows(dy, self.n) if copy_dy else dy, x, w, mean, rstd)
        if db is not None and self.db_dtype is not None:
            db = db.to(self.db_dtype)
        return dx, dw, db


CALLS = PlanCache(lambda *args: _new_call(*args))

# ----------------------------------------------------------------------------------------------------
# the compiled path (crossfuse.ops._runtime.native)
# ----------------------------------------------------------------------------------------------------

# the backward's path that launches nothing (zero rows): no program, the Python path
_NOT_RECORDABLE = ("empty",)


def _to_native(call: Call, x, normalized_shape, weight, bias, eps) -> None:
    """Give the C++ module this call's key, once the forward's launch goes straight to its kernel: its
    program, recorded from one more run of the forward (the output discarded), and the backward that
    records its own programs (:func:`_native_backward`). Marks ``call.native`` done either way."""
    launch = call.fwd.launch
    if launch is None or launch.go is None:
        return  # not yet: the first call launched through Triton's dispatch
    call.native = False
    fast = native.module()
    if fast is None or not native.hooks_quiet():
        return
    (y, _, _, stats), calls = native.recorded([launch], lambda: call.forward(x, weight, bias))
    prog = native.program(calls, [x, weight, bias, y, stats])
    if prog is not None:
        backward = _native_backward(call)
        try:
            got = fast.add_layer_norm(x, normalized_shape, weight, bias, eps, prog, stats, backward)
        except Exception:  # whatever the module refuses: the Python path
            return
        call.native = got is not False


def _native_backward(call: Call):
    """The C++ node's backward where it has no program for a gradient's layout yet: the Python plan's, and
    once that plan launches straight to its kernels, its program recorded and registered (tried once per
    plan: one the module cannot make, with scratch of its own say, keeps the Python path)."""
    fast = native.module()
    refused: set[int] = set()  # the plans (by id: each lives as long as the call) that gave no program

    def backward(entry, dy, x, w, stats, need_dw, need_db, recordable):
        copy_dy, plan = call.backward_plan(dy, x, w, x.shape, need_dw, need_db)
        # only from a call whose saved tensors and gradient are as the entry's programs expect them
        # (``recordable``, which the node tells: a saved-tensor hook may have given back others) and of
        # the layout the module runs programs for (contiguous, x's shape and dtype: the program holds its
        # row stride)
        like_x = dy.is_contiguous() and dy.dtype == x.dtype and dy.shape == x.shape
        skip = not (recordable and like_x) or copy_dy or not plan.ready or id(plan) in refused
        if skip or plan.path in _NOT_RECORDABLE or not native.hooks_quiet():
            return call.backward(dy, x, w, stats, x.shape, need_dw, need_db)
        grads, calls = native.recorded(plan.launches, lambda: call.backward(dy, x, w, stats, x.shape, need_dw,
                                                                           need_db))  # fmt: skip
        dx, dw, db = grads
        try:
            prog = native.program(calls, [dy, x, w, stats, dx, dw, db])
        except Exception:  # an unforeseen refusal while recording: this call's results stand
            prog = None
        if prog is None:
            refused.add(id(plan))
        else:
            allocs = [None if plan.w_like or g is None else (False, plan.param_shape, g) for g in (dw, db)]
            try:
                fast.add_layer_norm_backward(entry, dy.data_ptr() % 16 == 0, need_dw, need_db, prog, *allocs)
            except Exception:  # whatever the module refuses: the Python path
                refused.add(id(plan))
        return grads

    return backward


def clear_plans() -> None:
    """Forget every plan (the calls', the forward's, the backward's): the next call of each key decides
    afresh (tests that steer those decisions)."""
    CALLS.clear()
    FWD_PLANS.clear()
    BWD_PLANS.clear()
    native.clear()


def _call_key(x, normalized_shape, weight, bias, eps):
    """The key of a call's :class:`Call`, or None where the arguments give none (the call then checks
    them and raises, or takes a plan it builds afresh). Whether it hashes is found by the look-up."""
    if type(normalized_shape) is list:
        normalized_shape = tuple(normalized_shape)
    try:
        # with the types of the dims and eps: 16.0 == 16 and True == 1 hash alike, and a key a valid call
        # made would otherwise let an invalid one past the checks (the C++ path takes exact ints only); a
        # torch.Size holds ints, and a single dim (an int, numpy's) is its own type
        ns = normalized_shape
        kinds = tuple(map(type, ns)) if type(ns) is tuple else type(ns)
        return (tensor_key(x), normalized_shape, kinds, tensor_key(weight), tensor_key(bias), eps, type(eps))
    except (AttributeError, RuntimeError, TypeError):  # not a tensor, sparse, a shape of no dims
        return None


# ----------------------------------------------------------------------------------------------------
# autograd.Function and the functional entry point
# ----------------------------------------------------------------------------------------------------


def _backward(ctx, dy):
    need_dw, need_db = ctx.needs_input_grad[2], ctx.needs_input_grad[3]
    call = ctx.call
    if call is not None:
        x2, w, stats = ctx.saved_tensors
        dx, dw, db = call.backward(dy, x2, w, stats, ctx.x_shape, need_dw, need_db)
        return dx, None, dw, db, None, None
    x2, w, mean, rstd = ctx.saved_tensors
    n = x2.shape[1]
    # while tracing, the operator fixes the strides (torch 2.6 refused .stride() in a traced backward)
    if _library.tracing():
        dy2 = dy.reshape(-1, n)
        dx, dw, db = _library.LAYER_NORM_BWD(dy2, x2, w, mean, rstd, need_dw, need_db)
    else:
        dx, dw, db = layer_norm_bwd(_rows(dy, n), x2, w, mean, rstd, need_dw, need_db)
    grads = []
    for g, p in zip((dw, db), ctx.params, strict=True):
        grads.append(None if g is None else g.view(p[0]).to(p[1]))
    return dx.view(ctx.x_shape), None, grads[0], grads[1], None, None


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n, weight, bias, eps, call=None):
        ctx.x_shape = x.shape
        ctx.call = call
        if call is not None:  # eager: the call's plan
            y, x2, w, stats = call.forward(x, weight, bias)
            ctx.save_for_backward(x2, w, stats)
            return y
        ctx.params = [(p.shape, p.dtype) if p is not None else None for p in (weight, bias)]
        x2 = _rows(x, n)
        # unit stride (a weight or bias may be a slice or an expanded scalar), before w is saved
        w, b = _unit_stride(weight), _unit_stride(bias)
        fwd = _library.LAYER_NORM_FWD_SHAPED if _library.tracing() else _operator_fwd_shaped
        y, mean, rstd = fwd(x2, list(x.shape), w, b, eps)
        ctx.save_for_backward(x2, w, mean, rstd)
        return y

    backward = backward_once(_backward, "layer_norm")


_APPLY = plain_apply(LayerNormFunction)  # for eager calls whose arguments gave a key


_INTERPRETER_PROBLEM = interpreter_problem() if INTERPRETED else None
_NATIVE = native.loaded()  # the compiled path's module once loaded (see native.module)


def _check_layer_norm_args(x, normalized_shape, weight, bias, eps) -> tuple[int, tuple]:
    """``(N, normalized_shape as a tuple of ints)``, or a TypeError or ValueError naming the argument."""
    check_tensor(x, "x", SUPPORTED_DTYPES)
    if isinstance(normalized_shape, numbers.Integral):
        normalized_shape = (normalized_shape,)
    try:
        if isinstance(normalized_shape, (str, bytes)):
            raise TypeError
        # operator.index: ints (numpy's too), not floats such as 8.7, which int() would truncate
        normalized_shape = tuple(operator.index(d) for d in normalized_shape)
    except (TypeError, ValueError):
        raise TypeError(
            f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
        ) from None
    k = len(normalized_shape)
    if k == 0 or x.dim() < k or tuple(x.shape[x.dim() - k :]) != normalized_shape:
        raise ValueError(
            f"normalized_shape {list(normalized_shape)} does not match the trailing dims of x, "
            f"whose shape is {list(x.shape)}"
        )
    n = math.prod(normalized_shape)
    if n < 1 or n > MAX_N:
        raise ValueError(
            f"x's normalised size is {n} (normalized_shape {list(normalized_shape)}); "
            f"crossfuse.layer_norm supports 1 to {MAX_N} elements per row"
        )
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None:
            continue
        check_tensor(p, name, SUPPORTED_DTYPES)
        if tuple(p.shape) != normalized_shape:
            raise ValueError(
                f"{name} has shape {list(p.shape)}; expected normalized_shape {list(normalized_shape)}"
            )
        check_same_device(p, name, x, "x")
    check_positive_float(eps, "eps")
    check_runnable(x, "x", INTERPRETED, _INTERPRETER_PROBLEM)
    return n, normalized_shape


def _new_call(x, normalized_shape, weight, bias, eps) -> Call:
    n, shape = _check_layer_norm_args(x, normalized_shape, weight, bias, eps)
    return Call(x, n, shape, weight, bias, float(eps))


def layer_norm(
    x: torch.Tensor,
    normalized_shape,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """Layer norm with ``torch.nn.functional.layer_norm``'s arguments, in its order (the first named ``x``
    here, ``input`` there), and semantics, fused in Triton.

    Normalises over the trailing ``normalized_shape`` dims: ``(x - mean) / sqrt(var + eps) * weight +
    bias`` with the biased variance. ``weight`` and ``bias`` are each optional. Differentiable in
    ``x``, ``weight`` and ``bias``. See the module docstring for limits.
    """
    if _library.tracing():  # the custom operators stand in for the launchers
        n, _ = _check_layer_norm_args(x, normalized_shape, weight, bias, eps)
        x, weight, bias = _library.distinct(x, weight, bias)  # one tensor as weight and bias: see distinct
        return LayerNormFunction.apply(x, n, weight, bias, float(eps), None)
    fast = _NATIVE.get("module")
    if fast is not None and not native.compiled_autograd():  # the compiled path, where it has this call's key
        y = fast.layer_norm(x, normalized_shape, weight, bias, eps)  # never for a dual or functorch tensor
        if y is not None:
            return y
    if forward_ad._current_level >= 0 or functorch_active():  # torch.func, dual tensors: refused
        refuse_transforms("layer_norm", x, weight, bias)
    key = _call_key(x, normalized_shape, weight, bias, eps)
    try:
        call = CALLS.plans.get(key) if key is not None else None
    except TypeError:  # an unhashable argument (eps, a dim of normalized_shape): no key
        key = call = None
    if call is None:
        call = CALLS.get(key, x, normalized_shape, weight, bias, eps) if key is not None else (
            _new_call(x, normalized_shape, weight, bias, eps)
        )
    if call.native is None and key is not None:
        _to_native(call, x, normalized_shape, weight, bias, eps)
    grads = x.requires_grad or (weight is not None and weight.requires_grad) or (
        bias is not None and bias.requires_grad
    )
    if grads and torch.is_grad_enabled():
        if key is None:
            return LayerNormFunction.apply(x, call.n, weight, bias, call.eps, call)
        return _APPLY(x, call.n, weight, bias, call.eps, call)
    return call.forward(x, weight, bias)[0]  # nothing to differentiate: no autograd node
