"""The bridge's Julia entries, tested without Julia: registration, their behaviour when the Julia side
is off or fails to start, input checks, the array layout mapping (torch ``(M, N)`` = Julia ``N×M``),
and the declared Julia side (juliapkg.json, the Julia package's Project.toml, the glue file).
No test here starts Julia or imports juliacall.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import crossfuse_julia
import numpy as np
import pytest
import torch
from _bridge_env import BRIDGE, DETECTION_LIMIT_S, ROOT
from crossfuse import registry
from crossfuse.check import run_case
from crossfuse_julia import _detect, arrays, session
from crossfuse_julia.ops import JuliaVariant
from crossfuse_julia.registry import VARIANTS, variants

# ----------------------------------------------------------------------------------------------------
# the Julia entries when Julia is off
# ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def julia_registered():
    """The Julia entries, registered through the entry point when crossfuse is installed, else directly
    (``register`` is idempotent), so the bridge's logic is tested either way."""
    if not registry.implementations(side="julia"):
        from crossfuse_julia.registry import register

        register(registry)


def julia_entries():
    return registry.implementations(side="julia")


def test_the_plugin_entry_point_is_declared():
    eps = importlib.metadata.entry_points(group="crossfuse.implementations")
    if not list(eps):
        pytest.skip("crossfuse is not installed (pip install -e .): no entry points to check")
    assert {ep.name: ep.value for ep in eps}.get("julia") == "crossfuse_julia.registry:register"


def test_every_julia_variant_is_registered_with_its_callables():
    got = {(i.op, i.name): i for i in julia_entries()}
    want = {(v.op, v.name) for v in variants()}
    assert set(got) == want
    assert want == {("normalise", "normal_now"), ("normalise", "normal_new"), ("normalise", "normal_newer"),
                    ("layer_norm", "layernorm"), ("layer_norm_maxstd", "layer_norm")}
    python_side = {(i.op, i.name) for i in registry.implementations(side="python")}
    for key, impl in got.items():
        assert impl.side == "julia" and impl.kernel == "julia"
        assert impl.vjp is not None and impl.measure is not None and impl.check_available is not None
        assert "cpu" in impl.devices
        assert key in python_side, f"{key} has no Python twin"


def test_registration_never_starts_julia():
    # in a fresh process: through the entry point where crossfuse is installed, else (a checkout on
    # PYTHONPATH, as on the GPU machine) by calling the plugin's register as the entry point would
    installed = bool(list(importlib.metadata.entry_points(group="crossfuse.implementations")))
    setup = "" if installed else "from crossfuse_julia.registry import register; register(registry); "
    code = ("import sys; from crossfuse import registry; " + setup
            + "impls = registry.implementations(side='julia'); "
            "print(len(impls), 'juliacall' in sys.modules, 'crossfuse_julia.session' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(len(variants())), "False", "True"]


def test_julia_entries_declare_no_bfloat16(isolated, monkeypatch):
    # NumPy (the CPU path) and DLPack.jl (the GPU path) cannot carry bfloat16: the entries leave it out, so
    # `crossfuse check` skips it with that reason rather than reporting the TypeError as an error
    entries = julia_entries()
    assert entries
    for impl in entries:
        assert set(impl.dtypes) == {torch.float32, torch.float64, torch.float16}, impl.key
    monkeypatch.setattr(_detect, "_CACHE", _detect.Detection(None, "/fake/julia", (1, 11, 0), "PATH"))
    monkeypatch.setattr(session, "_SESSION", None)
    for impl in entries:  # Julia looks available: the dtype is the reason
        assert impl.unavailable_reason("cpu", torch.float32) is None
        assert "no bfloat16 support" in impl.unavailable_reason("cpu", torch.bfloat16), impl.key


def test_registering_twice_is_harmless():
    from crossfuse_julia.registry import register

    before = {i.key for i in julia_entries()}
    register(registry)
    assert {i.key for i in julia_entries()} == before


@pytest.fixture
def julia_off(isolated, monkeypatch):
    monkeypatch.setenv("CROSSFUSE_JULIA", "0")
    return "CROSSFUSE_JULIA=0 turns the Julia side off"


@pytest.mark.parametrize("key", [f"{op}/julia/{name}" for op, v in VARIANTS.items() for name, _ in v])
def test_julia_entries_raise_and_skip_with_the_reason_when_off(julia_off, key):
    op_name, _, name = key.split("/")
    impl = registry.get(op_name, name, side="julia")
    op = registry.OPS[op_name]
    inputs = op.make_inputs((4, 8), torch.float32)
    assert impl.unavailable_reason("cpu") == julia_off
    with pytest.raises(crossfuse_julia.JuliaUnavailable, match=re.escape(julia_off)):
        impl.fn(**inputs)
    with pytest.raises(crossfuse_julia.JuliaUnavailable, match=re.escape(julia_off)):
        impl.vjp(inputs, torch.randn(4, 8))
    with pytest.raises(crossfuse_julia.JuliaUnavailable, match=re.escape(julia_off)):
        impl.measure((4, 8), torch.float32, "cpu", "fwd", {})
    res = run_case(impl, (4, 8), torch.float32)
    assert (res.status, res.reason) == ("skip", julia_off)


def test_julia_failing_to_start_is_a_skip_not_an_error(isolated):
    """Julia found (so the entry looks available) but failing at its first call, e.g. CrossFuse not
    resolvable: ``crossfuse check`` shows that case as skipped with the reason, not as the entry's
    error."""
    reason = "juliapkg could not resolve CrossFuse (simulated)"

    def fails(**_):
        raise crossfuse_julia.JuliaUnavailable(reason)

    impl = dataclasses.replace(
        julia_entries()[0], fn=fails, vjp=lambda *_: fails(), check_available=lambda _device: None
    )
    for grads in (True, False):
        res = run_case(impl, (4, 8), torch.float32, grads=grads)
        assert (res.status, res.reason) == ("skip", reason)


@pytest.mark.parametrize("value", ["inf", "nan", "1e400", "0", "-5", "ten"])
def test_a_setup_timeout_that_is_no_positive_number_is_a_clear_error(value, isolated, monkeypatch):
    monkeypatch.setenv("CROSSFUSE_JULIA_SETUP_TIMEOUT", value)
    with pytest.raises(crossfuse_julia.JuliaUnavailable, match="is not a number of seconds > 0"):
        session.setup_timeout()


@pytest.mark.parametrize(
    "exc, words",
    [
        (OverflowError("cannot convert float infinity to integer"), "OverflowError: cannot convert"),
        (crossfuse_julia.JuliaUnavailable("juliapkg could not resolve CrossFuse (simulated)"),
         "juliapkg could not resolve CrossFuse"),
    ],
    ids=["unexpected", "unavailable"],
)
def test_an_unexpected_failure_at_start_is_unavailable_and_kept(isolated, monkeypatch, exc, words):
    """Any exception while Julia starts (the bridge's own or any other) becomes JuliaUnavailable, and is
    kept: later calls get the same reason without starting (resolving packages, …) again."""
    starts = []

    def boom():
        starts.append(1)
        raise exc

    monkeypatch.setattr(_detect, "_CACHE", _detect.Detection(None, "/fake/julia", (1, 11, 0), "PATH"))
    monkeypatch.setattr(session, "_start", boom)
    monkeypatch.setattr(session, "_SESSION", None)
    for _ in range(2):
        with pytest.raises(crossfuse_julia.JuliaUnavailable, match=re.escape(words)):
            session.get()
    assert starts == [1] and words in session.failure()
    assert words in crossfuse_julia.unavailable_reason()


def test_a_resolve_child_that_fails_with_status_1_fails_the_start_once(isolated, monkeypatch):
    """A resolve child that exits with status 1 (a Python traceback: juliapkg missing or broken) is a failed
    start, kept: the resolve (up to CROSSFUSE_JULIA_SETUP_TIMEOUT, 1800 s by default) is not run again."""
    resolves = []
    resolve = session.resolve_packages
    failing = [sys.executable, "-c", "import juliapkg_not_here"]

    def resolve_failing():
        resolves.append(1)
        resolve(10.0, cmd=failing)

    monkeypatch.setattr(_detect, "_CACHE", _detect.Detection(None, "/fake/julia", (1, 11, 0), "PATH"))
    monkeypatch.setattr(session, "resolve_packages", resolve_failing)
    monkeypatch.setattr(session, "_SESSION", None)
    monkeypatch.setitem(sys.modules, "juliacall", None)  # never the real one: no Julia starts here
    failed = re.escape("(juliapkg.resolve) failed with status 1")
    for _ in range(2):
        with pytest.raises(crossfuse_julia.JuliaUnavailable, match=failed):
            session.get()
    assert resolves == [1]
    assert "ModuleNotFoundError: No module named 'juliapkg_not_here'" in session.failure()


def test_a_cuda_flag_that_is_no_flag_is_named_in_the_reason(isolated, monkeypatch):
    from crossfuse_julia import ops

    monkeypatch.setenv("CROSSFUSE_JULIA_CUDA", "2")
    monkeypatch.setattr(_detect, "_CACHE", _detect.Detection(None, "/fake/julia", (1, 11, 0), "PATH"))
    assert not session.cuda_requested()
    reason = ops.unavailable_reason("cuda")
    assert "CROSSFUSE_JULIA_CUDA='2': expected one of" in reason, reason


def test_julia_entries_skip_fast_when_julia_is_absent(isolated):
    """What ``crossfuse check`` pays for the Julia entries on a machine without Julia."""
    t0 = time.monotonic()
    dtypes = (torch.float32, torch.float64)
    results = [run_case(impl, (4, 8), dtype) for impl in julia_entries() for dtype in dtypes]
    seconds = time.monotonic() - t0
    assert {r.status for r in results} == {"skip"}
    assert all("no Julia executable found" in r.reason for r in results)
    assert seconds < DETECTION_LIMIT_S


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_default_eps_is_the_machine_epsilon_for_normalise_and_1e_5_for_layer_norm(dtype):
    # normalise's Python twins default to eps = finfo(x.dtype).eps; the affine ops to torch's 1e-5
    x = torch.randn(4, 8).to(dtype)
    for name in ("normal_now", "normal_new", "normal_newer"):
        *_, eps = JuliaVariant("normalise", name)._prepare(x, None, None, None)
        assert eps == torch.finfo(dtype).eps
    for op, name in (("layer_norm", "layernorm"), ("layer_norm_maxstd", "layer_norm")):
        *_, eps = JuliaVariant(op, name)._prepare(x, None, None, None)
        assert eps == 1e-5


def test_bad_inputs_are_refused_before_julia_is_asked(julia_off):
    v = JuliaVariant("layer_norm", "layernorm")
    x = torch.randn(4, 8)
    with pytest.raises(TypeError, match="bfloat16 cannot cross to Julia: NumPy has no bfloat16"):
        v.forward(x.bfloat16(), None, None, 1e-5)
    with pytest.raises(TypeError, match="int64 cannot cross to Julia"):
        v.forward(torch.ones(4, 8, dtype=torch.int64), None, None, 1e-5)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        v.forward(x, torch.ones(7), None, 1e-5)
    with pytest.raises(ValueError, match="eps must be positive"):
        v.forward(x, None, None, 0.0)
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor"):
        v.forward(x.numpy(), None, None, 1e-5)
    with pytest.raises(ValueError, match="normalise takes no weight"):
        JuliaVariant("normalise", "normal_new").forward(x, torch.ones(8), None, 1e-5)
    with pytest.raises(ValueError, match="mode must be"):
        v.measure((4, 8), torch.float32, "cpu", "backward", {})


# Bad inputs for the bridge's Python API, each refused with a TypeError or ValueError naming the argument
# before Julia is asked (the fixture julia_off turns Julia off: a check that came too late would raise
# JuliaUnavailable instead). (entry point, arguments, exception, words in its message)
X = torch.randn(4, 8)
META = torch.device("meta")
LN, NORM = JuliaVariant("layer_norm", "layernorm"), JuliaVariant("normalise", "normal_new")
MAXSTD = JuliaVariant("layer_norm_maxstd", "layer_norm")


def _fwd(v, x=X, weight=None, bias=None, eps=1e-5):
    return lambda: v.forward(x, weight, bias, eps)


def _vjp(v, dy, **inputs):
    return lambda: v.vjp({"x": X, **inputs}, dy)


BAD_INPUTS = {
    # dtype
    "x bfloat16": (_fwd(LN, X.bfloat16()), TypeError, "bfloat16 cannot cross to Julia"),
    "x int64": (_fwd(LN, torch.ones(4, 8, dtype=torch.int64)), TypeError, "int64 cannot cross"),
    "x bool": (_fwd(NORM, torch.ones(4, 8, dtype=torch.bool)), TypeError, "bool cannot cross"),
    "x complex64": (_fwd(LN, torch.ones(4, 8, dtype=torch.complex64)), TypeError, "complex64 cannot cross"),
    "weight float64, x float32": (_fwd(LN, weight=torch.ones(8, dtype=torch.float64)), ValueError,
                                  "weight must have shape (8,) and dtype torch.float32"),
    "bias bfloat16": (_fwd(MAXSTD, bias=torch.ones(8, dtype=torch.bfloat16)), TypeError, "bias: bfloat16"),
    "dy float64, x float32": (_vjp(LN, torch.randn(4, 8, dtype=torch.float64)), ValueError, "dy must have"),
    # device
    "x on meta": (_fwd(LN, torch.ones(4, 8, device=META)), ValueError, "the Julia bridge takes cpu and cuda"),
    "weight on another device": (_fwd(LN, weight=torch.ones(8, device=META)), ValueError,
                                 "weight is on meta"),
    "dy on another device": (_vjp(LN, torch.ones(4, 8, device=META)), ValueError, "dy is on meta"),
    # shape
    "x 0-d": (_fwd(LN, torch.tensor(1.0)), ValueError, "at least one dimension"),
    "weight too short": (_fwd(LN, weight=torch.ones(7)), ValueError, "weight must have shape (8,)"),
    "weight 2-d": (_fwd(MAXSTD, weight=torch.ones(1, 8)), ValueError, "weight must have shape (8,)"),
    "bias too long": (_fwd(LN, bias=torch.ones(9)), ValueError, "bias must have shape (8,)"),
    "dy of another shape": (_vjp(NORM, torch.randn(8, 4)), ValueError, "dy must have x's shape (4, 8)"),
    "weight for normalise": (_fwd(NORM, weight=torch.ones(8)), ValueError, "normalise takes no weight"),
    "bias for normalise": (_fwd(NORM, bias=torch.ones(8)), ValueError, "normalise takes no bias"),
    # NaN and Inf where a number belongs (in the data they propagate, as in torch)
    "eps NaN": (_fwd(LN, eps=math.nan), ValueError, "eps must be positive and finite"),
    "eps inf": (_fwd(LN, eps=math.inf), ValueError, "eps must be positive and finite"),
    "eps 0": (_fwd(NORM, eps=0.0), ValueError, "eps must be positive and finite"),
    "eps negative": (_fwd(MAXSTD, eps=-1e-5), ValueError, "eps must be positive and finite"),
    # wrong types
    "x a list": (_fwd(LN, [[1.0] * 8] * 4), TypeError, "x must be a torch.Tensor, got list"),
    "x a numpy array": (_fwd(LN, np.ones((4, 8))), TypeError, "x must be a torch.Tensor, got ndarray"),
    "weight a list": (_fwd(LN, weight=[1.0] * 8), TypeError, "weight must be a torch.Tensor"),
    "dy a numpy array": (_vjp(LN, np.ones((4, 8))), TypeError, "dy must be a torch.Tensor"),
    "eps a string": (_fwd(LN, eps="1e-5"), TypeError, "eps must be a real number, got str"),
    "eps True": (_fwd(LN, eps=True), TypeError, "eps must be a real number, got bool"),
    "eps a tensor": (_fwd(LN, eps=torch.tensor(1e-5)), TypeError, "eps must be a real number, got Tensor"),
    "measure mode": (lambda: LN.measure((4, 8), torch.float32, "cpu", "backward", {}), ValueError,
                     "mode must be"),
    "layout of a 0-d shape": (lambda: arrays.julia_layout(()), ValueError, "at least one dimension"),
    "host view of a non-contiguous tensor": (lambda: arrays.host_view(X.T), ValueError, "contiguous"),
    "host vector of a 2-d tensor": (lambda: arrays.host_vector(X), ValueError, "1-D"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_inputs_of_the_bridge_are_refused_naming_the_argument(julia_off, case):
    call, exc, words = BAD_INPUTS[case]
    with pytest.raises(exc, match=re.escape(words)):
        call()


@pytest.mark.parametrize("v", [LN, NORM, MAXSTD], ids=lambda v: v.op)
@pytest.mark.parametrize("shape", [(0, 8), (4, 0), (2, 0, 8)])
def test_empty_inputs_give_empty_results_without_julia(julia_off, v, shape):
    """As torch does (layer_norm of an empty batch is empty): no Julia needed, so none is asked."""
    x = torch.randn(shape)
    affine = {"weight": torch.ones(shape[-1]), "bias": torch.zeros(shape[-1])} if v.affine else {}
    out = v.forward(x, affine.get("weight"), affine.get("bias"), None)
    assert out.shape == x.shape and out.dtype == x.dtype
    out, grads = v.vjp({"x": x, **affine}, torch.randn(shape))
    assert out.shape == x.shape and grads["x"].shape == x.shape
    for k, t in affine.items():
        assert grads[k].shape == t.shape and not grads[k].any()


def test_non_contiguous_and_strided_inputs_are_accepted_as_copies():
    """Strides are no bad input: a transposed or expanded tensor crosses as a contiguous copy."""
    for t in (X.T.contiguous().T, torch.ones(8).expand(4, 8), X[:, ::2]):
        p = arrays.prepare(t, "x")
        assert p.is_contiguous() and torch.equal(p, t)


# ----------------------------------------------------------------------------------------------------
# layout: torch (M, N) row-major = Julia N×M column-major, features on dims=1
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, n, m",
    [
        ((5, 7), 7, 5),
        ((2, 3, 4), 4, 6),  # leading dims flatten into the rows
        ((1, 9), 9, 1),  # one row
        ((6, 1), 1, 6),  # one feature
        ((11,), 11, 1),  # a vector is one row
    ],
)
def test_julia_layout(shape, n, m):
    lay = arrays.julia_layout(shape)
    assert (lay.features, lay.rows) == (n, m)
    assert lay.julia_size == (n, m)  # the shape reversed (after flattening the leading dims)
    assert lay.julia_strides == (1, n)  # column-major: consecutive features are adjacent
    assert lay.torch_strides == (n, 1)  # the same memory seen row-major
    assert lay.dims == 1


def test_julia_layout_refuses_a_scalar():
    with pytest.raises(ValueError, match="at least one dimension"):
        arrays.julia_layout(())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("shape", [(5, 7), (2, 3, 4), (1, 9), (6, 1)])
def test_host_view_is_the_julia_array_on_the_same_memory(shape, dtype):
    t = torch.randn(shape, dtype=torch.float64).to(dtype)
    v = arrays.host_view(t)
    lay = arrays.julia_layout(shape)
    item = t.element_size()
    assert v.shape == lay.julia_size
    assert v.ctypes.data == t.data_ptr()  # same buffer: no copy
    assert v.flags.f_contiguous  # column-major, as Julia reads it
    assert v.strides == tuple(s * item for s in lay.julia_strides)
    assert v.dtype == np.dtype(str(dtype).removeprefix("torch."))
    rows = t.reshape(lay.rows, lay.features)
    np.testing.assert_array_equal(v.T, rows.numpy())  # Julia's x[j, i] is torch's x[i, j]
    v[0, 0] = 42  # writes through: one buffer
    assert rows[0, 0].item() == 42


def test_host_vector_is_a_view():
    w = torch.randn(8)
    assert arrays.host_vector(w).ctypes.data == w.data_ptr()
    with pytest.raises(ValueError, match="1-D"):
        arrays.host_vector(torch.randn(2, 4))


@pytest.mark.parametrize("shape", [(5, 7), (2, 3, 4), (1, 9), (6, 1)])
def test_from_host_views_a_column_major_result(shape):
    lay = arrays.julia_layout(shape)
    # a result as Julia lays it out: N×M, column-major
    julia_result = np.asfortranarray(np.random.default_rng().standard_normal(lay.julia_size))
    t = arrays.from_host(julia_result, shape, torch.float64)
    assert t.shape == shape
    assert t.is_contiguous()
    assert t.data_ptr() == julia_result.ctypes.data  # zero copy
    np.testing.assert_array_equal(t.reshape(lay.rows, lay.features).numpy(), julia_result.T)


def test_round_trip_through_the_julia_layout_keeps_the_buffer():
    t = torch.randn(3, 4, 5)
    back = arrays.from_host(arrays.host_view(t), t.shape, t.dtype)
    assert back.data_ptr() == t.data_ptr()
    assert torch.equal(back, t)


def test_from_host_checks_the_size_and_copies_read_only_memory():
    a = np.asfortranarray(np.arange(12.0).reshape(4, 3))
    with pytest.raises(ValueError, match=r"Julia returned an array of size \(4, 3\), expected \(3, 4\)"):
        arrays.from_host(a, (4, 3), torch.float64)
    a.flags.writeable = False
    t = arrays.from_host(a, (3, 4), torch.float64)
    assert t.data_ptr() != a.ctypes.data
    np.testing.assert_array_equal(t.numpy(), a.T)
    assert arrays.from_host(np.asfortranarray(a), (3, 4), torch.float32).dtype == torch.float32
    v = np.arange(5.0)
    tv = arrays.vector_from_host(v, 5, torch.float64)
    assert tv.data_ptr() == v.ctypes.data
    with pytest.raises(ValueError, match="expected"):
        arrays.vector_from_host(v, 6, torch.float64)


def test_prepare_makes_inputs_contiguous_and_detached():
    base = torch.randn(6, 4, requires_grad=True)
    x = base.T  # non-contiguous: prepare copies it once (documented)
    p = arrays.prepare(x, "x")
    assert p.is_contiguous() and not p.requires_grad
    assert torch.equal(p, x.detach())
    c = torch.randn(3, 5)
    assert arrays.prepare(c, "x").data_ptr() == c.data_ptr()  # contiguous: no copy
    with pytest.raises(ValueError, match="weight is on"):
        arrays.prepare(c, "weight", torch.device("meta"))


def test_supported_dtypes_and_the_bfloat16_reason():
    for dtype in (torch.float32, torch.float64, torch.float16):
        assert arrays.dtype_reason(dtype) is None
    reason = arrays.dtype_reason(torch.bfloat16)
    assert "NumPy has no bfloat16" in reason and "DLPack.jl" in reason
    with pytest.raises(TypeError):  # what NumPy itself does: the reason is real
        torch.ones(2, dtype=torch.bfloat16).numpy()


# ----------------------------------------------------------------------------------------------------
# the declared Julia side
# ----------------------------------------------------------------------------------------------------


def julia_project_toml() -> str:
    return (ROOT / "julia" / "Project.toml").read_text()


def test_juliapkg_json_declares_crossfuse_from_the_checkout():
    spec = json.loads((BRIDGE / "juliapkg.json").read_text())
    uuid_re = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
    crossfuse = spec["packages"]["CrossFuse"]
    assert crossfuse["dev"] is True
    assert (BRIDGE / crossfuse["path"]).resolve() == (ROOT / "julia").resolve()  # relative to the json
    assert _detect.crossfuse_julia_dir() == (ROOT / "julia").resolve()
    project_uuid = re.search(r'^uuid\s*=\s*"([^"]+)"', julia_project_toml(), re.M)[1]
    assert crossfuse["uuid"] == project_uuid
    for name, pkg in spec["packages"].items():
        assert not name.endswith(".jl")
        assert uuid_re.match(pkg["uuid"]), name
        assert "version" in pkg or pkg.get("dev"), f"{name} has no compat bound"
    assert {"Zygote", "DLPack"} <= set(spec["packages"])
    assert "CUDA" not in spec["packages"]  # only on request (CROSSFUSE_JULIA_CUDA=1)
    assert spec["julia"]


def test_juliapkg_json_is_valid_for_juliapkg():
    deps = pytest.importorskip("juliapkg.deps", reason="juliapkg (installed with juliacall) is not installed")
    compat = pytest.importorskip("juliapkg.compat")
    spec = json.loads((BRIDGE / "juliapkg.json").read_text())
    compat.Compat.parse(spec["julia"])
    for name, pkg in spec["packages"].items():
        deps.PkgSpec(name, **pkg)
        if "version" in pkg:
            compat.Compat.parse(pkg["version"])


def test_cuda_request_matches_the_julia_packages_compat():
    toml = julia_project_toml()
    assert session.CUDA_UUID in toml
    compat = re.search(r'^CUDA\s*=\s*"([^"]+)"', toml.split("[compat]", 1)[1], re.M)[1]
    assert session.CUDA_COMPAT == compat


def test_glue_file_passes_fatou():
    fatou = shutil.which("fatou") or shutil.which("fatou", path=str(Path(sys.executable).parent))
    if fatou is None:
        pytest.skip("fatou (the Julia linter and formatter, pip install fatou) is not installed")
    glue = str(BRIDGE / "CrossFuseBridge.jl")
    for args in (["lint", glue], ["format", "--check", glue]):
        proc = subprocess.run([fatou, *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_glue_names_every_registered_variant():
    glue = (BRIDGE / "CrossFuseBridge.jl").read_text()
    for v in variants():
        assert f'"{v.name}" => CrossFuse.{v.name}' in glue
    for op in VARIANTS:
        assert f"apply(::Val{{:{op}}}" in glue


def test_the_wheel_ships_juliapkg_json_and_the_julia_package(tmp_path):
    """A wheel carries juliapkg.json and the Julia package it points at (crossfuse_julia/julia, a link to
    julia/ in the checkout): detection finds it there. Built offline from a copy of the sources."""
    pytest.importorskip("setuptools", reason="setuptools (the build backend) is not installed")
    import zipfile

    src = tmp_path / "src"
    (src / "julia").mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE", "julia/Project.toml"):
        shutil.copy(ROOT / name, src / name)
    skip = shutil.ignore_patterns("__pycache__")
    for name in ("python", "bridge", "julia/src", "julia/ext"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=skip)
    assert (src / "bridge" / "crossfuse_julia" / "julia").is_symlink()
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
           str(tmp_path / "dist"), str(src)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (tmp_path / "dist").glob("crossfuse-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("juliapkg.json", "CrossFuseBridge.jl", "julia/Project.toml", "julia/src/CrossFuse.jl",
                 "julia/src/stats.jl", "julia/ext/CrossFuseCUDAExt.jl"):  # fmt: skip
        assert f"crossfuse_julia/{name}" in names, name
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    assert _detect.package_reason(site / "crossfuse_julia" / "juliapkg.json") is None

