"""Suites: loading them (data) and expanding a suite into measurement points.

The suites are the ``SUITES`` dict of :mod:`crossfuse.harness.suites`, which ships with the package; a
suite file of the same form replaces them when given as an explicit path or in the environment variable
``CROSSFUSE_SUITES``. Either way the dict is validated here: unknown keys, ops, dtypes and modes are
``ValueError`` s naming the suite and the key.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import registry
from . import suites as suites_module
from .schema import MODES, parse_dtype

_GROUP_KEYS = {"ops", "impls", "shapes", "quick_shapes", "dtypes", "options", "modes"}
_SUITE_KEYS = {"description", "groups", "exclude", "copy_ceiling"}
_EXCLUDE_KEYS = {"impl", "device", "reason", "quick_only"}
_COPY_KEYS = {"dtype", "numel", "quick_numel"}


@dataclass(frozen=True)
class Exclusion:
    impl: str  # fnmatch pattern on the implementation's name (or side/name, see matches())
    device: str | None  # None: every device
    reason: str
    quick_only: bool = False

    def applies(self, impl: registry.Implementation, device: str, quick: bool) -> bool:
        if self.quick_only and not quick:
            return False
        if self.device is not None and self.device != torch.device(device).type:
            return False
        return matches(impl, self.impl)


@dataclass(frozen=True)
class Group:
    ops: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    quick_shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    modes: tuple[str, ...]
    options: tuple[dict, ...] = ({},)
    impls: tuple[str, ...] | None = None  # fnmatch patterns; None: all of the op's implementations


@dataclass(frozen=True)
class CopyCeiling:
    dtype: torch.dtype
    numel: dict  # device type -> elements
    quick_numel: int


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    groups: tuple[Group, ...]
    exclude: tuple[Exclusion, ...] = ()
    copy_ceiling: CopyCeiling | None = None


@dataclass(frozen=True)
class Point:
    """One op at one shape, dtype and option set: every implementation and mode is measured here."""

    op: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    options: dict = field(hash=False)
    modes: tuple[str, ...]
    impls: tuple[str, ...] | None


def _fail(suite: str, what: str) -> ValueError:
    return ValueError(f"suite {suite!r}: {what}")


def _shape_list(name: str, key: str, shapes, op_dims: set[int]) -> tuple[tuple[int, ...], ...]:
    out = []
    if isinstance(shapes, (str, bytes)) or not isinstance(shapes, (list, tuple)):
        raise _fail(name, f"{key} must be a list of shapes (each a list of ints), got {shapes!r}")
    for s in shapes:
        try:
            t = tuple(int(d) for d in s)
        except (TypeError, ValueError):
            raise _fail(name, f"{key}: each shape must be a list of ints, e.g. [4096, 1024], got {s!r}") \
                from None
        if not t or any(d <= 0 for d in t):
            raise _fail(name, f"{key} has a non-positive shape {s!r}")
        if len(t) not in op_dims:
            raise _fail(name, f"{key} has shape {s!r} of {len(t)} dims; its ops take {sorted(op_dims)} dims")
        out.append(t)
    return tuple(out)


def parse_suite(name: str, data: dict) -> Suite:
    """Validate one suite's data and return it as a :class:`Suite` (a ``ValueError`` naming the suite and
    what is wrong with it otherwise, a malformed value included)."""
    try:
        return _parse_suite(name, data)
    except (TypeError, KeyError, AttributeError) as exc:  # a value of the wrong kind somewhere below
        what = f"{type(exc).__name__}: {exc}"
        raise _fail(name, f"malformed suite data ({what}); see docs/harness.md for its keys") from None


def _parse_suite(name: str, data: dict) -> Suite:
    if not isinstance(data, dict):
        raise _fail(name, f"must be a dict of {sorted(_SUITE_KEYS)}, got {type(data).__name__}")
    unknown = set(data) - _SUITE_KEYS
    if unknown:
        raise _fail(name, f"unknown keys {sorted(unknown)}; allowed: {sorted(_SUITE_KEYS)}")
    for key in ("groups", "exclude"):
        items = data.get(key, ())
        if not isinstance(items, (list, tuple)) or not all(isinstance(g, dict) for g in items):
            raise _fail(name, f"{key} must be a list of dicts, got {items!r}")
    groups = []
    for i, g in enumerate(data.get("groups", ())):
        unknown = set(g) - _GROUP_KEYS
        if unknown:
            raise _fail(name, f"group {i}: unknown keys {sorted(unknown)}; allowed: {sorted(_GROUP_KEYS)}")
        ops = tuple(g.get("ops", ()))
        if not ops:
            raise _fail(name, f"group {i} names no ops")
        for op in ops:
            if op not in registry.OPS:
                raise _fail(name, f"group {i}: unknown op {op!r}; known: {', '.join(registry.OPS)}")
        dims = {len(registry.OPS[op].shape_names) for op in ops}
        modes = tuple(g.get("modes", MODES))
        for m in modes:
            if m not in MODES:
                raise _fail(name, f"group {i}: unknown mode {m!r}; known: {', '.join(MODES)}")
        try:
            dtypes = tuple(parse_dtype(d) for d in g.get("dtypes", ("float32",)))
        except ValueError as exc:
            raise _fail(name, f"group {i}: {exc}") from None
        shapes = _shape_list(name, f"group {i} shapes", g.get("shapes", ()), dims)
        quick = _shape_list(name, f"group {i} quick_shapes", g.get("quick_shapes", shapes), dims)
        options = tuple(dict(o) for o in g.get("options", ({},)))
        impls = g.get("impls")
        groups.append(
            Group(ops, shapes, quick, dtypes, modes, options, None if impls is None else tuple(impls))
        )
    if not groups:
        raise _fail(name, "has no groups")
    excl = []
    for e in data.get("exclude", ()):
        unknown = set(e) - _EXCLUDE_KEYS
        if unknown or "impl" not in e or "reason" not in e:
            raise _fail(
                name,
                f"exclude entries need 'impl' and 'reason' (and may have 'device', 'quick_only'); "
                f"got {sorted(e)}",
            )
        excl.append(Exclusion(e["impl"], e.get("device"), e["reason"], bool(e.get("quick_only", False))))
    cc = data.get("copy_ceiling")
    copy = None
    if cc is not None:
        if not isinstance(cc, dict) or not {"numel", "quick_numel"} <= set(cc) <= _COPY_KEYS:
            raise _fail(name, "copy_ceiling must be a dict with 'numel' ({device type: elements}) and "
                        f"'quick_numel' (elements), and may have 'dtype'; got {cc!r}")  # fmt: skip
        copy = CopyCeiling(
            parse_dtype(cc.get("dtype", "bfloat16")), dict(cc["numel"]), int(cc["quick_numel"])
        )
    return Suite(name, str(data.get("description", "")), tuple(groups), tuple(excl), copy)


def find_suites_file(path: str | os.PathLike | None = None) -> Path:
    """The suite file: ``path``, else ``CROSSFUSE_SUITES``, else the package's own
    (:mod:`crossfuse.harness.suites`)."""
    if path is None:
        path = os.environ.get("CROSSFUSE_SUITES") or None
    if path is None:
        return Path(suites_module.__file__)
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no suite file at {file} (from --suites or CROSSFUSE_SUITES)")
    return file


def _suites_data(file: Path) -> dict:
    """The ``SUITES`` dict of a suite file, run as Python; every error names the file."""
    spec = importlib.util.spec_from_file_location("_crossfuse_suites_file", file)
    if spec is None or spec.loader is None:  # Python loads only files it knows the kind of, e.g. *.py
        raise ValueError(f"{file}: not a Python file (a suite file is a .py file defining SUITES)")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise ValueError(f"{file}: not valid Python: {exc}") from None
    except Exception as exc:  # the file runs as Python: any error in it is the file's, named as such
        raise ValueError(f"{file}: running it raised {type(exc).__name__}: {exc}") from None
    data = getattr(module, "SUITES", None)
    if not isinstance(data, dict):
        raise ValueError(f"{file} defines no SUITES dict")
    return data


def load_suites(path: str | os.PathLike | None = None) -> dict[str, Suite]:
    """All suites, validated: the package's (:mod:`crossfuse.harness.suites`), or those of the suite file
    at ``path`` or ``CROSSFUSE_SUITES``."""
    file = find_suites_file(path)
    data = suites_module.SUITES if file == Path(suites_module.__file__) else _suites_data(file)
    return {name: parse_suite(name, d) for name, d in data.items()}


def points(
    suite: Suite,
    quick: bool = False,
    dtypes: Sequence[torch.dtype] | None = None,
    ops: Sequence[str] | None = None,
) -> Iterator[Point]:
    """The suite's measurement points, in order (group, op, shape, dtype, options)."""
    for g in suite.groups:
        for op in g.ops:
            if ops is not None and op not in ops:
                continue
            for shape in g.quick_shapes if quick else g.shapes:
                for dt in g.dtypes:
                    if dtypes is not None and dt not in dtypes:
                        continue
                    for opt in g.options:
                        yield Point(op, shape, dt, dict(opt), g.modes, g.impls)


def matches(impl: registry.Implementation, pattern: str) -> bool:
    """fnmatch of ``pattern`` against the name, or against ``side/name`` when it holds a ``/``
    (``python/layernorm`` picks the Python entry of a name both sides have)."""
    target = f"{impl.side}/{impl.name}" if "/" in pattern else impl.name
    return fnmatch.fnmatchcase(target, pattern)


def select(impls: Sequence[registry.Implementation], patterns: Sequence[str] | None):
    """Implementations matching one of the ``patterns`` (see :func:`matches`; all if None)."""
    if patterns is None:
        return list(impls)
    return [i for i in impls if any(matches(i, p) for p in patterns)]
