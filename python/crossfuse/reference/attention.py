"""Pure-torch ReLU attention: the naive form (materialises the L x L scores) and its float64 reference.

``out = relu_scale * act(mask(q @ k^T * scale)) @ v`` with ``act = relu`` or ``relu(.)^2``, the causal
mask zeroing keys after the query, ``scale = 1/sqrt(D)`` and ``relu_scale = 1/Lk`` by default.
Layout ``[B, H, L, D]``. relu's derivative at exactly 0 is 0 (torch's convention).
"""

from __future__ import annotations

import math

import torch


def attention_scales(d: int, lk: int, scale: float | None, relu_scale: float | None) -> tuple[float, float]:
    """Defaults: ``scale = 1/sqrt(D)``, ``relu_scale = 1/Lk``."""
    return (
        1.0 / math.sqrt(d) if scale is None else float(scale),
        1.0 / lk if relu_scale is None else float(relu_scale),
    )


def relu_attention_naive(q, k, v, causal: bool = False, squared: bool = False, scale=None, relu_scale=None):
    """Naive ReLU attention in the inputs' dtype: matmul, scale, mask, relu, matmul (O(L^2) memory)."""
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
    return relu_attention_naive(q.double(), k.double(), v.double(), causal, squared, scale, relu_scale)
