"""``crossfuse.nn.LayerNorm``: a drop-in for ``torch.nn.LayerNorm`` running the fused Triton kernels."""

from __future__ import annotations

import torch

from .._module_checks import check_module_input, named
from ..ops.layer_norm.api import layer_norm


class LayerNorm(torch.nn.LayerNorm):
    """Same constructor, parameters and ``state_dict`` as ``torch.nn.LayerNorm``; forward is fused.

    A state_dict saved from either class loads into the other. As torch's, it takes an input of another
    floating dtype than its weights (mixed precision: the output has the input's dtype); an input on
    another device than the weights, or of the wrong shape, is an error that names the module.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        try:
            return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)
        except (TypeError, ValueError) as exc:  # the op's argument errors, said of this module
            # checked only once the op has refused the input: a call that succeeds pays for no check
            check_module_input(self, input, self.weight, same_dtype=False)
            raise named(self, exc) from None
