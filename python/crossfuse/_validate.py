"""Argument checks shared by the ops: every failure is a TypeError/ValueError naming the argument."""

from __future__ import annotations

import torch

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_tensor(t, name: str, dtypes=KERNEL_DTYPES) -> torch.Tensor:
    """``t`` must be a tensor whose dtype is one of ``dtypes``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        allowed = ", ".join(dtype_name(d) for d in dtypes)
        raise TypeError(f"{name} has dtype {dtype_name(t.dtype)}; expected one of {allowed}")
    return t


def check_same_device(t: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    if t.device != ref.device:
        raise ValueError(
            f"{name} is on {t.device} but {ref_name} is on {ref.device}; move them to one device"
        )


def check_positive_float(value, name: str, allow_zero: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not (value > 0 or (allow_zero and value == 0)) or value != value or value == float("inf"):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value}")
    return value
