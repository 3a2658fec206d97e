"""The ops' compiled eager path: building the C++ module (``csrc/fastpath.cpp`` and its headers) and
recording the programs it runs (the layer norm's and the ReLU attention's).

A Python ``autograd.Function`` and the Python around its launches cost more host time per call than
torch's whole C++ operator. Once a call's plans launch straight to their compiled kernels, the plan is
run once more with its launches recorded (:func:`recorded`; the attention's plans list theirs, see
``relu_attention.plans.steps``); :func:`program` turns the record into a program of the C++ module: per
launch the kernel's function handle, grid, block, shared memory and each argument as a constant, an
address within one of the call's tensors (a slot), or a tensor descriptor's map over one (kept per
address by the module, encoded by Triton on a miss: :func:`_map_args`). The C++ module then makes such
calls itself: its key look-up, allocations, autograd node and ``cuLaunchKernelEx``.

It is built once per source, torch, Python and Triton, by the C++ compiler Triton itself needs on this
machine, into crossfuse's cache (``CROSSFUSE_CACHE_DIR``, else ``~/.cache/crossfuse``); where it cannot
be built (no compiler, no headers) every call stays on the Python path, and :func:`problem` says why.
Only with the Triton versions whose launcher it mirrors (``direct.RAW_LAUNCH``) and where launches go
straight to their kernels (``CROSSFUSE_DIRECT_LAUNCH`` not 0). The compiled path calls none of Triton's
launch hooks: programs are recorded only while no hook is set (:func:`hooks_quiet`), and a key recorded
before a hook was set keeps its program (``crossfuse.ops.layer_norm.clear_plans()`` and
``crossfuse.ops.relu_attention.clear_eager()`` forget them).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import torch
import triton

from ..._backend import triton_version
from . import direct

SOURCE = Path(__file__).with_name("csrc") / "fastpath.cpp"  # with the headers beside it (programs.h, ...)
NAME = "crossfuse_fastpath"

# the C++ module's argument kinds (programs.h's Kind), by Triton's signature type; MAP: a tensor map
PTR, I32, I64, F32, F64, I8, U32, U64, MAP = range(9)
MAP_BYTES = 128  # a CUtensorMap
_SCALARS = {"i32": I32, "i64": I64, "u32": U32, "u64": U64, "fp32": F32, "f32": F32, "fp64": F64, "i8": I8}
MAX_SHARED = 228 * 1024  # above it Triton's launcher adds an attribute the C++ module does not

_lock = threading.Lock()
_state: dict = {}  # "module" once loaded, or "problem": why it cannot be


def cache_dir() -> Path:
    """Where the built module is kept."""
    root = os.environ.get("CROSSFUSE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                 "crossfuse")  # fmt: skip
    return Path(root) / "native"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        path = shutil.which(name) if name else None
        if path:
            return path
    return None


def _cuda_include() -> str | None:
    """The directory of ``cuda.h``: the one Triton ships for its own launcher."""
    d = Path(triton.__file__).parent / "backends" / "nvidia" / "include"
    return str(d) if (d / "cuda.h").exists() else None


def _command(cxx: str, out: Path) -> list[str]:
    from torch.utils import cpp_extension

    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"], _cuda_include()]
    libs = cpp_extension.library_paths()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *(f"-I{d}" for d in includes), str(SOURCE), "-o", str(out),
        *(f"-L{d}" for d in libs), *(f"-Wl,-rpath,{d}" for d in libs),
        "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-ldl",
    ]  # fmt: skip


def _tag() -> str:
    h = hashlib.sha256()
    for path in sorted(SOURCE.parent.iterdir()):  # the module and the headers it includes
        if path.suffix in (".cpp", ".h"):
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    h.update(f"{torch.__version__} {sys.version} {triton_version()} {sysconfig.get_platform()}".encode())
    return h.hexdigest()[:20]


def missing() -> str | None:
    """What the build needs and this machine lacks (a C++ compiler, Python's headers, Triton's cuda.h), or
    ``None``."""
    if _compiler() is None:
        return "no C++ compiler (c++, g++ or clang++; or CXX) was found"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        return f"Python's headers (Python.h) are not in {sysconfig.get_paths()['include']}"
    if _cuda_include() is None:
        return "Triton's cuda.h was not found"
    return None


def build(verbose: bool = True) -> Path:
    """The built module's path, building it first where it is not in the cache (one process builds, the
    others wait for it). Raises RuntimeError where the machine lacks what it needs (:func:`missing`) or
    with the compiler's output where compiling fails."""
    lacking = missing()
    if lacking is not None:
        raise RuntimeError(lacking)
    cxx = _compiler()
    where = cache_dir() / _tag()
    so = where / (NAME + importlib.machinery.EXTENSION_SUFFIXES[0])
    if so.exists():
        return so
    where.mkdir(parents=True, exist_ok=True)
    with open(where / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if so.exists():  # another process built it meanwhile
            return so
        if verbose:
            print(f"crossfuse: compiling its C++ eager path once (about a minute) into {where}",
                  file=sys.stderr)  # fmt: skip
        tmp = where / f"{NAME}.{os.getpid()}.tmp.so"
        done = subprocess.run(_command(cxx, tmp), capture_output=True, text=True)
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"compiling {SOURCE.name} failed:\n{done.stderr[-4000:]}")
        os.replace(tmp, so)  # whole or not at all
    return so


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(NAME, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def usable_here() -> str | None:
    """Why the compiled path cannot serve calls in this process, or ``None`` where it can."""
    if not direct.available():
        return "direct launches are off (CROSSFUSE_DIRECT_LAUNCH=0, ROCm or an unsupported Triton)"
    if triton_version() not in direct.RAW_LAUNCH:
        return f"Triton {'.'.join(map(str, triton_version()))}'s launcher was not read for it"
    return None


def hooks_quiet() -> bool:
    """Whether Triton's launch hooks call nothing (their default), so that a recorded program, which calls
    none, launches as the Python path would."""
    hooks = triton.knobs.runtime
    return direct._quiet(hooks.launch_enter_hook) and direct._quiet(hooks.launch_exit_hook)


def module():
    """The C++ module, built and loaded on first use; ``None`` where it cannot be (see :func:`problem`)."""
    got = _state.get("module")
    if got is not None or "problem" in _state:
        return got
    with _lock:
        if "module" in _state or "problem" in _state:
            return _state.get("module")
        why = usable_here()
        if why is None:
            try:
                _state["module"] = _load(build())
                return _state["module"]
            except Exception as err:  # any failure: the Python path, and the reason kept
                why = str(err)
        _state["problem"] = why
        return None


def compiled_autograd() -> bool:
    """Whether torch's compiled autograd is on (its module is imported once it can be): it cannot trace
    the compiled path's C++ nodes (no ``compiled_args``), so calls take the Python path meanwhile."""
    ca = sys.modules.get("torch._dynamo.compiled_autograd")
    return ca is not None and bool(ca.compiled_autograd_enabled)


def loaded() -> dict:
    """The module's state: ``"module"`` once loaded (read on every call: a dictionary look-up)."""
    return _state


def clear(op: str = "layer_norm") -> None:
    """Forget every registered program of ``op`` (``"layer_norm"`` or ``"relu_attention"``): its next calls
    take the Python path, whose entries must be forgotten too to record them again."""
    fast = _state.get("module")
    if fast is not None and op == "layer_norm":
        fast.clear()
    elif fast is not None:
        fast.clear_attention()


def problem() -> str | None:
    """Why the compiled path is not in use (after :func:`module` was asked), else ``None``."""
    return _state.get("problem")


# ----------------------------------------------------------------------------------------------------
# recording
# ----------------------------------------------------------------------------------------------------


_recording = threading.Lock()


def recorded(launches, run):
    """``(run(), calls)``: ``calls`` the ``(launch, args)`` of every call of ``launches`` (each a
    :class:`crossfuse.ops.layer_norm.plan.Launch` that launches straight to its kernel) that ``run`` made
    in this thread; another thread's launches through them meanwhile are made, not recorded. One
    recording at a time, so that each puts back the launchers it found."""
    calls = []
    me = threading.get_ident()
    with _recording:
        kept = [(launch, launch.go) for launch in launches]

        def recorder(launch, go):
            def call(*args):
                if threading.get_ident() == me:
                    calls.append((launch, args))
                go(*args)

            return call

        try:
            for launch, go in kept:
                launch.go = recorder(launch, go)
            out = run()
        finally:
            for launch, go in kept:
                launch.go = go
    return out, calls


def _slot(address: int, slots: list) -> tuple[int, int] | None:
    """``(slot, byte offset)`` of the slot tensor whose bytes hold ``address``; ``None`` where none does.
    Where several slots' bytes hold it, the one slot that starts there: q, k and v as views of one fused
    projection overlap, and a kernel is given each view's own start. ``None`` where no slot or two start
    there (one tensor as weight and bias, say: a later call of the key may pass two, and the program could
    not tell which one the kernel was given)."""
    holding = []
    for i, t in enumerate(slots):
        if t is None:
            continue
        base = t.data_ptr()
        if base <= address < base + max(1, t.numel() * t.element_size()):
            holding.append((i, address - base))
    if len(holding) == 1:
        return holding[0]
    starting = [at for at in holding if at[1] == 0]
    return starting[0] if len(starting) == 1 else None


def _extra_params(run) -> int:
    """The pointers Triton's launcher passes after the kernel's own arguments: its global scratch and,
    where it has one, its profile scratch (both null here: only kernels that ask for neither)."""
    return int(hasattr(run, "global_scratch_size")) + int(hasattr(run, "profile_scratch_size"))


def map_bytes(obj) -> bytes | None:
    """The 128 bytes of the tensor map Triton's ``make_tensordesc_arg`` made (the first item it returns):
    through ``tma_desc_cpu_ptr`` where the object has it, else from Triton's ``PyCUtensorMap``, whose map is
    its last member (``{PyObject_HEAD; aligned CUtensorMap tensorMap;}``: the map ends where the object
    does); ``None`` for another object."""
    cpu_ptr = getattr(obj, "tma_desc_cpu_ptr", None)
    if callable(cpu_ptr):
        address = cpu_ptr()
    elif "tensormap" in type(obj).__name__.lower() and type(obj).__basicsize__ >= 16 + MAP_BYTES:
        address = id(obj) + type(obj).__basicsize__ - MAP_BYTES
    else:
        return None
    return ctypes.string_at(address, MAP_BYTES) if address else None


def expanded(signature: list, metas: list) -> list:
    """The types Triton's launcher passes for each of ``signature``'s tensor descriptors, each lowered to a
    tensor map (``metas``' entries not None): the map, then the shape as i32 and the strides as i64 per
    dim; the rule of Triton's own ``expand_signature``, for the versions whose driver module keeps it
    inside its launcher's builder."""
    out = []
    for ty in signature:
        found = re.match(r"tensordesc<([^[>]*)\[([^]]*)\]", ty)
        if found is None:
            out.append(ty)
            continue
        ndim = found.group(2).count(",") + 1
        out += ["nvTmaDesc", *["i32"] * ndim, *["i64"] * ndim]
    return out


def _at_offset(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A view of ``t``'s memory starting ``offset`` bytes into it (a descriptor reads only its base's
    address: the program fixes its shape, strides and box)."""
    if not offset:
        return t
    return t.as_strided((1,), (1,), t.storage_offset() + offset // t.element_size())


def _map_args(launch, position: int, value, ty: str, slots: list) -> list | None:
    """The packed arguments of the tensor descriptor at ``position`` of ``launch``, whose base is
    ``value``: its tensor map (the C++ module keeps one per address and calls the encoder returned here on
    a miss: Triton's own encoding), then its shape and strides as Triton's launcher expands them, as
    constants. ``None`` where the launcher's handling is not the one read (see
    ``direct.tensordesc_handling``) or the map's bytes cannot be read back: the same address must give the
    same bytes, another address others."""
    handling = direct.tensordesc_handling(getattr(launch.compiled.run, "launch", None))
    if handling is None or not isinstance(value, torch.Tensor):
        return None
    _, indices, metas, make, expand = handling
    if position not in indices or len(metas) != len(indices):
        return None
    meta, spec = metas[sorted(indices).index(position)], launch.descs[position]
    at = _slot(value.data_ptr(), slots)
    if meta is None or at is None:
        return None

    def parts(t):
        return make(direct.build_descriptor(t, spec), meta)

    def encode(t: torch.Tensor, offset: int) -> bytes:
        return map_bytes(parts(_at_offset(t, offset))[0])

    try:
        got, types = parts(value), (expand or expanded)([ty], [meta])
        first = map_bytes(got[0])
        other = map_bytes(parts(_at_offset(value, 16))[0])
        again = encode(slots[at[0]], at[1])
    except Exception:  # whatever Triton refuses: no program
        return None
    if len(got) != len(types) or types[0] != "nvTmaDesc" or first is None or other == first or again != first:
        return None
    packed = [(MAP, at[0], at[1], 0.0, encode)]
    for t, v in zip(types[1:], got[1:], strict=True):
        if _SCALARS.get(t) not in (I32, I64) or type(v) is not int:
            return None
        packed.append((_SCALARS[t], -1, v, 0.0))
    return packed


def _zeroing(args: tuple, slots: list) -> tuple | None:
    """``(slot, byte offset, bytes)`` of a recorded zeroing of ``args``' one contiguous tensor, where its
    bytes lie within one slot's; else ``None``."""
    if len(args) != 1 or not isinstance(args[0], torch.Tensor) or not args[0].is_contiguous():
        return None
    view = args[0]
    size = view.numel() * view.element_size()
    at = _slot(view.data_ptr(), slots)
    if at is None or size == 0:
        return None
    whole = slots[at[0]]
    return (*at, size) if at[1] + size <= whole.numel() * whole.element_size() else None


def program(calls: list, slots: list) -> list | None:
    """The C++ module's program of recorded ``calls`` (see :func:`recorded`; a launch given as anything with
    the attributes ``compiled``, ``tail``, ``grid`` and ``descs`` of :class:`crossfuse.ops.layer_norm.plan.
    Launch`), every pointer argument an address within one of ``slots`` (tensors, or None), every tensor
    descriptor's base too (:func:`_map_args`); ``None`` where a launch cannot be made there: a kernel that
    asks for scratch memory, clusters, an argument type the module does not pack, a descriptor whose map
    cannot be kept, or an address outside the slots. A recorded zeroing (a step with ``zeroes``, see
    :class:`crossfuse.ops.layer_norm.plan.Zeroing`) becomes ``(slot, byte offset, bytes)``, which the
    module zeroes in stream order."""
    out = []
    for launch, args in calls:
        if getattr(launch, "zeroes", False):  # a zeroing of contiguous bytes within one slot
            zero = _zeroing(args, slots)
            if zero is None:
                return None
            out.append(zero)
            continue
        compiled, tail, descs = getattr(launch, "compiled", None), getattr(launch, "tail", None), getattr(
            launch, "descs", None)  # fmt: skip
        if compiled is None:
            return None
        run, meta = compiled.run, compiled.metadata
        if getattr(run, "global_scratch_size", 0) or getattr(run, "profile_scratch_size", 0):
            return None
        if getattr(meta, "num_ctas", 1) != 1 or meta.shared > MAX_SHARED:
            return None
        values = (*args, *tail)
        types = list(compiled.src.signature.values())
        if len(types) != len(values):
            return None
        packed = []
        for i, (ty, v) in enumerate(zip(types, values, strict=True)):
            if ty == "constexpr":
                continue
            if descs and i in descs:
                maps = _map_args(launch, i, v, ty, slots)
                if maps is None:
                    return None
                packed += maps
            elif ty.startswith("*"):
                address = v.data_ptr() if isinstance(v, torch.Tensor) else v
                if type(address) is not int:
                    return None
                at = _slot(address, slots)
                if at is None:
                    return None
                packed.append((PTR, at[0], at[1], 0.0))
            elif ty in _SCALARS and type(v) in (int, float, bool):
                kind = _SCALARS[ty]
                packed.append((kind, -1, 0, float(v)) if kind in (F32, F64) else (kind, -1, int(v), 0.0))
            else:
                return None
        packed += [(PTR, -1, 0, 0.0)] * _extra_params(run)
        grid = (*launch.grid, 1, 1)[:3]
        pdl, coop = getattr(run, "launch_pdl", False), getattr(run, "launch_cooperative_grid", False)
        block = 32 * meta.num_warps
        out.append((compiled.function, *grid, block, meta.shared, bool(pdl), bool(coop), packed))
    return out
