"""The Triton ReLU attention (crossfuse.relu_attention, crossfuse.nn.ReLUAttention) against float64."""

from __future__ import annotations

import crossfuse
import numpy as np
import pytest
import torch
from _attention import DTYPES, kink_slack, qkv, randn, run_and_compare
from crossfuse.ops import relu_attention as ra
from crossfuse.reference import relu_attention_naive, relu_attention_ref, tf32_truncate
from crossfuse.tolerances import relerr, relerr_with_slack, tolerance

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
    # within tf32's rounding of 0 falls on the same side of relu's kink in both (one score of
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


def test_more_batch_and_heads_than_a_grid_axis_holds(device, gen):
    # the kernels put B * H on the grid's second axis (CUDA: at most 65535); more pairs run as batch
    # slices: here the limit is lowered to 5, so B=4, H=2 runs as four slices of one batch each (two
    # pairs), results as the float64 reference's, in both layouts
    choices = ra.Choices(max_grid_1=5)
    for layout in ra.LAYOUTS:
        q, k, v = qkv(4, 2, 12, 12, 16, torch.float32, device, gen)
        if layout == "blhd":
            q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        run_and_compare(q, k, v, True, False, gen, layout=layout, choices=choices)
    assert [(b.start, b.stop) for b in ra._batch_slices(4, 2, 5)] == [(0, 2), (2, 4)]
    assert [(b.start, b.stop) for b in ra._batch_slices(3, 7, 5)] == [(0, 1), (1, 2), (2, 3)]


@pytest.mark.gpu
@pytest.mark.parametrize("length", [1000, 2100], ids=["short", "long"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [128, 256])
def test_float32_tiles_of_the_large_head_dims(d, causal, length, gen):
    # the tables' float32 tiles at D = 128 and 256, each (causal, length) entry: a tile changes how a
    # program sums, not the result (L not a multiple of any tile, so every tail is masked too)
    q, k, v = qkv(1, 2, length, length, d, torch.float32, "cuda", gen)
    run_and_compare(q, k, v, causal, squared=False, gen=gen)


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
