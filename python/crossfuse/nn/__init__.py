"""Thin ``torch.nn.Module`` wrappers around crossfuse's functional ops, and the one call that puts a model's
layer norms onto them (:func:`swap_layer_norms`)."""

from .layer_norm import LayerNorm
from .relu_attention import ReLUAttention
from .swap import swap_layer_norms

__all__ = ["LayerNorm", "ReLUAttention", "swap_layer_norms"]
