"""crossfuse: fused layer norm and ReLU attention in Triton, checked and measured against Julia twins.

``crossfuse.layer_norm`` and ``crossfuse.relu_attention`` import Triton on first use (not at
``import crossfuse``), so a program can still choose Triton's interpreter (``TRITON_INTERPRET=1``)
after importing this package. ``import crossfuse`` imports torch and defines the custom operators
``torch.ops.crossfuse.*`` (``crossfuse.ops._library``), so that saved ``torch.export`` programs load.
"""

from __future__ import annotations

import importlib

from .ops import _library  # noqa: F401  torch.ops.crossfuse.* for torch.compile and torch.export (no Triton)

__version__ = "0.1.0"

_LAZY = {
    "layer_norm": ("crossfuse.ops.layer_norm", "layer_norm"),
    "relu_attention": ("crossfuse.ops.relu_attention", "relu_attention"),
    "nn": ("crossfuse.nn", None),
    "reference": ("crossfuse.reference", None),
    "registry": ("crossfuse.registry", None),
}

__all__ = ["__version__", "layer_norm", "nn", "reference", "registry", "relu_attention"]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'crossfuse' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
