"""Thin ``torch.nn.Module`` wrappers around crossfuse's functional ops."""

from .layer_norm import LayerNorm
from .relu_attention import ReLUAttention

__all__ = ["LayerNorm", "ReLUAttention"]
