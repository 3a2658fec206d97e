"""Pure-torch reference variants (the seed's Julia variants in torch) and float64 references."""

from .attention import kink_rows, kink_slack, relu_attention_naive, relu_attention_ref, tf32_truncate
from .norms import (
    layer_norm,
    layer_norm_maxstd_ref,
    layer_norm_ref,
    layernorm,
    normal_new,
    normal_newer,
    normal_now,
    normalise_ref,
)

__all__ = [
    "kink_rows",
    "kink_slack",
    "layer_norm",
    "layer_norm_maxstd_ref",
    "layer_norm_ref",
    "layernorm",
    "normal_new",
    "normal_newer",
    "normal_now",
    "normalise_ref",
    "relu_attention_naive",
    "relu_attention_ref",
    "tf32_truncate",
]
