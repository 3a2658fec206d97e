"""Bad inputs, table-driven, for every public Python entry point: the ops (``crossfuse.layer_norm``,
``crossfuse.relu_attention``) and the ``crossfuse.nn`` modules (the references' are in
tests/test_bad_reference_inputs.py, the CLI's in tests/test_bad_command_lines.py). Each
case is one wrong thing (dtype, device, shape, stride, empty, NaN/Inf, a size past the limits, a wrong
type) and the TypeError/ValueError (or exit code and message) it must give; inputs that are odd but
valid (strided, expanded, empty, non-finite) must give torch's answer.

The tables' sizes per entry point are counted by ``test_every_entry_point_has_cases``."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from crossfuse import nn as cnn
from crossfuse import reference as ref  # the answer of odd but valid inputs


@dataclass(frozen=True)
class Case:
    entry: str  # the entry point
    name: str  # what is wrong
    call: Callable[[], object]
    exc: type[Exception]
    match: str  # a regular expression the message must match


def t(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, dtype=torch.float32).to(dtype=dtype, device=device)


def meta(*shape):
    return torch.empty(*shape, device="meta")


def _ln(*args, **kw):
    import crossfuse

    return crossfuse.layer_norm(*args, **kw)


def _attn(*args, **kw):
    import crossfuse

    return crossfuse.relu_attention(*args, **kw)


Q = (1, 2, 8, 16)  # [B, H, L, D]: the smallest shape the kernels take

LAYER_NORM = [
    Case(
        "crossfuse.layer_norm",
        "x not a tensor",
        lambda: _ln([[1.0]], (1,)),
        TypeError,
        "x must be a torch.Tensor",
    ),
    Case(
        "crossfuse.layer_norm",
        "x int dtype",
        lambda: _ln(torch.ones(2, 4, dtype=torch.int64), (4,)),
        TypeError,
        "x has dtype int64",
    ),
    Case(
        "crossfuse.layer_norm",
        "x bool dtype",
        lambda: _ln(torch.ones(2, 4, dtype=torch.bool), (4,)),
        TypeError,
        "x has dtype bool",
    ),
    Case(
        "crossfuse.layer_norm",
        "x complex",
        lambda: _ln(torch.ones(2, 4, dtype=torch.complex64), (4,)),
        TypeError,
        "x has dtype complex64",
    ),
    Case("crossfuse.layer_norm", "x sparse", lambda: _ln(t(2, 4).to_sparse(), (4,)), TypeError, "dense"),
    Case("crossfuse.layer_norm", "x on meta", lambda: _ln(meta(2, 4), (4,)), ValueError, "device meta"),
    Case("crossfuse.layer_norm", "shape a string", lambda: _ln(t(2, 4), "4"), TypeError, "normalized_shape"),
    Case("crossfuse.layer_norm", "shape a float", lambda: _ln(t(2, 4), 4.0), TypeError, "normalized_shape"),
    Case("crossfuse.layer_norm", "shape mismatch", lambda: _ln(t(2, 4), (5,)), ValueError, "does not match"),
    Case("crossfuse.layer_norm", "shape empty", lambda: _ln(t(2, 4), ()), ValueError, "does not match"),
    Case(
        "crossfuse.layer_norm", "shape longer than x", lambda: _ln(t(4), (1, 4)), ValueError, "does not match"
    ),
    Case("crossfuse.layer_norm", "row of 0", lambda: _ln(t(2, 0), (0,)), ValueError, "1 to"),
    Case(
        "crossfuse.layer_norm",
        "row past the limit",
        lambda: _ln(t(1, (1 << 18) + 1), ((1 << 18) + 1,)),
        ValueError,
        "supports 1 to 262144",
    ),
    Case(
        "crossfuse.layer_norm",
        "weight shape",
        lambda: _ln(t(2, 4), (4,), t(5)),
        ValueError,
        "weight has shape",
    ),
    Case(
        "crossfuse.layer_norm",
        "weight int",
        lambda: _ln(t(2, 4), (4,), torch.ones(4, dtype=torch.int32)),
        TypeError,
        "weight has dtype int32",
    ),
    Case(
        "crossfuse.layer_norm",
        "weight on meta",
        lambda: _ln(t(2, 4), (4,), meta(4)),
        ValueError,
        "weight is on meta",
    ),
    Case(
        "crossfuse.layer_norm",
        "bias a list",
        lambda: _ln(t(2, 4), (4,), None, [0.0] * 4),
        TypeError,
        "bias must be a torch.Tensor",
    ),
    Case("crossfuse.layer_norm", "eps negative", lambda: _ln(t(2, 4), (4,), eps=-1e-5), ValueError, "eps"),
    Case("crossfuse.layer_norm", "eps NaN", lambda: _ln(t(2, 4), (4,), eps=math.nan), ValueError, "eps"),
    Case("crossfuse.layer_norm", "eps inf", lambda: _ln(t(2, 4), (4,), eps=math.inf), ValueError, "eps"),
    Case("crossfuse.layer_norm", "eps a string", lambda: _ln(t(2, 4), (4,), eps="1e-5"), TypeError, "eps"),
    Case("crossfuse.layer_norm", "eps a bool", lambda: _ln(t(2, 4), (4,), eps=True), TypeError, "eps"),
]

ATTENTION = [
    Case(
        "crossfuse.relu_attention",
        "q not a tensor",
        lambda: _attn(1.0, t(*Q), t(*Q)),
        TypeError,
        "q must be a torch.Tensor",
    ),
    Case(
        "crossfuse.relu_attention",
        "q int",
        lambda: _attn(torch.ones(Q, dtype=torch.int64), t(*Q), t(*Q)),
        TypeError,
        "q has dtype int64",
    ),
    Case(
        "crossfuse.relu_attention",
        "dtypes differ",
        lambda: _attn(t(*Q), t(*Q, dtype=torch.float16), t(*Q)),
        TypeError,
        "share one dtype",
    ),
    Case(
        "crossfuse.relu_attention",
        "q 3-D",
        lambda: _attn(t(2, 8, 16), t(2, 8, 16), t(2, 8, 16)),
        ValueError,
        "must be 4-D",
    ),
    Case(
        "crossfuse.relu_attention",
        "k heads differ",
        lambda: _attn(t(*Q), t(1, 3, 8, 16), t(1, 3, 8, 16)),
        ValueError,
        "does not match q's",
    ),
    Case(
        "crossfuse.relu_attention",
        "v shape",
        lambda: _attn(t(*Q), t(*Q), t(1, 2, 9, 16)),
        ValueError,
        "must equal k's",
    ),
    Case(
        "crossfuse.relu_attention",
        "head dim 8",
        lambda: _attn(t(1, 2, 8, 8), t(1, 2, 8, 8), t(1, 2, 8, 8)),
        ValueError,
        "head dim D=8",
    ),
    Case(
        "crossfuse.relu_attention",
        "heads past the limit",
        lambda: _attn(t(1, 65536, 1, 16), t(1, 65536, 1, 16), t(1, 65536, 1, 16)),
        ValueError,
        "at most 65535",
    ),
    Case(
        "crossfuse.relu_attention",
        "causal Lq != Lk",
        lambda: _attn(t(*Q), t(1, 2, 9, 16), t(1, 2, 9, 16), causal=True),
        ValueError,
        "Lq=8, Lk=9",
    ),
    Case(
        "crossfuse.relu_attention",
        "causal an int",
        lambda: _attn(t(*Q), t(*Q), t(*Q), causal=1),
        TypeError,
        "causal must be a bool",
    ),
    Case(
        "crossfuse.relu_attention",
        "squared a string",
        lambda: _attn(t(*Q), t(*Q), t(*Q), squared="yes"),
        TypeError,
        "squared must be a bool",
    ),
    Case(
        "crossfuse.relu_attention",
        "scale 0",
        lambda: _attn(t(*Q), t(*Q), t(*Q), scale=0.0),
        ValueError,
        "scale",
    ),
    Case(
        "crossfuse.relu_attention",
        "scale NaN",
        lambda: _attn(t(*Q), t(*Q), t(*Q), scale=math.nan),
        ValueError,
        "scale",
    ),
    Case(
        "crossfuse.relu_attention",
        "relu_scale negative",
        lambda: _attn(t(*Q), t(*Q), t(*Q), relu_scale=-1.0),
        ValueError,
        "relu_scale",
    ),
    Case(
        "crossfuse.relu_attention",
        "relu_scale inf",
        lambda: _attn(t(*Q), t(*Q), t(*Q), relu_scale=math.inf),
        ValueError,
        "relu_scale",
    ),
    Case(
        "crossfuse.relu_attention",
        "layout unknown",
        lambda: _attn(t(*Q), t(*Q), t(*Q), layout="bthd"),
        ValueError,
        "layout must be one of",
    ),
    Case(
        "crossfuse.relu_attention",
        "k on meta",
        lambda: _attn(t(*Q), meta(*Q), meta(*Q)),
        ValueError,
        "k is on meta but q is on cpu",
    ),
]


def _module_on_meta(cls, *args):
    return cls(*args, device="meta")


NN = [
    Case(
        "nn.LayerNorm",
        "input a list",
        lambda: cnn.LayerNorm(4)([[1.0] * 4]),
        TypeError,
        "LayerNorm: input must be a torch.Tensor, got list",
    ),
    Case(
        "nn.LayerNorm",
        "input int",
        lambda: cnn.LayerNorm(4)(torch.ones(2, 4, dtype=torch.int64)),
        TypeError,
        "LayerNorm: x has dtype int64",
    ),
    Case(
        "nn.LayerNorm",
        "input shape",
        lambda: cnn.LayerNorm(4)(t(2, 5)),
        ValueError,
        r"LayerNorm: normalized_shape \[4\] does not match",
    ),
    Case(
        "nn.LayerNorm",
        "weights on meta",
        lambda: _module_on_meta(cnn.LayerNorm, 4)(t(2, 4)),
        ValueError,
        "LayerNorm: input is on cpu but the module's weights are on meta",
    ),
    Case(
        "nn.ReLUAttention",
        "embed_dim not a multiple",
        lambda: cnn.ReLUAttention(10, 3),
        ValueError,
        "multiple of num_heads",
    ),
    Case("nn.ReLUAttention", "head dim 8", lambda: cnn.ReLUAttention(16, 2), ValueError, "head_dim"),
    Case("nn.ReLUAttention", "embed_dim a float", lambda: cnn.ReLUAttention(32.0, 2), TypeError, "embed_dim"),
    Case(
        "nn.ReLUAttention", "causal an int", lambda: cnn.ReLUAttention(32, 2, causal=1), TypeError, "causal"
    ),
    Case(
        "nn.ReLUAttention",
        "input dtype",
        lambda: cnn.ReLUAttention(32, 2)(t(1, 8, 32, dtype=torch.float16)),
        TypeError,
        r"ReLUAttention: input dtype torch.float16 does not match the module's weights \(torch.float32\)",
    ),
    Case(
        "nn.ReLUAttention",
        "weights on meta",
        lambda: _module_on_meta(cnn.ReLUAttention, 32, 2)(t(1, 8, 32)),
        ValueError,
        "ReLUAttention: input is on cpu but the module's weights are on meta",
    ),
    Case(
        "nn.ReLUAttention",
        "input 2-D",
        lambda: cnn.ReLUAttention(32, 2)(t(8, 32)),
        ValueError,
        r"ReLUAttention: x must have shape \[B, L, 32\]",
    ),
    Case(
        "nn.ReLUAttention",
        "input a tuple",
        lambda: cnn.ReLUAttention(32, 2)((1, 2)),
        TypeError,
        "ReLUAttention: input must be a torch.Tensor, got tuple",
    ),
]

TABLE = [*LAYER_NORM, *ATTENTION, *NN]


@pytest.mark.parametrize("case", TABLE, ids=[f"{c.entry}: {c.name}" for c in TABLE])
def test_bad_input_raises_a_clear_error(case: Case):
    with pytest.raises(case.exc, match=case.match):
        case.call()


def test_a_valid_call_does_not_let_an_equal_but_invalid_one_past_the_checks():
    # 16.0 == 16 and True == 1 hash alike: the calls' cache must not take one for the other
    x = t(2, 16)
    _ln(x, (16,), eps=1)
    with pytest.raises(TypeError, match="normalized_shape must be an int or a sequence of ints"):
        _ln(x, (16.0,), eps=1)
    with pytest.raises(TypeError, match="eps must be a number, got bool"):
        _ln(x, (16,), eps=True)


# ------------------------------------------------------------------------------ odd but valid: torch's answer


def _ln_torch(x, w=None, b=None):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)


def _ln_ours(x, w=None, b=None):
    return _ln(x, (x.shape[-1],), w, b)


ACCEPTED = {
    "crossfuse.layer_norm: transposed x": lambda: t(16, 4).t(),
    "crossfuse.layer_norm: expanded x (stride 0)": lambda: t(1, 16).expand(5, 16),
    "crossfuse.layer_norm: sliced x (row stride 32)": lambda: t(4, 32)[:, ::2],
    "crossfuse.layer_norm: 3-D x": lambda: t(2, 3, 16),
    "crossfuse.layer_norm: no rows (M=0)": lambda: t(0, 16),
    "crossfuse.layer_norm: NaN and Inf rows": lambda: torch.tensor(
        [[1.0, 2.0, math.nan, 4.0], [math.inf, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]]
    ),
}


@pytest.mark.parametrize("make", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_odd_but_valid_layer_norm_inputs_give_torchs_answer(make):
    x = make().requires_grad_(True)
    w = t(x.shape[-1]).requires_grad_(True)
    b = t(x.shape[-1]).requires_grad_(True)
    y, want = _ln_ours(x, w, b), _ln_torch(x, w, b)
    assert y.shape == want.shape and y.dtype == want.dtype
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    dy = torch.ones_like(y)
    got = torch.autograd.grad(y, (x, w, b), dy)
    exp = torch.autograd.grad(want, (x, w, b), dy)
    for g, e in zip(got, exp, strict=True):
        assert g.shape == e.shape
        finite = e.isfinite() & g.isfinite()
        torch.testing.assert_close(g[finite], e[finite], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "make",
    [
        lambda: (t(1, 2, 16, 16).transpose(2, 3).contiguous().transpose(2, 3),) * 3,  # L-major storage
        lambda: tuple(t(1, 16, 2, 16).transpose(1, 2) for _ in range(3)),  # [B, L, H, D] viewed as bhld
        lambda: (t(1, 1, 16, 16).expand(2, 2, 16, 16),) * 3,  # expanded over batch and heads
        lambda: tuple(t(1, 2, 16, 16) for _ in range(3)),  # NaN in q: its row is NaN, the others finite
        lambda: (t(1, 2, 0, 16),) * 3,  # no queries and no keys: empty, as torch's attention
        lambda: (t(1, 2, 5, 16), t(1, 2, 0, 16), t(1, 2, 0, 16)),  # no keys: zeros, as torch's attention
    ],
    ids=["L-major", "blhd view", "expanded", "NaN row", "L=0", "Lk=0"],
)
def test_odd_but_valid_attention_inputs_give_the_references_answer(make):
    q, k, v = make()
    if q.shape[2] == 16 and q.shape[0] == 1 and q.stride(-1) == 1 and q.is_contiguous():
        q = q.clone()
        q[0, 0, 3, 5] = math.nan
    out = _attn(q, k, v)
    want = ref.relu_attention_ref(q, k, v)
    assert out.shape == want.shape
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_every_entry_point_has_cases(capsys):
    counts = Counter(c.entry for c in TABLE)
    counts.update({"crossfuse.layer_norm": len(ACCEPTED), "crossfuse.relu_attention": 6})
    with capsys.disabled():
        print("\n" + "\n".join(f"{n:4d}  {entry}" for entry, n in sorted(counts.items())))
    for entry in ("crossfuse.layer_norm", "crossfuse.relu_attention", "nn.LayerNorm", "nn.ReLUAttention"):
        assert counts[entry] >= 4, entry
