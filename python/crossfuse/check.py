"""Correctness of one implementation on one case, against the op's float64 reference.

Used by the test-suite and by ``crossfuse check``. A case is (op, shape, dtype, device, options).
Inputs are fresh random numbers every call (the seed is reported, so a failure can be replayed);
the output gradient ``dy`` is random too, never ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from . import registry
from .tolerances import relerr, relerr_with_slack, tolerance


@dataclass
class CheckResult:
    impl: str  # registry key op/side/name
    op: str
    side: str
    device: str
    dtype: str
    shape: tuple
    options: dict
    status: str  # "pass" | "fail" | "skip" | "error"
    reason: str = ""
    fwd_err: float | None = None
    grad_err: dict = field(default_factory=dict)  # name -> relative error
    fwd_tol: float | None = None
    grad_tol: dict = field(default_factory=dict)
    seed: int | None = None
    slack_rows: dict = field(default_factory=dict)  # name -> gradient rows given slack (Comparison)

    @property
    def max_grad_err(self) -> float | None:
        return max(self.grad_err.values()) if self.grad_err else None

    def summary(self) -> str:
        errs = f"fwd {self.fwd_err:.2e} (tol {self.fwd_tol:.1e})" if self.fwd_err is not None else ""
        for k, v in self.grad_err.items():
            errs += f", d{k} {v:.2e} (tol {self.grad_tol[k]:.1e})"
        if self.slack_rows:
            rows = ", ".join(f"{n} d{k} rows" for k, n in self.slack_rows.items())
            errs += f" ({rows} given slack: no one right answer at this precision, see Op.gradient_slack)"
        case = f"{self.impl} {self.dtype} {self.shape} {self.options} seed={self.seed}"
        return f"{case}: {self.status} {errs} {self.reason}"


@dataclass
class Comparison:
    fwd_err: float
    fwd_tol: float
    grad_err: dict  # name -> relative error (NaN when the implementation gave no gradient)
    grad_tol: dict
    ok: bool
    slack_rows: dict = field(default_factory=dict)  # name -> rows of its gradient given slack


def compare(impl, dtype, device, rows: int, out, got: dict, ref_out, ref_grads: dict,
            inputs: dict | None = None, dy: torch.Tensor | None = None) -> Comparison:  # fmt: skip
    """Relative errors of an output and its gradients against the float64 ones, and whether each is
    within the op's tolerance (reduced gradients: growing with sqrt(rows); Triton on a GPU: tf32).
    With ``inputs`` and ``dy`` (those the references were computed from), each gradient row the op
    calls ambiguous at the inputs' precision is granted the distance its ambiguity allows
    (``Op.gradient_slack``: relu attention's rows at relu's kink) and counted; every row is still
    compared. tf32 products get no slack (their tolerance allows for such scores)."""
    op = registry.OPS[impl.op]
    tf32 = torch.device(device).type == "cuda" and impl.kernel == "triton"  # float32 dots on tf32 cores
    fwd_tol = tolerance(op.name, dtype, "fwd", tf32=tf32)
    fwd_err = relerr(out, ref_out)
    ok = fwd_err <= fwd_tol
    slacks = {}
    if ref_grads and inputs is not None and dy is not None and not (tf32 and dtype == torch.float32):
        slacks = op.gradient_slack(inputs, dy)
    grad_err, grad_tol, slack_rows = {}, {}, {}
    for name, ref_g in ref_grads.items():
        kind = "reduced" if name in op.reduced_args else "bwd"
        grad_tol[name] = tolerance(op.name, dtype, kind, rows, tf32=tf32)
        g = got.get(name)
        slack = slacks.get(name)
        if g is None:
            grad_err[name] = float("nan")
        elif slack is not None and bool((slack > 0).any()):
            slack_rows[name] = int((slack > 0).sum())
            grad_err[name] = relerr_with_slack(g, ref_g, slack)
        else:
            grad_err[name] = relerr(g, ref_g)
        ok = ok and grad_err[name] <= grad_tol[name]
    return Comparison(fwd_err, fwd_tol, grad_err, grad_tol, ok, slack_rows)


def fresh_generator(seed: int | None = None) -> tuple[torch.Generator, int]:
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    return torch.Generator().manual_seed(seed), seed


def run_case(
    impl: registry.Implementation,
    shape,
    dtype: torch.dtype,
    device: str = "cpu",
    options: dict | None = None,
    seed: int | None = None,
    grads: bool = True,
) -> CheckResult:
    """Compare ``impl`` with the float64 reference on fresh random inputs; never raises for the impl's
    own failures (they become ``status="error"`` with the message)."""
    options = dict(options or {})
    op = registry.OPS[impl.op]
    dtype_name = str(dtype).removeprefix("torch.")
    dev = torch.device(device).type
    res = CheckResult(impl.key, impl.op, impl.side, dev, dtype_name, tuple(shape), options, "skip")
    reason = impl.unavailable_reason(device, dtype)
    if not impl.same_function:
        reason = f"speed-only peer: computes a different function ({impl.description})"
    if reason:
        res.reason = reason
        return res
    gen, res.seed = fresh_generator(seed)
    inputs = op.make_inputs(shape, dtype, device, gen, **options)
    with torch.no_grad():
        ref_out = op.reference(inputs)
    dy = torch.randn(ref_out.shape, dtype=torch.float64, generator=gen).to(device=device, dtype=dtype)
    try:
        if grads:
            ref_out, ref_grads = op.reference_grads(inputs, dy)
            out, got = impl.forward_backward(inputs, dy)
        else:
            with torch.no_grad():
                out = impl.fn(**inputs)
            ref_grads, got = {}, {}
        # inside the try: an output or gradient of the wrong shape is the implementation's error too
        c = compare(impl, dtype, device, op.rows(inputs), out, got, ref_out, ref_grads, inputs, dy)
    except Exception as exc:  # the implementation's own failure is a result, not a crash
        if getattr(exc, "unavailable", False):  # its side cannot run here (crossfuse_julia.JuliaUnavailable)
            res.reason = getattr(exc, "reason", None) or str(exc)
            return res
        res.status, res.reason = "error", f"{type(exc).__name__}: {exc}"
        return res
    res.fwd_err, res.fwd_tol, res.grad_err, res.grad_tol = c.fwd_err, c.fwd_tol, c.grad_err, c.grad_tol
    res.slack_rows = c.slack_rows
    res.status = "pass" if c.ok else "fail"
    return res
