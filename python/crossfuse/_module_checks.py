"""Input checks of the ``crossfuse.nn`` modules: an error names the module and the mismatch (the input's
dtype or device against the module's weights), where torch would raise from deep inside a matmul."""

from __future__ import annotations

import torch

from ._validate import type_name


def check_module_input(module: torch.nn.Module, x, weight: torch.Tensor | None, same_dtype: bool) -> None:
    """``x`` a tensor on ``weight``'s device and, with ``same_dtype`` (outside autocast, which casts the
    input itself), of its dtype; ``weight`` None: a module without weights (only the type is checked)."""
    name = type(module).__name__
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: input must be a torch.Tensor, got {type_name(x)}")
    if weight is None:
        return
    if x.device != weight.device:
        raise ValueError(
            f"{name}: input is on {x.device} but the module's weights are on {weight.device}; move one of "
            f"them (module.to({str(x.device)!r}) or input.to({str(weight.device)!r}))"
        )
    if same_dtype and x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(
            f"{name}: input dtype {x.dtype} does not match the module's weights ({weight.dtype}); cast one "
            f"of them (module.to({weight.dtype}) or input.to({weight.dtype})), or run under torch.autocast"
        )


def named(module: torch.nn.Module, exc: Exception) -> Exception:
    """The same kind of error, its message prefixed with the module's name."""
    return type(exc)(f"{type(module).__name__}: {exc}")
