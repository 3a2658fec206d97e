"""crossfuse.layer_norm and crossfuse.nn.LayerNorm as users call them, against float64: shapes, dtypes,
parameters, strides, autograd, and bad input."""

from __future__ import annotations

import math

import crossfuse
import pytest
import torch
import torch.nn.functional as F
from _layer_norm_checks import DTYPES, check_against_reference, randn
from crossfuse.ops import layer_norm as ln_mod
from crossfuse.ops.layer_norm import api
from crossfuse.reference import layer_norm as single_pass_layer_norm
from crossfuse.reference import layer_norm_maxstd_ref, layer_norm_ref
from crossfuse.tolerances import relerr, tolerance

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
    assert api._rows(x, 200).data_ptr() == x.data_ptr()
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
    for loss in (lambda t: t.pow(3).sum(), lambda t: (t * t.detach()).sum()):  # the second: dy is constant
        y = crossfuse.layer_norm(x, (8,), w)
        (gx,) = torch.autograd.grad(loss(y), x, create_graph=True)
        with pytest.raises(RuntimeError, match="differentiate twice"):
            (y.sum() + gx.square().sum()).backward()
    # a Hessian through it: an error, not zeros (torch's once_differentiable gave zeros here)
    with pytest.raises(RuntimeError, match=r"differentiate twice crossfuse\.layer_norm"):
        torch.autograd.functional.hessian(lambda t: crossfuse.layer_norm(t, (8,), w).pow(2).sum(), x[:1])


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


def test_module_is_a_drop_in_for_torch(device, gen):
    ours = crossfuse.nn.LayerNorm(96, device=device, native_below=0)
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
    no_bias = crossfuse.nn.LayerNorm(96, bias=False, elementwise_affine=True, device=device, native_below=0)
    assert no_bias.bias is None and no_bias(x).shape == x.shape
    # eps reaches the op (rows with a variance of eps's size)
    ours = crossfuse.nn.LayerNorm(96, eps=0.3, device=device, native_below=0)
    theirs = torch.nn.LayerNorm(96, eps=0.3, device=device)
    small = randn((8, 96), torch.float32, device, gen, std=0.5)
    assert relerr(ours(small), theirs(small)) <= 1e-5


@pytest.mark.parametrize("native_below", [0, 1 << 30], ids=["fused", "torch's below native_below"])
def test_module_sees_parametrized_functional_call_and_replaced_parameters(native_below, device, gen):
    # a parametrized weight, or parameters given by torch.func.functional_call, are what the module uses,
    # on the fused path and on torch's below native_below
    from torch.nn.utils import parametrize

    class Doubled(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    x = randn((8, 96), torch.float32, device, gen)
    ours = crossfuse.nn.LayerNorm(96, device=device, native_below=native_below)
    theirs = torch.nn.LayerNorm(96, device=device)
    for m in (ours, theirs):
        parametrize.register_parametrization(m, "weight", Doubled())
    with torch.no_grad():
        theirs.bias.copy_(randn((96,), torch.float32, device, gen))
        ours.bias.copy_(theirs.bias)
    assert relerr(ours(x), theirs(x)) <= 1e-5  # the doubled weight, not the stored one
    plain = crossfuse.nn.LayerNorm(96, device=device, native_below=native_below)
    weight = randn((96,), torch.float32, device, gen, mean=1.0)
    bias = randn((96,), torch.float32, device, gen)
    got = torch.func.functional_call(plain, {"weight": weight, "bias": bias}, (x,))
    assert relerr(got, F.layer_norm(x, (96,), weight, bias)) <= 1e-5
    # a parameter replaced by a plain attribute (as wrappers that shard parameters do)
    del plain.weight
    plain.weight = 3 * weight
    assert "weight" not in plain._parameters
    assert relerr(plain(x), F.layer_norm(x, (96,), 3 * weight, plain.bias)) <= 1e-5


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
