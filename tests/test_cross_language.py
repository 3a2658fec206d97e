"""The cross-language suite: the Julia and the Python implementation of each variant compute the same
function and the same gradient.

For every (op, name) registered on both sides (``registry.implementations(side="python")`` and
``side="julia"``), on the same fresh random inputs and the same random output gradient ``dy``, the
output and the gradients (``x`` and, where the op has them, ``weight`` and ``bias``) of the Julia entry
and of the Python entry are each compared with the op's float64 reference, within the per-dtype
tolerances of :mod:`crossfuse.tolerances` (so the two sides agree with each other within twice that).
Julia computes its gradients itself (``Zygote.pullback`` through CrossFuse's rules); nothing is
differentiated by torch on the Julia side.

On the CPU always, on CUDA when torch has a GPU and the Julia GPU path is on (``CROSSFUSE_JULIA_CUDA=1``).
Without Julia here (no executable, no juliacall, ``CROSSFUSE_JULIA=0``) each test skips with the
bridge's reason, visibly, in a second or so. With Julia here, the suite cannot pass by skipping: a Julia
that fails to start, to resolve its packages or to load CrossFuse fails every test, naming the cause
(:func:`crossfuse_julia.ops.problem`, ``broken``); so does any reason at all with ``CROSSFUSE_JULIA=1``
(``make julia-test`` sets it), and an error in a call fails the test that made it.
"""

from __future__ import annotations

import math

import pytest
import torch
from crossfuse import registry
from crossfuse.check import fresh_generator, run_case
from crossfuse.tolerances import relerr, tolerance

F16, F32, F64 = torch.float16, torch.float32, torch.float64
DTYPES = [F32, F64, F16]
DEVICES = ["cpu", "cuda"]  # not marked `gpu`: these skip with their own reason (no GPU, Julia's GPU path off)

PYTHON = {(i.op, i.name): i for i in registry.implementations(side="python")}
JULIA = {(i.op, i.name): i for i in registry.implementations(side="julia")}
PAIRS = sorted(set(PYTHON) & set(JULIA))

# Edge cases, each with why it is here. (shape, options for Op.make_inputs)
CASES = {
    "random": ((32, 96), {}),  # a plain case
    "n1": ((8, 1), {}),  # one feature: every row has zero variance, y = 0 (or beta)
    "prime_n": ((16, 97), {}),  # N prime: no vector width or block size divides it
    "one_row": ((1, 128), {}),  # M = 1: the weight/bias gradients sum a single row
    "3d": ((2, 5, 48), {}),  # leading dims flatten into M = 10 rows; Julia sees 48×10
    "large_mean": ((16, 64), {"offset": 1e4}),  # 1e4 + randn: |mean|/std = 1e4, ill-conditioned
}

# Error bounds grow with the conditioning kappa = |mean|/std: the mean is known to about kappa * u of
# std in the dtype (unit roundoff u), and y, dx and dw inherit that relative error (kappa^2 * u for the
# single-pass layer_norm_maxstd, whose E[x^2] - mean^2 cancels). The case's tolerances are floored at
# LARGE_MEAN_FACTOR times that, and no higher: the Python twins reach at most 1.4 kappa * u (float32
# y, dw; 30 seeds), so a side 1% off fails in float32 (the floor is 4.8e-3), where kappa times the
# tolerance (2e-2 forward, 0.1 for gradients) let it pass.
LARGE_MEAN_CONDITION = 1e4
LARGE_MEAN_FACTOR = 8.0


def large_mean_floor(op: str, dtype: torch.dtype) -> float:
    """The large-mean case's tolerance floor: LARGE_MEAN_FACTOR * kappa^p * u (p = 2 for maxstd)."""
    kappa = LARGE_MEAN_CONDITION ** (2 if op == "layer_norm_maxstd" else 1)
    return LARGE_MEAN_FACTOR * kappa * torch.finfo(dtype).eps / 2


def no_entries_reason() -> str:
    from crossfuse_julia.registry import off_reason

    off = off_reason()
    if off:
        return f"{off}: its entries are not registered"
    return ("no Julia entries are registered: the crossfuse_julia plugin did not load (entry point "
            "crossfuse.implementations; is crossfuse installed with pip install -e .?)")


def pair_params():
    from crossfuse_julia import _detect

    if not JULIA:
        if _detect.required():  # CROSSFUSE_JULIA=1: a missing side is a failure (in require)
            return [pytest.param(None, None, id="no-julia-entries")]
        return [pytest.param(None, None, marks=pytest.mark.skip(reason=no_entries_reason()))]
    return [pytest.param(op, name, id=f"{op}/{name}") for op, name in PAIRS]


def require(op: str, name: str, device: str):
    """The two entries; a skip with the reason one of them cannot run on ``device`` when that is an
    absence (no Julia here, no GPU), a failure naming the cause when Julia is here and broken."""
    from crossfuse_julia.ops import problem

    if op is None:
        pytest.fail(f"CROSSFUSE_JULIA=1 requires the Julia side, and {no_entries_reason()}")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    jl, py = JULIA[(op, name)], PYTHON[(op, name)]
    p = problem(device, start=True)
    if p is not None and p.broken:
        pytest.fail(p.describe(), pytrace=False)
    reason = (p and p.reason) or jl.unavailable_reason(device)
    if reason:
        pytest.skip(f"Julia: {reason}")
    reason = py.unavailable_reason(device)
    if reason:
        pytest.skip(f"{py.key}: {reason}")
    return jl, py


# ----------------------------------------------------------------------------------------------------
# references and comparison
# ----------------------------------------------------------------------------------------------------


def _maxstd_reference(x, weight, bias, eps):
    """layer_norm_maxstd in float64 with max(std, eps) written as sqrt(max(var, eps^2)): the same values,
    and a gradient of 0 (not sqrt's 0 * inf = NaN) through the floor where var = 0."""
    x = x.double()
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).square().mean(-1, keepdim=True)
    y = (x - mean) / var.clamp(min=eps * eps).sqrt()
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y


def reference(op: registry.Op, inputs: dict, dy: torch.Tensor):
    """The op's float64 output and gradients. The registry's layer_norm_maxstd reference takes sqrt(var)
    before the floor, so its x-gradient is NaN where var = 0 (one feature, constant rows); there, the
    equivalent form above gives the true gradient: (g - mean(g)) / eps."""
    out, grads = op.reference_grads(inputs, dy)
    if op.name == "layer_norm_maxstd" and any(torch.isnan(g).any() for g in grads.values()):
        leaves = {k: inputs[k].detach().double().requires_grad_(True) for k in grads}
        ins = {**inputs, **leaves}
        out = _maxstd_reference(ins["x"], ins.get("weight"), ins.get("bias"), ins["eps"])
        grads = dict(zip(leaves, torch.autograd.grad(out, list(leaves.values()), dy.double()), strict=True))
        out = out.detach()
    return out, grads


def compare(op_name: str, impls, inputs: dict, dy: torch.Tensor, dtype: torch.dtype, floor: float = 0.0,
            seed=None) -> None:
    """Run every implementation on (inputs, dy); assert each is within the tolerance of float64 (or
    ``floor``, where that is larger)."""
    op = registry.OPS[op_name]
    ref_out, ref_grads = reference(op, inputs, dy)
    rows = op.rows(inputs)
    report, bad = {}, []
    for impl in impls:
        out, grads = impl.forward_backward(inputs, dy)
        assert out.shape == inputs["x"].shape and out.dtype == dtype, (impl.key, out.shape, out.dtype)
        assert out.device == inputs["x"].device, impl.key
        errs = {"y": (relerr(out, ref_out), max(floor, tolerance(op_name, dtype, "fwd")))}
        for name, g_ref in ref_grads.items():
            g = grads.get(name)
            kind = "reduced" if name in op.reduced_args else "bwd"
            tol = max(floor, tolerance(op_name, dtype, kind, rows))
            if g is None:
                errs["d" + name] = (math.nan, tol)
                continue
            assert g.shape == inputs[name].shape, (impl.key, name, g.shape)
            errs["d" + name] = (relerr(g, g_ref), tol)
        report[impl.key] = errs
        bad += [f"{impl.key} {k}" for k, (e, t) in errs.items() if not e <= t]
    lines = [f"{key}: " + ", ".join(f"{k} {e:.2e} (tol {t:.1e})" for k, (e, t) in errs.items())
             for key, errs in report.items()]
    assert not bad, f"seed={seed} {dtype}: beyond tolerance: {bad}\n" + "\n".join(lines)


# ----------------------------------------------------------------------------------------------------
# the suite
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("op, name", pair_params())
def test_julia_and_python_agree(op, name, case, dtype, dev):
    shape, options = CASES[case]
    if case == "large_mean" and dtype == F16:
        pytest.skip("float16 cannot hold 1e4 + randn (its spacing at 1e4 is 8): covered in float32, float64")
    if case == "large_mean" and op == "layer_norm_maxstd" and dtype != F64:
        pytest.skip("layer_norm_maxstd's single-pass E[x^2] - mean^2 cancels at |mean|/std = 1e4 in "
                    f"{str(dtype).removeprefix('torch.')}: both sides lose every digit of std (documented "
                    "with CrossFuse.layer_norm and its Python twin); covered in float64")
    jl, py = require(op, name, dev)
    floor = large_mean_floor(op, dtype) if case == "large_mean" else 0.0
    gen, seed = fresh_generator()
    inputs = registry.OPS[op].make_inputs(shape, dtype, dev, gen, **options)
    dy = torch.randn(shape, dtype=F64, generator=gen)
    if case == "n1":
        # with N = 1 the bias gradient is one number, a sum over rows; a random-sign dy can cancel it to
        # ~0, where its relative error measures the cancellation, not the implementation: |dy| here
        dy = dy.abs()
    dy = dy.to(device=dev, dtype=dtype)
    compare(op, (jl, py), inputs, dy, dtype, floor, seed)


class _OffBy:
    """An implementation ``factor`` times another's output and gradients: a wrong side to fail."""

    def __init__(self, impl, factor: float):
        self.impl, self.factor, self.key = impl, factor, f"{impl.key} x {factor}"

    def forward_backward(self, inputs, dy):
        out, grads = self.impl.forward_backward(inputs, dy)
        return out * self.factor, {k: g * self.factor for k, g in grads.items()}


@pytest.mark.parametrize("dtype", [F32, F64], ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("op, name", pair_params())
def test_large_mean_floor_passes_the_python_twin_and_fails_one_off(op, name, dtype):
    """Without Julia: the large-mean tolerances hold the Python twin of each pair (fresh inputs), and a
    side 1% off (float32; 1e-6 off in float64) fails them, so the floor is no blanket."""
    if op is None:
        require(op, name, "cpu")  # no Julia entries with CROSSFUSE_JULIA=1: fails, saying so
    if op == "layer_norm_maxstd" and dtype != F64:
        pytest.skip("layer_norm_maxstd loses every digit of std at |mean|/std = 1e4 below float64")
    py = PYTHON[(op, name)]
    shape, options = CASES["large_mean"]
    gen, seed = fresh_generator()
    inputs = registry.OPS[op].make_inputs(shape, dtype, "cpu", gen, **options)
    dy = torch.randn(shape, dtype=F64, generator=gen).to(dtype)
    floor = large_mean_floor(op, dtype)
    compare(op, (py,), inputs, dy, dtype, floor, seed)
    with pytest.raises(AssertionError, match="beyond tolerance"):
        compare(op, (_OffBy(py, 1.01 if dtype == F32 else 1 + 1e-6),), inputs, dy, dtype, floor, seed)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("op, name", pair_params())
def test_constant_rows_agree(op, name, dtype, dev):
    """Equal values in every row (zero variance): y = 0 (or beta), and eps decides dx. Rows of
    0.75 + 0.25 i over N = 64 keep every sum exact in every dtype, so the variance is exactly 0. dy is
    scaled by 1/64: where the max(std, eps) floor holds, dx = (g - mean(g)) / eps is about 1e5 |dy|,
    which would overflow float16 (max 65504) at |dy| ~ 1."""
    jl, py = require(op, name, dev)
    m, n = 8, 64
    gen, seed = fresh_generator()
    inputs = registry.OPS[op].make_inputs((m, n), dtype, dev, gen)
    rows = 0.75 + 0.25 * torch.arange(m, dtype=F64)
    inputs["x"] = rows[:, None].expand(m, n).to(device=dev, dtype=dtype).contiguous()
    dy = (torch.randn((m, n), dtype=F64, generator=gen) / 64).to(device=dev, dtype=dtype)
    compare(op, (jl, py), inputs, dy, dtype, seed=seed)


@pytest.mark.parametrize("op, name", pair_params())
def test_non_contiguous_input_crosses_as_a_copy(op, name):
    """A transposed view is made contiguous by the bridge (one copy) and gives the same result."""
    jl, py = require(op, name, "cpu")
    gen, seed = fresh_generator()
    inputs = registry.OPS[op].make_inputs((24, 48), F32, "cpu", gen)
    inputs["x"] = inputs["x"].T.contiguous().T  # the same (24, 48) values, strides (1, 24)
    assert not inputs["x"].is_contiguous()
    dy = torch.randn((24, 48), dtype=F64, generator=gen).float()
    compare(op, (jl, py), inputs, dy, F32, seed=seed)


@pytest.mark.parametrize("op, name", pair_params())
def test_julia_entry_passes_the_registry_check(op, name):
    """The same check ``crossfuse check`` runs (crossfuse.check.run_case), on the Julia entry."""
    require(op, name, "cpu")
    res = run_case(JULIA[(op, name)], (24, 80), F32, "cpu")
    assert res.status == "pass", res.summary()


RESULT_FIELDS = ("op", "impl", "side", "peer", "device", "device_name", "dtype", "shape", "causal", "mode",
                 "ms_p20", "ms_p50", "ms_p80", "gbps", "tflops", "alloc_bytes", "peak_bytes", "relerr",
                 "versions", "timestamp")  # the shared result schema (DESIGN.md)


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("op, name", pair_params())
def test_julia_measures_itself_in_the_shared_schema(op, name, mode):
    require(op, name, "cpu")
    row = JULIA[(op, name)].measure((16, 64), F32, "cpu", mode, {"repeats": 3, "warmup": 1})
    assert set(RESULT_FIELDS) <= set(row), set(RESULT_FIELDS) - set(row)
    assert (row["op"], row["impl"], row["side"], row["mode"]) == (op, name, "julia", mode)
    assert (row["device"], row["dtype"], row["shape"]) == ("cpu", "float32", "16x64")
    assert row["peer"] is False
    assert 0 < row["ms_p20"] <= row["ms_p50"] <= row["ms_p80"]
    assert row["gbps"] > 0 and row["alloc_bytes"] >= 0
    assert 0 <= row["relerr"] < 1e-3
