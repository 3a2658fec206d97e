"""Every registry implementation against its op's float64 reference, forward and gradients, per dtype."""

from __future__ import annotations

import math

import pytest
import torch
from crossfuse import registry
from crossfuse.check import run_case
from crossfuse.reference import relu_attention_naive
from crossfuse.tolerances import tolerance

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# (op, shape, options, why this case)
CASES = {
    "layer_norm": [
        ((33, 130), {}, "plain rows"),
        ((1, 97), {"weight": False}, "one row, prime N, no weight"),
    ],
    "normalise": [
        ((33, 130), {}, "plain rows"),
        ((3, 97), {"offset": 8.0}, "prime N, mean far from 0"),
    ],
    "layer_norm_maxstd": [
        ((33, 130), {}, "plain rows"),
        ((3, 40), {"std": 1e-4, "eps": 1e-3}, "std < eps: the eps floor branch"),
    ],
    "relu_attention": [
        ((1, 2, 40, 32), {"causal": True}, "causal, L not a multiple of the block"),
        ((2, 1, 17, 16), {"squared": True, "lk": 29}, "Lq != Lk, squared"),
    ],
}


def _params():
    for impl in registry.implementations(side="python"):
        for shape, options, why in CASES[impl.op]:
            for dtype in DTYPES:
                yield pytest.param(impl, shape, options, dtype,
                                   id=f"{impl.key}-{str(dtype)[6:]}-{why}")  # fmt: skip


@pytest.mark.parametrize("impl, shape, options, dtype", list(_params()))
def test_implementation_matches_float64_reference(impl, shape, options, dtype, device):
    if "compile" in impl.name and device == "cpu" and dtype != torch.float32:
        pytest.skip(
            "torch.compile on the CPU compiles for seconds per case: float32 only here, all on the GPU"
        )
    res = run_case(impl, shape, dtype, device, options)
    if res.status == "skip":
        pytest.skip(res.reason)
    assert res.status == "pass", res.summary()


def test_registry_lists_every_op_and_peer():
    keys = {i.key for i in registry.implementations(side="python")}
    for key in ("layer_norm/python/fused", "layer_norm/python/torch", "layer_norm/python/torch_compile",
                "layer_norm/python/liger", "normalise/python/normal_now", "normalise/python/normal_new",
                "normalise/python/normal_newer", "layer_norm/python/layernorm",
                "layer_norm_maxstd/python/layer_norm", "relu_attention/python/triton",
                "relu_attention/python/naive", "relu_attention/python/naive_compile",
                "relu_attention/python/row_block", "relu_attention/python/sdpa_softmax"):  # fmt: skip
        assert key in keys, key
    assert registry.get("relu_attention", "sdpa_softmax").same_function is False
    assert all(i.peer for i in registry.implementations("layer_norm") if i.name in ("torch", "liger"))
    with pytest.raises(ValueError, match="side must be 'python', 'julia' or None"):
        registry.implementations("layer_norm", side="rust")  # not an empty list: a misspelt side


def test_register_rejects_unknown_op_and_duplicates():
    with pytest.raises(ValueError, match="unknown op"):
        registry.register(registry.Implementation("no_such_op", "x", "python", lambda: None))
    with pytest.raises(ValueError, match="registered already"):
        registry.register(registry.get("layer_norm", "torch"))


def test_unavailable_reasons_are_given():
    liger = registry.get("layer_norm", "liger")
    assert liger.unavailable_reason("cpu") == "runs on cuda only"
    fused = registry.get("layer_norm", "fused")
    assert fused.interpreted("cpu") and not fused.interpreted("cuda")


def test_formulas_for_throughput():
    assert registry.min_bytes("layer_norm", (4096, 1024), "fwd", 2) == 2 * 4096 * 1024 * 2
    assert registry.min_bytes("layer_norm", (4096, 1024), "bwd", 2) == 3 * 4096 * 1024 * 2
    assert registry.flops("relu_attention", (2, 3, 128, 64), "fwd") == 4 * 2 * 3 * 128 * 128 * 64
    assert registry.flops("relu_attention", (2, 3, 128, 64), "fwd", causal=True) == 2 * 2 * 3 * 128 * 128 * 64
    assert registry.flops("relu_attention", (1, 1, 10, 16), "bwd") == 2.5 * 4 * 100 * 16
    assert registry.min_bytes("relu_attention", (1, 1, 10, 16), "fwd", 2) is None


def _kink_case():
    """q, k (float32, [1, 1, 3, 4]) with score (0, 1) exactly 0 and every other score far from 0."""
    q = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    k = torch.tensor([[1.0, 0.5, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [2.0, 1.0, 1.0, 1.0]])
    return q.view(1, 1, 3, 4), k.view(1, 1, 3, 4)


def test_kink_rows_are_the_rows_a_score_at_zero_reaches():
    from crossfuse.reference import kink_rows

    q, k = _kink_case()
    rows = kink_rows(q, k)
    assert rows["q"].tolist() == [[[True, False, False]]]  # query 0 against key 1
    assert rows["k"].tolist() == [[[False, True, False]]]
    assert not kink_rows(q, k, squared=True)["q"].any()  # relu^2 is smooth at 0
    assert not kink_rows(q, k, causal=True)["q"].any()  # key 1 is after query 0: masked, not ambiguous
    # a score that float32 rounding could move across 0 counts too; one well clear of it does not
    q2 = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [1.0, 2.0, 1.0, 1.0]]).view(1, 1, 3, 4)
    for delta, near in ((1e-7, True), (1e-3, False)):  # score (0, 1) = delta, sum |q_d k_d| = 2 - delta
        k2 = k.clone()
        k2[0, 0, 1, :2] = torch.tensor([1.0, delta - 1.0])
        assert kink_rows(q2, k2)["q"].tolist() == [[[near, False, False]]], delta


def test_kink_slack_is_the_jump_a_score_at_zero_makes():
    from crossfuse.reference import kink_slack, relu_attention_ref

    q, k = _kink_case()
    gen = torch.Generator().manual_seed(7)
    v, dout = (torch.randn(1, 1, 3, 4, dtype=torch.float64, generator=gen) for _ in range(2))
    slack = kink_slack(q, k, v, dout)
    # torch's relu has derivative 0 at 0; the same attention with derivative 1 there (where(s >= 0))
    # gives the other side of the kink: their dq and dk differ by the slack exactly, in its rows only
    qkv = [t.double().requires_grad_(True) for t in (q, k, v)]
    grads = torch.autograd.grad(relu_attention_ref(*qkv), qkv[:2], dout)
    s = qkv[0] @ qkv[1].transpose(-1, -2) / 2.0  # scale = 1/sqrt(4)
    other = torch.autograd.grad(torch.where(s >= 0, s, 0.0) @ qkv[2] / 3.0, qkv[:2], dout)  # relu_scale 1/3
    for name, g, o in zip("qk", grads, other, strict=True):
        jump = torch.linalg.vector_norm(o - g, dim=-1)
        assert torch.allclose(jump, slack[name], rtol=1e-12, atol=1e-15), (name, jump, slack[name])
    assert slack["q"][0, 0, 0] > 0 and slack["k"][0, 0, 1] > 0  # the rows of query 0 and key 1
    assert not kink_slack(q, k, v, dout, squared=True)["q"].any()  # relu^2: no jump
    assert not kink_slack(q, k, v, dout, causal=True)["q"].any()  # the kink score is masked


def _kink_inputs(seed):
    """``_kink_case``'s q and k with fresh v and dy: (inputs, dy, float64 output, float64 gradients)."""
    q, k = _kink_case()
    gen = torch.Generator().manual_seed(seed)
    v, dy = (torch.randn(1, 1, 3, 4, dtype=torch.float64, generator=gen) for _ in range(2))
    inputs = {"q": q, "k": k, "v": v.float(), "causal": False, "squared": False}
    ref_out, ref = registry.OPS["relu_attention"].reference_grads(inputs, dy)
    return inputs, dy, ref_out, ref


def test_compare_gives_the_kink_rows_their_slack_and_no_more():
    from crossfuse.check import compare

    impl = registry.get("relu_attention", "naive", "python")
    inputs, dy, ref_out, ref = _kink_inputs(11)
    slack = registry.OPS["relu_attention"].gradient_slack(inputs, dy)["q"][0, 0, 0].item()
    # 0.2 slack (the miss below) is far above float32's tolerance relative to dq
    assert 0.2 * slack > 10 * tolerance("relu_attention", torch.float32, "bwd") * ref["q"].norm().item()

    def with_row0(shift):  # dq with its ambiguous row moved by `shift` along one axis
        got = {name: g.float().clone() for name, g in ref.items()}
        got["q"][0, 0, 0, 1] += shift
        return compare(impl, torch.float32, "cpu", 3, ref_out.float(), got, ref_out, ref, inputs, dy)

    c = with_row0(0.99 * slack)  # within what the kink score allows: passes, and the rows are counted
    assert c.ok and c.slack_rows == {"q": 1, "k": 1}
    assert not with_row0(1.2 * slack).ok  # the ambiguous row is still compared beyond its slack
    got = {name: g.float().clone() for name, g in ref.items()}
    got["q"][0, 0, 0, 1] += 0.99 * slack
    assert not compare(impl, torch.float32, "cpu", 3, ref_out.float(), got, ref_out, ref, inputs).ok  # no dy
    got["q"][0, 0, 0, 1] -= 0.99 * slack
    got["q"][0, 0, 2] += 1e-3  # a row no score near 0 reaches: no slack
    assert not compare(impl, torch.float32, "cpu", 3, ref_out.float(), got, ref_out, ref, inputs, dy).ok


def test_relerr_with_slack():
    from crossfuse.tolerances import relerr_with_slack

    ref = torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=torch.float64)  # ||ref|| = 5
    out = torch.tensor([[3.0, 4.0], [0.0, 2.0]])
    assert relerr_with_slack(out, ref, torch.zeros(2)) == pytest.approx(2 / 5)
    assert relerr_with_slack(out, ref, torch.tensor([0.0, 1.5])) == pytest.approx(0.5 / 5)
    assert relerr_with_slack(out, ref, torch.tensor([10.0, 2.0])) == 0.0  # slack in one row helps no other
    assert relerr_with_slack(out, ref, torch.tensor([10.0, 0.0])) == pytest.approx(2 / 5)
    assert math.isnan(relerr_with_slack(out.index_fill(0, torch.tensor([0]), float("nan")), ref,
                                        torch.full((2,), 1e9)))  # fmt: skip
    with pytest.raises(ValueError, match="slack"):
        relerr_with_slack(out, ref, torch.zeros(3))


def _scaled_layer_norm(factor):
    def fn(x, weight, bias, eps):
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps) * factor

    return fn


@pytest.mark.parametrize("times, status", [(0.3, "pass"), (3.0, "fail")])
def test_the_check_passes_below_the_tolerance_and_fails_above(times, status):
    # an implementation off by a known relative error: a third of the forward's tolerance passes, three
    # times it fails (a loosened table would let the second pass)

    tol = tolerance("layer_norm", torch.float32, "fwd")
    off = _scaled_layer_norm(1 + times * tol)
    impl = registry.Implementation("layer_norm", f"test_off_{times}", "python", off)
    res = run_case(impl, (16, 64), torch.float32, grads=False)
    assert res.status == status and res.fwd_tol == tol, res


def test_reduced_tolerance_grows_as_the_square_root_of_the_rows():

    for dtype in (torch.float32, torch.bfloat16):
        big = 1 << 20  # far past the floor: the sqrt(M) regime
        assert tolerance("layer_norm", dtype, "reduced", 4 * big) == pytest.approx(
            2 * tolerance("layer_norm", dtype, "reduced", big)
        )
        assert tolerance("layer_norm", dtype, "reduced", 1) == tolerance("layer_norm", dtype, "bwd")


def test_tf32_tolerances_only_where_float32_runs_on_tensor_cores():
    # float32 attention on the CPU (the interpreter, or torch) is held to float32's tolerance, not tf32's
    from crossfuse import _backend

    impl = registry.get("relu_attention", "naive")
    res = run_case(impl, (1, 1, 16, 16), torch.float32, "cpu", grads=False)
    assert res.status == "pass" and res.fwd_tol == tolerance("relu_attention", torch.float32, "fwd")
    if _backend.interpreter_requested():
        res = run_case(registry.get("relu_attention", "triton"), (1, 1, 16, 16), torch.float32, "cpu")
        assert res.status == "pass" and res.fwd_tol == tolerance("relu_attention", torch.float32, "fwd")


# ----------------------------------------------------------------------------------------------------
# what a mutation audit found no test holding (each test fails with the bug it names)
# ----------------------------------------------------------------------------------------------------


def _nan_layer_norm(x, weight, bias, eps):
    return torch.full_like(x, float("nan"))


def test_a_nan_forward_fails_the_forward_only_check():
    impl = registry.Implementation("layer_norm", "test_nan_fwd", "python", _nan_layer_norm)
    assert run_case(impl, (4, 16), torch.float32, grads=False).status == "fail"


def test_a_given_seed_is_used_and_replays_the_case():
    impl = registry.get("layer_norm", "torch")
    a, b = (run_case(impl, (4, 16), torch.float32, seed=123) for _ in range(2))
    assert a.seed == b.seed == 123 and a.fwd_err == b.fwd_err and a.grad_err == b.grad_err


def test_per_element_gradients_keep_their_tolerance_at_many_rows():
    from crossfuse.check import compare

    impl = registry.get("layer_norm", "torch")
    op = registry.OPS["layer_norm"]
    inputs = op.make_inputs((4, 8), torch.float32, "cpu", torch.Generator().manual_seed(0))
    ref_out, ref = op.reference_grads(inputs, torch.ones(4, 8, dtype=torch.float64))
    c = compare(impl, torch.float32, "cpu", 100_000, ref_out.float(), ref, ref_out, ref)
    assert c.grad_tol["x"] == tolerance("layer_norm", torch.float32, "bwd")  # dx is no sum over rows
    assert c.grad_tol["weight"] == tolerance("layer_norm", torch.float32, "reduced", 100_000)


def test_tf32_products_get_no_kink_slack():
    # on a GPU the Triton kernel's float32 products run on tf32, whose tolerance allows for kink scores
    from crossfuse.check import compare

    inputs, dy, ref_out, ref = _kink_inputs(5)
    got = {name: g.float() for name, g in ref.items()}
    args = (torch.float32, "cuda", 3, ref_out.float(), got, ref_out, ref, inputs, dy)
    assert compare(registry.get("relu_attention", "triton"), *args).slack_rows == {}
    assert compare(registry.get("relu_attention", "naive"), *args).slack_rows == {"q": 1, "k": 1}


def test_rows_of_a_reduced_gradient_are_the_leading_dims():
    op = registry.OPS["layer_norm"]
    assert op.rows({"x": torch.empty(64, 256)}) == 64 and op.rows({"x": torch.empty(2, 3, 16)}) == 6


def test_an_unsupported_dtype_is_a_reason():
    impl = registry.Implementation("layer_norm", "test_f32_only", "python", _nan_layer_norm,
                                   dtypes=(torch.float32,))  # fmt: skip
    assert impl.unavailable_reason("cpu", torch.float32) is None
    assert "no bfloat16 support" in impl.unavailable_reason("cpu", torch.bfloat16)


def test_tf32_tolerances_are_for_float32_only():
    for dtype in (torch.float16, torch.bfloat16):
        for kind in ("fwd", "bwd"):
            own = tolerance("relu_attention", dtype, kind)
            assert tolerance("relu_attention", dtype, kind, tf32=True) == own


def _attention_off(factor, dtype):
    """relu attention whose output is exact and whose gradients are ``factor`` times the float64 ones."""

    def vjp(inputs, dy):
        op = registry.OPS["relu_attention"]
        out, grads = op.reference_grads(inputs, dy)
        return out.to(dtype), {k: (g * factor).to(dtype) for k, g in grads.items()}

    return registry.Implementation("relu_attention", "test_attn_off", "python", relu_attention_naive, vjp=vjp)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("times, status", [(0.3, "pass"), (3.0, "fail")])
def test_attention_gradients_pass_below_their_tolerance_and_fail_above(dtype, times, status):
    # per dtype: a table row read for another dtype, or a loosened one, lets the 3x case pass
    tol = tolerance("relu_attention", dtype, "bwd")
    impl = _attention_off(1 + times * tol, dtype)
    res = run_case(impl, (1, 2, 24, 16), dtype, seed=11)
    assert res.status == status and res.grad_tol["q"] == tol, res


@pytest.mark.parametrize("op", ["layer_norm", "relu_attention"])
def test_tolerances_tighten_with_the_precision(op):
    # float16 keeps 3 more mantissa bits than bfloat16: its tolerance is the tighter one (a float16 entry
    # read from bfloat16's row, or loosened past it, breaks the order)
    order = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
    for kind in ("fwd", "bwd"):
        tols = [tolerance(op, d, kind) for d in order]
        assert tols == sorted(tols) and len(set(tols)) == len(tols), (kind, tols)
