"""Pure-torch ReLU attention: the naive form (materialises the L x L scores) and its float64 reference.

``out = relu_scale * act(mask(q @ k^T * scale)) @ v`` with ``act = relu`` or ``relu(.)^2``, the causal
mask zeroing keys after the query, ``scale = 1/sqrt(D)`` and ``relu_scale = 1/Lk`` by default.
Layout ``[B, H, L, D]``. relu's derivative at exactly 0 is 0 (torch's convention).

Arguments are checked as ``crossfuse.relu_attention`` checks them (``crossfuse._validate``): a
TypeError/ValueError naming the argument, never a wrong answer; only the kernels' own limits (head dims,
heads a grid holds) do not apply. Not while torch.compile traces them (a compiled peer pays no checks).
"""

from __future__ import annotations

import math

import torch

from .._validate import REFERENCE_DTYPES, check_attention_args, check_bool, check_same_device, check_tensor


def attention_scales(d: int, lk: int, scale: float | None, relu_scale: float | None) -> tuple[float, float]:
    """Defaults: ``scale = 1/sqrt(D)``, ``relu_scale = 1/Lk`` (no key: 1, nothing is summed; the output is
    zeros, as torch's attention gives)."""
    return (
        1.0 / math.sqrt(d) if scale is None else float(scale),
        1.0 / max(lk, 1) if relu_scale is None else float(relu_scale),
    )


def relu_attention_naive(q, k, v, causal: bool = False, squared: bool = False, scale=None, relu_scale=None):
    """Naive ReLU attention in the inputs' dtype: matmul, scale, mask, relu, matmul (O(L^2) memory)."""
    if not torch.compiler.is_compiling():
        check_attention_args(q, k, v, causal, squared, scale, relu_scale)
    return _naive(q, k, v, causal, squared, scale, relu_scale)


def _naive(q, k, v, causal: bool, squared: bool, scale, relu_scale):
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale, relu_scale = attention_scales(d, lk, scale, relu_scale)
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        keep = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril()
        s = torch.where(keep, s, 0.0)
    p = torch.relu(s)
    if squared:
        p = p * p
    return torch.matmul(p * relu_scale, v)


def relu_attention_ref(q, k, v, causal: bool = False, squared: bool = False, scale=None, relu_scale=None):
    """The float64 reference of :func:`relu_attention_naive` (returns float64)."""
    check_attention_args(q, k, v, causal, squared, scale, relu_scale)
    return _naive(q.double(), k.double(), v.double(), causal, squared, scale, relu_scale)


def tf32_truncate(t: torch.Tensor) -> torch.Tensor:
    """float32 -> the tf32 value a tensor core multiplies: the low 13 of 23 mantissa bits cleared (a
    float64 reference given these inputs sees the operands a GPU's float32 dot sees)."""
    check_tensor(t, "t", (torch.float32,))
    return (t.contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


def _near_kink(q, k, causal: bool) -> torch.Tensor:
    """[..., Lq, Lk] bool: the scores within float32 rounding of relu's kink (inputs [..., L, D], in the
    dtype the kernel multiplies them in): ``|s| <= D * 2^-23 * sum_d |q_d k_d|`` may fall on either side
    of 0 in any float32 sum. Masked (causal) scores are not among them."""
    q, k = q.detach().double(), k.detach().double()
    near = (q @ k.transpose(-1, -2)).abs() <= q.shape[-1] * 2.0**-23 * (q.abs() @ k.abs().transpose(-1, -2))
    if causal:
        near &= torch.ones(near.shape[-2:], dtype=torch.bool, device=near.device).tril()
    return near


def kink_rows(q, k, causal: bool = False, squared: bool = False) -> dict[str, torch.Tensor]:
    """``{"q": rows, "k": rows}``: [..., L] masks of the query rows of dq and the key rows of dk that a
    score within float32 rounding of relu's kink reaches (inputs [..., L, D], in the dtype the kernel
    multiplies them in). relu's derivative jumps at 0, so such a row has no one right answer: how far
    it may move is :func:`kink_slack`. None for ``squared`` (continuous at 0) and none for dv. Not for
    tf32 products: their wider rounding is in their tolerance."""
    _check_rows(q=q, k=k)
    check_bool(causal, "causal")
    check_bool(squared, "squared")
    if squared:  # no kink: no score to compute
        return {"q": torch.zeros(q.shape[:-1], dtype=torch.bool, device=q.device),
                "k": torch.zeros(k.shape[:-1], dtype=torch.bool, device=k.device)}  # fmt: skip
    near = _near_kink(q, k, causal)
    return {"q": near.any(-1), "k": near.any(-2)}


def kink_slack(q, k, v, dout, causal: bool = False, squared: bool = False, scale=None, relu_scale=None):
    """``{"q": slack, "k": slack}``: [..., L] float64, for each row of dq (of dk) the largest distance
    its scores at relu's kink (:func:`kink_rows`) can move it. A score ``s_ij`` on the other side of 0
    adds or removes ``relu_scale * scale * dp_ij * k_j`` in dq row i (``... * q_i`` in dk row j), with
    ``dp = dout @ v^T``; the slack is the sum of their norms over the row's ambiguous scores (the
    triangle inequality), 0 in rows none reaches and everywhere for ``squared`` (continuous at 0). A
    comparison that grants each row its slack (``crossfuse.tolerances.relerr_with_slack``) keeps every
    row: a wrong row still fails unless it is wrong by no more than its kink scores allow."""
    _check_rows(q=q, k=k, v=v, dout=dout)
    check_bool(causal, "causal")
    check_bool(squared, "squared")
    lk, d = k.shape[-2], q.shape[-1]
    if squared:
        return {"q": torch.zeros(q.shape[:-1], dtype=torch.float64, device=q.device),
                "k": torch.zeros(k.shape[:-1], dtype=torch.float64, device=k.device)}  # fmt: skip
    scale, relu_scale = attention_scales(d, lk, scale, relu_scale)
    q, k, v, dout = (t.detach().double() for t in (q, k, v, dout))
    near = _near_kink(q, k, causal)
    jump = torch.where(near, (dout @ v.transpose(-1, -2)).abs(), 0.0) * abs(scale * relu_scale)
    q_norm, k_norm = torch.linalg.vector_norm(q, dim=-1), torch.linalg.vector_norm(k, dim=-1)
    return {"q": (jump @ k_norm.unsqueeze(-1)).squeeze(-1),
            "k": (jump.transpose(-1, -2) @ q_norm.unsqueeze(-1)).squeeze(-1)}  # fmt: skip


def _check_rows(**tensors: torch.Tensor) -> None:
    """Tensors [..., L, D] of one device, with q's head dim and k's rows in v (the kink helpers take any
    leading dims)."""
    for name, t in tensors.items():
        check_tensor(t, name, REFERENCE_DTYPES)
        if t.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dims ([..., L, D]), got shape {list(t.shape)}")
        check_same_device(t, name, tensors["q"], "q")
    q, k = tensors["q"], tensors["k"]
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k's head dim {k.shape[-1]} is not q's {q.shape[-1]}")
    v = tensors.get("v")
    if v is not None and v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"v's shape {list(v.shape)} does not match k's {list(k.shape)} but in the last dim")
