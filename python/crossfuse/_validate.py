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
