"""Launching a kernel Triton has already compiled, without going through Triton's dispatch again.

``kernel[grid](*args, **kwargs)`` (``JITFunction.run``) binds and specializes every argument, builds the
cache key of the compiled kernel, looks it up and checks the kernel's globals before it calls the
compiled kernel's launcher. On the H200 machine's host that dispatch cost 22-28 µs per launch of the
attention kernels, more than the launch that follows it (19-25 µs, the tensor descriptors' encoding
included): at shapes where the host sets the pace, half the
attention's host time.

:func:`key` names a launch by the kernel, its keyword arguments (constexprs and options, each by type and
value; a keyword value of another type, a tensor say, gives no key) and a key of its positional arguments
that is at least as fine as Triton's specialization of them (``python/src/specialize.cc``): ints, floats,
bools and ``None`` by type and value (Triton: floats as fp32, ints as a constant 1, by range and by
divisibility by 16, constexprs by value), tensors by dtype and 16-byte alignment of their data, tensor
descriptors by their base's dtype and block shape (Gluon's also by their shared-memory layout; their
base, shape and strides are passed at run time); anything else gives no key. :func:`remember` keeps the
compiled kernel that Triton's dispatch returned for that key; :func:`launch` then makes the call
``JITFunction.run`` ends with (``launch_metadata``, then the launcher with Triton's launch hooks and
every bound argument, constexprs included) for the current device and stream, through a :func:`launcher`
kept per key and grid, which a caller may also keep itself (the plans do) and which skips what does
nothing while no launch hook is set. Triton's ``debug`` and ``instrumentation_mode`` knobs (and 3.9's
``fpsan_homomorphic_casts``), the current device and the key select the compiled kernel, as they select
it in Triton's cache; with 3.9's ``add_stages_inspection_hook`` set there is no key.

Only with the Triton versions whose dispatch was read for this (3.6 to 3.9: the same launch call), on
CUDA (not ROCm, whose backend also specializes tensors by size), for Triton's and Gluon's JIT functions
(not the interpreter's), not for kernels with pre-run hooks, not for callable grids, and not with
``CROSSFUSE_DIRECT_LAUNCH=0`` (which also turns off :func:`descriptor`'s shortcut); otherwise every
launch goes through Triton's dispatch.
"""

from __future__ import annotations

import inspect

import torch
import triton

from ..._backend import switched_off, triton_version
from .device import bind_cuda_context

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton before 3.4
    TensorDescriptor = None
try:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
except ImportError:  # a Triton without Gluon
    GluonDescriptor = None

# the JIT functions whose launches may skip Triton's dispatch (the interpreter's are of another type)
_JIT_TYPES = ("JITFunction", "GluonJITFunction")

SUPPORTED = ((3, 6), (3, 9))  # the Triton versions (major, minor) whose JITFunction.run this mirrors


def _switched_off() -> bool:
    return switched_off("CROSSFUSE_DIRECT_LAUNCH")


def available() -> bool:
    """Whether launches may skip Triton's dispatch here (see the module docstring): not on ROCm, whose
    backend also specializes tensors on their size (2 GB), which the keys do not hold."""
    lo, hi = SUPPORTED
    return not _switched_off() and torch.version.hip is None and lo <= triton_version() <= hi


_ENABLED = available()
_OPTION_TYPES = (int, float, bool, str, type(None))  # keyword values keyed here: constexprs and options

MAX_REMEMBERED = 4096  # keys kept at most (each a few hundred bytes; Triton keeps the kernels themselves)

# key -> (compiled kernel, the bound values of the parameters after the positional ones, {grid: its
# launcher(...)})
_COMPILED: dict[tuple, tuple] = {}


def _arg_key(a):
    t = type(a)
    if t is int or a is None:
        return a
    if t is bool:  # not by value alone: True == 1 in a tuple, and Triton takes them apart (u1, constexpr 1)
        return bool, a
    if t is float:  # Triton takes a float as fp32, or by value where its parameter is a constexpr
        return float, a
    if t is TensorDescriptor:
        return a.base.dtype, tuple(a.block_shape)
    if t is GluonDescriptor:  # Triton's key of one holds its shared-memory layout too
        tf32 = vars(a).get("round_f32_to_tf32")
        return t, a.base.dtype, tuple(a.block_shape), repr(a.layout), a.padding, tf32
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    raise TypeError


def arg_keys(args: tuple) -> tuple | None:
    """The positional arguments' part of a key (see the module docstring), or ``None`` when one of them
    is of a type this does not know."""
    try:
        return tuple(map(_arg_key, args))
    except TypeError:
        return None


def option_keys(options: dict) -> tuple | None:
    """The keyword arguments' part of a key: each by name, type and value (1, 1.0 and True are three
    kernels to Triton), or ``None`` for a value of another type (a tensor given by keyword, say)."""
    opts = []
    for name, value in options.items():
        if type(value) not in _OPTION_TYPES:
            return None
        opts.append((name, type(value), value))
    return tuple(opts)


def key(kernel, args: tuple, options: dict) -> tuple | None:
    """The key of launching ``kernel(*args, **options)``, or ``None`` when it must go through Triton's
    dispatch (see the module docstring)."""
    if not _ENABLED or type(kernel).__name__ not in _JIT_TYPES or kernel.pre_run_hooks:
        return None  # (the interpreter's kernels are InterpretedFunction's)
    keys = arg_keys(args)
    if keys is None:
        return None
    opts = option_keys(options)
    if opts is None:
        return None
    now = state()
    if now is None:
        return None
    return (kernel, *now, keys, opts)


# knobs of the Triton versions that have them (3.9), found once: asking an object for an attribute it
# lacks raises inside getattr, which costs host time on every call
def _has_knob(group, name: str) -> bool:
    """Whether a group of Triton's knobs defines ``name`` (on its class: a knob read from the environment
    is a descriptor there)."""
    return any(name in vars(c) for c in type(group).__mro__)


_STAGES_HOOK = _has_knob(triton.knobs.runtime, "add_stages_inspection_hook")
_FPSAN = _has_knob(triton.knobs.compilation, "fpsan_homomorphic_casts")
# the current CUDA device as Triton's CUDA driver reads it (torch.cuda.current_device), without the
# Python around it (its lazy initialisation: a launch's tensors are on CUDA, so CUDA is initialised)
_cuda_device = getattr(torch._C, "_cuda_getDevice", None)


def state() -> tuple | None:
    """What, besides the kernel and its arguments, selects the compiled kernel in Triton's cache: the
    current device and Triton's ``debug``, ``instrumentation_mode`` (and 3.9's ``fpsan_homomorphic_casts``)
    knobs; ``None`` where launches must go through Triton's dispatch (direct launches off, or 3.9's
    ``add_stages_inspection_hook`` set)."""
    if not _ENABLED:
        return None
    knobs = triton.knobs
    runtime, compilation = knobs.runtime, knobs.compilation
    if _STAGES_HOOK and runtime.add_stages_inspection_hook is not None:  # 3.9: part of its key
        return None
    device = _cuda_device() if _cuda_device is not None else triton.runtime.driver.active.get_current_device()
    return (device, runtime.debug, compilation.instrumentation_mode,
            compilation.fpsan_homomorphic_casts if _FPSAN else None)  # fmt: skip


def launch(slot: tuple, grid: tuple, args: tuple) -> bool:
    """Launch the kernel remembered under ``slot`` on ``grid`` with ``args``; False when there is none."""
    hit = _COMPILED.get(slot)
    if hit is None or type(grid) is not tuple:  # a callable grid: Triton's dispatch evaluates it
        return False
    go = hit[2].get(grid)
    if go is None:
        go = hit[2][grid] = launcher(hit[0], grid, hit[1], slot[1])
    go(*args)
    return True


def kept(slot: tuple) -> tuple | None:
    """``(compiled kernel, the bound values after the positional arguments)`` kept under ``slot``."""
    hit = _COMPILED.get(slot)
    return None if hit is None else hit[:2]


def run(kernel, grid, args: tuple, options: dict) -> tuple | None:
    """``kernel[grid](*args, **options)``: straight into the compiled kernel where it was launched with this
    key before, else through Triton's dispatch (remembering what it compiled). Returns the launch's key
    (:func:`key`; ``None`` where it has none), for a caller that records it."""
    slot = key(kernel, args, options)
    if slot is None or not launch(slot, grid, args):
        remember(slot, kernel, args, options, kernel[grid](*args, **options))
    return slot


try:
    from triton.knobs import HookChain
except ImportError:  # Triton before knobs' hook chains: a hook is a function or None
    HookChain = None

# the Triton versions (major, minor) whose compiled-kernel launcher (CudaLauncher: its ``launch``, the C
# function, and what its __call__ adds before calling it) was read for :func:`launcher`
RAW_LAUNCH = ((3, 6),)


def _quiet(hook) -> bool:
    """Whether a launch hook of Triton's knobs calls nothing: unset, or an empty chain (the default)."""
    return hook is None or (type(hook) is HookChain and not hook.calls)


def launcher(compiled, grid: tuple, tail: tuple, device: int, descs: dict | None = None):
    """``go(*args)``: launch ``compiled`` on ``grid`` with ``(*args, *tail)`` on the current stream of CUDA
    device ``device``, the call :func:`launch` makes, for a caller that keeps it (a plan's launch).

    While Triton's launch hooks call nothing (their default), it passes no hooks and builds no launch
    metadata (``launch_metadata``: a dictionary per launch that only the hooks read). With the Triton
    versions of RAW_LAUNCH it calls the C launcher itself where the kernel asks for no scratch memory (all
    ``CudaLauncher.__call__`` adds is that scratch). Pointer arguments may be tensors or their addresses
    (ints), as the C launcher takes either; an address skips the launcher's look-up of the pointer's
    device (``cuPointerGetAttribute``).

    ``descs`` (``{position: spec}``, see :func:`build_descriptor`): the positions of ``args`` where the
    kernel takes a tensor descriptor and the caller passes its base tensor, which a plan's launches may do
    (the plan fixes the descriptor's shape, strides and box). Where the C launcher can be reached beneath
    Triton's handling of descriptors (:func:`_beneath_descriptors`), the encoded tensor map of each base
    address is kept and passed again; else a :class:`TensorDescriptor` is built per call."""
    n = len(grid)
    gx, gy, gz = grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1
    run, function, meta = compiled.run, compiled.function, compiled.packed_metadata
    stream_of = triton.runtime.driver.active.get_current_stream
    hooks = triton.knobs.runtime
    raw = None
    if (
        triton_version() in RAW_LAUNCH
        and type(run).__name__ == "CudaLauncher"
        and getattr(run, "global_scratch_size", 1) == 0
        and getattr(run, "profile_scratch_size", 1) == 0
    ):
        raw, coop, pdl = run.launch, run.launch_cooperative_grid, run.launch_pdl
    beneath = _beneath_descriptors(raw, descs) if raw is not None and descs else None

    def slow(*args):
        """The launch with Triton's handling of descriptors (built here where ``descs``) and its hooks."""
        stream = stream_of(device)
        enter, leave = hooks.launch_enter_hook, hooks.launch_exit_hook
        if descs:
            args = with_descriptors(args, descs)
        values = (*args, *tail)
        if not (_quiet(enter) and _quiet(leave)):
            run(gx, gy, gz, stream, function, meta, compiled.launch_metadata(grid, stream, *values), enter,
                leave, *values)  # fmt: skip
        elif raw is not None:
            raw(gx, gy, gz, stream, function, coop, pdl, None, None, meta, None, None, None, *values)
        else:
            run(gx, gy, gz, stream, function, meta, None, None, None, *values)

    if beneath is None:
        return slow

    c_launch, slots = beneath
    after_stream = (function, coop, pdl, None, None, meta, None, None, None)  # C launch's fixed arguments

    def go(*args):
        if not (_quiet(hooks.launch_enter_hook) and _quiet(hooks.launch_exit_hook)):
            slow(*args)
            return
        parts = [gx, gy, gz, stream_of(device), *after_stream]
        at = 0
        for i, encode, known in slots:
            parts += args[at:i]
            t = args[i]
            encoded = known.get(t.data_ptr())
            parts += encoded if encoded is not None else encode(t)
            at = i + 1
        parts += args[at:]
        parts += tail
        c_launch(*parts)

    return go


def with_descriptors(args: tuple, descs: dict) -> tuple:
    """``args`` with a :class:`TensorDescriptor` over the tensor at each position of ``descs`` (see
    :func:`launcher`), the tensors' CUDA context made current first (see ``bind_cuda_context``)."""
    out = list(args)
    for i, spec in descs.items():
        out[i] = build_descriptor(out[i], spec)
    return tuple(out)


def build_descriptor(t: torch.Tensor, spec: tuple):
    """A descriptor over ``t`` of ``spec``: ``(shape, strides, block_shape)``, Triton's
    :class:`TensorDescriptor`, or ``(shape, strides, block_shape, layout)``, Gluon's with that shared-memory
    layout; ``t``'s CUDA context made current first (see ``bind_cuda_context``)."""
    bind_cuda_context(t)
    if len(spec) == 4:
        return GluonDescriptor(t, *spec)
    return descriptor(t, *spec)


MAX_ENCODED = 128  # tensor maps kept per descriptor argument of a plan's launch (addresses: then afresh)


def tensordesc_handling(raw) -> tuple | None:
    """``(C launcher, descriptor positions, their metadata, make_tensordesc_arg, expand_signature)`` of a
    compiled kernel's launch (``CudaLauncher.launch``) in RAW_LAUNCH's Triton versions, where it wraps the
    C launcher in Triton's handling of tensor descriptors (``wrap_handle_tensordesc``); else ``None``."""
    code, cells = getattr(raw, "__code__", None), getattr(raw, "__closure__", None)
    if code is None or not cells:
        return None
    found = dict(zip(code.co_freevars, (c.cell_contents for c in cells), strict=False))
    c_launch, indices, metas = found.get("launcher"), found.get("tensordesc_indices"), found.get(
        "tensordesc_meta")  # fmt: skip
    make, expand = raw.__globals__.get("make_tensordesc_arg"), raw.__globals__.get("expand_signature")
    if c_launch is None or make is None or not isinstance(indices, set) or not isinstance(metas, list):
        return None
    return c_launch, indices, metas, make, expand


def _beneath_descriptors(raw, descs: dict) -> tuple | None:
    """``(C launcher, slots)`` where the launch of RAW_LAUNCH's Triton versions can skip its handling of
    tensor descriptors, else ``None``. That handling (``wrap_handle_tensordesc``: Python around the C
    launcher) walks every argument and encodes each descriptor's tensor map (``cuTensorMapEncodeTiled``)
    on every launch. A slot ``(position, encode, known)`` per descriptor: ``known`` maps a base address to
    what Triton's ``make_tensordesc_arg`` gave for it (the tensor map, shape and strides), which depends
    on nothing else here (the plan fixes shape, strides, box and dtype), and ``encode(t)`` adds ``t``'s.
    Only where every descriptor is lowered to a tensor map (``make_tensordesc_arg`` then keeps no
    reference to the tensor) and the descriptor positions are exactly those of ``descs``."""
    handling = tensordesc_handling(raw)
    if handling is None:
        return None
    c_launch, indices, metas, make, _ = handling
    if sorted(indices) != sorted(descs) or len(metas) != len(indices) or any(m is None for m in metas):
        return None
    slots = []
    for k, i in enumerate(sorted(indices)):
        known: dict[int, list] = {}

        def encode(t, spec=descs[i], meta=metas[k], known=known):
            encoded = make(build_descriptor(t, spec), meta)
            if len(known) >= MAX_ENCODED:
                known.clear()
            known[t.data_ptr()] = encoded
            return encoded

        slots.append((i, encode, known))
    return c_launch, tuple(slots)


def remember(slot: tuple | None, kernel, args: tuple, options: dict, compiled) -> None:
    """Keep ``compiled`` (what ``kernel[grid](*args, **options)`` returned) under ``slot``."""
    if slot is None or type(compiled).__name__ != "CompiledKernel":
        return
    tail = []
    for p in kernel.params[len(args) :]:
        if p.name in options:
            tail.append(options[p.name])
        elif p.default is not inspect.Parameter.empty:
            tail.append(p.default)
        else:  # a parameter Triton's dispatch would have refused: never cached
            return
    if len(_COMPILED) >= MAX_REMEMBERED:  # ints are keyed by value: many shapes, many keys; start afresh
        _COMPILED.clear()
    _COMPILED[slot] = (compiled, tuple(tail), {})


def _descriptor_factory():
    """A maker of ``TensorDescriptor(base, shape, strides, block_shape)`` that skips the dataclass's checks
    (6.2 µs against 1.5 on the H200 machine's host), or ``None`` where its fields are not the
    ones this was written for. The caller has made those checks (16-byte aligned base and strides, unit
    last stride, positive shape, power-of-two block)."""
    import dataclasses

    if _switched_off() or TensorDescriptor is None or not dataclasses.is_dataclass(TensorDescriptor):
        return None
    fields = dataclasses.fields(TensorDescriptor)
    if [f.name for f in fields[:4]] != ["base", "shape", "strides", "block_shape"]:
        return None
    rest = {}
    for f in fields[4:]:  # padding ("zero"), and 3.9's round_f32_to_tf32: their defaults
        if f.default is dataclasses.MISSING:
            return None
        rest[f.name] = f.default
    new = object.__new__

    def make(base, shape, strides, block_shape):
        d = new(TensorDescriptor)
        d.__dict__.update(base=base, shape=shape, strides=strides, block_shape=block_shape, **rest)
        return d

    # the same object as the dataclass builds, field for field, or not used
    try:
        t = torch.zeros(2, 3, 8, 16)
        args = (t, list(t.shape), list(t.stride()), [1, 1, 8, 16])
        want, got = TensorDescriptor(*args), make(*args)
        same = (
            type(got) is TensorDescriptor
            and vars(got).keys() == vars(want).keys()
            and want.base is got.base
            and all(getattr(want, name) == getattr(got, name) for name in vars(want) if name != "base")
        )
    except Exception:  # any surprise: the dataclass's own constructor
        return None
    return make if same else None


_DESCRIPTOR = _descriptor_factory()


def descriptor(base: torch.Tensor, shape: list, strides: list, block_shape: list):
    """``TensorDescriptor(base, shape, strides, block_shape)``, without its checks where that was verified
    to build the same object (see :func:`_descriptor_factory`)."""
    if _DESCRIPTOR is None:
        return TensorDescriptor(base, shape, strides, block_shape)
    return _DESCRIPTOR(base, shape, strides, block_shape)


def clear() -> None:
    """Forget every remembered kernel (tests)."""
    _COMPILED.clear()
