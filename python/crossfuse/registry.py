"""The implementation registry: every implementation of every op, in one place.

Tests, ``crossfuse check`` and the benchmark harness iterate over :func:`implementations`; none keeps a
list of its own. An :class:`Op` says what an op computes (formula, inputs, float64 reference); an
:class:`Implementation` is one way to compute it, with one calling convention per op: ``fn(**inputs)``
where ``inputs`` is what :meth:`Op.make_inputs` returns.

Implementations from other packages (the Julia side, through ``crossfuse_julia``) arrive through the
entry-point group ``crossfuse.implementations``: each entry point is a callable ``register(registry)``
that calls :func:`register`. Plugins load lazily on the first query, so the core never imports them and
works without them. Importing this module imports neither Triton nor the kernels.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from . import _backend
from .reference import attention as _attn_ref
from .reference import norms as _norms

# ----------------------------------------------------------------------------------------------------
# Ops
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    name: str
    formula: str
    shape_names: tuple[str, ...]  # e.g. ("M", "N"): what a benchmark shape tuple means
    tensor_args: tuple[str, ...]  # inputs that are tensors, in order
    grad_args: tuple[str, ...]  # inputs that gradients are taken for
    reduced_args: tuple[str, ...]  # gradients reduced over rows (tolerance grows with sqrt(rows))
    _make: Callable = field(repr=False)
    _reference: Callable = field(repr=False)
    # (dy, **inputs) -> {grad name: [..., rows] float64 slack}: for gradient rows with no one right answer
    # at the inputs' precision, how far they may stand from the float64 one (relu attention: what its
    # scores at relu's kink can move a row); None: no slack, every row held to the tolerance alone
    _slack: Callable | None = field(default=None, repr=False)

    def make_inputs(
        self, shape: Sequence[int], dtype: torch.dtype, device="cpu", generator=None, **options
    ) -> dict:
        """Fresh random inputs for ``shape`` (see ``shape_names``); never zeros."""
        return self._make(tuple(shape), dtype, torch.device(device), generator, **options)

    def reference(self, inputs: dict) -> torch.Tensor:
        """The float64 output for ``inputs``."""
        return self._reference(**inputs)

    def reference_grads(self, inputs: dict, dy: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """The float64 output and the float64 gradients of ``<out, dy>`` for the ``grad_args`` present."""
        return _vjp(self._reference, inputs, self.grad_args, dy.double(), torch.float64)

    def gradient_slack(self, inputs: dict, dy: torch.Tensor) -> dict:
        """``{grad name: slack over its rows}`` granted in gradient comparisons (see ``_slack``)."""
        return {} if self._slack is None else self._slack(dy, **inputs)

    def rows(self, inputs: dict) -> int:
        """How many rows a reduced gradient sums over (for its tolerance)."""
        t = inputs[self.tensor_args[0]]
        return max(1, t.numel() // max(1, t.shape[-1]))


def _vjp(fn, inputs: dict, names, dy: torch.Tensor, dtype: torch.dtype | None = None):
    """``fn(**inputs)`` and the gradients of ``<out, dy>`` for the tensor inputs named in ``names``,
    taken on fresh leaves (converted to ``dtype`` when given; the caller's tensors are untouched)."""
    ins = dict(inputs)
    leaves = {}
    for name in names:
        t = ins.get(name)
        if t is not None:
            t = t.detach().to(dtype) if dtype is not None else t.detach().clone()
            leaves[name] = ins[name] = t.requires_grad_(True)
    out = fn(**ins)
    grads = torch.autograd.grad(out, list(leaves.values()), dy, allow_unused=True)
    return out.detach(), dict(zip(leaves, grads, strict=True))


def _randn(shape, dtype, device, gen, mean=0.0, std=1.0):
    t = torch.randn(shape, dtype=torch.float64, generator=gen) * std + mean
    return t.to(device=device, dtype=dtype)


def _norm_inputs(shape, dtype, device, gen, affine=True, offset=0.0, std=1.0):
    x = _randn(shape, dtype, device, gen, mean=offset, std=std)
    inputs = {"x": x}
    n = shape[-1]
    if affine:
        inputs["weight"] = _randn((n,), dtype, device, gen, mean=1.0, std=0.5)
        inputs["bias"] = _randn((n,), dtype, device, gen, std=0.5)
    return inputs, n


def _make_layer_norm(
    shape, dtype, device, gen, affine=True, weight=True, bias=True, offset=0.0, std=1.0, eps=1e-5
):
    inputs, _ = _norm_inputs(shape, dtype, device, gen, affine=affine, offset=offset, std=std)
    inputs.setdefault("weight", None)
    inputs.setdefault("bias", None)
    if not weight:
        inputs["weight"] = None
    if not bias:
        inputs["bias"] = None
    inputs["eps"] = eps
    return inputs


def _make_normalise(shape, dtype, device, gen, offset=0.0, std=1.0, eps=None):
    inputs, _ = _norm_inputs(shape, dtype, device, gen, affine=False, offset=offset, std=std)
    inputs["eps"] = torch.finfo(dtype).eps if eps is None else eps
    return inputs


def _make_attention(shape, dtype, device, gen, causal=False, squared=False, lk=None):
    b, h, lq, d = shape
    lk = lq if lk is None else lk
    return {
        "q": _randn((b, h, lq, d), dtype, device, gen),
        "k": _randn((b, h, lk, d), dtype, device, gen),
        "v": _randn((b, h, lk, d), dtype, device, gen),
        "causal": causal,
        "squared": squared,
    }


OPS: dict[str, Op] = {
    op.name: op
    for op in (
        Op(
            "layer_norm",
            "y = (x - mean) / sqrt(var + eps) * weight + bias over the last dim (biased var, eps=1e-5)",
            ("M", "N"),
            ("x", "weight", "bias"),
            ("x", "weight", "bias"),
            ("weight", "bias"),
            _make_layer_norm,
            lambda x, weight, bias, eps: _norms.layer_norm_ref(x, weight, bias, eps),
        ),
        Op(
            "normalise",
            "y = (x - mean) / sqrt(var + eps) over the last dim (biased var, eps = machine eps of the dtype)",
            ("M", "N"),
            ("x",),
            ("x",),
            (),
            _make_normalise,
            lambda x, eps: _norms.normalise_ref(x, eps),
        ),
        Op(
            "layer_norm_maxstd",
            "y = weight * (x - mean) / max(std, eps) + bias over the last dim (single-pass stats, eps=1e-5)",
            ("M", "N"),
            ("x", "weight", "bias"),
            ("x", "weight", "bias"),
            ("weight", "bias"),
            _make_layer_norm,
            lambda x, weight, bias, eps: _norms.layer_norm_maxstd_ref(x, weight, bias, eps),
        ),
        Op(
            "relu_attention",
            "out = relu_scale * act(mask(q k^T * scale)) @ v, act = relu or relu^2, scale = 1/sqrt(D), "
            "relu_scale = 1/Lk; [B, H, L, D]",
            ("B", "H", "L", "D"),
            ("q", "k", "v"),
            ("q", "k", "v"),
            (),
            _make_attention,
            lambda q, k, v, causal, squared: _attn_ref.relu_attention_ref(q, k, v, causal, squared),
            lambda dy, q, k, v, causal, squared: _attn_ref.kink_slack(q, k, v, dy, causal, squared),
        ),
    )
}


# ----------------------------------------------------------------------------------------------------
# Implementations
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Implementation:
    op: str
    name: str
    side: str  # "python" | "julia"
    fn: Callable = field(repr=False)  # fn(**inputs) -> output
    devices: tuple[str, ...] = ("cpu", "cuda")
    peer: bool = False  # someone else's implementation, measured for comparison
    same_function: bool = True  # False: a speed-only peer that computes a different function
    kernel: str = "torch"  # "triton": on the CPU only under Triton's interpreter; "julia"
    description: str = ""
    # (inputs, dy) -> (out, {name: grad}); None means torch autograd through fn
    vjp: Callable | None = field(default=None, repr=False)
    # (device) -> reason it cannot run there, or None
    check_available: Callable[[str], str | None] | None = field(default=None, repr=False)
    dtypes: tuple | None = None  # input dtypes it supports; None: all of the op's
    # native measurement by the implementation's own side (Julia times itself in Julia):
    # (shape, dtype, device, mode, options) -> dict of result-schema fields; None: the harness times fn
    measure: Callable | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        return f"{self.op}/{self.side}/{self.name}"

    def unavailable_reason(self, device: str = "cpu", dtype: torch.dtype | None = None) -> str | None:
        """Why this implementation cannot run on ``device`` (in ``dtype``, when given) now, or ``None``.
        What keeps it from running at all here (no GPU, no Julia, no Triton) comes before a dtype it
        lacks, so that every dtype of an implementation that cannot run gives the same reason."""
        device = torch.device(device).type
        if device not in self.devices:
            return f"runs on {', '.join(self.devices)} only"
        reason = self._environment_reason(device)
        if reason:
            return reason
        if dtype is not None and self.dtypes is not None and dtype not in self.dtypes:
            have = ", ".join(str(d).removeprefix("torch.") for d in self.dtypes)
            return f"no {str(dtype).removeprefix('torch.')} support (has {have})"
        return None

    def _environment_reason(self, device: str) -> str | None:
        if device == "cuda" and not torch.cuda.is_available():
            return "no CUDA device"
        if self.check_available is not None:
            reason = self.check_available(device)
            if reason:
                return reason
        if self.kernel == "triton":
            if not _backend.HAS_TRITON:
                return _backend.triton_missing_reason()
            if device == "cpu" and not _backend.interpreter_requested():
                return "Triton kernel on the CPU needs the interpreter (TRITON_INTERPRET=1 before import)"
            if device == "cuda" and _backend.interpreter_requested():
                return "TRITON_INTERPRET=1 is set: Triton kernels run interpreted, not on the GPU"
        return None

    def interpreted(self, device: str = "cpu") -> bool:
        """True when this runs through Triton's interpreter on ``device`` (correct but not timeable)."""
        return self.kernel == "triton" and torch.device(device).type == "cpu"

    def forward_backward(self, inputs: dict, dy: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Output and gradients of ``<fn(**inputs), dy>`` for the op's grad_args present in inputs."""
        if self.vjp is not None:
            return self.vjp(inputs, dy)
        return _vjp(self.fn, inputs, OPS[self.op].grad_args, dy)


_REGISTRY: dict[str, Implementation] = {}
_plugins_loaded = False


def register(impl: Implementation, replace: bool = False) -> Implementation:
    """Add an implementation; its ``op`` must be one of :data:`OPS`."""
    if impl.op not in OPS:
        raise ValueError(f"unknown op {impl.op!r}; known ops: {', '.join(OPS)}")
    if impl.side not in ("python", "julia"):
        raise ValueError(f"side must be 'python' or 'julia', got {impl.side!r}")
    if impl.key in _REGISTRY and not replace:
        raise ValueError(f"implementation {impl.key} is registered already")
    _REGISTRY[impl.key] = impl
    return impl


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    if _backend.switched_off("CROSSFUSE_PLUGINS"):
        return
    import sys

    for ep in importlib.metadata.entry_points(group="crossfuse.implementations"):
        try:
            ep.load()(sys.modules[__name__])
        except Exception as exc:  # a broken plugin must not take the core down; say so
            warnings.warn(f"crossfuse plugin {ep.name!r} failed to load: {exc}", stacklevel=2)


def implementations(op: str | None = None, side: str | None = None, include_plugins: bool = True) -> list:
    """Registered implementations, optionally of one op and/or one side, in registration order."""
    if op is not None and op not in OPS:
        raise ValueError(f"unknown op {op!r}; known ops: {', '.join(OPS)}")
    if side not in (None, "python", "julia"):
        raise ValueError(f"side must be 'python', 'julia' or None (both), got {side!r}")
    if include_plugins:
        _load_plugins()
    return [i for i in _REGISTRY.values() if (op is None or i.op == op) and (side is None or i.side == side)]


def get(op: str, name: str, side: str = "python") -> Implementation:
    _load_plugins()
    key = f"{op}/{side}/{name}"
    if key not in _REGISTRY:
        raise KeyError(f"no implementation {key}; have: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[key]


# ----------------------------------------------------------------------------------------------------
# Built-in entries (callables import their modules on first call: no Triton import here)
# ----------------------------------------------------------------------------------------------------


def _fused_layer_norm(x, weight, bias, eps):
    from .ops.layer_norm import layer_norm

    return layer_norm(x, x.shape[-1], weight, bias, eps)


def _torch_layer_norm(x, weight, bias, eps):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def _compile(fn):
    """``torch.compile(fn, dynamic=False)`` for a peer entry, with settings fit for checking and timing it.

    * ``dynamic=False`` compiles once per shape and dtype; dynamo's default limit of 8 compiles per
      function would silently fall back to eager in a suite with more shapes: raised to 64.
    * AOTAutograd's donated buffers (torch >= 2.5) free saved tensors during the backward, which forbids
      ``retain_graph=True`` (how the harness times a backward alone): off.
    Both are process-wide dynamo settings, applied before the entry's first compilation.
    """
    import torch._dynamo.config as dcfg

    name = "recompile_limit" if hasattr(dcfg, "recompile_limit") else "cache_size_limit"
    if getattr(dcfg, name, 64) < 64:
        setattr(dcfg, name, 64)
    try:
        import torch._functorch.config as fcfg
    except ImportError:  # pragma: no cover - very old torch
        fcfg = None
    if fcfg is not None and getattr(fcfg, "donated_buffer", False):
        fcfg.donated_buffer = False
    return torch.compile(fn, dynamic=False)


@functools.cache
def _compiled_layer_norm():
    return _compile(torch.nn.functional.layer_norm)


def _torch_compile_layer_norm(x, weight, bias, eps):
    return _compiled_layer_norm()(x, (x.shape[-1],), weight, bias, eps)


def _liger_reason(device: str | None = None) -> str | None:
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel is not installed (pip install liger-kernel)"
    return None


def _liger_layer_norm(x, weight, bias, eps):
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction

    n = x.shape[-1]
    if weight is None:
        weight = torch.ones(n, dtype=x.dtype, device=x.device)
    if bias is None:
        bias = torch.zeros(n, dtype=x.dtype, device=x.device)
    return LigerLayerNormFunction.apply(x, weight, bias, eps)


def _relu_attention_triton(q, k, v, causal, squared):
    from .ops.relu_attention import relu_attention

    return relu_attention(q, k, v, causal=causal, squared=squared)


def _relu_attention_row_block(q, k, v, causal, squared):
    from .ops.relu_attention.row_block import relu_attention_row_block

    return relu_attention_row_block(q, k, v, causal=causal, squared=squared)


def _relu_attention_naive(q, k, v, causal, squared):
    return _attn_ref.relu_attention_naive(q, k, v, causal, squared)


@functools.cache
def _compiled_relu_attention():
    return _compile(_attn_ref.relu_attention_naive)


def _relu_attention_compiled(q, k, v, causal, squared):
    return _compiled_relu_attention()(q, k, v, causal, squared)


def _sdpa_softmax(q, k, v, causal, squared):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _builtin() -> None:
    py = "python"
    for impl in (
        Implementation("layer_norm", "fused", py, _fused_layer_norm, kernel="triton",
                       description="crossfuse's fused Triton layer norm"),
        Implementation("layer_norm", "torch", py, _torch_layer_norm, peer=True,
                       description="torch.nn.functional.layer_norm"),
        Implementation("layer_norm", "torch_compile", py, _torch_compile_layer_norm, peer=True,
                       description="torch.compile(torch.nn.functional.layer_norm)"),
        Implementation("layer_norm", "liger", py, _liger_layer_norm, devices=("cuda",), peer=True,
                       kernel="triton", check_available=_liger_reason,
                       description="Liger-Kernel's Triton layer norm"),
        Implementation("layer_norm", "layernorm", py, _norms.layernorm,
                       description="NNlib-style mean/var/sqrt with torch autograd (the naive form)"),
        Implementation("normalise", "fused", py, lambda x, eps: _fused_layer_norm(x, None, None, eps),
                       kernel="triton", description="crossfuse's fused Triton layer norm without affine"),
        Implementation("normalise", "torch", py,
                       lambda x, eps: _torch_layer_norm(x, None, None, eps), peer=True,
                       description="torch.nn.functional.layer_norm without affine"),
        Implementation("normalise", "normal_now", py, _norms.normal_now,
                       description="plain mean, var, sqrt per element; torch autograd"),
        Implementation("normalise", "normal_new", py, _norms.normal_new,
                       description="one rsqrt per row; memory-saving custom backward"),
        Implementation("normalise", "normal_newer", py, _norms.normal_newer,
                       description="one-pass Welford statistics; memory-saving custom backward"),
        Implementation("layer_norm_maxstd", "layer_norm", py,
                       lambda x, weight, bias, eps: _norms.layer_norm(x, weight, bias, eps),
                       description="single-pass sum/sum of squares, max(std, eps); custom backward"),
        Implementation("relu_attention", "triton", py, _relu_attention_triton, kernel="triton",
                       description="crossfuse's flash-style Triton ReLU attention"),
        Implementation("relu_attention", "naive", py, _relu_attention_naive,
                       description="matmul, scale, mask, relu, matmul in torch (L x L scores)"),
        Implementation("relu_attention", "naive_compile", py, _relu_attention_compiled, peer=True,
                       description="torch.compile of the naive ReLU attention"),
        Implementation("relu_attention", "row_block", py, _relu_attention_row_block, kernel="triton",
                       peer=True, dtypes=(torch.float32,),
                       description="the seed notebook's algorithm, written here: a block of query rows a "
                       "program, one pass over the keys, the backward in one kernel (baseline)"),
        Implementation("relu_attention", "sdpa_softmax", py, _sdpa_softmax, peer=True,
                       same_function=False,
                       description="torch scaled_dot_product_attention (softmax): speed-only peer"),
    ):  # fmt: skip
        register(impl)


_builtin()


def flops(op: str, shape: Sequence[int], mode: str, causal: bool = False) -> float | None:
    """Matmul FLOPs counted for TFLOP/s (attention only): 4·B·H·L²·D forward, halved when causal;
    backward 2.5× forward; fwd+bwd 3.5× forward."""
    if op != "relu_attention":
        return None
    b, h, l, d = shape
    fwd = 4.0 * b * h * l * l * d * (0.5 if causal else 1.0)
    return fwd * {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}[mode]


def min_bytes(op: str, shape: Sequence[int], mode: str, element_size: int) -> float | None:
    """Fewest bytes a normalisation must move (for GB/s): 2·M·N·bytes forward, 3·M·N·bytes backward,
    5·M·N·bytes forward+backward. ``None`` for attention (reported in TFLOP/s)."""
    if op == "relu_attention":
        return None
    mn = math.prod(shape)
    return {"fwd": 2, "bwd": 3, "fwd+bwd": 5}[mode] * mn * element_size
