"""Argument checks shared by the ops: every failure is a TypeError/ValueError naming the argument."""

from __future__ import annotations

import numbers
import operator

import torch

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def type_name(value) -> str:
    """``float``, ``numpy.float32``: the module too where it is not a builtin."""
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def check_tensor(t, name: str, dtypes=KERNEL_DTYPES) -> torch.Tensor:
    """``t`` must be a dense (strided) tensor whose dtype is one of ``dtypes``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type_name(t)}")
    if t.layout != torch.strided:
        raise TypeError(f"{name} is a {t.layout} tensor; the kernels take dense tensors (call .to_dense())")
    if t.dtype not in dtypes:
        allowed = ", ".join(dtype_name(d) for d in dtypes)
        raise TypeError(f"{name} has dtype {dtype_name(t.dtype)}; expected one of {allowed}")
    return t


def check_same_device(t: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    if t.device != ref.device:
        raise ValueError(
            f"{name} is on {t.device} but {ref_name} is on {ref.device}; move them to one device"
        )


def _is_bool(value) -> bool:
    """Python's bool or numpy's (``numpy.bool`` in numpy 2, ``numpy.bool_`` in numpy 1)."""
    t = type(value)
    return isinstance(value, bool) or (t.__module__ == "numpy" and t.__name__ in ("bool", "bool_"))


def check_bool(value, name: str) -> bool:
    """A bool, numpy's included (``numpy.bool_``); not an int."""
    if _is_bool(value):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type_name(value)}")


def check_positive_float(value, name: str, allow_zero: bool = True) -> float:
    """A real number (numpy's scalars included, bools not), finite and > 0 (or >= 0)."""
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type_name(value)}")
    value = float(value)
    if not (value > 0 or (allow_zero and value == 0)) or value != value or value == float("inf"):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value}")
    return value


def check_int(value, name: str) -> int:
    """An integer (numpy's included, via ``operator.index``); not a float and not a bool."""
    if not _is_bool(value):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{name} must be an integer, got {type_name(value)}")


# ----------------------------------------------------------------------------------------------------
# the checks of the pure-torch references (crossfuse.reference): the ops' rules, without the kernels' own
# limits (head dims, row lengths, grid sizes), since a reference computes any size the formula defines
# ----------------------------------------------------------------------------------------------------

REFERENCE_DTYPES = (*KERNEL_DTYPES, torch.float64)


def check_norm_args(x, params: dict, eps, dtypes=REFERENCE_DTYPES, eps_may_be_none: bool = False) -> int:
    """A normalisation over the last dim of ``x``: ``x`` a tensor of one of ``dtypes`` with at least one
    dim and one element a row; each of ``params`` (``{name: tensor or None}``) of shape [N] on x's device;
    ``eps`` a finite number >= 0 (or None where a default applies). Returns N."""
    check_tensor(x, "x", dtypes)
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(
            f"x must have at least one dim and a last dim of at least 1, got shape {list(x.shape)}"
        )
    n = x.shape[-1]
    for name, p in params.items():
        if p is None:
            continue
        check_tensor(p, name, dtypes)
        if tuple(p.shape) != (n,):
            raise ValueError(f"{name} has shape {list(p.shape)}; expected [{n}] (x's last dim)")
        check_same_device(p, name, x, "x")
    if eps is not None or not eps_may_be_none:
        check_positive_float(eps, "eps")
    return n


def check_attention_args(q, k, v, causal, squared, scale, relu_scale, dtypes=REFERENCE_DTYPES) -> None:
    """Attention inputs [B, H, L, D]: q, k, v tensors of one of ``dtypes``, one dtype and one device; k's
    batch, heads and head dim those of q, v's shape k's; causal only with as many queries as keys; bool
    flags; ``scale`` finite > 0, ``relu_scale`` finite >= 0 (None: the defaults). No key (Lk = 0) is valid:
    the output is zeros, as torch's attention gives."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name, dtypes)
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D ([B, H, L, D]), got shape {list(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"q, k, v must share one dtype; got {dtype_name(q.dtype)}, {dtype_name(k.dtype)}, "
            f"{dtype_name(v.dtype)}"
        )
    check_same_device(k, "k", q, "q")
    check_same_device(v, "v", q, "q")
    (b, h, lq, d), (bk, hk, lk, dk) = q.shape, k.shape
    if (bk, hk, dk) != (b, h, d):
        raise ValueError(
            f"k's shape {list(k.shape)} does not match q's {list(q.shape)} in batch, heads or head dim"
        )
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v's shape {list(v.shape)} must equal k's {list(k.shape)}")
    if d < 1:
        raise ValueError(f"head dim D must be at least 1, got shape {list(q.shape)}")
    check_bool(causal, "causal")
    check_bool(squared, "squared")
    if causal and lq != lk:
        raise ValueError(f"causal=True needs equal query and key lengths, got Lq={lq}, Lk={lk}")
    if scale is not None:
        check_positive_float(scale, "scale", allow_zero=False)
    if relu_scale is not None:
        check_positive_float(relu_scale, "relu_scale")
