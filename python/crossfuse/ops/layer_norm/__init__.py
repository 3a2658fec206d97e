"""Fused layer norm in Triton: forward, and backward for dx, dw and db.

Formula (torch's ``layer_norm``, normalising over the last dim of a (M, N) view of the input)::

    mean = sum(x) / N
    var  = sum((x - mean)^2) / N                    (biased; corrected two-pass: no cancellation,
                                                     and the mean's rounding is corrected too)
    rstd = 1 / sqrt(var + eps)                      (eps inside the square root)
    y    = (x - mean) * rstd * w + b                (w, b each optional)

    xhat = (x - mean) * rstd,   g = dy * w
    dx   = rstd * (g - xhat * mean(g * xhat) - mean(g))
    dw   = sum over rows of dy * xhat,   db = sum over rows of dy

The package, by responsibility: :mod:`.api` (``layer_norm``, its checks, the autograd.Function and the
eager calls' plans), :mod:`.config` (the typed launch configuration, the measured tables, the rules),
:mod:`.plan` (launch plans and their launches), :mod:`.launch` and :mod:`.launch_bwd` (the forward's and
backward's plans and launchers), :mod:`.kernels_fwd`, :mod:`.kernels_bwd`, :mod:`.kernels_finish` and
:mod:`.kernels_common` (the Triton kernels), :mod:`.gluon_bwd` (the Gluon backward of long rows).
docs/ describes the design: how each kernel works, its limits and the measurements behind it.

Limits: last dim 1 <= N <= MAX_N; float32, float16, bfloat16 (float64 for checking); rows may be
strided (any row stride, unit column stride) and are read without a copy when ``reshape`` gives a view.
"""

from . import gluon_bwd
from .api import (
    SUPPORTED_DTYPES,
    LayerNormFunction,
    _operator_bwd,
    _operator_fwd,
    _operator_fwd_shaped,
    clear_plans,
    layer_norm,
)
from .config import (
    FUSED_MAX_N,
    MANY_ROWS,
    MAX_N,
    SMEM_ROWS_FALLBACK,
    TUNED,
    FinishConfig,
    LaunchConfig,
    backward_programs,
    interpreter_config,
    launch_config,
    reduce_tile,
    rule_config,
    shifted_max_ratio,
    smem_rows_fallback,
)
from .launch import layer_norm_fwd
from .launch_bwd import finish_from_shares, layer_norm_bwd, reduce_partials

__all__ = [
    "FUSED_MAX_N",
    "MANY_ROWS",
    "MAX_N",
    "SMEM_ROWS_FALLBACK",
    "SUPPORTED_DTYPES",
    "TUNED",
    "FinishConfig",
    "LaunchConfig",
    "LayerNormFunction",
    "_operator_bwd",
    "_operator_fwd",
    "_operator_fwd_shaped",
    "backward_programs",
    "clear_plans",
    "finish_from_shares",
    "gluon_bwd",
    "interpreter_config",
    "launch_config",
    "layer_norm",
    "layer_norm_bwd",
    "layer_norm_fwd",
    "reduce_partials",
    "reduce_tile",
    "rule_config",
    "shifted_max_ratio",
    "smem_rows_fallback",
]
