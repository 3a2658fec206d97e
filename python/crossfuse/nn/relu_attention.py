"""``crossfuse.nn.ReLUAttention``: multi-head ReLU attention with projections, on the fused kernels."""

from __future__ import annotations

import torch

from .._module_checks import check_module_input, named
from .._validate import check_bool, check_int
from ..ops.relu_attention import HEAD_DIMS, relu_attention


class ReLUAttention(torch.nn.Module):
    """Self-attention ``out_proj(relu_attention(q, k, v))`` over inputs of shape [B, L, embed_dim].

    One fused ``qkv`` projection; q, k and v are strided [B, L, H, D] views of its output that the
    kernel reads in place (layout ``"blhd"``): no transposes, no copies. ``head_dim = embed_dim //
    num_heads`` must be one of 16, 32, 64, 128, 256. An input of another dtype or device than the
    weights (outside autocast) is an error that names the module and both.
    """

    def __init__(self, embed_dim: int, num_heads: int, causal: bool = False, squared: bool = False,
                 bias: bool = True, device=None, dtype=None):  # fmt: skip
        super().__init__()
        embed_dim, num_heads = check_int(embed_dim, "embed_dim"), check_int(num_heads, "num_heads")
        causal, squared = check_bool(causal, "causal"), check_bool(squared, "squared")
        bias = check_bool(bias, "bias")
        if num_heads < 1 or embed_dim % num_heads:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be a positive multiple of num_heads ({num_heads})"
            )
        head_dim = embed_dim // num_heads
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim = embed_dim // num_heads = {head_dim}; it must be one of {HEAD_DIMS}")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, head_dim
        self.causal, self.squared = causal, squared
        factory = dict(device=device, dtype=dtype)
        self.qkv = torch.nn.Linear(embed_dim, 3 * embed_dim, bias=bias, **factory)
        self.out_proj = torch.nn.Linear(embed_dim, embed_dim, bias=bias, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_module_input(self, x, self.qkv.weight, same_dtype=True)
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(
                f"ReLUAttention: x must have shape [B, L, {self.embed_dim}], got {list(x.shape)}"
            )
        b, l, _ = x.shape
        q, k, v = self.qkv(x).view(b, l, 3, self.num_heads, self.head_dim).unbind(2)
        try:
            out = relu_attention(q, k, v, causal=self.causal, squared=self.squared, layout="blhd")
        except (TypeError, ValueError) as exc:  # the op's argument errors, said of this module
            raise named(self, exc) from None
        return self.out_proj(out.reshape(b, l, self.embed_dim))

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, causal={self.causal}, "
                f"squared={self.squared}")  # fmt: skip
