"""``crossfuse.nn.LayerNorm``: a drop-in for ``torch.nn.LayerNorm`` running the fused Triton kernels (or
torch's own layer norm for CUDA inputs smaller than ``native_below``)."""

from __future__ import annotations

import torch

from .._module_checks import check_module_input, named
from .._validate import check_int
from ..ops.layer_norm.api import layer_norm

# Inputs of fewer elements than this run torch's own layer norm (see LayerNorm). Where a call's GPU work is
# this small, its cost is the host's: the fused kernels finish first on the GPU, but a Python call that
# launches a Triton kernel through an autograd.Function costs more host time than torch's C++ op, so a
# model whose step is paced by its host (small batches) would run slower. Back to back with nothing else
# queued the fused module pays only from about 25M elements (bench/layer_norm_crossover.py); in real models
# the matmuls keep the GPU busy and hide the host: 4M sits below GPT2's, BERT's and ViT's large batches
# (6-13M elements, crossfuse bench models), where the fused kernels' steps were within the runs' noise of
# torch's or faster.
NATIVE_BELOW = 1 << 22


class LayerNorm(torch.nn.LayerNorm):
    """Same constructor, parameters and ``state_dict`` as ``torch.nn.LayerNorm``; forward is fused.

    A state_dict saved from either class loads into the other. As torch's, it takes an input of another
    floating dtype than its weights (mixed precision: the output has the input's dtype); an input on
    another device than the weights, or of the wrong shape, is an error that names the module.

    ``native_below``: a CUDA input of fewer elements runs torch's own layer norm (same dtypes as the
    weights, no autocast), where the host's time per call, not the GPU's, sets the pace (see
    :data:`NATIVE_BELOW`); 0 runs the fused kernels at every size. A module made by
    :func:`crossfuse.nn.swap_layer_norms` has the default unless that call says otherwise.
    """

    native_below: int = NATIVE_BELOW

    def __init__(self, *args, native_below: int = NATIVE_BELOW, **kwargs):
        super().__init__(*args, **kwargs)
        self.native_below = _check_native_below(native_below)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        # read from the parameters' own dict: each read through Module.__getattr__ (as torch's module
        # reads them) costs about a microsecond, more than all the checks below. A parametrized module,
        # or one whose parameters a wrapper replaced by plain attributes, has them elsewhere: read as
        # attributes then. functional_call puts its tensors into this dict.
        params = self._parameters
        if "weight" in params and "bias" in params:
            weight, bias = params["weight"], params["bias"]
        else:
            weight, bias = self.weight, self.bias
        if isinstance(input, torch.Tensor) and input.numel() < self.native_below and input.is_cuda:
            dtype = input.dtype  # dtypes are singletons: `is` is the cheaper `==`
            if (weight is None or weight.dtype is dtype) and (bias is None or bias.dtype is dtype):
                # outside autocast, whose layer norm gives float32 (the fused one the input's dtype: a
                # size must never change the output's dtype). Any device's autocast counts: the check
                # costs a third of torch.is_autocast_enabled("cuda")'s, and a CPU autocast around a CUDA
                # call only sends it to the fused kernels, which are right under any autocast.
                if not torch._C._is_any_autocast_enabled():
                    # F.layer_norm's own op without its Python frame (which reads the deprecated
                    # cudnn flag the op ignores): host time the checks above spend instead
                    return torch.layer_norm(input, self.normalized_shape, weight, bias, self.eps)
        try:
            return layer_norm(input, self.normalized_shape, weight, bias, self.eps)
        except (TypeError, ValueError) as exc:  # the op's argument errors, said of this module
            # checked only once the op has refused the input: a call that succeeds pays for no check
            check_module_input(self, input, weight, same_dtype=False)
            raise named(self, exc) from None

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, native_below={self.native_below}"


def _check_native_below(value) -> int:
    value = check_int(value, "native_below")  # numpy's integers too; a TypeError for a float or a bool
    if value < 0:
        raise ValueError(f"native_below must be an int >= 0 (elements of an input), got {value!r}")
    return value
