"""``crossfuse.nn.LayerNorm``: a drop-in for ``torch.nn.LayerNorm`` running the fused Triton kernels."""

from __future__ import annotations

import torch

from ..ops.layer_norm.api import layer_norm


class LayerNorm(torch.nn.LayerNorm):
    """Same constructor, parameters and ``state_dict`` as ``torch.nn.LayerNorm``; forward is fused.

    A state_dict saved from either class loads into the other.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)
