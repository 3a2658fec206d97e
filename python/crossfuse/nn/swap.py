"""``crossfuse.nn.swap_layer_norms``: every ``torch.nn.LayerNorm`` of a model onto the fused kernels.

How a module is swapped: in place, by changing its class to :class:`crossfuse.nn.LayerNorm` (a subclass of
``torch.nn.LayerNorm`` that overrides ``forward`` only and adds no state). The module object stays where it
is, so nothing that already holds it or its parts goes stale:

* its ``weight`` and ``bias`` stay the very same ``Parameter`` objects (an optimizer built before the swap
  keeps updating them; tied parameters stay tied; ``state_dict`` keys are unchanged);
* its ``normalized_shape``, ``eps``, ``elementwise_affine``, missing bias (``bias=False``), device, dtype,
  ``training`` flag and hooks are its own attributes and are kept as they are;
* a module reachable under two names is one object, swapped once (reported under its first name).

Which modules are swapped:

* ``torch.nn.LayerNorm`` itself, and subclasses that do not override ``forward`` (their forward is torch's
  layer norm, so crossfuse's computes the same function). Such a subclass becomes ``crossfuse.nn.LayerNorm``:
  ``isinstance(m, TheSubclass)`` no longer holds and its other methods (``extra_repr``...) are dropped.
* Subclasses with a ``forward`` of their own are left alone by default, with a warning naming them: their
  forward may compute something else (add a residual, return float32, normalise another dim: timm's
  ``LayerNorm2d`` normalises the channels of NCHW tensors), and nothing here can tell. The exceptions are
  the classes of :data:`KNOWN_LAYER_NORMS`, whose forward is read and is ``F.layer_norm`` of the module's
  own attributes (timm's ``LayerNorm``, which the timm vision transformers use). Where the caller knows
  it is layer norm over ``normalized_shape`` with ``weight``, ``bias`` and ``eps``, e.g. a subclass that
  upcasts the input to float32 and casts the result back, ``accept=(Cls,)`` swaps it: crossfuse
  accumulates the statistics in float32 and rounds once on the store, as such a subclass does; one that
  returns float32 for a low-precision input would now return the input's dtype.
* ``crossfuse.nn.LayerNorm`` modules are already swapped and are not reported again; a ``normalized_shape``
  larger than the kernels take (``crossfuse.ops.layer_norm.MAX_N`` elements) is left alone, with a warning,
  as is a subclass whose instances have another memory layout (``__slots__``: its class cannot be changed).
* A module under ``torch.nn.utils.parametrize`` (a parametrized weight) is swapped to a class like the one
  torch made for it, over ``crossfuse.nn.LayerNorm``: the parametrization keeps working, and removing it
  leaves a ``crossfuse.nn.LayerNorm``.
"""

from __future__ import annotations

import fnmatch
import math
import warnings
from collections.abc import Callable, Iterable

import torch

from .._validate import type_name
from .layer_norm import LayerNorm, _check_native_below

#: LayerNorm subclasses, by module and qualified name, whose own ``forward`` computes exactly
#: ``F.layer_norm(x, normalized_shape, weight, bias, eps)`` (timm's, also under its ``fast_norm`` option,
#: which only changes the dtype under autocast): swapped without ``accept``. Names, not classes, so that
#: nothing here imports those libraries.
KNOWN_LAYER_NORMS: tuple[str, ...] = ("timm.layers.norm.LayerNorm",)

Include = Callable[[str, torch.nn.Module], bool] | str | Iterable[str] | None


def _name_filter(include: Include) -> Callable[[str, torch.nn.Module], bool]:
    """``include`` as a predicate of (qualified name, module)."""
    if include is None:
        return lambda name, module: True
    if callable(include):
        return include
    patterns = [include] if isinstance(include, str) else include
    try:
        patterns = list(patterns)
    except TypeError:
        raise TypeError(
            "include must be None, a callable (name, module) -> bool, or fnmatch patterns of qualified "
            f"module names (a str or an iterable of str), got {type_name(include)}"
        ) from None
    bad = [p for p in patterns if not isinstance(p, str)]
    if bad:
        raise TypeError(f"include's patterns must be str, got {type_name(bad[0])} ({bad[0]!r})")
    return lambda name, module: any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _accepted(accept) -> tuple[type, ...]:
    try:
        classes = tuple(accept)
    except TypeError:
        raise TypeError(
            f"accept must be an iterable of torch.nn.LayerNorm subclasses, got {type_name(accept)}"
        ) from None
    for c in classes:
        if not (isinstance(c, type) and issubclass(c, torch.nn.LayerNorm)):
            raise TypeError(f"accept must hold torch.nn.LayerNorm subclasses, got {c!r}")
    return classes


def _own_forward(cls: type) -> bool:
    """Whether ``cls`` (a LayerNorm subclass) computes its forward with code other than torch's or that of
    a class of :data:`KNOWN_LAYER_NORMS`."""
    for base in cls.__mro__:
        if "forward" in vars(base):
            known = f"{base.__module__}.{base.__qualname__}" in KNOWN_LAYER_NORMS
            return not (base is torch.nn.LayerNorm or known)
    return True


def _swapped_class(module: torch.nn.Module) -> type:
    """:class:`LayerNorm`, or for a module under ``torch.nn.utils.parametrize`` (whose class torch made, a
    subclass of its own that reads ``weight`` through the parametrization), a class like it over
    :class:`LayerNorm`, made from its class as it is now (torch adds a property to it for each tensor
    parametrized later): the parametrization keeps working, and removing it leaves a crossfuse LayerNorm."""
    if not torch.nn.utils.parametrize.is_parametrized(module):
        return LayerNorm
    own = {k: v for k, v in vars(type(module)).items() if k not in ("__dict__", "__weakref__", "__module__")}
    return type(f"Parametrized{LayerNorm.__name__}", (LayerNorm,), own)


def swap_layer_norms(
    model: torch.nn.Module, *, include: Include = None, accept: Iterable[type] = (),
    native_below: int | None = None,
) -> list[str]:
    """Swap, in place, every ``torch.nn.LayerNorm`` of ``model`` (``model`` itself included) for
    :class:`crossfuse.nn.LayerNorm`; return the qualified names of the modules swapped (``""`` for the root).

    Args:
        model: the module tree.
        include: which modules to consider: None (all), fnmatch patterns of qualified names (a str or an
            iterable of str, e.g. ``"encoder.*"``), or a callable ``(name, module) -> bool``.
        accept: LayerNorm subclasses with a ``forward`` of their own that the caller vouches compute layer
            norm (see the module's docstring); any other such subclass is left alone with a warning.
        native_below: each swapped module's :attr:`LayerNorm.native_below` (None: the class default, the
            size below which torch's own layer norm is faster in a model).

    Parameters are kept as the same objects, so an optimizer made before the call needs no rebuilding; the
    call is idempotent (a second one returns ``[]``). Swapped modules then run crossfuse's kernels: on a
    CUDA device, or on the CPU under Triton's interpreter.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type_name(model)}")
    keep = _name_filter(include)
    accepted = _accepted(accept)
    if native_below is not None:
        native_below = _check_native_below(native_below)
    from ..ops.layer_norm import MAX_N

    swapped, refused, too_large = [], [], []  # too_large: also classes that cannot be changed
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.LayerNorm) or isinstance(module, LayerNorm):
            continue
        if not keep(name, module):
            continue
        cls = type(module)
        if _own_forward(cls) and not issubclass(cls, accepted):
            refused.append(f"{name or '<root>'} ({cls.__module__}.{cls.__qualname__})")
            continue
        if math.prod(module.normalized_shape) > MAX_N:
            too_large.append(f"{name or '<root>'} (normalized_shape {list(module.normalized_shape)})")
            continue
        try:
            module.__class__ = _swapped_class(module)
        except TypeError:  # a class of another layout (__slots__): nothing was changed
            too_large.append(f"{name or '<root>'} ({cls.__module__}.{cls.__qualname__}: its instances' "
                             "memory layout (__slots__) differs, so its class cannot change)")  # fmt: skip
            continue
        if native_below is not None:
            module.native_below = native_below
        swapped.append(name)
    if refused:
        warnings.warn(
            f"swap_layer_norms left {len(refused)} LayerNorm subclass modules alone, whose forward is their "
            f"own and may compute something else: {', '.join(refused[:5])}"
            f"{', ...' if len(refused) > 5 else ''}; pass accept=(TheClass,) if it computes layer norm",
            UserWarning,
            stacklevel=2,
        )
    if too_large:
        warnings.warn(
            f"swap_layer_norms left {len(too_large)} LayerNorm modules alone, normalising more than the "
            f"{MAX_N} elements a row the kernels take, or of a class it cannot change: "
            f"{', '.join(too_large[:5])}",
            UserWarning,
            stacklevel=2,
        )
    return swapped
