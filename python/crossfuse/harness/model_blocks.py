"""The pre-norm transformer blocks of ``crossfuse bench models``' second table, in three builds that share
their parameters' names (and so one ``state_dict``):

* ``crossfuse``: ``crossfuse.nn.LayerNorm`` and ``crossfuse.nn.ReLUAttention``;
* ``torch_relu``: the same math in plain torch: ``torch.nn.LayerNorm`` and relu attention with its scores
  materialised (:func:`crossfuse.reference.attention.relu_attention_naive`, the defaults of
  ``crossfuse.relu_attention``: ``scale = 1/sqrt(D)``, ``relu_scale = 1/L``);
* ``torch_sdpa``: ``torch.nn.LayerNorm`` and ``F.scaled_dot_product_attention`` (softmax attention: another
  function, a speed peer only).

A block is ``x + attn(ln1(x))`` then ``x + fc2(gelu(fc1(ln2(x))))``; the stack ends with a LayerNorm; the
loss is the mean square of its output, in float32.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F

#: float32 copies whose attention scores (saved for the backward, every block) would pass this many bytes
#: are not built: the errors against float32 are then left empty, with a note.
FP32_SCORES_MAX_BYTES = 24 * 2**30


@dataclass(frozen=True)
class BlockCase:
    label: str
    batch: int
    seq: int
    dim: int
    heads: int
    blocks: int


#: (full, quick) cases: a short and a long sequence.
BLOCK_CASES: tuple[tuple[BlockCase, ...], tuple[BlockCase, ...]] = (
    (BlockCase("short", 8, 256, 1024, 16, 4), BlockCase("long", 2, 4096, 1024, 16, 4)),
    (BlockCase("short", 1, 16, 32, 2, 1), BlockCase("long", 1, 32, 32, 2, 1)),
)


class TorchAttention(torch.nn.Module):
    """Self-attention with ``crossfuse.nn.ReLUAttention``'s parameters (``qkv``, ``out_proj``), computed in
    torch: ``kind`` ``"relu"`` (scores materialised) or ``"sdpa"`` (softmax)."""

    def __init__(self, dim: int, heads: int, kind: str):
        super().__init__()
        if kind not in ("relu", "sdpa"):
            raise ValueError(f"kind must be 'relu' or 'sdpa', got {kind!r}")
        self.heads, self.kind = heads, kind
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out_proj = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from ..reference.attention import relu_attention_naive

        b, l, d = x.shape
        q, k, v = self.qkv(x).view(b, l, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if self.kind == "relu":
            out = relu_attention_naive(q, k, v)
        else:
            out = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(out.transpose(1, 2).reshape(b, l, d))


class Block(torch.nn.Module):
    def __init__(self, dim: int, heads: int, impl: str):
        super().__init__()
        from .. import nn as cnn

        norm = cnn.LayerNorm if impl == "crossfuse" else torch.nn.LayerNorm
        self.ln1, self.ln2 = norm(dim), norm(dim)
        if impl == "crossfuse":
            self.attn = cnn.ReLUAttention(dim, heads)
        else:
            self.attn = TorchAttention(dim, heads, "relu" if impl == "torch_relu" else "sdpa")
        self.fc1 = torch.nn.Linear(dim, 4 * dim)
        self.fc2 = torch.nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Stack(torch.nn.Module):
    def __init__(self, case: BlockCase, impl: str):
        super().__init__()
        from .. import nn as cnn

        self.blocks = torch.nn.ModuleList(Block(case.dim, case.heads, impl) for _ in range(case.blocks))
        self.norm = (cnn.LayerNorm if impl == "crossfuse" else torch.nn.LayerNorm)(case.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


def loss(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    return model(inputs["x"]).float().square().mean()


def block_impls(case: BlockCase, device, dtype: torch.dtype, seed: int):
    """``({"crossfuse": ..., "torch_relu": ..., "torch_sdpa": ...}, the float32 copy of torch_relu or None,
    the loss, the inputs)``: the three stacks with the same weights, in ``dtype`` on ``device``, eval mode."""
    torch.manual_seed(seed)
    ref = Stack(case, "torch_relu").to(device, dtype).eval()
    impls = {"crossfuse": None, "torch_relu": ref, "torch_sdpa": None}
    for name in ("crossfuse", "torch_sdpa"):
        m = Stack(case, name).to(device, dtype).eval()
        m.load_state_dict(ref.state_dict())
        impls[name] = m
    scores = case.batch * case.heads * case.seq**2 * 4 * 2 * case.blocks  # s and relu(s), float32
    fp32 = copy.deepcopy(ref).float() if scores <= FP32_SCORES_MAX_BYTES else None
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(case.batch, case.seq, case.dim, generator=gen).to(device, dtype)
    return impls, fp32, loss, {"x": x}
