"""What a point's implementations share when the runner measures them: the inputs, the output gradient
and the float64 reference, made once a point."""

from __future__ import annotations

import torch

from .. import check, registry
from .suite import Point

# Largest float64 score matrix (B*H*L*Lk elements) the attention relerr check may build.
ATTENTION_RELERR_MAX_SCORES = 1 << 28


def relerr_heads(op: str, shape: tuple[int, ...]) -> int | None:
    """For attention too large for a float64 reference: how many heads of batch entry 0 to check
    (batch entries and heads are independent); None when the whole output is checked."""
    if op != "relu_attention":
        return None
    b, h, l, _ = shape
    if b * h * l * l <= ATTENTION_RELERR_MAX_SCORES:
        return None
    return max(1, min(h, ATTENTION_RELERR_MAX_SCORES // (l * l)))


class PointData:
    """What all implementations at one point share: inputs, the output gradient, the float64 reference.

    Made lazily (a point whose implementations are all skipped costs nothing). ``heads``: compare only
    ``[:1, :heads]`` (attention too large for a float64 reference), else None.
    """

    def __init__(self, p: Point, device: str):
        self.p, self.device = p, device
        self.op = registry.OPS[p.op]
        self.heads = relerr_heads(p.op, p.shape)
        gen, self.seed = check.fresh_generator()
        self.inputs = self.op.make_inputs(p.shape, p.dtype, device, gen, **p.options)
        self.dy: torch.Tensor | None = None
        self._ref = None  # (out, grads or None) in float64, sliced when heads is set
        self.ref_error: str | None = None

    def part(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.heads is None else t[:1, : self.heads]

    def dy_like(self, out: torch.Tensor) -> torch.Tensor:
        """The output gradient (random, never ones), made from the first output seen."""
        if self.dy is None:
            gen = torch.Generator(out.device).manual_seed(self.seed)
            self.dy = torch.randn(out.shape, dtype=out.dtype, device=out.device, generator=gen)
        return self.dy

    def reference_inputs(self) -> dict:
        """The inputs the float64 reference is computed from (the compared part of each tensor)."""
        return {k: self.part(v) if k in self.op.tensor_args and isinstance(v, torch.Tensor) else v
                for k, v in self.inputs.items()}  # fmt: skip

    def reference(self, grads: bool):
        """``(out, {name: grad})`` in float64 (grads empty when not asked), computed once."""
        if self._ref is not None and (self._ref[1] is not None or not grads):
            return self._ref[0], self._ref[1] or {}
        ins = self.reference_inputs()
        if grads:
            out, g = self.op.reference_grads(ins, self.part(self.dy))
            self._ref = (out, g)
        else:
            with torch.no_grad():
                self._ref = (self.op.reference(ins), None)
        return self._ref[0], self._ref[1] or {}
