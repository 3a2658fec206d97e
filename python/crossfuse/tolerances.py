"""Tolerances as data: the largest accepted ``||out - ref|| / ||ref||`` against the float64 reference.

Per op and input dtype, separately for the forward output (``fwd``), per-element input gradients
(``bwd``) and gradients reduced over rows (``reduced``: dw, db, dalpha, dbeta), whose error grows with
the number of rows summed: their tolerance is ``reduced * sqrt(M)``, never below ``bwd``.

Low precisions are bounded by rounding the output itself (bfloat16 keeps 8 bits: a relative error of
about 2e-3 per element); attention's float32 matmuls run on tf32 tensor cores on GPUs (10 bits).
"""

from __future__ import annotations

import math

import torch

_F32, _F16, _BF16, _F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64

_NORMS = {
    _F64: dict(fwd=1e-12, bwd=1e-11, reduced=1e-13),
    _F32: dict(fwd=2e-6, bwd=1e-5, reduced=2e-7),
    _F16: dict(fwd=1e-3, bwd=2e-3, reduced=2e-5),
    _BF16: dict(fwd=8e-3, bwd=1.6e-2, reduced=1.5e-4),
}

TOLERANCES: dict[str, dict[torch.dtype, dict[str, float]]] = {
    "layer_norm": _NORMS,
    "normalise": _NORMS,
    "layer_norm_maxstd": _NORMS,
    "relu_attention": {
        _F64: dict(fwd=1e-12, bwd=1e-11, reduced=1e-13),
        _F32: dict(fwd=2e-5, bwd=2e-4, reduced=0.0),
        _F16: dict(fwd=2e-3, bwd=4e-3, reduced=0.0),
        _BF16: dict(fwd=1.2e-2, bwd=2.5e-2, reduced=0.0),
    },
}

# float32 matmuls on tf32 tensor cores (Triton's float32 dot on GPUs): operands keep 10 mantissa bits,
# truncated, not rounded (emulated on the CPU: 1.5e-3 forward, 2.5e-2 for dq/dk, where scores near 0
# change sign and so change relu's mask). Measured on the H200: 2.2e-3 forward, 2.9e-2 dq/dk against
# float64 at large L (1.4e-2 at L=4096). At L=17 one flipped score can reach 0.12, so the
# GPU tests give the float64 reference the same truncated inputs (tests/test_relu_attention.py).
TF32 = {"relu_attention": dict(fwd=5e-3, bwd=6e-2, reduced=0.0)}


def tolerance(op: str, dtype: torch.dtype, kind: str = "fwd", rows: int = 1, tf32: bool = False) -> float:
    """Accepted relative error for ``op`` in ``dtype``; ``kind`` is ``fwd``, ``bwd`` or ``reduced``;
    ``tf32``: float32 matmuls ran on tf32 tensor cores."""
    table = TF32[op] if tf32 and dtype == _F32 and op in TF32 else TOLERANCES[op][dtype]
    if kind == "reduced":
        return max(table["bwd"], table["reduced"] * math.sqrt(max(rows, 1)))
    return table[kind]


def relerr_with_slack(out: torch.Tensor, ref: torch.Tensor, slack: torch.Tensor) -> float:
    """:func:`relerr` with each row of ``out`` granted ``slack`` (a float tensor over the leading dims):
    a row's distance from ``ref`` counts only beyond its slack, ``max(||out_i - ref_i|| - slack_i, 0)``.
    Every row is compared; rows with no one right answer get the distance their ambiguity allows and no
    more (e.g. ``crossfuse.reference.kink_slack``: gradient rows at relu's kink)."""
    out64, ref64 = out.detach().to(ref.device, torch.float64), ref.detach().double()
    if out64.shape != ref64.shape or tuple(slack.shape) != tuple(ref64.shape[:-1]):
        shapes = f"{tuple(out64.shape)} vs reference {tuple(ref64.shape)}, slack {tuple(slack.shape)}"
        raise ValueError(f"shape mismatch: {shapes}")
    if not torch.isfinite(out64).all():
        return float("nan")
    beyond = (torch.linalg.vector_norm(out64 - ref64, dim=-1) - slack.to(ref64)).clamp(min=0)
    denom = torch.linalg.vector_norm(ref64).item()
    num = torch.linalg.vector_norm(beyond).item()
    return num / denom if denom > 0 else num


def relerr(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64 (NaN anywhere gives NaN, which no tolerance accepts)."""
    out64, ref64 = out.detach().to(ref.device, torch.float64), ref.detach().double()
    if out64.shape != ref64.shape:
        raise ValueError(f"shape mismatch: {tuple(out64.shape)} vs reference {tuple(ref64.shape)}")
    denom = torch.linalg.vector_norm(ref64).item()
    num = torch.linalg.vector_norm(out64 - ref64).item()
    if not math.isfinite(num) or not torch.isfinite(out64).all():
        return float("nan")
    return num / denom if denom > 0 else num
