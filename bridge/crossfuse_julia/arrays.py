"""How torch tensors cross to Julia and back, without copies.

A C-contiguous torch tensor of shape ``(..., N)`` holds ``M = prod(...)`` rows of ``N`` features. On the
same memory, Julia sees a column-major ``N×M`` array with the features along ``dims=1``: the shape
reversed, the strides reversed (``(N, 1)`` elements in torch, ``(1, N)`` in Julia), the same first
element. Normalising over torch's last dim is normalising over Julia's ``dims=1``: no transpose, no copy.
:func:`julia_layout` states this mapping; :func:`host_view` and :func:`from_host` do it on the CPU.

* CPU in: ``t.reshape(M, N).numpy().T`` — a NumPy view of shape ``(N, M)``, Fortran-ordered, same
  pointer; juliacall hands it to Julia as a ``PyArray`` (zero copy). Out: Julia returns a fresh
  ``Array``; ``np.asarray`` of juliacall's array wrapper is a zero-copy view of Julia's memory (kept
  alive by the view), and ``torch.from_numpy(...).T`` is the ``(M, N)`` tensor on it.
* CUDA in: the tensor itself (DLPack: ``DLPack.from_dlpack`` in Julia). Out: Python allocates the
  outputs (``torch.empty_like``) and Julia writes into them. torch is synchronised before the call,
  Julia's stream after it.
* Non-contiguous input is made contiguous first (``.contiguous()``: that one is a copy); tensors that
  require grad are detached (the bridge computes gradients itself, in Julia).
* dtypes: float32, float64 and float16 on both paths. bfloat16 is refused: NumPy has no bfloat16 (the
  CPU path; ``t.numpy()`` raises), and although DLPack.jl maps DLPack's bfloat16 code to
  ``BFloat16s.BFloat16`` (the CUDA path could carry it), CrossFuse is neither written nor tested for
  that type; such inputs get a ``TypeError`` that says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.float16)

BFLOAT16_REASON = ("bfloat16 cannot cross to Julia: NumPy has no bfloat16 (the CPU path), and CrossFuse is "
                   "not written or tested for BFloat16s.BFloat16, the type DLPack.jl maps it to (the CUDA "
                   "path); use float16, float32 or float64")


def dtype_reason(dtype: torch.dtype) -> str | None:
    """Why tensors of ``dtype`` cannot cross to Julia, or ``None``."""
    if dtype == torch.bfloat16:
        return BFLOAT16_REASON
    if dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        return f"{str(dtype).removeprefix('torch.')} cannot cross to Julia; supported: {names}"
    return None


@dataclass(frozen=True)
class JuliaLayout:
    """How a C-contiguous torch tensor of ``shape`` looks from Julia, on the same memory."""

    shape: tuple[int, ...]  # torch's shape, row-major: (..., N)
    rows: int  # M: the product of all but the last dim
    features: int  # N: the last dim, the normalised one
    julia_size: tuple[int, int]  # (N, M): column-major
    julia_strides: tuple[int, int]  # (1, N), in elements
    torch_strides: tuple[int, int]  # (N, 1), in elements, of the (M, N) view
    dims: int = 1  # Julia's normalised dim (torch's last)


def julia_layout(shape) -> JuliaLayout:
    """The Julia view of a C-contiguous tensor of ``shape`` (at least 1-D): ``N×M``, features on dims=1."""
    shape = tuple(int(s) for s in shape)
    if not shape:
        raise ValueError("x must have at least one dimension (the features), got a 0-d tensor")
    n = shape[-1]
    m = math.prod(shape[:-1])
    return JuliaLayout(shape, m, n, (n, m), (1, n), (n, 1))


def prepare(t: torch.Tensor, name: str, device: torch.device | None = None) -> torch.Tensor:
    """``t`` detached and contiguous, checked: a floating tensor of a dtype that can cross, on ``device``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    reason = dtype_reason(t.dtype)
    if reason:
        raise TypeError(f"{name}: {reason}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (the device of x)")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} is on {t.device}; the Julia bridge takes cpu and cuda tensors")
    return t.detach().contiguous()


def host_view(t: torch.Tensor) -> np.ndarray:
    """The Julia-ordered NumPy view of a contiguous CPU tensor of shape ``(..., N)``: ``(N, M)``,
    Fortran-ordered, on the same memory (no copy)."""
    _check_host(t)
    return t.reshape(-1, t.shape[-1]).numpy().T


def host_vector(t: torch.Tensor) -> np.ndarray:
    """The NumPy view of a contiguous 1-D CPU tensor (a weight or bias of length ``N``), no copy."""
    _check_host(t)
    if t.dim() != 1:
        raise ValueError(f"expected a 1-D tensor, got shape {tuple(t.shape)}")
    return t.numpy()


def _check_host(t: torch.Tensor) -> None:
    if t.device.type != "cpu":
        raise ValueError(f"a NumPy view needs a CPU tensor, got one on {t.device}")
    if not t.is_contiguous():
        raise ValueError("a NumPy view needs a contiguous tensor (call .contiguous() first)")


def _torch_from_julia(value, want: tuple[int, ...]) -> torch.Tensor:
    a = np.asarray(value)
    if a.shape != want:
        raise ValueError(f"Julia returned an array of size {a.shape}, expected {want}")
    if not a.flags.writeable:
        a = a.copy(order="F")
    return torch.from_numpy(a)


def from_host(value, shape, dtype: torch.dtype) -> torch.Tensor:
    """The tensor of torch ``shape`` ``(..., N)`` on the memory of the Julia ``N×M`` array ``value``
    returned through juliacall: zero copy (a copy only when Julia's memory is not writable, or to
    convert a dtype Julia changed)."""
    lay = julia_layout(shape)
    t = _torch_from_julia(value, lay.julia_size).T  # (M, N), C-contiguous for a column-major array
    t = t.reshape(lay.shape)
    return t if t.dtype == dtype else t.to(dtype)


def vector_from_host(value, n: int, dtype: torch.dtype) -> torch.Tensor:
    """The length-``n`` tensor on the memory of the Julia vector ``value`` (zero copy, as
    :func:`from_host`)."""
    t = _torch_from_julia(value, (n,))
    return t if t.dtype == dtype else t.to(dtype)
