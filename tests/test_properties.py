"""Property-based tests (Hypothesis): the ops against their float64 references over drawn shapes, strides,
dtypes and flags, under Triton's interpreter on the CPU (or the GPU where there is one); the references
against torch; a result CSV written with any row reads back as it was.

Small on purpose (tiny shapes, ~10-20 examples each, derandomized so a run is repeatable): the whole
file takes well under a minute on two cores."""

from __future__ import annotations

import math

import pytest
import torch
from crossfuse import reference as ref
from crossfuse.harness import schema
from crossfuse.tolerances import relerr, tolerance

hypothesis = pytest.importorskip(
    "hypothesis", reason="hypothesis is in the test extra: pip install -e '.[test]'"
)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SMALL = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _device() -> str:
    from conftest import INTERPRETED

    return "cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu"


def _laid_out(x: torch.Tensor, how: str) -> torch.Tensor:
    """``x``'s values in another memory layout: as is, stored with the last two dims swapped, or every
    other element of a wider tensor (a stride of 2 in the last dim)."""
    if how == "transposed" and x.dim() >= 2:
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)
    if how == "strided":
        wide = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype, device=x.device)
        wide[..., ::2] = x
        return wide[..., ::2]
    return x


LAYOUTS = st.sampled_from(["contiguous", "transposed", "strided"])


@SMALL
@given(
    m=st.integers(0, 5),
    n=st.integers(1, 48),
    lead=st.integers(1, 2),
    dtype=st.sampled_from(DTYPES),
    affine=st.sampled_from(["none", "weight", "both"]),
    eps=st.sampled_from([1e-5, 1e-3, 0.0]),
    how=LAYOUTS,
    seed=st.integers(0, 2**31 - 1),
)
def test_layer_norm_matches_its_float64_reference(m, n, lead, dtype, affine, eps, how, seed):
    import crossfuse

    device, gen = _device(), torch.Generator().manual_seed(seed)
    shape = (lead, m, n) if lead > 1 else (m, n)
    x = _laid_out(torch.randn(shape, generator=gen).to(device, dtype) + 3.0, how).requires_grad_(True)
    w = torch.randn(n, generator=gen).to(device, dtype).requires_grad_(True) if affine != "none" else None
    b = torch.randn(n, generator=gen).to(device, dtype).requires_grad_(True) if affine == "both" else None
    if eps == 0.0 and n == 1:
        eps = 1e-5  # a single feature has variance 0: eps 0 would divide by zero, in torch too
    y = crossfuse.layer_norm(x, (n,), w, b, eps)
    assert y.shape == x.shape and y.dtype == dtype
    leaves = [p for p in (x, w, b) if p is not None]
    x64, w64, b64 = (None if p is None else p.detach().double().requires_grad_(True) for p in (x, w, b))
    want = ref.layer_norm_ref(x64, w64, b64, eps)
    assert relerr(y, want) <= 4 * tolerance("layer_norm", dtype, "fwd")
    dy = torch.randn(y.shape, generator=gen).to(device, dtype)
    got = torch.autograd.grad(y, leaves, dy)
    exp = torch.autograd.grad(want, [p for p in (x64, w64, b64) if p is not None], dy.double())
    rows = max(1, x.numel() // n)  # no rows (M=0): empty gradients for x, zeros for the weights
    for g, e, kind in zip(got, exp, ["bwd", "reduced", "reduced"], strict=False):
        assert g.shape == e.shape and g.dtype == dtype
        bound = 4 * tolerance("layer_norm", dtype, kind, rows=rows)
        assert relerr(g, e) <= bound or (e.abs().max() < 1e-6 and g.abs().max() < 1e-3), (kind, relerr(g, e))


@SMALL
@given(
    bh=st.sampled_from([(1, 1), (1, 2), (2, 1)]),
    lq=st.integers(1, 24),
    lk=st.integers(1, 24),
    d=st.sampled_from([16, 32]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    causal=st.booleans(),
    squared=st.booleans(),
    scale=st.sampled_from([None, 0.1, 1.0]),
    relu_scale=st.sampled_from([None, 0.0, 0.05]),
    layout=st.sampled_from(["bhld", "blhd"]),
    how=LAYOUTS,
    seed=st.integers(0, 2**31 - 1),
)
def test_relu_attention_matches_its_float64_reference(
    bh, lq, lk, d, dtype, causal, squared, scale, relu_scale, layout, how, seed
):
    import crossfuse

    if causal:
        lk = lq
    device, gen = _device(), torch.Generator().manual_seed(seed)
    if device == "cuda" and dtype == torch.float64:
        dtype = torch.float32  # float64 attention runs only under the interpreter
    b, h = bh

    def make(length):
        t = torch.randn(b, h, length, d, generator=gen).to(device, dtype)
        t = _laid_out(t, how)
        return t.transpose(1, 2) if layout == "blhd" else t  # [B, L, H, D] views of the same values

    q, k, v = make(lq), make(lk), make(lk)
    flags = dict(causal=causal, squared=squared, scale=scale, relu_scale=relu_scale, layout=layout)
    out = crossfuse.relu_attention(q, k, v, **flags)
    bhld = (lambda t: t.transpose(1, 2)) if layout == "blhd" else (lambda t: t)
    want = ref.relu_attention_ref(bhld(q), bhld(k), bhld(v), causal, squared, scale, relu_scale)
    assert out.shape == q.shape and out.dtype == dtype
    assert relerr(bhld(out), want) <= 4 * tolerance("relu_attention", dtype, "fwd")
    if dtype == torch.float64:  # gradients where relu's kink cannot flip a sign by rounding
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        out = crossfuse.relu_attention(*leaves, **flags)
        dout = torch.randn(out.shape, generator=gen, dtype=dtype).to(device)
        got = torch.autograd.grad(out, leaves, dout)
        refs = [bhld(t).detach().requires_grad_(True) for t in (q, k, v)]
        want = ref.relu_attention_ref(*refs, causal, squared, scale, relu_scale)
        exp = torch.autograd.grad(want, refs, bhld(dout))
        for g, e in zip(got, exp, strict=True):
            assert relerr(bhld(g), e) <= 4 * tolerance("relu_attention", dtype, "bwd")


@SMALL
@given(m=st.integers(0, 6), n=st.integers(1, 64), eps=st.floats(0, 1e-2), seed=st.integers(0, 2**31 - 1))
def test_the_norm_references_agree_with_torch(m, n, eps, seed):
    x = torch.randn(m, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    w, b = torch.randn(n, dtype=torch.float64), torch.randn(n, dtype=torch.float64)
    if n == 1 and eps == 0:
        eps = 1e-5
    want = torch.nn.functional.layer_norm(x, (n,), w, b, eps)
    torch.testing.assert_close(ref.layer_norm_ref(x, w, b, eps), want, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ref.layernorm(x, w, b, eps), want, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ref.normalise_ref(x, eps), torch.nn.functional.layer_norm(x, (n,), eps=eps),
                               rtol=1e-9, atol=1e-9)  # fmt: skip


_FINITE = st.floats(0, 1e6, allow_nan=False, allow_infinity=False)
_NUMBER = st.one_of(st.none(), _FINITE, st.sampled_from([math.inf, -math.inf, math.nan]))


@SMALL
@given(
    rows=st.lists(
        st.fixed_dictionaries(
            {
                "ms_p50": _NUMBER,
                "gbps": _NUMBER,
                "relerr": _NUMBER,
                "peak_bytes": st.one_of(st.none(), st.integers(0, 2**40)),
                "note": st.text(
                    st.characters(blacklist_categories=["Cs", "Cc"]) | st.sampled_from(',"\n'), max_size=30
                ),
                "status": st.sampled_from(schema.STATUSES[:-1]),
                "mode": st.sampled_from(schema.MODES),
                "shape": st.lists(st.integers(1, 9999), min_size=1, max_size=4).map(schema.shape_str),
            }
        ),
        min_size=1,
        max_size=6,
    )
)
def test_any_row_the_harness_writes_reads_back(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("csv") / "results.csv"
    with schema.CsvWriter(path) as w:
        for r in rows:
            w.write(schema.Row(op="layer_norm", impl="torch", side="python", peer=False, device="cpu",
                               device_name="cpu", dtype="float32", causal=False, suite="s", **r))  # fmt: skip
    assert schema.check_csv(path) == len(rows)
    df = schema.read_csv(path)
    for (_, got), r in zip(df.iterrows(), rows, strict=True):
        for c in ("ms_p50", "gbps", "relerr", "peak_bytes"):
            v = r[c]
            if v is None or not math.isfinite(v):
                assert math.isnan(got[c])  # an empty cell
            else:
                assert got[c] == pytest.approx(float(v))
        infinite = [c for c in ("ms_p50", "gbps", "relerr") if r[c] is not None and math.isinf(r[c])]
        assert all(f"{c} was" in got["note"] for c in infinite)
        assert got["note"].startswith(r["note"].replace("\r", "")) or r["note"] == ""
        assert (got["status"], got["mode"], got["shape"]) == (r["status"], r["mode"], r["shape"])
