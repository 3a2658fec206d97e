"""The plugin hook: ``register(registry)`` adds every Julia variant to crossfuse's registry.

Declared in pyproject.toml as the entry point ``julia = "crossfuse_julia.registry:register"`` of the
group ``crossfuse.implementations``; crossfuse's registry calls it on its first query. Registration is
cheap and never starts Julia: it only builds the entries. Each carries ``check_available``, which
answers with the reason Julia cannot be used (``CROSSFUSE_JULIA=0``, no juliacall, no Julia
executable, a failed start, the GPU path off), so the Julia entries show up everywhere, skipped with
that reason, on a machine without Julia.

``CROSSFUSE_JULIA=0`` at registration: the side is off, so its entries are left out (a command then
neither lists nor checks them) and one line on stderr says so, once per process, instead of a skip row
per entry. Set later, the registered entries skip with that reason.

Implementation names are the Julia function names (the same names as the Python twins in
``crossfuse.reference.norms``).
"""

from __future__ import annotations

import logging

from . import _detect
from .ops import JuliaVariant
from .session import cuda_requested

log = logging.getLogger("crossfuse_julia")

# op -> (Julia function name, description)
VARIANTS: dict[str, tuple[tuple[str, str], ...]] = {
    "normalise": (
        ("normal_now", "CrossFuse.normal_now (Julia): Statistics.mean/var, a sqrt per element; Zygote "
                       "through the rules of mean, var and broadcasting"),
        ("normal_new", "CrossFuse.normal_new (Julia): one sqrt per slice; rrule with one full-size "
                       "temporary"),
        ("normal_newer", "CrossFuse.normal_newer (Julia): mean_var statistics (one-pass Welford on a Float32 "
                         "GPU array); rrule with one full-size temporary"),
    ),
    "layer_norm": (
        ("layernorm", "CrossFuse.layernorm (Julia): NNlib-style affine layer norm, torch's eps convention; "
                      "differentiated by Zygote"),
    ),
    "layer_norm_maxstd": (
        ("layer_norm", "CrossFuse.layer_norm (Julia): NeuralAttentionlib-style single pass, max(std, eps); "
                       "rrule"),
    ),
}


def variants() -> list[JuliaVariant]:
    """Every Julia variant, as (op, name) pairs in registration order."""
    return [JuliaVariant(op, name) for op, entries in VARIANTS.items() for name, _ in entries]


def off_reason() -> str | None:
    """``CROSSFUSE_JULIA=<value> turns the Julia side off`` when the variable says off, else ``None``."""
    try:
        off = _detect.env_flag("CROSSFUSE_JULIA") is False
    except ValueError:  # not a flag: detection names the value in every entry's reason
        return None
    return _detect.off_reason() if off else None


def register(registry, honour_off_switch: bool = True) -> bool:
    """Add the Julia entries (side ``"julia"``) to ``registry`` (the module ``crossfuse.registry``);
    returns whether it did.

    Idempotent (entries are replaced). Devices: ``cpu`` and ``cuda``; ``check_available(device)`` says
    when the GPU path is off (it needs ``CROSSFUSE_JULIA_CUDA=1``). No bfloat16 (``dtypes``). With
    ``CROSSFUSE_JULIA=0`` (and ``honour_off_switch``, as the plugin hook is called) nothing is added and
    the reason is logged once (a warning of the ``crossfuse_julia`` logger: stderr unless configured).
    """
    reason = off_reason() if honour_off_switch else None
    if reason:
        log.warning("crossfuse_julia: %s: its entries are not registered", reason)
        return False
    import torch

    devices = ("cpu", "cuda")  # check_available(device) says when the GPU path is off
    gpu_note = "" if cuda_requested() else " [CUDA: set CROSSFUSE_JULIA_CUDA=1]"
    # bfloat16 cannot cross on the CPU (NumPy has none), and CrossFuse is not written for BFloat16
    dtypes = (torch.float32, torch.float64, torch.float16)
    for op, entries in VARIANTS.items():
        for name, description in entries:
            v = JuliaVariant(op, name)
            registry.register(
                registry.Implementation(
                    op,
                    name,
                    "julia",
                    v.fn(),
                    devices=devices,
                    kernel="julia",
                    description=description + gpu_note,
                    vjp=v.vjp,
                    check_available=v.check_available,
                    dtypes=dtypes,
                    measure=v.measure,
                ),
                replace=True,
            )
    return True
