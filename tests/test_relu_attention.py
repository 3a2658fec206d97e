"""The Triton ReLU attention (crossfuse.relu_attention, crossfuse.nn.ReLUAttention) against float64."""

from __future__ import annotations

import math

import crossfuse
import numpy as np
import pytest
import torch
from crossfuse.ops import relu_attention as ra
from crossfuse.reference import kink_slack as reference_kink_slack
from crossfuse.reference import relu_attention_naive, relu_attention_ref, tf32_truncate
from crossfuse.tolerances import relerr, relerr_with_slack, tolerance
from triton.runtime.errors import OutOfResources

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def randn(shape, dtype, device, gen):
    return torch.randn(shape, dtype=torch.float64, generator=gen).to(device=device, dtype=dtype)


def qkv(b, h, lq, lk, d, dtype, device, gen):
    return (
        randn((b, h, lq, d), dtype, device, gen),
        randn((b, h, lk, d), dtype, device, gen),
        randn((b, h, lk, d), dtype, device, gen),
    )


def kink_slack(q, k, v, dout, causal, squared, **scales):
    """Each dq, dk, dv row's slack: how far its scores at relu's kink may move it (see
    crossfuse.reference.kink_slack; none for dv, relu being continuous)."""
    slack = reference_kink_slack(q, k, v, dout, causal, squared, **scales)
    return {"dq": slack["q"], "dk": slack["k"], "dv": torch.zeros(v.shape[:-1], dtype=torch.float64,
                                                                  device=v.device)}  # fmt: skip


@pytest.fixture
def launched(monkeypatch):
    """The kernels ``relu_attention``'s launchers launch through ``_launch`` during the test, in order."""
    kernels = []
    launch = ra._launch

    def spy(kernel, grid, key, *args, **options):
        kernels.append(kernel)
        return launch(kernel, grid, key, *args, **options)

    monkeypatch.setattr(ra, "_launch", spy)
    return kernels


@pytest.fixture
def copies(monkeypatch):
    """How many tensors each launch of float32's copies with unit stride on L (``_l_major_copies``, not
    launched through ``_launch``) copied during the test, in order."""
    counts, copy = [], ra._l_major_copies
    monkeypatch.setattr(ra, "_l_major_copies", lambda ts, *a: counts.append(len(ts)) or copy(ts, *a))
    return counts


@pytest.fixture
def nan_copies(monkeypatch):
    """The copies a float32 Gluon dQ kernel with WRITE writes (``_copies_to_write``) start as NaN, so that
    any element the dK/dV kernel reads before it is written (or that is never written) shows in its
    results; returns how many calls made them."""
    made = []

    def nan(q):
        made.append(1)
        B, H, L, D = q.shape
        return tuple(y.transpose(2, 3) for y in q.new_full((2, B, H, D, L), math.nan).unbind(0))

    monkeypatch.setattr(ra, "_copies_to_write", nan)
    return made


def run_and_compare(q, k, v, causal, squared, gen, layout="bhld"):
    """Kernel forward + backward vs the float64 reference; returns the errors (asserted here)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = crossfuse.relu_attention(*leaves, causal=causal, squared=squared, layout=layout)
    dout = randn(out.shape, out.dtype, out.device, gen)
    out.backward(dout)
    dtype, tf32 = q.dtype, q.is_cuda and q.dtype == torch.float32  # float32 dots run on tf32 on GPUs
    # with tf32 the kernel multiplies operands truncated to 10 mantissa bits: the reference gets the same
    # truncated inputs, so that a score within rounding of 0 falls on the same side of relu's kink in
    # both (otherwise one flipped score among a few hundred decides the error of a short sequence)
    refs = [(tf32_truncate(t) if tf32 else t).detach().double().requires_grad_(True) for t in (q, k, v)]
    to_bhld = (lambda t: t) if layout == "bhld" else (lambda t: t.transpose(1, 2))
    out_ref = relu_attention_ref(*(to_bhld(t) for t in refs), causal=causal, squared=squared)
    out_ref = to_bhld(out_ref)
    out_ref.backward(dout.double())
    errs = {"out": (relerr(out, out_ref), tolerance("relu_attention", dtype, "fwd", tf32=tf32))}
    # every gradient row is compared; a row that a score within float32 rounding of 0 reaches may stand
    # as far from float64 as those scores on the other side of relu's kink would move it, and no farther
    # (such scores are rare in short rows, but each row holds L of them: 16% of the rows at bf16 L=2048
    # on the H200 meet one, run 171, where leaving those rows out would have hidden a wrong gradient)
    slack = kink_slack(*(to_bhld(t) for t in refs), to_bhld(dout), causal, squared)
    for name, got, ref in zip("qkv", leaves, refs, strict=True):
        err = relerr_with_slack(to_bhld(got.grad), to_bhld(ref.grad), slack["d" + name])
        errs["d" + name] = (err, tolerance("relu_attention", dtype, "bwd", tf32=tf32))
    bad = {k: v for k, v in errs.items() if not v[0] <= v[1]}
    assert not bad, f"relative error over tolerance (error, tolerance): {bad}"
    return errs, out, leaves


# lengths not multiples of the block (32 in the interpreter, 64/128 on the GPU), and the edge L=1
LENGTHS = [
    pytest.param(1, id="L=1: one key, one query"),
    pytest.param(17, id="L=17: one partial block"),
    pytest.param(64, id="L=64: whole blocks"),
    pytest.param(100, id="L=100: whole blocks and a tail"),
]


@pytest.mark.parametrize("squared", [False, True], ids=["relu", "squared"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("length", LENGTHS)
def test_matches_float64_reference(length, causal, squared, device, gen):
    q, k, v = qkv(2, 2, length, length, 32, torch.float32, device, gen)
    run_and_compare(q, k, v, causal, squared, gen)


@pytest.mark.parametrize("d", ra.HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_each_head_dim_and_dtype(d, dtype, device, gen):
    q, k, v = qkv(1, 2, 45, 45, d, dtype, device, gen)
    run_and_compare(q, k, v, causal=d % 32 == 0, squared=d == 64, gen=gen)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_low_precision_error_at_most_twice_torch(dtype, device, gen):
    # flash-attention's criterion: against float64, the kernel in a low dtype errs at most ~2x as
    # much as the naive torch implementation in that same dtype
    # (Triton's interpreter rounds float32 -> bfloat16 towards zero, not to nearest as the GPU does: a
    # bias of half an ulp per rounding, so the bound there is 4x)
    q, k, v = qkv(2, 2, 96, 96, 64, dtype, device, gen)
    ref = relu_attention_ref(q, k, v, causal=True)
    err_kernel = relerr(crossfuse.relu_attention(q, k, v, causal=True), ref)
    err_torch = relerr(relu_attention_naive(q, k, v, causal=True), ref)
    factor = 4 if device == "cpu" and dtype == torch.bfloat16 else 2
    assert err_kernel <= factor * err_torch, (err_kernel, err_torch)


def test_long_sequence(device, gen):
    # L=1000 (not a multiple of any block): many key blocks streamed per query block
    q, k, v = qkv(1, 1, 1000, 1000, 16, torch.float32, device, gen)
    run_and_compare(q, k, v, causal=True, squared=False, gen=gen)


@pytest.mark.parametrize("lq, lk", [(17, 100), (100, 17), (1, 64)])
def test_query_and_key_lengths_may_differ(lq, lk, device, gen):
    q, k, v = qkv(1, 3, lq, lk, 64, torch.float32, device, gen)
    run_and_compare(q, k, v, causal=False, squared=lq > lk, gen=gen)


def test_layouts_give_the_same_result(device, gen):
    q, k, v = qkv(2, 3, 50, 50, 32, torch.float32, device, gen)
    _, out_bhld, _ = run_and_compare(q, k, v, True, False, gen)
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # [B, L, H, D] in memory
    out = crossfuse.relu_attention(qt, kt, vt, causal=True, layout="blhd")
    assert out.shape == qt.shape and out.is_contiguous()
    torch.testing.assert_close(out.transpose(1, 2), out_bhld.detach(), rtol=1e-5, atol=1e-6)
    run_and_compare(qt, kt, vt, True, False, gen, layout="blhd")


def test_strided_views_read_in_place(device, gen):
    # q, k, v as slices of one packed [B, L, 3, H, D] projection: no copies are made
    b, l, h, d = 2, 33, 2, 16
    packed = randn((b, l, 3, h, d), torch.float32, device, gen)
    q, k, v = packed.unbind(2)
    assert ra._unit_d(ra._to_bhld(q, "blhd")).data_ptr() == q.data_ptr()
    run_and_compare(q, k, v, False, True, gen, layout="blhd")


def test_output_and_gradients_fully_written(device, gen):
    # poison the memory the allocator hands out next; every element must be overwritten
    q, k, v = qkv(1, 2, 70, 70, 32, torch.float32, device, gen)
    for _ in range(4):
        torch.full((1, 2, 70, 32), float("nan"), device=device)
    _, out, leaves = run_and_compare(q, k, v, True, True, gen)
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(t.grad).all() for t in leaves)


def test_gradient_at_exactly_zero_score_is_zero(device):
    # q orthogonal to k: every score is exactly 0; relu'(0) = 0, so dq = dk = 0 (torch's convention)
    q = torch.zeros(1, 1, 4, 16, device=device)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, 4, 16, device=device)
    k[..., 1] = 1.0
    v = torch.randn(1, 1, 4, 16, device=device)
    q.requires_grad_(True)
    k.requires_grad_(True)
    crossfuse.relu_attention(q, k, v).sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q)) and torch.equal(k.grad, torch.zeros_like(k))


@pytest.mark.parametrize(
    "causal, squared", [(True, False), (False, True)], ids=["causal relu", "full squared"]
)
def test_gradcheck_float64(causal, squared, device, gen):
    if device == "cuda":
        pytest.skip("Triton's dot has no float64 on GPUs: gradcheck runs under the interpreter (CPU)")
    # fast mode (random projections of the Jacobian): a full one takes minutes in the interpreter
    q, k, v = (t.requires_grad_(True) for t in qkv(1, 1, 7, 7, 16, torch.float64, device, gen))
    assert torch.autograd.gradcheck(
        lambda q, k, v: crossfuse.relu_attention(q, k, v, causal=causal, squared=squared),
        (q, k, v),
        fast_mode=True,
    )


@pytest.mark.parametrize("squared", [False, True], ids=["relu", "squared"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_custom_scales(causal, squared, device, gen):
    # scale and relu_scale other than the defaults, forward and backward through the public function (the
    # backward takes them from what the forward saved)
    q, k, v = (t.requires_grad_(True) for t in qkv(1, 2, 20, 20, 32, torch.float32, device, gen))
    kw = dict(causal=causal, squared=squared, scale=0.3, relu_scale=2.0)
    out = crossfuse.relu_attention(q, k, v, **kw)
    dout = randn(out.shape, torch.float32, device, gen)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    # on GPUs the reference takes the inputs truncated to tf32, as the kernels' products do: a score
    # within tf32's rounding of 0 falls on the same side of relu's kink in both (run 300: one score of
    # 3.3e-4 on the other side moved dq by 0.114 of its norm)
    tf32 = q.is_cuda
    refs = [(tf32_truncate(t) if tf32 else t).detach().double().requires_grad_(True) for t in (q, k, v)]
    ref = relu_attention_ref(*refs, **kw)
    ref_grads = torch.autograd.grad(ref, refs, dout.double())
    assert relerr(out, ref) <= tolerance("relu_attention", torch.float32, tf32=tf32)
    slack = kink_slack(*refs, dout, causal, squared, scale=0.3, relu_scale=2.0)
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads, strict=True):
        err = relerr_with_slack(got, want, slack[name])
        assert err <= tolerance("relu_attention", torch.float32, "bwd", tf32=tf32), (name, err)


def test_saves_tensors_for_backward(device, gen):
    # the seed assigned ctx.save_for_backward instead of calling it; here the graph holds q, k, v
    q, k, v = (t.requires_grad_(True) for t in qkv(1, 1, 8, 8, 16, torch.float32, device, gen))
    out = crossfuse.relu_attention(q, k, v)
    saved = out.grad_fn.saved_tensors
    assert len(saved) == 3 and all(s.shape == (1, 1, 8, 16) for s in saved)


@pytest.mark.parametrize("layout", ra.LAYOUTS)
def test_output_can_be_changed_in_place(layout, device, gen):
    # the output is the new tensor itself, in its layout, not a view (torch forbids in-place changes to
    # views made inside an autograd.Function): out.add_ then backward works, as with SDPA
    q, k, v = (t.requires_grad_(True) for t in qkv(1, 2, 8, 8, 16, torch.float32, device, gen))
    if layout == "blhd":
        q, k, v = (t.detach().transpose(1, 2).contiguous().requires_grad_(True) for t in (q, k, v))
    out = crossfuse.relu_attention(q, k, v, layout=layout)
    assert out._base is None and out.is_contiguous()
    out.add_(1.0).sum().backward()
    assert all(t.grad is not None and t.grad.isfinite().all() for t in (q, k, v))


def test_differentiating_the_gradient_is_a_clear_error(device, gen):
    q, k, v = (t.requires_grad_(True) for t in qkv(1, 1, 8, 8, 16, torch.float32, device, gen))
    out = crossfuse.relu_attention(q, k, v)
    (gq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        (out.sum() + gq.square().sum()).backward()


@pytest.mark.parametrize("squared", [False, True], ids=["relu", "squared"])
@pytest.mark.parametrize("where", ["query", "key"])
def test_nan_propagates_as_in_torch(where, squared, device, gen):
    # relu(NaN) is NaN in torch: a NaN query row gives a NaN output row, a NaN key every output row
    # (Triton's tl.maximum returned 0 for NaN, so the NaN vanished and a diverging run looked healthy)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # on GPUs: the bf16 cvt.relu path too
    q, k, v = qkv(1, 1, 6, 6, 16, dtype, device, gen)
    (q if where == "query" else k)[0, 0, 2, 3] = float("nan")
    out = crossfuse.relu_attention(q, k, v, squared=squared)
    ref = relu_attention_naive(q.double(), k.double(), v.double(), squared=squared)
    assert torch.equal(out.isnan(), ref.isnan()) and ref.isnan().any()


def test_more_batch_and_heads_than_a_grid_axis_holds(device, gen, monkeypatch):
    # the kernels put B * H on the grid's second axis (CUDA: at most 65535); more pairs run as batch
    # slices: here the limit is lowered to 5, so B=4, H=2 runs as four slices of one batch each (two
    # pairs), results as the float64 reference's, in both layouts
    monkeypatch.setattr(ra, "MAX_GRID_1", 5)
    for layout in ra.LAYOUTS:
        q, k, v = qkv(4, 2, 12, 12, 16, torch.float32, device, gen)
        if layout == "blhd":
            q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        run_and_compare(q, k, v, True, False, gen, layout=layout)
    assert [(b.start, b.stop) for b in ra._batch_slices(4, 2)] == [(0, 2), (2, 4)]
    assert [(b.start, b.stop) for b in ra._batch_slices(3, 7)] == [(0, 1), (1, 2), (2, 3)]


@pytest.mark.gpu
def test_more_batch_and_heads_than_cuda_grid_axis_holds(gen):
    # 65536 (batch, head) pairs: one more than CUDA allows on a grid's second axis
    q, k, v = qkv(16384, 4, 16, 16, 16, torch.bfloat16, "cuda", gen)
    assert q.shape[0] * q.shape[1] > ra.MAX_GRID_1
    run_and_compare(q, k, v, False, False, gen)


def test_numpy_scalars_are_accepted(device, gen):
    from crossfuse._validate import check_bool

    # numpy 1 names its bool type bool_ (numpy 2: bool); a stand-in for it, whichever numpy is installed
    numpy1_bool = type("bool_", (), {"__module__": "numpy", "__bool__": lambda self: True})()
    assert check_bool(numpy1_bool, "causal") is True
    with pytest.raises(TypeError, match="causal must be a bool, got int"):
        check_bool(1, "causal")
    np = pytest.importorskip("numpy")
    q, k, v = qkv(1, 1, 8, 8, 16, torch.float32, device, gen)
    out = crossfuse.relu_attention(q, k, v, causal=np.bool_(True), scale=np.float32(0.25))
    ref = relu_attention_ref(q, k, v, causal=True, scale=0.25)
    assert relerr(out, ref) <= tolerance("relu_attention", torch.float32, tf32=q.is_cuda)


@pytest.mark.parametrize("squared", [False, True], ids=["relu", "squared"])
def test_module(squared, device, gen):
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
    mod = crossfuse.nn.ReLUAttention(64, 2, causal=True, squared=squared, device=device)
    x = randn((2, 30, 64), torch.float32, device, gen)
    y = mod(x)
    qkv_ = mod.qkv(x).view(2, 30, 3, 2, 32).permute(2, 0, 3, 1, 4)
    ref = relu_attention_ref(qkv_[0], qkv_[1], qkv_[2], causal=True, squared=squared).float()
    expected = mod.out_proj(ref.transpose(1, 2).reshape(2, 30, 64))
    assert relerr(y, expected) <= (
        1e-4 if device == "cpu" else tolerance("relu_attention", torch.float32, tf32=True)
    )
    y.sum().backward()
    assert mod.qkv.weight.grad is not None
    with pytest.raises(ValueError, match="head_dim"):
        crossfuse.nn.ReLUAttention(60, 2)
    # the constructor names a bad argument (the forward would fail inside torch.view, or take "no" as
    # true); numpy's integers and bools pass
    for kw, name in ((dict(num_heads=4.0), "num_heads"), (dict(num_heads=True), "num_heads"),
                     (dict(embed_dim="64"), "embed_dim"), (dict(causal="no"), "causal"),
                     (dict(squared=1), "squared"), (dict(bias=None), "bias")):  # fmt: skip
        with pytest.raises(TypeError, match=name):
            crossfuse.nn.ReLUAttention(**{"embed_dim": 64, "num_heads": 4, **kw})
    mod = crossfuse.nn.ReLUAttention(np.int64(64), np.int32(4), causal=np.bool_(True))
    assert (mod.num_heads, mod.causal) == (4, True) and type(mod.causal) is bool


# ----------------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------------


def _t(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, dtype=dtype, device=device)


@pytest.mark.parametrize(
    "make, exc, words",
    [
        (lambda d: (_t(1, 2, 8, 16, device=d), _t(1, 3, 8, 16, device=d), _t(1, 3, 8, 16, device=d), {}),
         ValueError, "k's shape"),
        (lambda d: (_t(1, 2, 8, 16, device=d), _t(1, 2, 8, 16, device=d), _t(1, 2, 9, 16, device=d), {}),
         ValueError, "v's shape"),
        (lambda d: (_t(1, 2, 8, 48, device=d),) * 3 + ({},), ValueError, "head dim D=48"),
        (lambda d: (_t(1, 2, 8, 16, device=d), _t(1, 2, 8, 16, dtype=torch.float16, device=d),
                    _t(1, 2, 8, 16, device=d), {}), TypeError, "share one dtype"),
        (lambda d: (_t(1, 2, 8, 16, device=d), _t(1, 2, 9, 16, device=d), _t(1, 2, 9, 16, device=d),
                    {"causal": True}), ValueError, "causal=True needs equal"),
        (lambda d: (_t(2, 8, 16, device=d),) * 3 + ({},), ValueError, "q must be 4-D"),
        (lambda d: (_t(1, 2, 8, 16, device=d),) * 3 + ({"layout": "bshd"},), ValueError, "layout must be"),
        (lambda d: (torch.ones(1, 2, 8, 16, dtype=torch.int32, device=d),) * 3 + ({},), TypeError,
         "q has dtype int32"),
        (lambda d: (_t(1, 2, 8, 16, device=d),) * 3 + ({"scale": 0.0},), ValueError, "scale must be"),
        (lambda d: (_t(1, 2, 8, 16, device=d),) * 3 + ({"scale": math.inf},), ValueError, "scale must be"),
        (lambda d: (_t(1, 2, 8, 16, device=d),) * 3 + ({"relu_scale": math.inf},), ValueError,
         "relu_scale must be"),
        (lambda d: (_t(1, 2, 8, 16, device=d), _t(1, 2, 0, 16, device=d), _t(1, 2, 0, 16, device=d), {}),
         ValueError, "at least one key"),
        (lambda d: (_t(1, 2, 8, 16, device=d),) * 3 + ({"causal": 1},), TypeError, "causal must be a bool"),
        (lambda d: (_t(1, 2, 8, 16, device=d).to_sparse(),) * 3 + ({},), TypeError,
         "q is a torch.sparse_coo"),
    ],
    ids=["heads mismatch", "v length", "unsupported D", "mixed dtypes", "causal Lq != Lk", "3-D", "layout",
         "integer dtype", "zero scale", "inf scale", "inf relu_scale", "no keys", "int causal", "sparse q"],
)  # fmt: skip
def test_bad_input_names_the_argument(make, exc, words, device):
    q, k, v, kw = make(device)
    with pytest.raises(exc) as info:
        crossfuse.relu_attention(q, k, v, **kw)
    assert words in str(info.value)


@pytest.mark.gpu
def test_cuda_and_cpu_tensors_mixed_are_rejected(gen):
    q, k, v = qkv(1, 1, 8, 8, 16, torch.float32, "cuda", gen)
    with pytest.raises(ValueError, match="k is on cpu"):
        crossfuse.relu_attention(q, k.cpu(), v)


@pytest.mark.gpu
def test_float64_on_gpu_is_a_clear_error(gen):
    q, k, v = qkv(1, 1, 8, 8, 16, torch.float64, "cuda", gen)
    with pytest.raises(TypeError, match="float64 runs only under the Triton interpreter"):
        crossfuse.relu_attention(q, k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_anchor_like_shapes_bf16(d, gen):
    # realistic sizes on the GPU: blocks of 64/128, tails, causal skipping
    for length in (1000, 2048):
        q, k, v = qkv(2, 4, length, length, d, torch.bfloat16, "cuda", gen)
        for causal in (False, True):
            run_and_compare(q, k, v, causal, False, gen)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("shape", [(2, 3, 100, 64), (1, 2, 1, 16), (1, 1, 130, 256), (2, 1, 0, 32)])
def test_l_major_copy_equals_torchs(shape, dtype, device, gen, monkeypatch):
    # the float32 kernels read some inputs through copies with unit stride on L, made by a Triton kernel:
    # equal to torch's transposed copy element for element, from the seed's layout (a [B, L, H, D]
    # tensor seen as [B, H, L, D]) and from a strided view, at lengths not multiples of its tile
    b, h, length, d = shape
    blhd = randn((b, length, h, d), dtype, device, gen).transpose(1, 2)
    strided = randn((b, h, length, 2 * d), dtype, device, gen)[..., ::2]
    for t in (blhd, strided):
        (got,) = ra._l_contiguous(t)
        assert got.stride(2) == 1 and got.shape == t.shape
        assert torch.equal(got, t)
        assert got.transpose(2, 3).is_contiguous()
    # several tensors in one launch (the backward's q, dout and k), one already with unit stride on L
    # (returned as it is) and one of another length (a launch of its own)
    other = randn((b, h, length + 3, d), dtype, device, gen)
    (unit_l,) = ra._l_contiguous(blhd)
    got = ra._l_contiguous(blhd, unit_l, strided, other, blhd)
    assert got[1] is unit_l
    for a, t in zip(got, (blhd, unit_l, strided, other, blhd), strict=True):
        assert a.stride(2) == 1 and torch.equal(a, t)
    # two in one launch; another dtype (a launch of its own, keeping its dtype)
    wide = blhd.double() if dtype == torch.float32 else blhd.float()
    got = ra._l_contiguous(strided, blhd, wide)
    for a, t in zip(got, (strided, blhd, wide), strict=True):
        assert a.stride(2) == 1 and a.dtype == t.dtype and torch.equal(a, t)
    monkeypatch.setattr(ra, "L_MAJOR_TILE", (32, 16, 4))  # tiles smaller than D: several along D
    assert torch.equal(ra._l_contiguous(blhd)[0], blhd)
    assert ra._l_contiguous(unit_l)[0] is unit_l  # already unit stride on L: no copy


@pytest.mark.parametrize("shape", [(2, 3, 64, 64), (1, 2, 8, 16), (1, 1, 136, 32)])
def test_l_major_copy_in_sigma_order(shape, device, gen):
    # the float32 Gluon kernels read their copies with the keys (or queries) of each 8 in sigma's order
    # (attention v34): place 8g + sigma(c) of the copy holds row 8g + c, sigma(b0 + 2 b1 + 4 b2) = b1 + 2 b2
    # + 4 b0; a tensor with unit stride on L already is copied too
    b, h, length, d = shape
    sigma = [(c >> 1) | ((c & 1) << 2) for c in range(8)]
    rows = ra.sigma_rows(length)
    assert sorted(rows.tolist()) == list(range(length))
    assert all(rows[8 * g + sigma[c]] == 8 * g + c for g in range(length // 8) for c in range(8))
    blhd = randn((b, length, h, d), torch.float32, device, gen).transpose(1, 2)
    unit_l = blhd.transpose(2, 3).contiguous().transpose(2, 3)
    got = ra._l_contiguous(blhd, unit_l, sigma=True)
    assert got[1] is not unit_l
    for a in got:
        assert a.stride(2) == 1 and a.transpose(2, 3).is_contiguous()
        assert torch.equal(a, blhd[:, :, rows.to(device)])
    with pytest.raises(ValueError, match="multiple of 8"):
        ra._l_contiguous(blhd[:, :, :-1], sigma=True)


def test_l_major_copy_in_sigma_order_past_the_grid_limit(gen, monkeypatch):
    # more than 65535 of the copy kernel's tiles along L: torch's copy instead, in the same order
    monkeypatch.setattr(ra, "L_MAJOR_TILE", (1, 16, 4))
    t = randn((1, 65544, 1, 2), torch.float32, "cpu", gen).transpose(1, 2)
    (got,) = ra._l_contiguous(t, sigma=True)
    assert got.stride(2) == 1 and torch.equal(got, t[:, :, ra.sigma_rows(65544)])


@pytest.mark.parametrize("lq, lk", [(70, 70), (17, 100), (100, 17)])
def test_peeled_first_block_changes_nothing(lq, lk, device, gen, monkeypatch):
    # float32's non-causal loops take their first block in a loop of its own (ra._peel: ptxas serializes
    # their tf32 products otherwise); the blocks are added in the same order, so the results are those of
    # the single loop bit for bit, at lengths shorter than a block, with a tail, and unequal
    assert ra._peel(torch.float32, False)
    assert not ra._peel(torch.float32, True) and not ra._peel(torch.bfloat16, False)
    q, k, v = qkv(1, 2, lq, lk, 32, torch.float32, device, gen)
    do = randn(q.shape, torch.float32, device, gen)
    args = (q, k, v, False, False, 1 / math.sqrt(32), 1 / lk)
    peeled = (ra.relu_attention_fwd(*args), *ra.relu_attention_bwd(q, k, v, do, *args[3:]))
    monkeypatch.setattr(ra, "_peel", lambda dtype, causal: False)
    plain = (ra.relu_attention_fwd(*args), *ra.relu_attention_bwd(q, k, v, do, *args[3:]))
    for a, b in zip(peeled, plain, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("group, first", [(3, 5), (4, 0), (3, 0), (8, 0), (2, 6), (5, 3)])
def test_grouped_causal_order_changes_nothing(group, first, device, gen, monkeypatch):
    # the descriptor forward may take its last (batch, head) pairs' blocks as one group, heaviest first
    # (ra._causal_order, 16-bit D=64 causal rows longer than SHORT_L): every block is computed as before,
    # in another launch order, so the output is the plain order's bit for bit; 8 pairs, groups of 3 after
    # 5 pairs one by one, groups that divide the pairs and one that does not, one group of all
    def keys(length, d):  # 4 x 16 pairs: 16 MiB of keys and values is 16 pairs at L=4096, D=64
        return torch.empty(4, 16, length, d, dtype=torch.bfloat16, device="meta")

    assert ra._causal_order(keys(4096, 64), True) == (16, 48)
    assert ra._causal_order(keys(4096, 64), False) == ra._causal_order(keys(4096, 128), True) == (1, 0)
    assert ra._causal_order(keys(1024, 64), True) == (1, 0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v = qkv(2, 4, 100, 100, 64, dtype, device, gen)
    args = (q, k, v, True, False, 0.125, 0.01)
    cfg = ra.AttnConfig(32, 16, 4, 1, True)
    if not ra._tma_usable(ra.is_interpreted(ra._relu_attn_fwd_kernel), q, k, v):
        pytest.skip("the descriptor kernels need compute capability 9+ on GPUs")
    monkeypatch.setattr(ra, "_causal_order", lambda k, causal: (group, first))
    grouped = ra.relu_attention_fwd(*args, config=cfg)
    monkeypatch.setattr(ra, "_causal_order", lambda k, causal: (1, 0))
    plain = ra.relu_attention_fwd(*args, config=cfg)
    assert torch.equal(grouped, plain)
    ref = relu_attention_ref(q, k, v, causal=True, scale=0.125, relu_scale=0.01)
    assert relerr(grouped, ref) <= tolerance("relu_attention", dtype, tf32=q.is_cuda)


@pytest.mark.parametrize("length", [20, 70, 96, 128])
def test_folded_causal_blocks_change_nothing(length, device, gen, monkeypatch):
    # float32's causal kernels give each program two blocks, a heavy one and its light mirror (ra._fold);
    # each block is computed as before, so the results are the unfolded kernels' bit for bit, with one
    # block (shorter than a block), an odd count whose middle block has no partner, a tail, an even count
    assert ra._fold(torch.float32, True)
    assert not ra._fold(torch.float32, False) and not ra._fold(torch.bfloat16, True)
    q, k, v = qkv(1, 2, length, length, 32, torch.float32, device, gen)
    do = randn(q.shape, torch.float32, device, gen)
    args = (q, k, v, True, False, 1 / math.sqrt(32), 1 / length)
    cfg = ra.AttnConfig(32, 32, 4, 2)  # blocks of 32 on GPUs too (the tables' tiles hold these lengths whole)

    def run():
        grads = ra.relu_attention_bwd(q, k, v, do, *args[3:], configs=(cfg, cfg))
        return (ra.relu_attention_fwd(*args, config=cfg), *grads)

    folded = run()
    monkeypatch.setattr(ra, "_fold", lambda dtype, causal: False)
    plain = run()
    for a, b in zip(folded, plain, strict=True):
        assert torch.equal(a, b)
    ref = relu_attention_ref(q, k, v, causal=True, scale=1 / math.sqrt(32), relu_scale=1 / length)
    assert relerr(folded[0], ref) <= tolerance("relu_attention", torch.float32, tf32=q.is_cuda)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kernels", ["pointers", "descriptors"])
@pytest.mark.parametrize("d", [64, 128])
def test_dependent_dq_launch_changes_nothing(d, kernels, causal, gen, monkeypatch):
    # on compute capability 9+ the dQ kernel is a programmatic dependent launch that starts while the
    # dK/dV kernel ends (they read the same inputs and write different outputs) and waits for it at its
    # end: the gradients must be those of plain launches, bit for bit, and a following kernel must see
    # dk and dv complete (they are read right after, on the same stream)
    if not ra._gdc.usable(torch.empty(0, device="cuda"), False):
        pytest.skip("needs grid dependency control (compute capability 9+, Triton 3.4+)")
    tma = kernels == "descriptors"
    configs = (ra.AttnConfig(64, 64, 4, 2, tma), ra.AttnConfig(64, 64, 4, 2, tma))
    q, k, v = qkv(4, 8, 1000, 1000, d, torch.bfloat16, "cuda", gen)
    do = randn(q.shape, torch.bfloat16, "cuda", gen)
    args = (q, k, v, do, causal, False, 1 / math.sqrt(d), 1e-3)
    chained = [tuple(t.clone() for t in ra.relu_attention_bwd(*args, configs=configs)) for _ in range(3)]
    monkeypatch.setattr(ra._gdc, "usable", lambda t, interpreted: False)
    plain = ra.relu_attention_bwd(*args, configs=configs)
    for got in chained:
        for a, b in zip(got, plain, strict=True):
            assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float32_kernels_chained_after_their_copies_change_nothing(causal, gen, monkeypatch):
    # float32's kernels read copies with unit stride on L; on compute capability 9+ the forward and the
    # dK/dV kernel are dependent launches after the copy kernel, waiting for it at their start (and the dQ
    # kernel, which reads k's copy, starts only after the dK/dV kernel's programs waited): the results
    # must be those of plain launches, bit for bit, on inputs written just before by another kernel. Each
    # call takes other inputs, so a kernel reading a copy buffer before its copy completed (the allocator
    # hands the last call's buffers back) would read the last call's values
    if not ra._gdc.usable(torch.empty(0, device="cuda"), False):
        pytest.skip("needs grid dependency control (compute capability 9+, Triton 3.4+)")
    b, h, length, d = 4, 16, 1000, 64
    base = [randn((b, length, h, d), torch.float32, "cuda", gen) for _ in range(4)]
    args = (causal, False, 1 / math.sqrt(d), 1e-3)

    def run(factor):
        q, k, v, do = (t.mul(factor).transpose(1, 2) for t in base)  # [B, L, H, D] written by a kernel
        return ra.relu_attention_fwd(q, k, v, *args).clone(), *ra.relu_attention_bwd(q, k, v, do, *args)

    factors = (1.0, -0.5, 2.0, 0.25)
    chained = [run(f) for f in factors]
    monkeypatch.setattr(ra._gdc, "usable", lambda t, interpreted: False)
    for f, got in zip(factors, chained, strict=True):
        for a, c in zip(got, run(f), strict=True):
            assert torch.equal(a, c)


def test_launch_configs_divide_for_causal_blocks():
    # causal loops need the block sizes to divide each other (fwd/dq: BLOCK_N | BLOCK_M; dkdv: BLOCK_M |
    # BLOCK_N), for every head dim and dtype the heuristic or the tuned table can return
    for d in ra.HEAD_DIMS:
        for dtype in DTYPES:
            for causal in (False, True):
                for kind in ("fwd", "dq"):
                    cfg = ra.attention_config(kind, d, dtype, causal)
                    assert cfg.block_m % cfg.block_n == 0, (kind, d, dtype, cfg)
                cfg = ra.attention_config("dkdv", d, dtype, causal)
                assert cfg.block_n % cfg.block_m == 0, (d, dtype, cfg)
                assert math.log2(cfg.block_m).is_integer() and math.log2(cfg.block_n).is_integer()


class _KernelFitting:
    """Stands in for a Triton kernel on a GPU whose shared memory holds ``fits`` pipeline stages: a launch
    with more raises Triton's OutOfResources, as Triton does before running anything."""

    def __init__(self, fits: int, resource: str = "shared memory"):
        self.fits, self.resource, self.stages_tried = fits, resource, []

    def __getitem__(self, grid):
        def launch(*args, num_stages, **options):
            self.stages_tried.append(num_stages)
            if num_stages > self.fits:
                raise OutOfResources(49152 * num_stages, 49152 * self.fits, self.resource)

        return launch


def test_launch_takes_fewer_stages_where_shared_memory_is_smaller(monkeypatch):
    # the tables were tuned on an H200; on a GPU with less shared memory the launcher steps the stages
    # down until the launch fits, once, and launches with those afterwards
    monkeypatch.setattr(ra, "_STAGES_THAT_FIT", {})
    kernel = _KernelFitting(fits=2)
    key = ("cuda:0", torch.bfloat16, 128, ra.AttnConfig(64, 128, 8, 4))
    ra._launch(kernel, (1, 1), key, "arg", num_warps=8, num_stages=4)
    assert kernel.stages_tried == [4, 3, 2]
    ra._launch(kernel, (1, 1), key, "arg", num_warps=8, num_stages=4)
    assert kernel.stages_tried == [4, 3, 2, 2]
    fits_all = _KernelFitting(fits=4)
    ra._launch(fits_all, (1, 1), key, num_warps=8, num_stages=4)  # another kernel: its own stages
    assert fits_all.stages_tried == [4]


def test_launch_reraises_what_fewer_stages_cannot_fix(monkeypatch):
    monkeypatch.setattr(ra, "_STAGES_THAT_FIT", {})
    key = ("cuda:0", torch.bfloat16, 128, ra.AttnConfig(64, 128, 8, 3))
    too_big = _KernelFitting(fits=0)
    with pytest.raises(OutOfResources, match="shared memory"):
        ra._launch(too_big, (1, 1), key, num_warps=8, num_stages=3)
    assert too_big.stages_tried == [3, 2, 1]
    threads = _KernelFitting(fits=1, resource="threads")
    with pytest.raises(OutOfResources, match="threads"):
        ra._launch(threads, (1, 1), key, num_warps=8, num_stages=3)
    assert threads.stages_tried == [3]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_forward_reads_values_with_unit_stride_on_keys(dtype, device, gen):
    # the launcher streams float32 values from a transposed copy on GPUs; any dtype may come that way
    q, k, v = qkv(2, 2, 70, 70, 32, dtype, device, gen)
    v_t = v.transpose(2, 3).contiguous().transpose(2, 3)  # [B, H, L, D] view, unit stride on L
    assert v_t.stride(2) == 1 and torch.equal(v_t, v)
    want = ra.relu_attention_fwd(q, k, v, True, False, 0.2, 1 / 70)
    got = ra.relu_attention_fwd(q, k, v_t, True, False, 0.2, 1 / 70)
    # the same products from operands in another memory layout: equal up to the output's rounding
    assert relerr(got, want) <= (1e-6 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_backward_reading_copies_with_unit_stride_on_keys(causal, device, gen):
    # float32 on GPUs reads q, dout and k for the products summed over L from copies with unit stride on
    # L (tf32 tensor cores want those operands K-major); the interpreter runs the same code when asked
    q, k, v = qkv(2, 2, 100, 100, 32, torch.float32, device, gen)
    do = randn(q.shape, torch.float32, device, gen)
    args = (q, k, v, do, causal, False, 0.2, 0.01)
    copies = ra.relu_attention_bwd(*args, trans_copies=True)
    plain = ra.relu_attention_bwd(*args, trans_copies=False)
    tf32 = device == "cuda"
    refs = [(tf32_truncate(t) if tf32 else t).double().requires_grad_(True) for t in (q, k, v)]
    out = relu_attention_ref(*refs, causal=causal, scale=0.2, relu_scale=0.01)
    tol = tolerance("relu_attention", torch.float32, "bwd", tf32=tf32)
    grads = torch.autograd.grad(out, refs, do.double())
    for name, a, b, ref in zip(("dq", "dk", "dv"), copies, plain, grads, strict=True):
        assert relerr(a, ref) <= tol, (name, relerr(a, ref))
        # the same products from operands in another memory layout: equal up to float32 rounding
        assert relerr(a, b) <= 1e-6, (name, relerr(a, b))


def _descriptor_configs(device):
    """(fwd, dkdv, dq) configs that ask for the tensor-descriptor kernels: small tiles in the interpreter;
    on a GPU, tiles of the tables."""
    if device == "cpu":
        return [(ra.AttnConfig(32, 16, 4, 1, True), ra.AttnConfig(16, 32, 4, 1, True),
                 ra.AttnConfig(32, 16, 4, 1, True))]  # fmt: skip
    fwd = ra.AttnConfig(64, 64, 4, 3, True)
    return [
        (fwd, ra.AttnConfig(64, 64, 4, 2, True), ra.AttnConfig(128, 32, 8, 3, True)),
        (fwd, ra.AttnConfig(64, 128, 8, 3, True), ra.AttnConfig(128, 64, 8, 3, True)),
    ]


@pytest.mark.parametrize("squared", [False, True], ids=["relu", "squared"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", ra.LAYOUTS)
@pytest.mark.parametrize("length", [17, 100, 192], ids=lambda n: f"L={n}")
def test_tensor_descriptor_kernels(length, layout, causal, squared, device, gen):
    # the TMA kernels: tails are the copy engine's zero fill and clipped stores, no masks
    if device == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("tensor descriptors need compute capability 9 or later")
    dtype, d = (torch.float32, 32) if device == "cpu" else (torch.bfloat16, 128)
    shape = (2, 3, length, d) if layout == "bhld" else (2, length, 3, d)
    q, k, v, do = (randn(shape, dtype, device, gen) for _ in range(4))
    qb, kb, vb, dob = (ra._to_bhld(t, layout) for t in (q, k, v, do))
    dq, dk, dv = (ra._to_bhld(ra._empty_in_layout(t, t.shape, layout), layout) for t in (qb, kb, vb))
    out = ra._to_bhld(ra._empty_in_layout(qb, qb.shape, layout), layout)
    assert ra._tma_usable(device == "cpu", qb, kb, vb, dob, dq, dk, dv, out)  # else it would test nothing
    scale, relu_scale = 1 / math.sqrt(d), 1 / length
    refs = [t.double().requires_grad_(True) for t in (qb, kb, vb)]
    want = relu_attention_ref(*refs, causal=causal, squared=squared, scale=scale, relu_scale=relu_scale)
    grads = torch.autograd.grad(want, refs, dob.double())
    for fwd, dkdv, dq_cfg in _descriptor_configs(device):
        ra.relu_attention_fwd(qb, kb, vb, causal, squared, scale, relu_scale, out=out, config=fwd)
        ra.relu_attention_bwd(qb, kb, vb, dob, causal, squared, scale, relu_scale, dq, dk, dv,
                              configs=(dkdv, dq_cfg))  # fmt: skip
        assert relerr(out, want) <= tolerance("relu_attention", dtype, "fwd"), (fwd, relerr(out, want))
        slack = kink_slack(qb, kb, vb, dob, causal, squared)
        for name, got, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), grads, strict=True):
            err = relerr_with_slack(got, ref, slack[name])
            assert err <= tolerance("relu_attention", dtype, "bwd"), (name, dkdv, err)


def test_gluon_forward_row_views_address_every_element(gen):
    # the Gluon float32 forward reads q and k through 2-D views: row b*rb + h*rh + l, column h*ch + d must
    # be element (b, h, l, d) of the [B, H, L, D] view, for [B, H, L, D] and [B, L, H, D] storage alike
    from crossfuse.ops import _attn_tf32

    B, H, L, D = 2, 3, 5, 4
    x = torch.randn(B, L, H, D, generator=gen)
    for t in (x.transpose(1, 2).contiguous(), x.transpose(1, 2), x.transpose(1, 2)[:, 1:]):
        view, rb, rh, ch = _attn_tf32.rows_view(t)
        assert view.data_ptr() == t.data_ptr()
        b, h, ll, d = (torch.arange(n).view(*([1] * i), n, *([1] * (3 - i))) for i, n in enumerate(t.shape))
        assert torch.equal(view[b * rb + h * rh + ll, h * ch + d], t)
    # a head stride neither a multiple of the rows' nor past the heads' columns: no such view
    odd = torch.empty(64).as_strided((1, 3, 4, 4), (40, 6, 8, 1))
    assert _attn_tf32.rows_view(odd) is None
    q = torch.zeros(1, 2, 128, 64)
    assert not _attn_tf32.usable(q, q, True, 64, 64)  # the interpreter, or a CPU tensor: Triton's kernel
    tiles = ((32, 64, 2, 1), (64, 64, 2, 1))
    assert not _attn_tf32.usable_bwd(q, q, q, q, (q, q, q), (q, q, q), True, *tiles)


def test_head_group_is_the_smallest_divisor_with_a_wave_of_programs(monkeypatch):
    # the causal launch order's groups of heads (attention v30): the smallest divisor of B*H whose heads
    # have GROUP_PROGRAMS programs (all heads where fewer); one head at a time where not causal; FORCE_GROUP
    # (a probe's) as a divisor of B*H
    monkeypatch.setattr(ra._attn_tf32, "GROUP_PROGRAMS", 256)
    assert ra._attn_tf32.head_group(64, True, 16) == 16  # L=1024 in 64-row blocks
    assert ra._attn_tf32.head_group(64, True, 32) == 8
    assert ra._attn_tf32.head_group(60, True, 24) == 12  # 11 heads would do: 12 is the next divisor
    assert ra._attn_tf32.head_group(6, True, 2) == 6  # 12 programs in all: every head in one group
    assert ra._attn_tf32.head_group(13, True, 64) == 13  # prime
    assert ra._attn_tf32.head_group(64, True, 512) == 1
    assert ra._attn_tf32.head_group(64, False, 16) == 1
    monkeypatch.setattr(ra._attn_tf32, "FORCE_GROUP", 16)
    assert ra._attn_tf32.head_group(24, False, 4) == 8


@pytest.mark.parametrize("scale", [0.0, -0.125, math.inf, math.nan])
def test_backward_refuses_a_scale_that_is_not_positive(scale):
    # the raw backward (the public API checks its arguments before): its kernels take relu's derivative
    # from the sign of the unscaled scores, which a negative scale flips (at scale -1/8 that formula's dq
    # is 1.35 from autograd's, relatively, in float64 on the CPU): refused, naming the argument, before
    # any launch
    q = torch.randn(1, 2, 16, 8)
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        ra.relu_attention_bwd(q, q, q, q, False, False, scale, 1 / 16)


def test_gluon_scale_fold_and_tile_flags(monkeypatch):
    # the launchers' arithmetic of the fold (attention v35, v36): a positive, finite scale goes with
    # relu_scale (squared: its square), any other stays with the scores; and the tiles' flags
    fold_scale = ra._attn_tf32.fold_scale
    assert fold_scale(0.125, 1 / 1024, False) == (True, 0.125 / 1024)
    assert fold_scale(0.1, 0.5, True) == (True, 0.5 * (0.1 * 0.1))
    for scale in (0.0, -0.125, math.inf, -math.inf, math.nan):
        assert fold_scale(scale, 0.25, False) == (False, 0.25), scale
    says_trans, says_write = ra._attn_tf32.says_trans, ra._attn_tf32.says_write
    tiles = ((64, 64, 2, 1), (64, 64, 2, 1, 0), (64, 64, 2, 1, 1))
    assert [says_trans(t) for t in tiles] == [False, False, True]
    tiles = ((64, 64, 2, 1, 1), (64, 64, 2, 1, 1, 0), (64, 64, 2, 1, 1, 1))
    assert [says_write(t) for t in tiles] == [False, False, True]
    # a dQ kernel that writes the copies must transpose k itself, and the dK/dV kernel read the copies
    # (the tensors' checks, which a CPU tensor fails, passed here)
    monkeypatch.setattr(ra._attn_tf32, "_row_views", lambda tensors, interpreted, multiple: "views")
    q = torch.zeros(1, 2, 128, 64)
    usable = [((32, 64, 2, 1), (64, 64, 2, 1, 1, 1)), ((32, 64, 2, 1), (64, 64, 2, 1, 1, 0))]
    refused = [((32, 64, 2, 1), (64, 64, 2, 1, 0, 1)), ((32, 64, 2, 1, 1), (64, 64, 2, 1, 1, 1))]
    for tiles in usable + refused:
        found = ra._attn_tf32.usable_bwd(q, q, q, q, None, (q, q, q), False, *tiles)
        assert (found is not None) == (tiles in usable), tiles


# every key of the float32 Gluon tables TF32_FWD and TF32_BWD: (causal, long sequence)
_EVERY_KEY = [(c, long) for c in (False, True) for long in (False, True)]


def _float32_gpu_inputs(n, length, layout, d, gen):
    """``n`` random float32 CUDA tensors of B=2, H=3 stored in ``layout``, as [B, H, L, D] views."""
    shape = (2, 3, length, d) if layout == "bhld" else (2, length, 3, d)
    return [ra._to_bhld(randn(shape, torch.float32, "cuda", gen), layout) for _ in range(n)]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tiles",
    [(128, 64, 2, 0, 0), (64, 64, 3, 0, 0), (64, 32, 2, 0, 0), (128, 64, 2, 1, 0), (64, 64, 3, 1, 0),
     (64, 32, 3, 1, 0), (128, 64, 2, 0, 1), (64, 64, 2, 1, 1), (64, 32, 2, 0, 1), (128, 64, 2, 1, 1)],
    ids=lambda t: f"{t[0]}x{t[1]}x{t[2]}{'a' * t[3]}{'t' * t[4]}",
)  # fmt: skip
@pytest.mark.parametrize("squared", [False, True], ids=["relu", "squared"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", ra.LAYOUTS)
@pytest.mark.parametrize("length", [128, 320, 100], ids=lambda n: f"L={n}")
def test_float32_gluon_forward(length, layout, causal, squared, tiles, gen, monkeypatch, launched, copies):
    # the float32 forward in Gluon (attention v26, its products in flight v30, v transposed in the kernel
    # v31; crossfuse.ops._attn_tf32): against float64 on the tf32-truncated inputs and against Triton's
    # kernel; where the length is not a multiple of the query tile (L=100; L=320 with 128 rows) Triton's
    # kernel runs, after v's copy, as does the Gluon kernel without TRANS
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon forward needs compute capability 9 or later")
    monkeypatch.setattr(ra, "TF32_FWD", dict.fromkeys(_EVERY_KEY, tiles))
    d = 64
    qb, kb, vb = _float32_gpu_inputs(3, length, layout, d, gen)
    v_before = vb.clone()
    scale, relu_scale = 1 / math.sqrt(d), 1 / length
    got = ra.relu_attention_fwd(qb, kb, vb, causal, squared, scale, relu_scale)
    gluon_ran = ra._attn_tf32._attn_fwd_tf32_kernel in launched
    assert gluon_ran == (length % tiles[0] == 0)
    assert copies == ([] if gluon_ran and tiles[4] else [1]), copies  # v's copy, unless TRANS
    monkeypatch.setattr(ra, "TF32_FWD", {})
    triton_kernel = ra.relu_attention_fwd(qb, kb, vb, causal, squared, scale, relu_scale)
    refs = [tf32_truncate(t).double() for t in (qb, kb, vb)]
    want = relu_attention_ref(*refs, causal=causal, squared=squared, scale=scale, relu_scale=relu_scale)
    tol = tolerance("relu_attention", torch.float32, "fwd", tf32=True)
    assert relerr(got, want) <= tol, relerr(got, want)
    assert relerr(got, triton_kernel) <= 1e-5, relerr(got, triton_kernel)
    assert torch.equal(vb, v_before)  # v's tiles are transposed in shared memory, not in v


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [0.125, 0.1, -0.125], ids=["pow2", "other", "negative"])
@pytest.mark.parametrize("squared", [False, True], ids=["relu", "squared"])
def test_float32_gluon_forward_folds_the_scale(scale, squared, gen, monkeypatch, launched):
    # the Gluon forward applies a positive scale with relu_scale, to the output (relu(s * scale) = scale *
    # relu(s), squared: scale^2; attention v35), and a scale that is not positive (which the raw launcher
    # takes) to the scores: both against float64 and against Triton's kernel, which scales the scores:
    # equal up to float32 rounding where the scale is a power of 2, else up to the tf32 rounding of p
    # (rounded before the scale here, after it there: 3.2e-4 apart at scale 0.1 in run 315)
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon forward needs compute capability 9 or later")
    monkeypatch.setattr(ra, "TF32_FWD", dict.fromkeys(_EVERY_KEY, (128, 64, 2, 0, 1)))
    qb, kb, vb = _float32_gpu_inputs(3, 256, "blhd", 64, gen)
    call = (True, squared, scale, 1 / 256)
    got = ra.relu_attention_fwd(qb, kb, vb, *call)
    assert launched == [ra._attn_tf32._attn_fwd_tf32_kernel], launched
    monkeypatch.setattr(ra, "TF32_FWD", {})
    triton_kernel = ra.relu_attention_fwd(qb, kb, vb, *call)
    refs = [tf32_truncate(t).double() for t in (qb, kb, vb)]
    want = relu_attention_ref(*refs, causal=True, squared=squared, scale=scale, relu_scale=1 / 256)
    tol = tolerance("relu_attention", torch.float32, "fwd", tf32=True)
    assert relerr(got, want) <= tol, relerr(got, want)
    between = 1e-5 if math.log2(abs(scale)).is_integer() else 2 * tol
    assert relerr(got, triton_kernel) <= between, relerr(got, triton_kernel)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float32_gluon_forward_transposes_v_or_reads_its_copy(causal, gen, monkeypatch, launched, copies):
    # TRANS (attention v31): v's tiles transposed in shared memory, no copy; without it, v's copy; the same
    # products in the same order either way: equal bit for bit
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon forward needs compute capability 9 or later")
    qb, kb, vb = _float32_gpu_inputs(3, 256, "blhd", 64, gen)
    call = (qb, kb, vb, causal, False, 0.125, 1 / 256)
    results = []
    for trans in (1, 0):
        monkeypatch.setattr(ra, "TF32_FWD", dict.fromkeys(_EVERY_KEY, (128, 64, 2, 0, trans)))
        copies.clear()
        launched.clear()
        results.append(ra.relu_attention_fwd(*call))
        assert launched == [ra._attn_tf32._attn_fwd_tf32_kernel], launched
        assert copies == ([] if trans else [1]), (trans, copies)
    assert torch.equal(results[0], results[1]), relerr(results[0], results[1])


@pytest.mark.gpu
@pytest.mark.parametrize("tiles", [(128, 64, 2, 0, 0), (64, 64, 3, 1, 0)], ids=["128x64", "64x64a"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float32_gluon_forward_reads_l_major_v(causal, tiles, gen, monkeypatch, launched, copies):
    # a v with unit stride on L ([B, H, D, L] contiguous) is read as it is, its keys in their order (the
    # left operand p moved between lanes, attention v26), where v's copy has them in sigma's order (p
    # relabelled, v34): both against float64, and against each other up to float32 rounding
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon forward needs compute capability 9 or later")
    monkeypatch.setattr(ra, "TF32_FWD", dict.fromkeys(_EVERY_KEY, tiles))
    qb, kb, vb = _float32_gpu_inputs(3, 256, "blhd", 64, gen)
    v_l = vb.transpose(2, 3).contiguous().transpose(2, 3)
    call = (causal, False, 0.125, 1 / 256)
    got = ra.relu_attention_fwd(qb, kb, v_l, *call)
    assert copies == [] and launched == [ra._attn_tf32._attn_fwd_tf32_kernel], (copies, launched)
    copied = ra.relu_attention_fwd(qb, kb, vb, *call)
    assert copies == [1], copies
    refs = [tf32_truncate(t).double() for t in (qb, kb, vb)]
    want = relu_attention_ref(*refs, causal=causal, squared=False, scale=0.125, relu_scale=1 / 256)
    tol = tolerance("relu_attention", torch.float32, "fwd", tf32=True)
    assert relerr(got, want) <= tol and relerr(copied, want) <= tol, (relerr(got, want), relerr(copied, want))
    assert relerr(got, copied) <= 1e-5, relerr(got, copied)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tiles",
    [(128, 64, 2, 0, 0), (64, 64, 3, 1, 0), (128, 64, 2, 0, 1), (64, 64, 3, 1, 1), (64, 64, 2, 0, 1)],
    ids=lambda t: f"{t[0]}x{t[1]}x{t[2]}{'a' * t[3]}{'t' * t[4]}",
)  # fmt: skip
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float32_gluon_forward_many_blocks(causal, tiles, gen, monkeypatch, launched):
    # 16 key blocks a program and more programs than the GPU holds at once: with p relabelled (attention
    # v34) the products in flight (ASYNC) once read a p the next block's relu had overwritten, which
    # the shorter sequences of test_float32_gluon_forward did not show (run 311)
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon forward needs compute capability 9 or later")
    monkeypatch.setattr(ra, "TF32_FWD", dict.fromkeys(_EVERY_KEY, tiles))
    qb, kb, vb = _float32_gpu_inputs(3, 1024, "blhd", 64, gen)
    qb, kb, vb = (t.repeat(8, 1, 1, 1) for t in (qb, kb, vb))  # B=16, H=3
    call = (causal, False, 0.125, 1 / 1024)
    got = ra.relu_attention_fwd(qb, kb, vb, *call)
    assert ra._attn_tf32._attn_fwd_tf32_kernel in launched
    monkeypatch.setattr(ra, "TF32_FWD", {})
    triton_kernel = ra.relu_attention_fwd(qb, kb, vb, *call)
    refs = [tf32_truncate(t[:2]).double() for t in (qb, kb, vb)]
    want = relu_attention_ref(*refs, causal=causal, squared=False, scale=0.125, relu_scale=1 / 1024)
    tol = tolerance("relu_attention", torch.float32, "fwd", tf32=True)
    assert relerr(got[:2], want) <= tol, relerr(got[:2], want)
    assert relerr(got, triton_kernel) <= 1e-5, relerr(got, triton_kernel)


def _tile_id(tiles):
    """A kernel's tiles (BLOCK_M, BLOCK_N, STAGES, ASYNC[, TRANS[, WRITE]]) as a test id: 32x64a (ASYNC),
    t (TRANS), w (the dQ kernel writes q's and dout's copies)."""
    flags = [*tiles[3:], 0, 0][:3]
    return f"{tiles[0]}x{tiles[1]}" + "".join(c * bool(f) for c, f in zip("atw", flags, strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tiles",
    [((32, 64, 3, 1), (64, 64, 2, 1)), ((64, 64, 2, 0), (128, 64, 2, 0)), ((32, 128, 2, 1), (64, 32, 3, 0)),
     ((32, 64, 3, 1, 1), (64, 64, 2, 1, 1)), ((32, 64, 2, 1, 1), (64, 32, 3, 1, 0)),
     ((32, 64, 2, 0, 0), (64, 32, 3, 0, 1)), ((32, 128, 2, 1, 1), (128, 32, 2, 1, 1)),
     ((32, 64, 2, 1), (64, 64, 2, 1, 1, 1)), ((64, 128, 2, 1), (128, 64, 2, 0, 1, 1))],
    ids=lambda t: "-".join(_tile_id(x) for x in t),
)  # fmt: skip
@pytest.mark.parametrize("squared", [False, True], ids=["relu", "squared"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", ra.LAYOUTS)
@pytest.mark.parametrize("length", [128, 384, 100], ids=lambda n: f"L={n}")
def test_float32_gluon_backward(length, layout, causal, squared, tiles, gen, monkeypatch, launched, copies,
                                nan_copies):  # fmt: skip
    # the float32 backward in Gluon (attention v27; its kernels transposing their tiles of q and dout, or
    # of k, themselves where the tiles say TRANS, v32; the dQ kernel first, writing q's and dout's copies,
    # where its tiles say WRITE, v36; crossfuse.ops._attn_tf32): against float64 on the tf32-truncated
    # inputs and against Triton's kernels; where the length is not a multiple of the tiles (L=100; L=384
    # with 128-row tiles) Triton's kernels run, after the copies of q, dout and k
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon backward needs compute capability 9 or later")
    monkeypatch.setattr(ra, "TF32_BWD", dict.fromkeys(_EVERY_KEY, tiles))
    d = 64
    qb, kb, vb, dob = _float32_gpu_inputs(4, length, layout, d, gen)
    before = [t.clone() for t in (qb, kb, vb, dob)]
    scale, relu_scale = 1 / math.sqrt(d), 1 / length
    args = (qb, kb, vb, dob, causal, squared, scale, relu_scale)
    got = ra.relu_attention_bwd(*args)
    gluon = {ra._attn_tf32._attn_bwd_dkdv_tf32_kernel, ra._attn_tf32._attn_bwd_dq_tf32_kernel}
    multiple = math.lcm(tiles[0][1], tiles[1][0])
    ran = length % multiple == 0
    assert (gluon <= set(launched)) == ran, (launched, multiple)
    trans = [ran and ra._attn_tf32.says_trans(t) for t in tiles]
    write = ran and ra._attn_tf32.says_write(tiles[1])
    # q and dout for the dK/dV kernel (unless the dQ kernel writes them), k for the dQ kernel
    wanted = 2 * (not trans[0] and not write) + (not trans[1])
    assert copies == ([wanted] if wanted else []), copies
    if write:  # the dQ kernel first: the dK/dV kernel reads what it wrote (the copies NaN before)
        assert launched == [ra._attn_tf32._attn_bwd_dq_tf32_kernel, ra._attn_tf32._attn_bwd_dkdv_tf32_kernel]
    assert len(nan_copies) == write, nan_copies
    assert all(torch.equal(a, b) for a, b in zip((qb, kb, vb, dob), before, strict=True))
    monkeypatch.setattr(ra, "TF32_BWD", {})
    triton_kernels = ra.relu_attention_bwd(*args)
    refs = [tf32_truncate(t).double().requires_grad_(True) for t in (qb, kb, vb)]
    out = relu_attention_ref(*refs, causal=causal, squared=squared, scale=scale, relu_scale=relu_scale)
    grads = torch.autograd.grad(out, refs, dob.double())
    slack = kink_slack(qb, kb, vb, dob, causal, squared, scale=scale, relu_scale=relu_scale)
    tol = tolerance("relu_attention", torch.float32, "bwd", tf32=True)
    for name, a, b, ref in zip(("dq", "dk", "dv"), got, triton_kernels, grads, strict=True):
        err = relerr_with_slack(a, ref, slack[name])
        assert err <= tol, (name, err)
        # the same tf32 products summed in another order: equal up to float32 rounding
        assert relerr(a, b) <= 1e-4, (name, relerr(a, b))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tiles",
    [((32, 64, 2, 1), (64, 64, 2, 1)), ((64, 128, 2, 1, 1), (64, 64, 2, 1, 1)),
     ((32, 64, 2, 1), (64, 64, 2, 1, 1, 1)), ((64, 128, 2, 1), (128, 64, 2, 0, 1, 1))],
    ids=lambda t: "-".join(_tile_id(x) for x in t),
)  # fmt: skip
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float32_gluon_backward_many_blocks(causal, tiles, gen, monkeypatch, launched, nan_copies):
    # L=1024 and more programs than the GPU holds at once, so that the second kernel's programs start
    # while the first one's last run: above all where the dQ kernel writes the copies the dK/dV kernel
    # reads (WRITE, attention v36; NaN before), which that kernel may read only once the dQ kernel is done
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon backward needs compute capability 9 or later")
    monkeypatch.setattr(ra, "TF32_BWD", dict.fromkeys(_EVERY_KEY, tiles))
    qb, kb, vb, dob = _float32_gpu_inputs(4, 1024, "blhd", 64, gen)
    qb, kb, vb, dob = (t.repeat(8, 1, 1, 1) for t in (qb, kb, vb, dob))  # B=16, H=3
    args = (qb, kb, vb, dob, causal, False, 0.125, 1 / 1024)
    got = ra.relu_attention_bwd(*args)
    assert {ra._attn_tf32._attn_bwd_dkdv_tf32_kernel, ra._attn_tf32._attn_bwd_dq_tf32_kernel} <= set(launched)
    monkeypatch.setattr(ra, "TF32_BWD", {})
    triton_kernels = ra.relu_attention_bwd(*args)
    refs = [tf32_truncate(t[:2]).double().requires_grad_(True) for t in (qb, kb, vb)]
    out = relu_attention_ref(*refs, causal=causal, squared=False, scale=0.125, relu_scale=1 / 1024)
    grads = torch.autograd.grad(out, refs, dob[:2].double())
    slack = kink_slack(qb[:2], kb[:2], vb[:2], dob[:2], causal, False, scale=0.125, relu_scale=1 / 1024)
    tol = tolerance("relu_attention", torch.float32, "bwd", tf32=True)
    for name, a, b, ref in zip(("dq", "dk", "dv"), got, triton_kernels, grads, strict=True):
        assert relerr_with_slack(a[:2], ref, slack[name]) <= tol, (name, relerr(a[:2], ref))
        assert relerr(a, b) <= 1e-4, (name, relerr(a, b))
        # every repeat of the batch alike: the copies each program read were all written
        assert all(torch.equal(a[i : i + 2], a[:2]) for i in range(2, 16, 2)), name


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tiles",
    [((32, 64, 2, 1), (64, 64, 2, 1)), ((64, 128, 2, 1, 1), (64, 64, 2, 1, 1)),
     ((32, 64, 2, 1), (64, 64, 2, 1, 1, 1))],
    ids=lambda t: "-".join(_tile_id(x) for x in t),
)  # fmt: skip
@pytest.mark.parametrize("scale", [0.125, 0.1], ids=["pow2", "other"])
@pytest.mark.parametrize("squared", [False, True], ids=["relu", "squared"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float32_gluon_backward_folds_the_scale(causal, squared, scale, tiles, gen, monkeypatch, launched,
                                                nan_copies):  # fmt: skip
    # the Gluon backward with FOLD_BWD (attention v36): a positive scale goes with relu_scale (squared:
    # scale^2, and the 2 of ds with dq's and dk's); against float64, against the kernels without the fold
    # (equal bit for bit where the scale is a power of 2: every scaling exact; else up to the tf32
    # rounding of p and ds, rounded before the scale here: 2^-11 of each element at most), and against
    # Triton's kernels (the backward refuses a scale that is not positive:
    # test_backward_refuses_a_scale_that_is_not_positive)
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon backward needs compute capability 9 or later")
    monkeypatch.setattr(ra, "TF32_BWD", dict.fromkeys(_EVERY_KEY, tiles))
    qb, kb, vb, dob = _float32_gpu_inputs(4, 256, "blhd", 64, gen)
    args = (qb, kb, vb, dob, causal, squared, scale, 1 / 256)
    monkeypatch.setattr(ra._attn_tf32, "FOLD_BWD", True)
    got = ra.relu_attention_bwd(*args)
    gluon = {ra._attn_tf32._attn_bwd_dkdv_tf32_kernel, ra._attn_tf32._attn_bwd_dq_tf32_kernel}
    assert gluon <= set(launched), launched
    monkeypatch.setattr(ra._attn_tf32, "FOLD_BWD", False)
    unfolded = ra.relu_attention_bwd(*args)
    monkeypatch.setattr(ra, "TF32_BWD", {})
    triton_kernels = ra.relu_attention_bwd(*args)
    refs = [tf32_truncate(t).double().requires_grad_(True) for t in (qb, kb, vb)]
    out = relu_attention_ref(*refs, causal=causal, squared=squared, scale=scale, relu_scale=1 / 256)
    grads = torch.autograd.grad(out, refs, dob.double())
    slack = kink_slack(qb, kb, vb, dob, causal, squared, scale=scale, relu_scale=1 / 256)
    tol = tolerance("relu_attention", torch.float32, "bwd", tf32=True)
    exact = math.log2(scale).is_integer()
    for name, a, b, c, ref in zip(("dq", "dk", "dv"), got, unfolded, triton_kernels, grads, strict=True):
        err = relerr_with_slack(a, ref, slack[name])
        assert err <= tol, (name, err)
        assert torch.equal(a, b) if exact else relerr(a, b) <= 2e-3, (name, relerr(a, b))
        assert relerr(a, c) <= (1e-4 if exact else 2e-3), (name, relerr(a, c))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "fwd_tiles, bwd_tiles",
    [((128, 64, 2, 0, 1), ((32, 64, 2, 1), (64, 64, 2, 1))),
     ((128, 64, 2, 0, 0), ((64, 128, 2, 1, 1), (64, 64, 2, 1, 1))),
     ((64, 64, 3, 0, 0), ((32, 64, 2, 1), (64, 64, 2, 1, 1, 1))),
     ((64, 32, 2, 0, 1), ((32, 64, 2, 0, 0), (64, 32, 3, 0, 1)))],
    ids=lambda t: _tile_id(t) if isinstance(t[0], int) else "-".join(_tile_id(x) for x in t),
)  # fmt: skip
@pytest.mark.parametrize("squared", [False, True], ids=["relu", "squared"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float32_gluon_split_barriers_change_nothing(causal, squared, fwd_tiles, bwd_tiles, gen, monkeypatch,
                                                     launched, nan_copies):  # fmt: skip
    # SPLIT_BARS (attention v37): a barrier array per tensor of each ring, the loads of a slot under
    # barriers of their own, expected before the CTA barrier that frees the slot: the same products in
    # the same order, so the same results bit for bit, at L=1024 with more programs than the GPU holds
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon kernels need compute capability 9 or later")
    monkeypatch.setattr(ra, "TF32_FWD", dict.fromkeys(_EVERY_KEY, fwd_tiles))
    monkeypatch.setattr(ra, "TF32_BWD", dict.fromkeys(_EVERY_KEY, bwd_tiles))
    qb, kb, vb, dob = (t.repeat(8, 1, 1, 1) for t in _float32_gpu_inputs(4, 1024, "blhd", 64, gen))
    call = (causal, squared, 0.125, 1 / 1024)

    def both():
        return ra.relu_attention_fwd(qb, kb, vb, *call), *ra.relu_attention_bwd(qb, kb, vb, dob, *call)

    results = {}
    for split in (False, True):
        monkeypatch.setattr(ra._attn_tf32, "SPLIT_BARS", split)
        launched.clear()
        results[split] = both()
        kernels = {ra._attn_tf32._attn_fwd_tf32_kernel, ra._attn_tf32._attn_bwd_dkdv_tf32_kernel,
                   ra._attn_tf32._attn_bwd_dq_tf32_kernel}  # fmt: skip
        assert kernels <= set(launched), launched
    for name, a, b in zip(("out", "dq", "dk", "dv"), results[True], results[False], strict=True):
        assert torch.equal(a, b), (name, relerr(a, b))
    monkeypatch.setattr(ra, "TF32_FWD", {})
    monkeypatch.setattr(ra, "TF32_BWD", {})
    for name, a, b in zip(("out", "dq", "dk", "dv"), results[True], both(), strict=True):
        assert relerr(a, b) <= 1e-4, (name, relerr(a, b))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "fwd_tiles, bwd_tiles",
    [((64, 64, 3, 1, 0), ((32, 64, 2, 1), (64, 32, 3, 1))),
     ((128, 64, 2, 0, 1), ((32, 64, 2, 1, 1), (64, 32, 3, 1, 1))),
     ((128, 64, 2, 0, 1), ((32, 64, 2, 1), (64, 64, 2, 1, 1, 1)))],
    ids=["copy", "trans", "write"],
)  # fmt: skip
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float32_gluon_launch_orders(causal, fwd_tiles, bwd_tiles, gen, monkeypatch, launched, nan_copies):
    # the Gluon kernels' blocks in every launch order (heads in groups of 1, 2, 3, 6 of B*H = 6; attention
    # v30): the same results bit for bit (each block is computed by one program whatever its place), and
    # the same as Triton's kernels up to float32 rounding
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon kernels need compute capability 9 or later")
    monkeypatch.setattr(ra, "TF32_FWD", dict.fromkeys(_EVERY_KEY, fwd_tiles))
    monkeypatch.setattr(ra, "TF32_BWD", dict.fromkeys(_EVERY_KEY, bwd_tiles))
    qb, kb, vb, dob = _float32_gpu_inputs(4, 256, "blhd", 64, gen)
    call = (qb, kb, vb, causal, False, 0.125, 1 / 256)
    results = {}
    for group in (1, 2, 3, 6):
        monkeypatch.setattr(ra._attn_tf32, "FORCE_GROUP", group)
        launched.clear()
        results[group] = (ra.relu_attention_fwd(*call), *ra.relu_attention_bwd(qb, kb, vb, dob, *call[3:]))
        kernels = {ra._attn_tf32._attn_fwd_tf32_kernel, ra._attn_tf32._attn_bwd_dkdv_tf32_kernel,
                   ra._attn_tf32._attn_bwd_dq_tf32_kernel}  # fmt: skip
        assert kernels <= set(launched), launched
    for group in (2, 3, 6):
        for name, a, b in zip(("out", "dq", "dk", "dv"), results[group], results[1], strict=True):
            assert torch.equal(a, b), (group, name, relerr(a, b))
    monkeypatch.setattr(ra, "TF32_FWD", {})
    monkeypatch.setattr(ra, "TF32_BWD", {})
    triton_kernels = (ra.relu_attention_fwd(*call), *ra.relu_attention_bwd(qb, kb, vb, dob, *call[3:]))
    for name, a, b in zip(("out", "dq", "dk", "dv"), results[1], triton_kernels, strict=True):
        assert relerr(a, b) <= 1e-4, (name, relerr(a, b))


@pytest.mark.gpu
@pytest.mark.parametrize("tiles", [None, ((32, 64, 2, 1), (64, 64, 2, 1, 1, 1))], ids=["table", "write"])
def test_float32_gluon_backward_in_a_cuda_graph(tiles, gen, monkeypatch, launched, nan_copies):
    # the Gluon float32 backward (its copies and dependent launches; with WRITE the copies the dQ kernel
    # writes, allocated inside the capture) captured into a CUDA graph: replays on new values equal the
    # eager backward bit for bit (the same kernels in the same order)
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon backward needs compute capability 9 or later")
    if tiles is not None:
        monkeypatch.setattr(ra, "TF32_BWD", dict.fromkeys(_EVERY_KEY, tiles))
    shape = (2, 128, 3, 64)  # [B, L, H, D], the seed's layout
    static = [randn(shape, torch.float32, "cuda", gen).transpose(1, 2) for _ in range(4)]
    call = (*static, True, False, 0.125, 1 / 128)
    ra.relu_attention_bwd(*call)
    assert ra._attn_tf32._attn_bwd_dkdv_tf32_kernel in launched
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        ra.relu_attention_bwd(*call)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ra.relu_attention_bwd(*call)
    for _ in range(2):
        for t in static:
            t.copy_(randn(t.shape, torch.float32, "cuda", gen))
        graph.replay()
        eager = ra.relu_attention_bwd(*call)
        for name, a, b in zip(("dq", "dk", "dv"), captured, eager, strict=True):
            assert torch.equal(a, b), (name, relerr(a, b))


def test_tensor_descriptors_need_aligned_strides(device, gen):
    # a view whose base is not 16-byte aligned takes the pointer kernels, with the same result
    if device == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("tensor descriptors need compute capability 9 or later")
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = qkv(1, 2, 40, 32, 32, dtype, device, gen)
    buf = torch.empty(q.numel() + 1, dtype=q.dtype, device=device)
    q_odd = buf[1:].view(q.shape).copy_(q)  # base one element past an aligned address
    interp = device == "cpu"
    assert ra._tma_usable(interp, q, k, v) and not ra._tma_usable(interp, q_odd, k, v)
    assert not ra._tma_usable(interp, q, k, v[:, :1].expand(1, 2, 32, 32))  # stride 0 on heads
    want = ra.relu_attention_fwd(q, k, v, False, False, 0.2, 1 / 32, config=ra.AttnConfig(32, 16, 4, 1))
    cfg = ra.AttnConfig(32, 16, 4, 1, True)
    got = ra.relu_attention_fwd(q_odd, k, v, False, False, 0.2, 1 / 32, config=cfg)
    assert relerr(got, want) <= (1e-6 if dtype == torch.float32 else 1e-2)
