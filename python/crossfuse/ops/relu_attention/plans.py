"""Launching the attention's kernels: stages that fit the GPU, and launch plans replayed by later calls.

``_launch`` is the one place a kernel is launched: through Triton's dispatch the first time, straight
into the compiled kernel afterwards (:mod:`.._runtime.direct`). A launcher's call records its launches
(``record``); :func:`_planned` keeps them as a plan under everything the launcher's decisions read, and a
later call with the same key replays the plan on its own tensors (:func:`_replay`) without deciding again.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import torch
from triton.runtime.errors import OutOfResources

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton before 3.4: the pointer kernels only
    TensorDescriptor = None

from .._runtime import direct as _direct

# (kernel, device, dtype, D, config) -> the pipeline stages that fit that GPU's shared memory, where fewer
# than the config's (see _launch)
_STAGES_THAT_FIT: dict[tuple, int] = {}


def _launch(kernel, grid, key: tuple, *args, **options) -> None:
    """``kernel[grid](*args, **options)``. The tables were tuned on an H200 (227 KB of shared memory per
    program; a D=128 backward step takes up to 192 KB); on a GPU with less, Triton refuses a launch whose
    stages do not fit (``OutOfResources``, before anything runs), so the launch is retried with one stage
    fewer, down to one, and the stages that fit are remembered under ``(kernel, *key)``. A launch Triton
    has compiled before goes straight to the compiled kernel (:mod:`._runtime.direct`)."""
    direct = _direct.key(kernel, args, options)  # the compiled kernel, launched again without dispatch
    record(direct, grid, args)
    if direct is not None and _direct.launch(direct, grid, args):
        return
    slot = (kernel, *key)
    asked = dict(options)
    stages = _STAGES_THAT_FIT.get(slot, options.pop("num_stages"))
    while True:
        try:
            compiled = kernel[grid](*args, num_stages=stages, **options)
            _direct.remember(direct, kernel, args, asked, compiled)
            return
        except OutOfResources as exc:
            if exc.name != "shared memory" or stages <= 1:
                raise
            stages -= 1
            _STAGES_THAT_FIT[slot] = stages


# Launch plans. A call of a launcher decides its kernels, tiles, grids and arguments from
# its tensors' shapes, strides, dtypes and alignment, its flags and tiles; at the shapes where the host
# sets the pace (16x32x1024x64 causal: about 0.65 ms of GPU work for a forward+backward) those decisions
# and the launch keys cost as much host time as the launches. A call records its launches (_launch);
# where they went straight into compiled kernels (:mod:`.._runtime.direct`) and took no tensor but the
# call's own, they are kept under everything the decisions read, and a later call with the same key
# builds the descriptors over its own tensors and makes the same launches.
MAX_PLANS = 1024  # plans kept at most (ints and floats are part of their keys: a table that starts afresh)
_PLANS: dict[tuple, Plan] = {}
_RECORDING = threading.local()


class _Tensor(NamedTuple):
    """In a plan's arguments: the call's tensor ``index`` itself (or, past the call's tensors, a view of a
    scratch buffer: :class:`Plan`), or the base of a tensor descriptor the plan's launcher makes over it
    (see ``descs`` of :func:`.._runtime.direct.launcher`)."""

    index: int


class Step(NamedTuple):
    """What a plan's launch is made of, for the compiled eager path (``.._runtime.native.program``): the
    compiled kernel, the values of its parameters after the positional ones, the grid, and the
    descriptors' specs (``{position: spec}``, as :func:`.._runtime.direct.launcher` takes them)."""

    compiled: object
    tail: tuple
    grid: tuple
    descs: dict | None


class Plan(NamedTuple):
    """A call's launches, made again on another call's tensors (:func:`_replay`).

    ``launches``: ``(launcher, template, places, step)`` per launch (see :func:`_make_plan`, :class:`Step`).
    ``scratch``: ``(shape, dtype, device)`` of each buffer the launchers allocated and wrote during the call
    (float32's copies, :func:`scratch`): a replay allocates its own, as the call did, and drops them once its
    launches are queued (the stream orders their reuse). ``views``: ``(buffer, size, stride, offset)`` of each
    tensor over those buffers that a launch took; ``_Tensor(len(call's tensors) + i)`` names view
    ``i``."""

    launches: tuple
    scratch: tuple = ()
    views: tuple = ()


def scratch(buffer: torch.Tensor) -> None:
    """Where a launch plan is in the making on this thread, note a buffer the launcher just allocated for
    the call alone (its launches write it before they read it): a plan allocates it afresh on replay."""
    buffers = getattr(_RECORDING, "scratch", None)
    if buffers is not None:
        buffers.append(buffer)


def record(slot: tuple | None, grid, args: tuple) -> None:
    """Where a launch plan is in the making on this thread (_planned), note a launch: its compiled kernel's
    slot (``None`` for one that cannot be replayed), grid and arguments."""
    launches = getattr(_RECORDING, "launches", None)
    if launches is not None:
        launches.append((slot, grid, args))


def _plan_key(kind: str, tensors: tuple, *decided) -> tuple | None:
    """The key of a launcher's call on ``tensors``: ``kind``, what else decides it (flags, scales, tiles,
    the caller's :class:`.config.Choices`), each tensor's shape, strides, dtype and 16-byte alignment, and
    what selects the compiled kernels (``_direct.state``); ``None`` where launches go through Triton's
    dispatch."""
    now = _direct.state()
    if now is None:
        return None
    return (kind, now, *decided, *[(t.shape, t.stride(), t.dtype, t.data_ptr() % 16 == 0) for t in tensors])


def _replay(plan: Plan, tensors: tuple) -> None:
    """Make the launches of ``plan`` on ``tensors``. Each launch's arguments are its template with the
    call's tensors (and views of the plan's scratch buffers, allocated here) at the places the plan names:
    a few items, not every argument, are looked at; each launch goes to the compiled kernel's launcher the
    plan keeps, which makes the descriptors over them."""
    if plan.scratch:
        buffers = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype, device in plan.scratch]
        tensors = (*tensors, *[buffers[j].as_strided(*view) for j, *view in plan.views])
    for go, template, places, _ in plan.launches:
        go(*_filled(template, places, tensors))


def _filled(template: tuple, places: tuple, tensors: tuple) -> list:
    """A launch's arguments: its template with the call's tensors at their places."""
    args = list(template)
    for i, index in places:
        args[i] = tensors[index]
    return args


def steps(plan: Plan, tensors: tuple) -> tuple[list, tuple]:
    """``([(step, args)], buffers)``: each launch of ``plan`` on ``tensors`` as a :class:`Step` and its
    positional arguments (descriptors given by their bases), what the compiled eager path records, and the
    plan's scratch buffers allocated for them (the arguments' views over them lie in them; the C++ module
    allocates such buffers per call, as :func:`_replay` does)."""
    buffers = tuple(torch.empty(shape, dtype=dtype, device=device) for shape, dtype, device in plan.scratch)
    tensors = (*tensors, *[buffers[j].as_strided(*view) for j, *view in plan.views])
    calls = [(step, tuple(_filled(template, places, tensors))) for _, template, places, step in plan.launches]
    return calls, buffers


def _make_plan(launches: list, tensors: tuple, buffers: tuple = ()) -> Plan | None:
    """A plan from the recorded ``launches`` of a call on ``tensors``: per launch ``(launcher, template,
    places, step)`` (the compiled kernel's :func:`.._runtime.direct.launcher`; :class:`Step`), the template's
    arguments with the call's tensors (or descriptors' bases) as :class:`_Tensor` items, whose places
    ``(position, index)`` are listed. A tensor over one of ``buffers`` (the call's scratch, :func:`scratch`)
    becomes a view the replay makes over its own buffer. ``None`` where one of the launches had no key or took
    a tensor that is neither one of ``tensors`` nor over a buffer (float32's copies beyond a grid's limit,
    made by torch), or where one tensor was given twice (its places could not be told apart: another call
    may pass two tensors there)."""
    if len({id(t) for t in tensors}) < len(tensors):
        return None
    views: list[tuple] = []

    def over_buffer(t: torch.Tensor) -> int | None:
        """The index of ``t`` as a view of one of ``buffers``, or None where it is over none of them."""
        at = t.untyped_storage().data_ptr()
        j = next((j for j, b in enumerate(buffers) if b.untyped_storage().data_ptr() == at), None)
        if j is None:
            return None
        view = (j, tuple(t.shape), t.stride(), t.storage_offset())
        if view not in views:
            views.append(view)
        return len(tensors) + views.index(view)

    plan = []
    for slot, grid, args in launches:
        hit = _direct.kept(slot) if slot is not None else None
        if hit is None or type(grid) is not tuple:
            return None
        template, places, descs = [], [], {}
        for i, a in enumerate(args):  # (a None argument is a value like any other: only a tensor not found
            if type(a) is _direct.GluonDescriptor:  # is refused) a Gluon descriptor: over a view of one
                index = _viewed(a.base, tensors)
                if index is None:
                    index = over_buffer(a.base)
                if index is None:
                    return None
                descs[i] = (list(a.shape), list(a.strides), list(a.block_shape), a.layout)
            elif type(a) is TensorDescriptor or isinstance(a, torch.Tensor):
                base = a.base if type(a) is TensorDescriptor else a
                index = next((j for j, t in enumerate(tensors) if t is base), None)
                if index is None:
                    index = over_buffer(base)
                if index is None:
                    return None
                if base is not a:
                    descs[i] = (list(a.shape), list(a.strides), list(a.block_shape))
            else:
                template.append(a)
                continue
            places.append((i, index))
            template.append(_Tensor(index))
        go = _direct.launcher(hit[0], grid, hit[1], slot[1], descs or None)
        plan.append((go, tuple(template), tuple(places), Step(hit[0], hit[1], grid, descs or None)))
    if not plan:
        return None
    return Plan(tuple(plan), tuple((tuple(b.shape), b.dtype, b.device) for b in buffers), tuple(views))


def _viewed(view: torch.Tensor, tensors: tuple) -> int | None:
    """The index of the one tensor of ``tensors`` whose memory ``view`` starts at (the Gluon kernels' row
    views: a descriptor needs only the address of its base, the plan fixes its shape and strides), or
    ``None`` where none or several do (views of one memory: their places could not be told apart)."""
    ptr = view.data_ptr()
    found = [j for j, t in enumerate(tensors) if t.data_ptr() == ptr]
    return found[0] if len(found) == 1 else None


def _planned(key: tuple | None, tensors: tuple, launch, *args) -> Plan | None:
    """``launch(*tensors, *args)``, or the plan kept under ``key`` from an earlier call; returns the plan
    that now stands for such calls (``None`` where there is none)."""
    if key is None:
        launch(*tensors, *args)
        return None
    plan = _PLANS.get(key)
    if plan is not None:
        _replay(plan, tensors)
        return plan
    _RECORDING.launches, _RECORDING.scratch = launches, buffers = [], []
    try:
        launch(*tensors, *args)
    finally:
        _RECORDING.launches = _RECORDING.scratch = None
    plan = _make_plan(launches, tensors, tuple(buffers))
    if plan is not None:
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def clear_plans() -> None:
    """Forget every launch plan (tests that count the launches a call decides)."""
    _PLANS.clear()


# CUDA's limit on a grid's second axis, where every attention kernel puts the (batch, head) pairs
