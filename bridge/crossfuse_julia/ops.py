"""The Julia variants as Python callables with the registry's calling conventions.

Each Julia entry of the registry is one :class:`JuliaVariant`: ``op`` and ``name`` (the Julia function's
name). Its callables, with the conventions of :data:`crossfuse.registry.OPS`:

* ``forward``: ``normalise``: ``fn(x, eps)``; ``layer_norm`` and ``layer_norm_maxstd``:
  ``fn(x, weight, bias, eps)`` (``weight``/``bias`` may be ``None``). In Julia, on the same memory
  (see :mod:`crossfuse_julia.arrays`): ``normal_*(x; dims=1, eps)``, ``layernorm(x, w, b; dims=1, eps)``,
  ``layer_norm(eps, w, b, x)``.
* ``vjp(inputs, dy) -> (out, {name: grad})``: output and gradients computed in Julia by
  ``Zygote.pullback`` (which uses CrossFuse's ``rrule`` where it has one), for ``x`` and for the
  ``weight``/``bias`` that are not ``None``.
* ``measure(shape, dtype, device, mode, options) -> dict``: one row of the shared result schema, from
  CrossFuse's ``measure_forward`` (``mode="fwd"``) or ``measure_gradient`` with ``Zygote.pullback``
  (``"bwd"``, ``"fwd+bwd"``), timed by Julia on the inputs :meth:`Op.make_inputs` draws in Python (so
  both sides measure the same distribution). ``options`` may hold ``repeats``, ``warmup`` and ``seed``
  (passed to Julia); the rest go to ``make_inputs``.
* ``check_available(device=None)``: the reason this cannot run, or ``None``, from cheap checks (see
  :func:`unavailable_reason`); it never starts Julia. A start that fails later (on the first call) raises
  :class:`JuliaUnavailable` there, and from then on ``check_available`` reports that reason.

Every call raises :class:`JuliaUnavailable` (with the reason) when Julia cannot be used, and
:class:`JuliaError` (with Julia's message) when Julia raises.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from . import arrays, session
from .errors import JuliaUnavailable, Problem

OPS_WITH_AFFINE = ("layer_norm", "layer_norm_maxstd")
_JULIA_OPTIONS = ("repeats", "warmup", "seed")


def unavailable_reason(device=None, start: bool = False) -> str | None:
    """Why the Julia entries cannot run (on ``device``, when given), or ``None``.

    Cheap by default: the cached detection, the cached failure of an earlier start, and whether the GPU
    path was asked for; it starts Julia only with ``start=True`` (or reports on a session already
    started), so ``crossfuse info``/``check`` listings never trigger a start or a package install.
    """
    p = problem(device, start)
    return None if p is None else p.reason


def problem(device=None, start: bool = False) -> Problem | None:
    """:func:`unavailable_reason` with its kind: ``Problem(reason, broken)``, ``broken`` when Julia is
    here (or required, ``CROSSFUSE_JULIA=1``) and cannot be used, which a test must report as a failure
    rather than skip. ``None`` when the Julia entries can run on ``device``."""
    from . import _detect

    d = _detect.detect()
    if d.reason:
        return Problem(d.reason, d.broken)
    if session.failure():
        return Problem(session.failure(), True)
    cuda = device is not None and torch.device(device).type == "cuda"
    if cuda and not session.cuda_requested():
        if flag := session.cuda_flag_problem():
            return Problem(f"the Julia GPU path is off: {flag}", True)
        # an opt-in of its own, not asked for: an absence even where the Julia side is required
        return Problem("the Julia GPU path is off (set CROSSFUSE_JULIA_CUDA=1 before the first Julia call)",
                       False)
    if start or session.started():
        try:
            s = session.get()
        except JuliaUnavailable as exc:
            return Problem(exc.reason, exc.broken)
        if cuda and not s.cuda:  # the GPU path was asked for, and CUDA.jl cannot use the GPU
            return Problem(s.cuda_reason or "the Julia GPU path is off", True)
    return None


def _device_index(t: torch.Tensor) -> int:
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


@dataclass(frozen=True)
class JuliaVariant:
    op: str
    name: str

    @property
    def affine(self) -> bool:
        return self.op in OPS_WITH_AFFINE

    # ------------------------------------------------------------------------------------------------
    # the registry's callables
    # ------------------------------------------------------------------------------------------------

    def fn(self):
        """The forward callable in the op's calling convention."""
        if self.affine:

            def forward(x, weight=None, bias=None, eps=1e-5):
                return self.forward(x, weight, bias, eps)
        else:

            def forward(x, eps=None):
                return self.forward(x, None, None, eps)

        forward.__name__ = forward.__qualname__ = f"julia_{self.name}"
        forward.__doc__ = f"CrossFuse.{self.name} (Julia) for the op {self.op}, through crossfuse_julia."
        return forward

    def check_available(self, device=None) -> str | None:
        return unavailable_reason(device)

    def forward(self, x, weight, bias, eps):
        x, w, b, eps = self._prepare(x, weight, bias, eps)
        if x.numel() == 0:  # nothing to normalise: an empty result, as torch gives, without Julia
            return torch.empty_like(x)
        s = session.get()
        lay = arrays.julia_layout(x.shape)
        n, m = lay.features, lay.rows
        where = f"CrossFuse.{self.name} ({self.op}, forward)"
        if x.device.type == "cpu":
            y = session.call(where, s.bridge.host_forward, self.op, self.name, arrays.host_view(x),
                             _vec(w), _vec(b), eps, n, m)
            return arrays.from_host(y, x.shape, x.dtype)
        self._require_cuda(s)
        out = torch.empty_like(x)
        torch.cuda.synchronize(x.device)
        session.call(where, s.bridge.device_forward, out, self.op, self.name, x, w, b, eps, n, m,
                     _device_index(x))
        return out

    def vjp(self, inputs: dict, dy: torch.Tensor) -> tuple[torch.Tensor, dict]:
        x, w, b, eps = self._prepare(inputs["x"], inputs.get("weight"), inputs.get("bias"), inputs.get("eps"))
        dy = arrays.prepare(dy, "dy", x.device)
        if dy.shape != x.shape or dy.dtype != x.dtype:
            raise ValueError(f"dy must have x's shape {tuple(x.shape)} and dtype {x.dtype}, "
                             f"got {tuple(dy.shape)} {dy.dtype}")
        if x.numel() == 0:  # empty: an empty output and gradients (zeros for weight and bias), as torch
            grads = {"x": torch.empty_like(x)}
            grads.update({k: torch.zeros_like(t) for k, t in (("weight", w), ("bias", b)) if t is not None})
            return torch.empty_like(x), grads
        s = session.get()
        lay = arrays.julia_layout(x.shape)
        n, m = lay.features, lay.rows
        where = f"CrossFuse.{self.name} ({self.op}, pullback)"
        if x.device.type == "cpu":
            xv, dyv = arrays.host_view(x), arrays.host_view(dy)
            y, dx, dw, db = session.call(where, s.bridge.host_pullback, self.op, self.name, xv, _vec(w),
                                         _vec(b), eps, dyv, n, m)
            out = arrays.from_host(y, x.shape, x.dtype)
            grads = {"x": arrays.from_host(dx, x.shape, x.dtype)}
            for key, t, g in (("weight", w, dw), ("bias", b, db)):
                if t is not None:
                    grads[key] = torch.zeros_like(t) if g is None else arrays.vector_from_host(g, n, t.dtype)
            return out, grads
        self._require_cuda(s)
        out, dx = torch.empty_like(x), torch.empty_like(x)
        dw = None if w is None else torch.empty_like(w)
        db = None if b is None else torch.empty_like(b)
        torch.cuda.synchronize(x.device)
        session.call(where, s.bridge.device_pullback, out, dx, dw, db, self.op, self.name, x, w, b, eps, dy,
                     n, m, _device_index(x))
        grads = {"x": dx}
        if w is not None:
            grads["weight"] = dw
        if b is not None:
            grads["bias"] = db
        return out, grads

    def measure(self, shape, dtype, device, mode: str, options: dict | None = None) -> dict:
        from crossfuse.registry import OPS

        if mode not in ("fwd", "bwd", "fwd+bwd"):
            raise ValueError(f"mode must be 'fwd', 'bwd' or 'fwd+bwd', got {mode!r}")
        opts = dict(options or {})
        kw = {k: int(opts.pop(k)) for k in _JULIA_OPTIONS if k in opts}
        if mode == "fwd":
            kw.pop("seed", None)  # measure_forward draws nothing
        inputs = OPS[self.op].make_inputs(shape, dtype, device, **opts)
        x, w, b, eps = self._prepare(inputs["x"], inputs.get("weight"), inputs.get("bias"), inputs.get("eps"))
        s = session.get()
        lay = arrays.julia_layout(x.shape)
        n, m = lay.features, lay.rows
        where = f"CrossFuse.{self.name} ({self.op}, measure {mode})"
        if x.device.type == "cpu":
            names, values = session.call(where, s.bridge.host_measure, self.op, self.name, mode,
                                         arrays.host_view(x), _vec(w), _vec(b), eps, n, m, **kw)
        else:
            self._require_cuda(s)
            torch.cuda.synchronize(x.device)
            names, values = session.call(where, s.bridge.device_measure, self.op, self.name, mode, x, w, b,
                                         eps, n, m, _device_index(x), **kw)
        return {str(k): _plain(v) for k, v in zip(names, values, strict=True)}

    # ------------------------------------------------------------------------------------------------

    def _prepare(self, x, weight, bias, eps):
        x = arrays.prepare(x, "x")
        if x.dim() < 1:
            raise ValueError(f"x must have at least one dimension (the features), got shape {tuple(x.shape)}")
        n = x.shape[-1]
        out = [x]
        for name, t in (("weight", weight), ("bias", bias)):
            if t is not None:
                if not self.affine:
                    raise ValueError(f"{self.op} takes no {name}")
                t = arrays.prepare(t, name, x.device)
                if t.shape != (n,) or t.dtype != x.dtype:
                    raise ValueError(f"{name} must have shape ({n},) and dtype {x.dtype} (x's last dim and "
                                     f"dtype), got {tuple(t.shape)} {t.dtype}")
            out.append(t)
        if eps is None:
            eps = torch.finfo(x.dtype).eps if self.op == "normalise" else 1e-5
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
            raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
        eps = float(eps)
        if not 0 < eps < math.inf:
            raise ValueError(f"eps must be positive and finite, got {eps}")
        return (*out, eps)

    @staticmethod
    def _require_cuda(s: session.Session) -> None:
        if not s.cuda:
            raise JuliaUnavailable(s.cuda_reason or "the Julia GPU path is off")


def _vec(t):
    return None if t is None else arrays.host_vector(t)


def _plain(v):
    """A value of a Julia result row as a plain Python value (juliacall gives str, int, float, bool, None
    and tuples for the types the rows use; anything else becomes its string)."""
    if v is None or isinstance(v, (str, bool, int, float)):
        return v
    if isinstance(v, tuple):
        return tuple(_plain(e) for e in v)
    return str(v)
