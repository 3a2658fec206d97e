"""The fused Triton layer norm (crossfuse.layer_norm, crossfuse.nn.LayerNorm) against float64."""

from __future__ import annotations

import glob
import math
import os
import shutil
import subprocess
import sys

import crossfuse
import pytest
import torch
import triton
from crossfuse.ops import layer_norm as ln_mod
from crossfuse.reference import layer_norm as single_pass_layer_norm
from crossfuse.reference import layer_norm_maxstd_ref, layer_norm_ref
from crossfuse.tolerances import relerr, tolerance

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def randn(shape, dtype, device, gen, mean=0.0, std=1.0):
    return (torch.randn(shape, dtype=torch.float64, generator=gen) * std + mean).to(
        device=device, dtype=dtype
    )


# dw and db of the fused kernels are sums over rows in float32, rounded once to the parameter's dtype:
# in 16 bits their error is that rounding, flat in the row count, where the registry's "reduced"
# tolerance grows with sqrt(M) (it also covers peers that sum in 16 bits). The bounds are an ulp or two (a
# single element rounds by up to that under the interpreter, whose conversions may truncate: 4.9e-3
# seen for a one-element db in bfloat16). A row left out of the sums moves them by about 1/sqrt(M)
# (random signs): these bounds catch it up to M ~ 16000 in bfloat16, 250000 in float16.
FLOAT32_SUMS = {torch.float16: 2.0**-9, torch.bfloat16: 2.0**-7}


def ln_tol(x_dtype, kind, rows, grad_dtype=None):
    """The tolerance of a fused layer-norm output or gradient (see FLOAT32_SUMS)."""
    tol = tolerance("layer_norm", x_dtype, kind, rows)
    if kind == "reduced":
        tol = min(tol, FLOAT32_SUMS.get(grad_dtype or x_dtype, tol))
    return tol


def check_against_reference(x, weight, bias, eps=1e-5, gen=None):
    """Forward and gradients of the fused kernel vs the float64 reference, with per-dtype tolerances."""
    n = x.shape[-1]
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None for t in (x, weight, bias)]
    y = crossfuse.layer_norm(leaves[0], (n,), leaves[1], leaves[2], eps)
    dy = torch.randn(y.shape, dtype=torch.float64, generator=gen).to(device=y.device, dtype=y.dtype)
    y.backward(dy)
    refs = [t.detach().double().requires_grad_(True) if t is not None else None for t in (x, weight, bias)]
    y_ref = layer_norm_ref(refs[0], refs[1], refs[2], eps)
    y_ref.backward(dy.double())
    rows = max(1, x.numel() // n)
    assert y.dtype == x.dtype and y.shape == x.shape
    errors = {"y": (relerr(y, y_ref), tolerance("layer_norm", x.dtype, "fwd"))}
    kinds = ("bwd", "reduced", "reduced")
    for name, got, ref, kind in zip(("x", "weight", "bias"), leaves, refs, kinds, strict=True):
        if got is None:
            continue
        assert got.grad is not None and got.grad.dtype == got.dtype, name
        errors["d" + name] = (relerr(got.grad, ref.grad), ln_tol(x.dtype, kind, rows, got.grad.dtype))
    if n == 1:
        # one feature: dx is exactly 0 (y == bias whatever x is), so a relative error is undefined.
        # On GPUs the compiler contracts g - mean(g) into an fma, leaving g's rounding error, which
        # rstd = 1/sqrt(eps) ~ 316 magnifies (seen on the H200: |dx| ~ 1.7e-5 |dy|; torch: 6e-5):
        # bound it against dy instead
        dx_err = errors.pop("dx")[0]
        assert dx_err <= 1e-4 * torch.linalg.vector_norm(dy.double()).item(), dx_err
    bad = {k: v for k, v in errors.items() if not v[0] <= v[1]}
    assert not bad, f"relative error over tolerance (error, tolerance): {bad}"
    return errors


def check_backward_and_repeat(got, dy, x, w, w_ref, mean, rstd, grads, cfg):
    """``got`` = layer_norm_bwd(dy, x, w, mean, rstd, *grads, config=cfg) against float64 autograd of the
    reference with weight ``w_ref`` (dx, and dw/db where ``grads`` asks, else None), each within its
    tolerance; then the same call again gives the same gradients bit for bit."""
    m, n = x.shape
    leaves = [t.double().requires_grad_(True) for t in (x, w_ref, torch.zeros(n, device=x.device))]
    layer_norm_ref(*leaves, 1e-5).backward(dy.double())
    for i, (kind, want) in enumerate(zip(("bwd", "reduced", "reduced"), (True, *grads), strict=True)):
        if not want:
            assert got[i] is None
            continue
        tol = ln_tol(x.dtype, kind, m, got[i].dtype)
        assert relerr(got[i], leaves[i].grad) <= tol, (i, relerr(got[i], leaves[i].grad), tol)
    again = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, *grads, config=cfg)
    for a, b in zip(got, again, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


# Shapes, each with the reason it is here.
SHAPES = [
    pytest.param((64, 256), id="plain"),
    pytest.param((7, 1), id="N=1: zero variance by construction, y == bias, dx == 0"),
    pytest.param((9, 97), id="prime N: masked tail columns in every row"),
    pytest.param((1, 1000), id="single row: one program, one tile"),
    pytest.param((129, 64), id="rows not a multiple of BLOCK_M: masked tail rows, several rows per program"),
    pytest.param((3, ln_mod.FUSED_MAX_N), id="largest row kept whole in registers"),
    pytest.param((2, ln_mod.FUSED_MAX_N + 3), id="N above the fused limit: chunked kernels"),
    pytest.param((2, 5, 33), id="3-D input: leading dims flattened into rows"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_float64_reference(shape, dtype, device, gen):
    n = shape[-1]
    x = randn(shape, dtype, device, gen)
    weight = randn((n,), dtype, device, gen, mean=1.0, std=0.5)
    bias = randn((n,), dtype, device, gen, std=0.5)
    check_against_reference(x, weight, bias, gen=gen)


@pytest.mark.parametrize(
    "affine", [(True, False), (False, True), (False, False)], ids=["weight only", "bias only", "neither"]
)
def test_weight_and_bias_each_optional(affine, device, gen):
    x = randn((33, 120), torch.float32, device, gen)
    weight = randn((120,), torch.float32, device, gen, mean=1.0) if affine[0] else None
    bias = randn((120,), torch.float32, device, gen) if affine[1] else None
    check_against_reference(x, weight, bias, gen=gen)


def test_weight_in_float32_with_bfloat16_input(device, gen):
    # mixed-precision training keeps parameters in float32: gradients come back in the parameter dtype
    x = randn((16, 200), torch.bfloat16, device, gen)
    w = randn((200,), torch.float32, device, gen, mean=1.0).requires_grad_(True)
    b = randn((200,), torch.float32, device, gen).requires_grad_(True)
    y = crossfuse.layer_norm(x, (200,), w, b)
    assert y.dtype == torch.bfloat16
    dy = randn((16, 200), torch.bfloat16, device, gen)
    y.backward(dy)
    assert w.grad.dtype == torch.float32 and b.grad.dtype == torch.float32
    # their values: float32 sums of the same products as float64's, so float32 sums' error
    refs = [t.detach().double().requires_grad_(True) for t in (w, b)]
    layer_norm_ref(x.double(), *refs, 1e-5).backward(dy.double())
    for got, ref in zip((w.grad, b.grad), refs, strict=True):
        assert relerr(got, ref.grad) <= tolerance("layer_norm", torch.float32, "reduced", 16)


def test_strided_rows_read_without_copy(device, gen):
    # rows 300 apart in memory, 200 used: reshape gives a view, the kernel reads it in place
    base = randn((40, 300), torch.float32, device, gen)
    x = base[:, :200]
    assert ln_mod._rows(x, 200).data_ptr() == x.data_ptr()
    check_against_reference(x, randn((200,), torch.float32, device, gen), None, gen=gen)


def test_non_contiguous_columns(device, gen):
    # a transposed input has no unit column stride: it is copied once, results are unaffected
    x = randn((50, 24), torch.float32, device, gen).t()
    assert not x.is_contiguous()
    check_against_reference(x, None, randn((50,), torch.float32, device, gen), gen=gen)


@pytest.mark.parametrize("which", ["weight", "bias"])
@pytest.mark.parametrize(
    "make",
    [
        lambda t: t.repeat_interleave(2)[::2],  # every other element of a longer vector
        lambda t: torch.stack([t, t * 0, t * 0], dim=1)[:, 0],  # a column of a matrix
        lambda t: t[:1].reshape(()).expand(t.shape[0]),  # one scalar expanded (stride 0)
    ],
    ids=["every other element", "matrix column", "expanded scalar"],
)
def test_strided_weight_and_bias(make, which, device, gen):
    # the kernels read weight[col] at unit stride: a strided parameter is made contiguous first (it was
    # once read as if it had unit stride: wrong y and dx, no error)
    x = randn((12, 40), torch.float32, device, gen)
    p = make(randn((40,), torch.float32, device, gen, mean=1.0))
    assert p.stride(0) != 1
    weight, bias = (p, None) if which == "weight" else (None, p)
    check_against_reference(x, weight, bias, gen=gen)
    # the parameter's gradient arrives through its strided view
    leaf = randn((40,), torch.float32, device, gen, mean=1.0).requires_grad_(True)
    view = make(leaf)
    args = (view, None) if which == "weight" else (None, view)
    crossfuse.layer_norm(x, (40,), *args).square().sum().backward()
    ref_leaf = leaf.detach().double().requires_grad_(True)
    ref_args = (make(ref_leaf), None) if which == "weight" else (None, make(ref_leaf))
    layer_norm_ref(x.double(), *ref_args, 1e-5).square().sum().backward()
    assert relerr(leaf.grad, ref_leaf.grad) <= tolerance("layer_norm", torch.float32, "reduced", 12)


@pytest.mark.parametrize("shape", [(6, 16), (2, 3, 16)], ids=["2-D", "3-D"])
def test_output_can_be_changed_in_place(shape, device, gen):
    # like torch's layer norm: y is no view of an internal tensor, so an in-place op after it (ReLU with
    # inplace=True, y.mul_) is allowed, and the gradient is right
    x = randn(shape, torch.float32, device, gen).requires_grad_(True)
    w = randn((16,), torch.float32, device, gen, mean=1.0)
    y = crossfuse.layer_norm(x, (16,), w)
    assert y._base is None and y.is_contiguous()
    torch.nn.functional.relu(y.mul_(2.0), inplace=True).sum().backward()
    x_ref = x.detach().double().requires_grad_(True)
    torch.relu(layer_norm_ref(x_ref, w.double(), None, 1e-5)).mul(2.0).sum().backward()
    assert relerr(x.grad, x_ref.grad) <= tolerance("layer_norm", torch.float32, "bwd", 6)


def test_differentiating_the_gradient_is_a_clear_error(device, gen):
    # the backward is hand-written and not itself differentiable: create_graph=True must not give a
    # gradient that silently drops the second-order term
    x = randn((4, 8), torch.float32, device, gen).requires_grad_(True)
    w = randn((8,), torch.float32, device, gen, mean=1.0).requires_grad_(True)
    y = crossfuse.layer_norm(x, (8,), w)
    (gx,) = torch.autograd.grad(y.pow(3).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        (y.sum() + gx.square().sum()).backward()


def test_equal_values_in_a_row(device, gen):
    # zero variance: rstd = 1/sqrt(eps), xhat = 0, so y == bias and every value stays finite; the
    # corrected mean makes x - mean exactly 0 (a plain sum/N mean would leave rounding * 316)
    n = 64
    x = randn((5, n), torch.float32, device, gen)
    x[2:] = 0.7134
    x[4] = -3.25e3
    bias = randn((n,), torch.float32, device, gen)
    errors = check_against_reference(x, randn((n,), torch.float32, device, gen), bias, gen=gen)
    assert all(math.isfinite(e) for e, _ in errors.values())


def test_large_mean_keeps_precision_where_single_pass_loses_it(device, gen):
    # rows of 1e4 + randn in float32. The two-pass kernel centres before squaring: its error stays
    # at the level torch's own layer norm has (~5e-4, from the float32 rounding of the mean), so 1e-3
    # is the stated bound. The single-pass form computes E[x^2] - mean^2 ~ 1e8 - 1e8 with a float32
    # spacing of 8 at 1e8 while var ~ 1: the variance is lost entirely, the error is above 1.
    x = randn((16, 1024), torch.float32, device, gen, mean=1e4)
    err_fused = relerr(crossfuse.layer_norm(x, (1024,)), layer_norm_ref(x))
    err_torch = relerr(torch.nn.functional.layer_norm(x.cpu(), (1024,)), layer_norm_ref(x))
    err_single = relerr(single_pass_layer_norm(x.cpu()), layer_norm_maxstd_ref(x))
    assert err_fused <= 1e-3
    assert err_fused <= 3 * err_torch + 1e-6
    assert err_single > 1.0


def test_output_fully_written(device, gen):
    # poison the allocator's next block: every output element must be overwritten by the kernel
    x = randn((37, 130), torch.bfloat16, device, gen)
    torch.full((37 * 130,), float("nan"), dtype=torch.bfloat16, device=device)
    y = crossfuse.layer_norm(x, (130,))
    assert torch.isfinite(y).all()  # and right: finite garbage would pass the line above
    assert relerr(y, layer_norm_ref(x.double(), None, None, 1e-5)) <= tolerance("layer_norm", torch.bfloat16)


@pytest.mark.parametrize("n", [1000, ln_mod.FUSED_MAX_N + 3], ids=["fused", "chunked"])
def test_eps_reaches_every_kernel(n, device, gen):
    # eps far from the default, with rows whose variance is of its size: a kernel keeping 1e-5 is off by
    # tens of percent (the chunked kernels run only above FUSED_MAX_N)
    x = randn((2, n), torch.float32, device, gen, std=0.5)
    check_against_reference(x, randn((n,), torch.float32, device, gen, mean=1.0), None, eps=0.3, gen=gen)


@pytest.mark.parametrize("case", ["plain", "chunked"])
def test_gradcheck_float64(case, device, gen):
    n = 7 if case == "plain" else ln_mod.FUSED_MAX_N + 1
    rows = 4 if case == "plain" else 1
    x = randn((rows, n), torch.float64, device, gen).requires_grad_(True)
    w = randn((n,), torch.float64, device, gen, mean=1.0).requires_grad_(True)
    b = randn((n,), torch.float64, device, gen).requires_grad_(True)
    inputs = (x, w, b) if case == "plain" else (x, w)
    fn = (
        (lambda x, w, b: crossfuse.layer_norm(x, (n,), w, b))
        if case == "plain"
        else (lambda x, w: crossfuse.layer_norm(x, (n,), w, None))
    )
    # the chunked case is large: checking a few output columns through a fast-mode gradcheck
    assert torch.autograd.gradcheck(fn, inputs, fast_mode=case == "chunked")


def test_multi_dim_normalized_shape(device, gen):
    # torch semantics: normalized_shape may cover several trailing dims
    x = randn((3, 4, 5), torch.float32, device, gen)
    w = randn((4, 5), torch.float32, device, gen)
    y = crossfuse.layer_norm(x, (4, 5), w, None)
    ref = torch.nn.functional.layer_norm(x.double(), (4, 5), w.double())
    assert relerr(y, ref) <= tolerance("layer_norm", torch.float32)


def test_empty_batch(device):
    x = torch.empty((0, 16), device=device, requires_grad=True)
    w = torch.ones(16, device=device, requires_grad=True)
    y = crossfuse.layer_norm(x, (16,), w)
    y.sum().backward()
    assert y.shape == (0, 16) and torch.equal(w.grad, torch.zeros(16, device=device))


# ----------------------------------------------------------------------------------------------------
# nn.LayerNorm
# ----------------------------------------------------------------------------------------------------


def test_module_is_a_drop_in_for_torch(device, gen):
    ours = crossfuse.nn.LayerNorm(96, device=device)
    theirs = torch.nn.LayerNorm(96, device=device)
    with torch.no_grad():
        theirs.weight.copy_(randn((96,), torch.float32, device, gen, mean=1.0))
        theirs.bias.copy_(randn((96,), torch.float32, device, gen))
    ours.load_state_dict(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict())
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    x = randn((8, 96), torch.float32, device, gen)
    assert relerr(ours(x), theirs(x)) <= 1e-5
    no_bias = crossfuse.nn.LayerNorm(96, bias=False, elementwise_affine=True, device=device)
    assert no_bias.bias is None and no_bias(x).shape == x.shape
    # eps reaches the op (rows with a variance of eps's size)
    ours = crossfuse.nn.LayerNorm(96, eps=0.3, device=device)
    theirs = torch.nn.LayerNorm(96, eps=0.3, device=device)
    small = randn((8, 96), torch.float32, device, gen, std=0.5)
    assert relerr(ours(small), theirs(small)) <= 1e-5


# ----------------------------------------------------------------------------------------------------
# Bad input: a clear error naming the argument
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, exc, words",
    [
        (lambda d: (torch.ones(4, 8, dtype=torch.int32, device=d), (8,), None, None), TypeError,
         "x has dtype int32"),
        (lambda d: (torch.ones(4, 8, device=d), (8,), torch.ones(7, device=d), None), ValueError,
         "weight has shape"),
        (lambda d: (torch.ones(4, 8, device=d), (8,), None, torch.ones(8, 1, device=d)), ValueError,
         "bias has shape"),
        (lambda d: (torch.ones(4, 8, device=d), (6,), None, None), ValueError, "normalized_shape [6]"),
        (lambda d: (torch.ones(4, 8, device=d), (4, 8, 1), None, None), ValueError, "normalized_shape"),
        (lambda d: (torch.ones(1, ln_mod.MAX_N + 1, device=d), (ln_mod.MAX_N + 1,), None, None), ValueError,
         "supports 1 to"),
        (lambda d: ([[1.0, 2.0]], (2,), None, None), TypeError, "x must be a torch.Tensor"),
        (lambda d: (torch.ones(4, 8, device=d), "8", None, None), TypeError, "normalized_shape must be"),
        (lambda d: (torch.ones(4, 8, device=d), (8,), torch.ones(8, dtype=torch.int64, device=d), None),
         TypeError, "weight has dtype int64"),
        (lambda d: (torch.ones(4, 8, device=d), (8.7,), None, None), TypeError, "normalized_shape must be"),
        (lambda d: (torch.ones(4, 8, device=d).to_sparse(), (8,), None, None), TypeError,
         "x is a torch.sparse_coo tensor"),
    ],
    ids=["integer x", "weight shape", "bias shape", "normalized_shape", "normalized_shape too long",
         "N over limit", "not a tensor", "normalized_shape type", "integer weight",
         "fractional normalized_shape", "sparse x"],
)  # fmt: skip
def test_bad_input_names_the_argument(make, exc, words, device):
    x, shape, w, b = make(device)
    with pytest.raises(exc, match=None) as info:
        crossfuse.layer_norm(x, shape, w, b)
    assert words in str(info.value)


def test_numpy_scalars_are_accepted(device, gen):
    # as by torch's layer norm: numpy's ints and floats for normalized_shape and eps
    np = pytest.importorskip("numpy")
    x = randn((4, 8), torch.float32, device, gen)
    y = crossfuse.layer_norm(x, np.int64(8), eps=np.float32(1e-3))
    assert relerr(y, layer_norm_ref(x.double(), None, None, float(np.float32(1e-3)))) <= 1e-6


@pytest.mark.parametrize("n", [32, 1000, ln_mod.FUSED_MAX_N + 3], ids=["one-tile", "fused", "chunked"])
def test_eps_zero_is_quiet_and_right(n, device, gen):
    # eps = 0 on rows of spread 1: y as torch's. Under the interpreter the padding rows and columns of a
    # tile (masked, never stored) compute 1 / sqrt(0): numpy warned there, where a GPU is silent
    import warnings

    x = randn((3, n), torch.float32, device, gen).requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        y = crossfuse.layer_norm(x, (n,), eps=0.0)
        y.backward(torch.ones_like(y))
    want = layer_norm_ref(x.detach().double(), None, None, 0.0)
    assert relerr(y, want) <= tolerance("layer_norm", torch.float32)


def test_negative_eps_is_rejected(device):
    for eps in (-1.0, math.inf, math.nan):  # inf would give y = 0 silently, NaN NaN
        with pytest.raises(ValueError, match="eps"):
            crossfuse.layer_norm(torch.ones(2, 4, device=device), (4,), eps=eps)


def test_cpu_tensor_without_interpreter_is_a_clear_error():
    # in a fresh interpreter with TRITON_INTERPRET unset, a CPU tensor must be refused with a message
    import subprocess
    import sys

    code = (
        "import os; os.environ.pop('TRITON_INTERPRET', None)\n"
        "import torch, crossfuse\n"
        "try:\n"
        "    crossfuse.layer_norm(torch.ones(2, 4), (4,))\n"
        "except ValueError as e:\n"
        "    print('ValueError:', e)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "ValueError: x is a CPU tensor" in out.stdout, out.stdout + out.stderr
    assert "TRITON_INTERPRET=1" in out.stdout


@pytest.mark.parametrize(
    "version, ok",
    [("3.6.0", False), ("3.2.0", False), ("3.7.0", True), ("3.10.1", True), ("3.8.0+git1a", True)],
)
def test_an_interpreter_too_old_for_the_kernels_is_a_clear_error(version, ok):
    # Triton 3.2 to 3.6's interpreters stop inside the kernels (a tl.range over program ids): the CPU path
    # says so, naming the argument and the version to install, instead
    from crossfuse import _backend

    problem = _backend.interpreter_problem(version)
    assert (problem is None) == ok
    if not ok:
        assert version in problem and "triton>=3.7" in problem
        with pytest.raises(ValueError, match=r"x is a CPU tensor, for Triton's interpreter: .*triton>=3\.7"):
            _backend.check_runnable(torch.ones(2), "x", True, problem)
    _backend.check_runnable(torch.ones(2), "x", True, None)  # a recent interpreter: no error


# ----------------------------------------------------------------------------------------------------
# GPU only
# ----------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1024, 16384])
def test_no_recompilation_across_row_counts(n, gen):
    # the row count M is never specialised on: new batch sizes reuse the compiled kernels. The tuning
    # table has two regimes (few rows, many rows: ln_mod.MANY_ROWS) that may pick different tiles, so a
    # kernel compiles at most once per regime: one row count of each first, then no more compilations.
    # Every kernel of the module counts (N = 16384: long rows' kernels, whichever the table picks)
    kernels = [k for mod in (ln_mod, ln_mod._ln_bwd_rows) for k in vars(mod).values()
               if isinstance(k, triton.runtime.jit.JITFunction)]  # fmt: skip

    def run(m):
        x = randn((m, n), torch.bfloat16, "cuda", gen).requires_grad_(True)
        w = torch.ones(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        crossfuse.layer_norm(x, (n,), w, None).backward(torch.ones(m, n, device="cuda", dtype=torch.bfloat16))
        torch.cuda.synchronize()

    def compiled():
        return sum(len(cache) for k in kernels for cache in _kernel_caches(k))

    run(4096)
    run(ln_mod.MANY_ROWS + 1)
    before = compiled()
    for m in (1, 7, 16, 100, 1000, 4097, ln_mod.MANY_ROWS, 65536):
        run(m)
    assert compiled() == before, "a new row count triggered a recompilation"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bfloat16", "float32"])
@pytest.mark.parametrize("shape", [(4096, 1024), (65536, 1024), (4096, 16384), (3000, 5000), (4096, 20000)],
                         ids=str)  # fmt: skip
def test_peak_memory_of_forward_and_backward_within_torchs(shape, dtype, gen):
    # what torch's layer norm allocates for a forward and backward (y, dx, dw, db, the saved mean and
    # rstd) is all the fused kernels allocate too: their partial sums live in dx (whole rows, split
    # backward, masked columns at N = 5000, the chunked forward and the rule's configuration at 20000)
    n = shape[1]
    x = randn(shape, dtype, "cuda", gen).requires_grad_(True)
    w = randn((n,), dtype, "cuda", gen).requires_grad_(True)
    b = randn((n,), dtype, "cuda", gen).requires_grad_(True)
    dy = randn(shape, dtype, "cuda", gen)

    def peak(fn):
        for _ in range(2):  # the first call compiles
            for t in (x, w, b):
                t.grad = None
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fn(x, (n,), w, b, 1e-5).backward(dy)
            torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    ours, theirs = peak(crossfuse.layer_norm), peak(torch.nn.functional.layer_norm)
    assert ours <= theirs, (ours, theirs)


def _kernel_caches(kernel):
    """The per-device compiled-kernel dicts of a JITFunction (Triton 3.x keeps them in device_caches)."""
    caches = getattr(kernel, "device_caches", None)
    if caches is None:
        pytest.skip("this Triton version keeps no device_caches on JITFunction")
    return [entry[0] for entry in caches.values()]


@pytest.mark.parametrize("keep_params", [False, True], ids=["params after stats", "params first"])
@pytest.mark.parametrize("prefetch", [False, True], ids=["loads in turn", "next tile prefetched"])
def test_persistent_forward_equals_one_program_per_tile(prefetch, keep_params, device, gen):
    # a config with programs_per_sm > 0 runs the forward on a persistent grid (programs loop over row
    # tiles): 4 rows per tile, 103 rows (a masked tail tile), more tiles than programs; with prefetch
    # each iteration loads the next tile first (past the last tile: masked, nothing read); "prefetch"
    # here also stands for reading through tensor descriptors, which keep tiles in flight the same way
    m, n = 103, 200
    x = randn((m, n), torch.bfloat16, device, gen, mean=2.0)
    w, b = randn((n,), torch.bfloat16, device, gen), randn((n,), torch.bfloat16, device, gen)
    one = ln_mod.layer_norm_fwd(x, w, b, 1e-5, config=ln_mod.LaunchConfig(4, 256, 4, 0))
    cfg = ln_mod.LaunchConfig(4, 256, 4, 1, prefetch=prefetch, keep_params=keep_params)
    if prefetch:
        # the same sums, but a tile from shared memory may be spread over the threads differently, so
        # the reductions may add in another order: the statistics within float32 rounding (run 38: 1 ulp
        # of the mean in 2 of 103 rows), y within bfloat16's
        tma = ln_mod.LaunchConfig(4, 256, 4, 1, keep_params=keep_params, tma_stages=2)
        for a, c in zip(one, ln_mod.layer_norm_fwd(x, w, b, 1e-5, config=tma), strict=True):
            torch.testing.assert_close(a, c)
    persistent = ln_mod.layer_norm_fwd(x, w, b, 1e-5, config=cfg)
    for a, c in zip(one, persistent, strict=True):
        torch.testing.assert_close(a, c, rtol=0, atol=0)


@pytest.mark.parametrize("n", [256, 200], ids=["N = BLOCK_N, a power of 2", "masked columns"])
@pytest.mark.parametrize("keep_params", [False, True], ids=["params after stats", "params first"])
def test_one_row_per_program_forward(n, keep_params, device, gen):
    # one row per program and a program per row: the kernel runs without its tile loop and without row
    # masks; it must give the persistent loop's answer bit for bit, and float64's within tolerance
    m = 37
    x = randn((m, n), torch.float32, device, gen, mean=-1.5)
    w, b = randn((n,), torch.float32, device, gen), randn((n,), torch.float32, device, gen)
    one_cfg = ln_mod.LaunchConfig(1, 256, 2, 0, keep_params=keep_params)  # a program per row
    one = ln_mod.layer_norm_fwd(x, w, b, 1e-5, config=one_cfg)
    cfg = ln_mod.LaunchConfig(1, 256, 2, 1, keep_params=keep_params)  # persistent: one program per SM
    looped = ln_mod.layer_norm_fwd(x, w, b, 1e-5, config=cfg)
    for a, c in zip(one, looped, strict=True):
        torch.testing.assert_close(a, c, rtol=0, atol=0)
    ref = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
    torch.testing.assert_close(one[0].double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "cfg",
    [ln_mod.LaunchConfig(4, 128, 4, 1), ln_mod.LaunchConfig(4, 128, 4, 1, prefetch=True),
     ln_mod.LaunchConfig(2, 512, 4, 1, prefetch=True), ln_mod.LaunchConfig(4, 512, 4, 1, tma_stages=2),
     ln_mod.LaunchConfig(2, 512, 4, 2, tma_stages=3), ln_mod.LaunchConfig(4, 512, 4, 1, coop=True),
     ln_mod.LaunchConfig(4, 128, 4, 1, prefetch=True, coop=True)],
    ids=["split", "split, prefetch", "fused, prefetch", "fused, descriptors", "fused, descriptors, 3 stages",
         "cooperative, one slab", "cooperative, 3 slabs (the split under the interpreter)"],
)  # fmt: skip
def test_backward_variants_equal_default(cfg, device, gen):
    # the tuning table may pick the split backward (row sums, then column chunks) for long rows, or the
    # cooperative one (column slabs that exchange their row sums), and loops that prefetch the next row
    # tile, or that read through tensor descriptors (TMA on Hopper; rows past M and columns past N arrive
    # as zeros): forced here on a short row, 37 rows (a masked tail tile; on the CPU one program walks
    # every tile), each must give the default kernel's answer
    m, n = 37, 300
    x = randn((m, n), torch.float32, device, gen)
    w = randn((n,), torch.float32, device, gen)
    dy = randn((m, n), torch.float32, device, gen)
    _, mean, rstd = ln_mod.layer_norm_fwd(x, w, None, 1e-5)
    default = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, True, True)
    variant = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, True, True, config=cfg)
    for a, b in zip(default, variant, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("grads", [(True, True), (False, True), (False, False)],
                         ids=["dw and db", "db only", "dx only"])  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize(
    "cfg",
    [pytest.param(ln_mod.LaunchConfig(2, 512, 4, 1, prefetch=True), id="whole rows"),
     pytest.param(ln_mod.LaunchConfig(2, 512, 4, 1, tma_stages=2), id="whole rows, descriptors"),
     pytest.param(ln_mod.LaunchConfig(4, 128, 4, 1), id="split"),
     pytest.param(ln_mod.LaunchConfig(2, 512, 4, 1, coop=True), id="cooperative, one slab"),
     pytest.param(ln_mod.LaunchConfig(4, 128, 4, 1, prefetch=True, coop=True),
                  id="cooperative, 3 slabs (the split under the interpreter)")],
)  # fmt: skip
def test_backward_keeps_its_partial_sums_in_dx(cfg, dtype, grads, device, gen, monkeypatch):
    # the backward allocates only dx, dw and db: the float32 partial sums of dw and db (and the split
    # backward's row sums) live in dx's last R rows, whose dx the main kernels leave unwritten (they
    # still sum those rows into dw and db); after the reduction a last launch writes it. Against float64,
    # and against the same kernels with a buffer of their own for the sums (what few rows get); the
    # other rows of dx come from the same kernels either way, so they are equal bit for bit
    m, n = 24 * ln_mod.device_parallelism(torch.empty(0, device=device)), 300
    x = randn((m, n), dtype, device, gen, mean=1.0)
    w = randn((n,), dtype, device, gen, mean=1.0, std=0.5)
    dy = randn((m, n), dtype, device, gen)
    var, mean = torch.var_mean(x.float(), dim=1, correction=0)
    rstd = torch.rsqrt(var + 1e-5)
    rows, scratch = [], ln_mod._scratch

    def spy(*args):
        got = scratch(*args)
        rows.append(got[0])
        return got

    monkeypatch.setattr(ln_mod, "_scratch", spy)
    in_dx = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, *grads, config=cfg)
    monkeypatch.setattr(ln_mod, "_scratch", lambda *args: (0, None))
    own = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, *grads, config=cfg)
    split = n > cfg.block_n or cfg.coop  # row sums (or the cooperative kernel's shares and counters) kept
    if any(grads) or split:
        assert len(rows) == 1 and 0 < rows[0] <= m // 4, rows
        assert torch.equal(in_dx[0][: m - rows[0]], own[0][: m - rows[0]])
    else:  # nothing to keep: no scratch
        assert rows == []
    leaves = [t.double().requires_grad_(True) for t in (x, w, torch.zeros(n, dtype=dtype, device=device))]
    layer_norm_ref(*leaves, 1e-5).backward(dy.double())
    for i, (kind, want) in enumerate(zip(("bwd", "reduced", "reduced"), (True, *grads), strict=True)):
        for got in (in_dx[i], own[i]):
            if not want:
                assert got is None
                continue
            tol = ln_tol(dtype, kind, m, got.dtype)
            assert relerr(got, leaves[i].grad) <= tol, (i, relerr(got, leaves[i].grad), tol)


@pytest.mark.gpu
@pytest.mark.parametrize("grads", [(True, True), (False, False)], ids=["dw and db", "dx only"])
@pytest.mark.parametrize(
    "m, n, cfg",
    [pytest.param(1000, ln_mod.FUSED_MAX_N + 3, ln_mod.LaunchConfig(2, 4096, 8, 2, prefetch=True, coop=True),
                  id="1000x16387, 5 slabs (the last of 3 columns), prefetch"),
     pytest.param(4101, 8192, ln_mod.LaunchConfig(1, 1024, 4, 4, coop=True), id="4101x8192, 8 slabs"),
     pytest.param(20000, 5000, ln_mod.LaunchConfig(4, 2048, 8, 2, prefetch=True, coop=True),
                  id="20000x5000, 3 slabs, partials in dx"),
     pytest.param(3000, 16384, ln_mod.LaunchConfig(1, 1024, 8, 32, coop=True),
                  id="3000x16384, 16 slabs, more programs than fit on the GPU at once")],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_cooperative_backward_against_float64(dtype, m, n, cfg, grads, gen):
    # the cooperative backward's programs wait for the other column slabs of their row group, so it runs
    # on the GPU only (the interpreter runs one program at a time): rows far from zero mean, masked tail
    # rows and columns, a grid larger than the GPU holds at once (programs take their place from a ticket
    # counter when they start, so the ones running can always finish); then the same gradients bit for bit
    # when run again (the shares of each row are added in slab order, whichever program comes last)
    x = randn((m, n), dtype, "cuda", gen, mean=3.0, std=2.0)
    w = randn((n,), dtype, "cuda", gen, mean=1.0, std=0.5)
    dy = randn((m, n), dtype, "cuda", gen)
    _, mean, rstd = ln_mod.layer_norm_fwd(x, w, None, 1e-5)
    got = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, *grads, config=cfg)
    check_backward_and_repeat(got, dy, x, w, w, mean, rstd, grads, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("grads", [(True, True), (False, True), (False, False)],
                         ids=["dw and db", "db only", "dx only"])  # fmt: skip
@pytest.mark.parametrize(
    "m, n, cfg",
    [pytest.param(4096, 1024, None, id="4096x1024, the table"),
     pytest.param(20000, 1000, ln_mod.LaunchConfig(2, 1024, 4, 2, tma_stages=3),
                  id="20000x1000, whole rows, descriptors, partials in dx"),
     pytest.param(20000, 1000, ln_mod.LaunchConfig(2, 1024, 4, 2, prefetch=True),
                  id="20000x1000, whole rows, pointers, partials in dx"),
     pytest.param(5000, 16387, ln_mod.LaunchConfig(2, 2048, 8, 2, prefetch=True), id="5000x16387, split"),
     pytest.param(5000, 16387, ln_mod.LaunchConfig(2, 4096, 16, 1, prefetch=True, coop=True),
                  id="5000x16387, cooperative")],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_dependent_launches_change_nothing(dtype, m, n, cfg, grads, gen, monkeypatch):
    # on compute capability 9+ each kernel of the backward after the first starts while the one before
    # it ends (programmatic dependent launch) and waits for it inside: the gradients must be those of
    # plain launches, bit for bit (the same kernels, the same sums), whichever kernels the backward runs
    if not ln_mod._gdc_usable(torch.empty(0, device="cuda")):
        pytest.skip("needs grid dependency control (compute capability 9+, Triton 3.4+)")
    x = randn((m, n), dtype, "cuda", gen, mean=1.0)
    w = randn((n,), dtype, "cuda", gen, mean=1.0, std=0.5)
    dy = randn((m, n), dtype, "cuda", gen)
    _, mean, rstd = ln_mod.layer_norm_fwd(x, w, None, 1e-5)
    chained = [ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, *grads, config=cfg) for _ in range(3)]
    monkeypatch.setattr(ln_mod, "_gdc_usable", lambda t: False)
    plain = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, *grads, config=cfg)
    for got in chained:
        for a, b in zip(got, plain, strict=True):
            assert (a is None and b is None) or torch.equal(a, b)


# the whole-row Gluon entry of bf16 rows of 16384 before the grouped kernel took the table's place
_WHOLE_16384 = ln_mod.LaunchConfig(1, 16384, 16, 1, tma_stages=3, smem_rows=True)


def _gluon_launches(monkeypatch, launcher: str, programs_arg: int) -> list:
    """Records, for each call of ``crossfuse.ops._ln_bwd_rows.<launcher>`` by layer_norm_bwd, its
    argument ``programs_arg`` (the programs, or the groups, it launches)."""
    calls, launch = [], getattr(ln_mod._ln_bwd_rows, launcher)

    def spy(*args, **kwargs):
        calls.append(args[programs_arg])
        return launch(*args, **kwargs)

    monkeypatch.setattr(ln_mod._ln_bwd_rows, launcher, spy)
    return calls


def _smem_rows_launches(monkeypatch) -> list:
    """The programs of each launch of the whole-row Gluon backward."""
    return _gluon_launches(monkeypatch, "launch", 8)


# every combination of the parameters' gradients, for the Gluon backwards' tests
_GRADS = pytest.mark.parametrize("grads", [(True, True), (True, False), (False, True), (False, False)],
                                 ids=["dw and db", "dw only", "db only", "dx only"])  # fmt: skip


@pytest.mark.gpu
@_GRADS
@pytest.mark.parametrize(
    "m, n, cfg, weight",
    [pytest.param(4101, 16384, _WHOLE_16384, True, id="4101x16384, 16 warps (partials in dx)"),
     pytest.param(300, 8192, None, True, id="300x8192, the table (partials in a buffer of their own)"),
     pytest.param(20000, 4096, None, False, id="20000x4096, the table, no weight"),
     pytest.param(5, 16384, _WHOLE_16384, True, id="5 rows: fewer rows than programs"),
     pytest.param(2000, 4096, ln_mod.LaunchConfig(1, 4096, 4, 3, tma_stages=2, smem_rows=True), True,
                  id="2000x4096, 4 warps, 2 buffers, 3 programs per SM")],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_smem_rows_backward_against_float64(dtype, m, n, cfg, weight, grads, gen, monkeypatch):
    # the Gluon backward that reads each row once (GPU only: Gluon does not run under the interpreter):
    # rows far from zero mean, every combination of gradients, with and without weight, the partial sums
    # in dx's last rows and in a buffer, fewer rows than programs; then the same gradients bit for bit
    # when run again (each program adds its rows in order; the partials are reduced in program order)
    x = randn((m, n), dtype, "cuda", gen, mean=3.0, std=2.0)
    w = randn((n,), dtype, "cuda", gen, mean=1.0, std=0.5) if weight else None
    dy = randn((m, n), dtype, "cuda", gen)
    if not ln_mod._ln_bwd_rows.usable(x, dy, w, False):
        pytest.skip("needs Gluon in Triton 3.6 (GLUON_TRITON) and compute capability 9+")
    calls = _smem_rows_launches(monkeypatch)
    _, mean, rstd = ln_mod.layer_norm_fwd(x, w, None, 1e-5)
    got = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, *grads, config=cfg)
    assert len(calls) == 1 and 1 <= calls[0] <= m, calls  # the Gluon kernel ran, with at most m programs
    ones = torch.ones(n, device="cuda")  # without weight, dw is the gradient of a weight of ones
    check_backward_and_repeat(got, dy, x, w, w if weight else ones, mean, rstd, grads, cfg)


def _grouped(n: int, slices: int, stages: int, lag: int, warps: int, paired: bool = False, per_sm: int = 1):
    """A grouped entry (the Gluon kernel that splits each row between ``slices`` programs; ``paired``: two
    groups' dw and db partials added into one row)."""
    return ln_mod.LaunchConfig(1, n, warps, per_sm, tma_stages=stages, smem_rows=True, slices=slices, lag=lag,
                               paired=paired)  # fmt: skip


def _group_launches(monkeypatch) -> list:
    """The groups of each launch of the grouped Gluon backward."""
    return _gluon_launches(monkeypatch, "launch_groups", 11)


@pytest.mark.gpu
@_GRADS
@pytest.mark.parametrize(
    "m, n, cfg, weight",
    [pytest.param(4101, 16384, None, True, id="4101x16384, the table (partials in dx)"),
     pytest.param(5, 16384, None, True, id="5 rows, the table: fewer rows than groups"),
     pytest.param(4101, 16384, _grouped(16384, 4, 8, 2, 16), True, id="4101x16384, 4 slices, partials in dx"),
     pytest.param(4101, 16384, _grouped(16384, 2, 6, 1, 16), True, id="4101x16384, 2 slices, lag 1"),
     pytest.param(300, 8192, _grouped(8192, 4, 6, 3, 8), True, id="300x8192, lag 3, partials in a buffer"),
     pytest.param(20000, 4096, _grouped(4096, 8, 4, 2, 2), False, id="20000x4096, 8 slices, no weight"),
     pytest.param(5, 16384, _grouped(16384, 4, 8, 2, 16), True, id="5 rows: fewer rows than groups"),
     pytest.param(1, 16384, _grouped(16384, 2, 3, 1, 16), True, id="one row: the lag past the end"),
     pytest.param(4101, 16384, _grouped(16384, 8, 4, 2, 2, True, 6), True, id="4101x16384, paired groups"),
     pytest.param(300, 8192, _grouped(8192, 4, 6, 3, 8, True), False, id="300x8192, paired, no weight"),
     pytest.param(5, 16384, _grouped(16384, 4, 8, 2, 16, True), True, id="5 rows paired: a group alone"),
     pytest.param(1, 16384, _grouped(16384, 2, 3, 1, 16, True), True, id="one row paired: one group")],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=["bfloat16", "float16", "float32"])  # fmt: skip
def test_grouped_backward_against_float64(dtype, m, n, cfg, weight, grads, gen, monkeypatch):
    # the Gluon backward that splits each row between a group of programs, which exchange their shares
    # of the row sums through L2 and use them `lag` rows later (GPU only): rows far from zero mean, every
    # combination of gradients, with and without weight, the partial sums in dx's last rows and in a
    # buffer, fewer rows than groups, a single row; then the same gradients bit for bit when run again
    # (the shares are added in slice order whichever program posts last); float32 rows take fewer
    # buffers, as many as fit
    x = randn((m, n), dtype, "cuda", gen, mean=3.0, std=2.0)
    w = randn((n,), dtype, "cuda", gen, mean=1.0, std=0.5) if weight else None
    dy = randn((m, n), dtype, "cuda", gen)
    if cfg is None:  # the table's entry
        cfg = ln_mod.launch_config(n, dtype, "bwd", m)
        assert cfg.smem_rows and cfg.slices > 1, cfg
    if not ln_mod._ln_bwd_rows.groups_usable(x, dy, w, False, cfg.slices):
        pytest.skip("needs Gluon in Triton 3.6 (GLUON_TRITON) and compute capability 9+")
    fit = ln_mod._ln_bwd_rows.group_stages_that_fit(n, x.element_size(), cfg.slices)
    cfg = cfg._replace(tma_stages=min(cfg.tma_stages, fit))
    calls = _group_launches(monkeypatch)
    plans, plan = [], ln_mod._finish_plan  # where the partials live in dx, how its scratch rows are finished
    monkeypatch.setattr(ln_mod, "_finish_plan", lambda *a: plans.append(plan(*a)) or plans[-1])
    _, mean, rstd = ln_mod.layer_norm_fwd(x, w, None, 1e-5)
    got = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, *grads, config=cfg)
    assert len(calls) == 1 and 1 <= calls[0] <= m, calls  # the grouped kernel ran, at most a group a row
    # the scratch rows from the posted sums (_ln_bwd_finish_kernel), not the two-pass kernel (where the sums
    # of 16-bit scratch rows of 4096 in 8 slices take 6 rows too: five of them are stored in parallel)
    assert None not in plans, plans
    ones = torch.ones(n, device="cuda", dtype=dtype)  # without weight, dw is the gradient of a weight of ones
    check_backward_and_repeat(got, dy, x, w, w if weight else ones, mean, rstd, grads, cfg)


def _post(v: torch.Tensor) -> torch.Tensor:
    """float32 ``v`` as the grouped kernel posts it: its bits below a tag of 1 (int64)."""
    return (v.float().view(torch.int32).to(torch.int64) & 0xFFFFFFFF) | (1 << 32)


@pytest.mark.parametrize("weight", [True, False], ids=["weight", "no weight"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bfloat16", "float32"])
@pytest.mark.parametrize(
    "m, n, slices, programs, parallel",  # parallel: the hot tiles stored in parallel, in bfloat16
    [(80, 2048, 2, 2, 0), (67, 4096, 4, 2, 0), (40, 8192, 2, 1, 0), (309, 2048, 8, 16, 2),
     (1400, 4096, 8, 80, 5)],
    ids=["80x2048, 2 slices", "67x4096, 4 slices", "40x8192, one group",
         "309x2048, 8 slices: three hot tiles in bf16, two of them in parallel",
         "1400x4096, 8 slices: six hot rows in bf16, five in parallel"],
)
def test_grouped_backward_finishes_its_scratch_rows_from_posted_sums(m, n, slices, programs, parallel, dtype,
                                                                     weight, device, gen):  # fmt: skip
    # what runs after the grouped kernel (which needs the GPU) when its partials live in dx's last rows:
    # the kernel that writes those rows' dx from the row sums the grouped kernel posted, the tiles that
    # hold other rows' sums once those rows' programs have read them (in parallel), its last program
    # taking the tiles that hold the hot rows' sums and the counter once every other program has read.
    # Here the scratch is laid out as layer_norm_bwd lays it out, the partials garbage, the sums posted
    # from float64 as the grouped kernel posts them (each slice its share, rstd folded into the first),
    # the counter at its value after the grouped kernel; dx of the scratch rows against float64, the rows
    # above left as they were
    x = randn((m, n), dtype, device, gen, mean=3.0, std=2.0)
    w = randn((n,), dtype, device, gen, mean=1.0, std=0.5) if weight else None
    dy = randn((m, n), dtype, device, gen)
    mean = x.float().mean(1)  # the statistics as the forward saves them (float32)
    rstd = torch.rsqrt(x.float().var(1, correction=0) + 1e-5)
    part, shares_n = ln_mod._align(programs * n), ln_mod._align(4 * slices * m)
    total = 2 * part + shares_n + ln_mod._align(1)
    dx = torch.full((m, n), 7.0, dtype=dtype, device=device)
    R, scratch = ln_mod._scratch(dx, torch.float32, total)
    assert 0 < R < m
    scratch[: 2 * part] = float("nan")  # the partials, read by now
    shares = scratch[2 * part : 2 * part + shares_n].view(torch.int64)[: 2 * slices * m].view(m, 2, slices)
    count = scratch[2 * part + shares_n :][:1].view(torch.int32)
    g = dy.double() * (w.double() if weight else 1.0)
    xc = x.double() - mean.double()[:, None]
    s1 = (xc * g).view(m, slices, -1).sum(-1) * rstd.double()[:, None]
    shares[:, 0], shares[:, 1] = _post(s1), _post(g.view(m, slices, -1).sum(-1))
    count.fill_(programs * slices)
    plan = ln_mod._finish_plan(dx, R, shares, slices)
    assert plan is not None
    if dtype == torch.bfloat16:  # HOT_TILE to LAST_TILE: the cases take both branches of the kernel
        assert plan[1] - plan[0] == parallel, plan
    ln_mod.finish_from_shares(dx, dy, x, w, mean, rstd, shares, count, R, slices, programs * slices, plan)
    xhat = xc * rstd.double()[:, None]
    want = (g - (xhat * (xhat * g).mean(1, keepdim=True) + g.mean(1, keepdim=True))) * rstd.double()[:, None]
    assert torch.equal(dx[: m - R], torch.full_like(dx[: m - R], 7.0))
    err, tol = relerr(dx[m - R :], want[m - R :]), ln_tol(dtype, "bwd", m)
    assert err <= tol, (err, tol)


# A backward under compute-sanitizer (run as its own process): dx a whole number of 2 MiB, so that the
# caching allocator gives it a segment of its own and the scratch in its last rows ends where the
# allocation does; a read past the shares of the row sums is then outside every allocation, which memcheck
# reports (and which faults the kernel on a real run whenever nothing is mapped after the segment)
_SANITIZED_BACKWARD = """
import sys, torch
from crossfuse.ops import layer_norm as ln
for m, n, dtype, slices, stages, lag, warps, paired in {cases}:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    w = torch.randn(n, device="cuda", dtype=dtype, generator=g)
    dy = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    _, mean, rstd = ln.layer_norm_fwd(x, w, None, 1e-5)
    cfg = ln.LaunchConfig(1, n, warps, 1, tma_stages=stages, smem_rows=True, slices=slices, lag=lag,
                          paired=paired)
    ln.layer_norm_bwd(dy, x, w, mean, rstd, True, True, config=cfg)
    torch.cuda.synchronize()
print("done")
"""


def _compute_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    return found or next(iter(sorted(glob.glob("/usr/local/cuda*/bin/compute-sanitizer"))), None)


@pytest.mark.gpu
def test_grouped_backward_reads_nothing_past_its_buffers(gen):
    # the grouped kernel's last iterations finish the rows still waiting (LAG of them) and ask for shares
    # of rows past the last: those addresses must stay in bounds, whatever they read
    x = randn((8, 16384), torch.bfloat16, "cuda", gen)
    if not ln_mod._ln_bwd_rows.groups_usable(x, x, x[0], False, 2):
        pytest.skip("needs Gluon in Triton 3.6 (GLUON_TRITON) and compute capability 9+")
    sanitizer = _compute_sanitizer()
    if sanitizer is None:
        pytest.skip("compute-sanitizer not found (CUDA's toolkit)")
    cases = [(256, 16384, "torch.bfloat16", 8, 12, 3, 8, False),
             (2048, 16384, "torch.bfloat16", 2, 4, 2, 8, False),
             (1024, 16384, "torch.float32", 2, 3, 1, 16, False),
             (2048, 16384, "torch.bfloat16", 8, 4, 2, 2, True)]  # fmt: skip
    for m, n, dtype, *_ in cases:  # dx a whole number of 2 MiB, its scratch in its last rows
        assert m * n * (2 if "bfloat16" in dtype else 4) % (2 << 20) == 0
    listed = ", ".join(f"({', '.join(map(str, case))})" for case in cases)
    code = _SANITIZED_BACKWARD.format(cases=f"[{listed}]")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    cmd = [sanitizer, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, "-c", code]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0 and "done" in run.stdout, (run.returncode, run.stdout[-3000:], run.stderr)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["whole rows", "grouped"])
def test_smem_rows_backward_only_where_it_can_run(kind, gen, monkeypatch):
    # where a Gluon kernel cannot run, a table entry that asks for it takes the Triton kernels of
    # SMEM_ROWS_FALLBACK, with results within the same tolerances. The whole-row kernel: float32, rows that
    # are not contiguous, N not a power of 2 or below 4096, another Triton. The grouped one (which takes
    # float32): rows that are not contiguous, N not a power of 2, N = 2048 (slices with fewer box rows than
    # the entry has warps), another Triton
    if kind == "whole rows":
        cfg = ln_mod.LaunchConfig(1, 16384, 16, 1, tma_stages=3, smem_rows=True)
        usable, launch = ln_mod._ln_bwd_rows.usable, "launch"
    else:
        cfg = ln_mod.launch_config(16384, torch.bfloat16, "bwd", 4096)
        box_rows_2048 = 2048 // cfg.slices // ln_mod._ln_bwd_rows.BOX_W  # of a slice of a row of 2048
        assert cfg.smem_rows and cfg.slices > 1 and cfg.num_warps > box_rows_2048, cfg

        def usable(x, dy, w, interpreted):
            rows = ln_mod._ln_bwd_rows
            fits = not rows.groups_launch_unfit(x.shape[1], x.element_size(), cfg.slices, cfg.num_warps,
                                                cfg.tma_stages, cfg.lag)  # fmt: skip
            return rows.groups_usable(x, dy, w, interpreted, cfg.slices) and fits

        launch = "launch_groups"
    base = randn((64, 2 * 16384), torch.bfloat16, "cuda", gen)
    cases = {
        "strided rows": base[:, :16384],
        "N = 12288": randn((64, 12288), torch.bfloat16, "cuda", gen),
        "N = 2048": randn((64, 2048), torch.bfloat16, "cuda", gen),
    }
    if kind == "whole rows":
        cases["float32"] = randn((64, 16384), torch.float32, "cuda", gen)
    good = randn((64, 16384), torch.bfloat16, "cuda", gen)
    if not usable(good, good, good[0], False):
        pytest.skip("needs Gluon in Triton 3.6 (GLUON_TRITON) and compute capability 9+")
    # Gluon's API changes between Triton releases: another version than the one the kernel was tested
    # with takes the Triton kernels
    monkeypatch.setattr(ln_mod._ln_bwd_rows, "triton_version", lambda: (3, 9))
    assert not usable(good, good, good[0], False)
    monkeypatch.undo()
    calls = _gluon_launches(monkeypatch, launch, 0)
    for name, x in cases.items():
        n = x.shape[1]
        w = randn((n,), x.dtype, "cuda", gen)
        dy = randn(x.shape, x.dtype, "cuda", gen)
        assert not usable(x, dy, w, False), name
        _, mean, rstd = ln_mod.layer_norm_fwd(x, w, None, 1e-5)
        dx, dw, db = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, True, True, config=cfg)
        leaves = [t.double().requires_grad_(True) for t in (x, w, torch.zeros(n, device="cuda"))]
        layer_norm_ref(*leaves, 1e-5).backward(dy.double())
        for got, leaf, kind_ in zip((dx, dw, db), leaves, ("bwd", "reduced", "reduced"), strict=True):
            tol = ln_tol(x.dtype, kind_, x.shape[0], got.dtype)
            assert relerr(got, leaf.grad) <= tol, (name, kind_, relerr(got, leaf.grad), tol)
    assert calls == []


@pytest.mark.parametrize(
    "programs, warps, stages, words",
    [(0, 16, 3, "programs must be from 1 to the row count 8"), (9, 16, 3, "programs must be"),
     (4, 64, 3, "warps must be a power of 2 from 1 to N / 512 = 32"), (4, 12, 3, "warps must be"),
     (4, 16, 1, "stages must be from 2"), (4, 16, 4, "stages must be")],
)  # fmt: skip
def test_smem_rows_launch_rejects_a_launch_that_cannot_run(programs, warps, stages, words):
    # the Gluon kernel's launcher checks what its kernel assumes before anything is compiled: at most one
    # program per row (each reads its first row's statistics), warps that tile half a row, row buffers
    # that fit in shared memory (4 x 64 KB do not, beside the weight)
    x = torch.zeros((8, 16384), dtype=torch.bfloat16)
    w, stats = torch.ones(16384, dtype=torch.bfloat16), torch.zeros(8)
    part = torch.zeros((programs or 1, 16384))
    rows = ln_mod._ln_bwd_rows
    with pytest.raises(ValueError, match=words):
        rows.launch(x, x, x, w, stats, stats, part, part, programs, 8, True, True, warps, stages)


@pytest.mark.parametrize(
    "groups, slices, warps, stages, lag, words",
    [(0, 4, 16, 8, 2, "groups must be from 1 to the row count 8"), (9, 4, 16, 8, 2, "groups must be"),
     (2, 4, 32, 8, 2, "warps must be a power of 2 from 1 to N / slices / 256 = 16"),
     (2, 4, 12, 8, 2, "warps must be"), (2, 4, 16, 8, 0, "lag must be at least 1"),
     (2, 4, 16, 3, 2, "stages from lag \\+ 2"), (2, 4, 16, 15, 2, "to what fits in shared memory")],
)  # fmt: skip
def test_grouped_launch_rejects_a_launch_that_cannot_run(groups, slices, warps, stages, lag, words):
    # the grouped kernel's launcher checks what its kernel assumes before anything is compiled: at most a
    # group per row, warps that tile a slice's box rows, buffers for the rows waiting on their shares and
    # at least one loading, no more than fit in shared memory (15 x 16 KB do not)
    x = torch.zeros((8, 16384), dtype=torch.bfloat16)
    w, stats = torch.ones(16384, dtype=torch.bfloat16), torch.zeros(8)
    part = torch.zeros((max(groups, 1), 16384))
    shares, tickets = torch.zeros(8 * 2 * slices, dtype=torch.int64), torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match=words):
        ln_mod._ln_bwd_rows.launch_groups(x, x, x, w, stats, stats, shares, tickets, tickets, part, part,
                                          groups, 8, True, True, slices, warps, stages, lag)  # fmt: skip


def test_grouped_table_entries_fit_their_programs_on_an_sm():
    # the table's grouped entries can launch (warps, lag and buffers as the launcher checks them), and
    # their programs_per_sm programs fit one SM's shared memory together (228 KB on sm_90, of which 1 KB
    # a program is the system's): a table entry whose buffers did not would run fewer programs an SM than
    # it was measured with, correct but slower, with nothing to say so
    rows = ln_mod._ln_bwd_rows
    grouped = {key: cfg for key, cfg in ln_mod.TUNED.items() if cfg.smem_rows and cfg.slices > 1}
    assert grouped
    for (kind, esize, n, _), cfg in grouped.items():
        assert kind == "bwd" and cfg.programs_per_sm >= 1, cfg
        assert rows.groups_launch_unfit(n, esize, cfg.slices, cfg.num_warps, cfg.tma_stages, cfg.lag) is None
        buffers = cfg.tma_stages * 2 * (n // cfg.slices) * esize + 8 * cfg.tma_stages  # x and dy, barriers
        assert cfg.programs_per_sm * (buffers + 1024) <= 228 * 1024, (n, esize, cfg)


@pytest.mark.parametrize("cfg", [ln_mod.LaunchConfig(1, 4096, 8, 2, tma_stages=3, smem_rows=True),
                                 _grouped(4096, 4, 6, 2, 4)], ids=["whole rows", "grouped"])  # fmt: skip
def test_smem_rows_entry_falls_back_off_the_gpu(cfg, device, gen):
    # under the interpreter (CI) the table's Gluon entries are never launched: the backward runs the
    # fallback's Triton kernels and matches the same entry run as the fallback itself, bit for bit
    m, n = 8, 4096
    x = randn((m, n), torch.bfloat16, device, gen, mean=1.0)
    w, dy = randn((n,), torch.bfloat16, device, gen), randn((m, n), torch.bfloat16, device, gen)
    interpreted = ln_mod.is_interpreted(ln_mod._ln_bwd_kernel)
    if ln_mod._ln_bwd_rows.usable(x, dy, w, interpreted) or ln_mod._ln_bwd_rows.groups_usable(
        x, dy, w, interpreted, cfg.slices
    ):
        pytest.skip("the Gluon kernels run here: the GPU tests cover them")
    _, mean, rstd = ln_mod.layer_norm_fwd(x, w, None, 1e-5)
    fallback = ln_mod.smem_rows_fallback(cfg, n, x.element_size(), m)
    got = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, True, True, config=cfg)
    want = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, True, True, config=fallback)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_backward_is_deterministic_and_repeatable(device, gen):
    # no atomics: the same gradients bit for bit on every call, and a second backward through the same
    # graph (retain_graph) finds the saved tensors intact; rows enough for the partials to live in dx
    m, n = 24 * ln_mod.device_parallelism(torch.empty(0, device=device)), 300
    x = randn((m, n), torch.bfloat16, device, gen).requires_grad_(True)
    w = randn((n,), torch.bfloat16, device, gen, mean=1.0).requires_grad_(True)
    b = randn((n,), torch.bfloat16, device, gen).requires_grad_(True)
    dy = randn((m, n), torch.bfloat16, device, gen)
    y = crossfuse.layer_norm(x, (n,), w, b)
    first = torch.autograd.grad(y, (x, w, b), dy, retain_graph=True)
    second = torch.autograd.grad(y, (x, w, b), dy)
    for a, c in zip(first, second, strict=True):
        assert torch.equal(a, c)
    check_against_reference(x, w, b, gen=gen)


@pytest.mark.parametrize(
    "n, p, max_p, acc, out_dtype",
    [
        (100, 3000, 3000, torch.float32, torch.bfloat16),  # 4-column blocks, 2 steps of 2 x 1024 rows
        (1000, 528, 528, torch.float32, torch.float32),  # 8-column blocks, masked last block, one step
        (16384, 300, 528, torch.float32, torch.bfloat16),  # 64-column blocks of 64 rows: 3 steps
        (4096, 77, 132, torch.float64, torch.float64),  # float64 partials (float64 inputs)
        (300, 77, 132, torch.float64, torch.bfloat16),  # float64 inputs, a bfloat16 weight
        (4096, 1, 132, torch.float32, torch.float16),  # one partial row
    ],
    ids=["N=100 P=3000", "N=1000 P=528", "N=16384 P=300", "float64", "float64 into bfloat16", "P=1"],
)
@pytest.mark.parametrize("which", ["dw and db", "dw", "db"])
def test_dwdb_reduction_sums_every_partial_row(n, p, max_p, acc, out_dtype, which, device, gen):
    # the backward's reduction of its (programs, N) partial sums on its own, against float64 column
    # sums: every row of every column block, in each loop step, with rows past p (up to the block)
    # masked; a skipped sum leaves its output untouched
    dw_part = randn((p, n), acc, device, gen)
    db_part = randn((p, n), acc, device, gen)
    dw = torch.full((n,), 7.0, dtype=out_dtype, device=device)
    db = torch.full((n,), 7.0, dtype=out_dtype, device=device)
    ln_mod.reduce_partials(dw_part if which != "db" else None, db_part if which != "dw" else None, dw, db, p,
                           n, max_p)  # fmt: skip
    # float32 (or float64) sums of up to 3000 rows, rounded once to the output dtype: that rounding (in
    # 16 bits), or the float32 sums' own error (sqrt(P) ulps), is the error
    tol = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
    tol = tol[out_dtype]
    for got, part, made in ((dw, dw_part, which != "db"), (db, db_part, which != "dw")):
        if made:
            want = part.double().sum(0)
            assert relerr(got, want) <= tol, relerr(got, want)
        else:
            assert torch.all(got == 7.0)


def test_descriptor_kernels_need_aligned_rows(device, gen):
    # tensor descriptors need 16-byte aligned rows: bfloat16 rows of 97 elements (194 bytes) take the
    # pointer kernels even where the config asks for descriptors, with the same results; rows of 96 do not
    x = randn((40, 97), torch.bfloat16, device, gen)
    assert not ln_mod._tma_usable(x)
    assert ln_mod._tma_usable(x[:, :96].contiguous()) == (ln_mod.TensorDescriptor is not None and (
        device == "cpu" or torch.cuda.get_device_capability()[0] >= 9))  # fmt: skip
    w, dy = randn((97,), torch.bfloat16, device, gen), randn((40, 97), torch.bfloat16, device, gen)
    for tma_stages in (0, 2):
        cfg = ln_mod.LaunchConfig(2, 128, 4, 1, tma_stages=tma_stages)
        y, mean, rstd = ln_mod.layer_norm_fwd(x, w, None, 1e-5, config=cfg)
        grads = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, True, True, config=cfg)
        if tma_stages == 0:
            expected = (y, mean, rstd, *grads)
        else:
            for a, c in zip(expected, (y, mean, rstd, *grads), strict=True):
                torch.testing.assert_close(a, c, rtol=0, atol=0)


SHIFTED = [pytest.param(False, id="three passes"), pytest.param(True, id="two passes (shifted sums)")]


@pytest.mark.parametrize("shifted", SHIFTED)
@pytest.mark.parametrize("unroll", [1, 2], ids=["unroll 1", "unroll 2: 3 chunks leave a remainder"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_chunked_forward_equals_fused(dtype, unroll, shifted, device, gen):
    # the tuning table may pick the chunked forward (passes over chunks, per-lane statistics) for long
    # rows: forced here on a row of 2.3 chunks, it must match the one-tile kernel
    m, n = 19, 300
    x = randn((m, n), dtype, device, gen, mean=3.0)
    w, b = randn((n,), dtype, device, gen), randn((n,), dtype, device, gen)
    fused = ln_mod.layer_norm_fwd(x, w, b, 1e-5)
    cfg = ln_mod.LaunchConfig(1, 128, 4, 0, unroll, shifted=shifted)
    chunked = ln_mod.layer_norm_fwd(x, w, b, 1e-5, config=cfg)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    for a, c in zip(fused, chunked, strict=True):
        torch.testing.assert_close(a, c, **tol)


@pytest.mark.parametrize("shifted", SHIFTED)
def test_chunked_forward_statistics_are_exact_and_stable(shifted, device, gen):
    # the chunked kernel's statistics keep the fused kernel's guarantees: a row of equal values gives
    # y == bias exactly (zero variance, x - mean exactly 0), and rows of 1e4 + randn keep the variance
    # (the error bound of test_large_mean_keeps_precision_where_single_pass_loses_it)
    m, n = 6, 300
    cfg = ln_mod.LaunchConfig(1, 128, 4, 0, shifted=shifted)
    x = randn((m, n), torch.float32, device, gen)
    x[1] = 0.7134
    x[3] = -3.25e3
    w, b = randn((n,), torch.float32, device, gen), randn((n,), torch.float32, device, gen)
    y, _, _ = ln_mod.layer_norm_fwd(x, w, b, 1e-5, config=cfg)
    assert torch.equal(y[1], b) and torch.equal(y[3], b)
    x = randn((16, n), torch.float32, device, gen, mean=1e4)
    y, _, _ = ln_mod.layer_norm_fwd(x, None, None, 1e-5, config=cfg)
    assert relerr(y, layer_norm_ref(x)) <= 1e-3


# (whole rows take the shifted statistics in 16 bits only: in float32 these run the two reductions)
SHIFTED_LAUNCHES = [
    # 2000 columns in chunks of 64: a partial last chunk
    pytest.param(ln_mod.LaunchConfig(1, 64, 4, 0, shifted=True), 2000, id="chunked, two passes"),
    # 250 of 256 columns: masked columns out of the sums
    pytest.param(ln_mod.LaunchConfig(2, 256, 4, 0, shifted=True), 250, id="whole rows, a program per 2 rows"),
    # 6 rows in tiles of 4: masked rows in the second tile
    pytest.param(
        ln_mod.LaunchConfig(4, 256, 4, 1, prefetch=True, shifted=True), 256, id="whole rows, persistent"
    ),
]


@pytest.mark.parametrize(("cfg", "n"), SHIFTED_LAUNCHES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_shifted_forward_keeps_the_tolerance_whatever_the_first_element(dtype, cfg, n, device, gen):
    # the sums about the first element lose about 1 + R roundings, R = (mean - x0)^2 / var, kept at most
    # shifted_max_ratio (1 in float32, 16 in 16 bits) by the second sums: rows whose first element lies
    # just inside (no second sums: the worst the kernel keeps) and just outside that ratio, and 3.9 and
    # 100 standard deviations out, each within the forward's tolerance against float64, the mean within
    # 1e-5 standard deviations and rstd within 2e-5 (chunked, under the interpreter, 12 seeds: 2.1e-7 and
    # 3.3e-7 in float32, 6.4e-7 and 3.3e-6 in bfloat16)
    m = 6
    r = ln_mod.shifted_max_ratio(dtype)
    x = randn((m, n), torch.float64, device, gen)
    for i, k in enumerate((0.0, 0.98 * math.sqrt(r), -0.98 * math.sqrt(r), 1.02 * math.sqrt(r), 3.9, 100.0)):
        x[i, 0] = x[i, 1:].mean() + k * x[i, 1:].std()
    x = x.to(dtype)
    w, b = randn((n,), dtype, device, gen), randn((n,), dtype, device, gen)
    y, mean, rstd = ln_mod.layer_norm_fwd(x, w, b, 1e-5, config=cfg)
    x64 = x.double()
    for i in range(m):
        want = layer_norm_ref(x64[i : i + 1], w.double(), b.double())
        assert relerr(y[i : i + 1], want) <= tolerance("layer_norm", dtype), i
    std = x64.std(1, unbiased=False)
    assert ((mean.double() - x64.mean(1)).abs() <= 1e-5 * std).all(), (mean.double() - x64.mean(1)) / std
    want_rstd = 1 / (x64.var(1, unbiased=False) + 1e-5).sqrt()
    torch.testing.assert_close(rstd.double(), want_rstd, rtol=2e-5, atol=0)


@pytest.mark.parametrize(("cfg", "n"), SHIFTED_LAUNCHES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_shifted_forward_keeps_equal_rows_exact(dtype, cfg, n, device, gen):
    # the shifted statistics keep the fused kernel's guarantee: a row of equal values (its first element
    # among them) gives mean == that value, and y == bias exactly; with a weight, in 16 bits
    x = randn((6, n), dtype, device, gen)
    x[1] = 0.7134
    x[4] = -325.0
    w, b = randn((n,), dtype, device, gen), randn((n,), dtype, device, gen)
    y, mean, _ = ln_mod.layer_norm_fwd(x, w, b, 1e-5, config=cfg)
    assert torch.equal(y[1], b) and torch.equal(y[4], b)
    assert mean[1].item() == x[1, 0].float().item() and mean[4].item() == x[4, 0].float().item()


@pytest.mark.parametrize(("cfg", "n"), SHIFTED_LAUNCHES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_shifted_forward_when_the_sums_of_squares_overflow(dtype, cfg, n, device, gen):
    # a first element 3e18 (or -3e18) from the rest: (x - x0)^2 summed over the row passes float32's
    # range, so the variance about x0 is inf; the sums are taken again about the mean (without that, rstd
    # was 0 and y the bias, 0.58 from float64, where the three-pass sums hold such rows). In float32 any
    # kernel loses the other elements' spread in such a row (x - mean rounds to -mean: the three-pass
    # kernel's y is 3e-6 from float64 there), so y is held to 1e-4 here, the statistics to the usual bounds
    x = randn((3, n), dtype, device, gen)
    x[0, 0] = 3e18
    x[1, 0] = -3e18
    y, mean, rstd = ln_mod.layer_norm_fwd(x, None, None, 1e-5, config=cfg)
    x64 = x.double()
    assert relerr(y, layer_norm_ref(x64)) <= max(1e-4, tolerance("layer_norm", dtype))
    std = x64.std(1, unbiased=False)
    assert ((mean.double() - x64.mean(1)).abs() <= 1e-5 * std).all(), (mean.double() - x64.mean(1)) / std
    want_rstd = 1 / (x64.var(1, unbiased=False) + 1e-5).sqrt()
    torch.testing.assert_close(rstd.double(), want_rstd, rtol=2e-5, atol=0)


def test_shifted_chunked_forward_when_the_first_element_is_far_from_the_mean(device, gen):
    # the two-pass kernel sums about the row's first element and, where that lies more than one standard
    # deviation from the mean (float32), sums again about the mean it found: rows with one large first
    # feature (1e4 before randn), a first chunk of 1e4 + randn, a first element 3.9 standard deviations
    # out, -1e3 + 1e-2 * randn before randn, rows whose only spread is in the first chunk, rows of 1e4 +
    # 1e-3 * randn
    n, bn = 1000, 128
    x = randn((7, n), torch.float32, device, gen)
    x[0, 0] = 1e4
    x[1, :bn] += 1e4
    x[2, 0] = x[2, 1:].mean() + 3.9 * x[2, 1:].std()
    x[3, :bn] = -1e3 + 1e-2 * x[3, :bn]
    x[4, bn:] = 5.0
    x[5] = 1e4 + 1e-3 * x[5]
    x[6, 0] = -1e4
    cfg = ln_mod.LaunchConfig(1, bn, 4, 0, shifted=True)
    y, mean, rstd = ln_mod.layer_norm_fwd(x, None, None, 1e-5, config=cfg)
    want = layer_norm_ref(x.double())
    assert relerr(y, want) <= 1e-4
    x64 = x.double()
    # the mean to a millionth of the row's largest value, each row's rstd to 1e-5 (without the second
    # sums the rows with a large first element miss both)
    err = mean.double() - x64.mean(1)
    assert (err.abs() <= 1e-6 * x64.abs().amax(1)).all(), err
    want_rstd = 1 / (x64.var(1, unbiased=False) + 1e-5).sqrt()
    assert ((rstd.double() - want_rstd).abs() <= 1e-5 * want_rstd).all(), rstd.double() / want_rstd - 1
