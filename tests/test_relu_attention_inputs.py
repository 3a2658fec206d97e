"""The ReLU attention's checks of its arguments and its empty inputs."""

from __future__ import annotations

import math

import crossfuse
import pytest
import torch
from _attention import qkv, randn, run_and_compare
from crossfuse.ops import relu_attention as ra
from crossfuse.ops.relu_attention import launch as launch_module


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
        (lambda d: (_t(1, 2, 8, 16, device=d),) * 3 + ({"causal": 1},), TypeError, "causal must be a bool"),
        (lambda d: (_t(1, 2, 8, 16, device=d).to_sparse(),) * 3 + ({},), TypeError,
         "q is a torch.sparse_coo"),
    ],
    ids=["heads mismatch", "v length", "unsupported D", "mixed dtypes", "causal Lq != Lk", "3-D", "layout",
         "integer dtype", "zero scale", "inf scale", "inf relu_scale", "int causal", "sparse q"],
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


# ----------------------------------------------------------------------------------------------------
# Empty inputs: as torch's scaled_dot_product_attention
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ra.LAYOUTS)
@pytest.mark.parametrize("lq, lk, causal", [(0, 5, False), (5, 0, False), (0, 0, False), (0, 0, True)])
def test_empty_lengths_as_sdpa(lq, lk, causal, layout, device, gen, monkeypatch):
    # no key: every output row is an empty sum, zeros (SDPA's too: the softmax of nothing times nothing);
    # no query: an empty output; the gradients zero, of their inputs' shapes; no kernel launched
    launches = []
    monkeypatch.setattr(launch_module, "_planned", lambda *a: launches.append(a))
    shapes = [(2, 3, n, 16) if layout == "bhld" else (2, n, 3, 16) for n in (lq, lk, lk)]
    for _ in range(2):  # the first call of a key and a later one
        leaves = [randn(s, torch.float32, device, gen).requires_grad_(True) for s in shapes]
        out = crossfuse.relu_attention(*leaves, causal=causal, layout=layout)
        want = torch.nn.functional.scaled_dot_product_attention(
            *(ra._to_bhld(t, layout).detach().requires_grad_(True) for t in leaves), is_causal=causal)
        assert out.shape == shapes[0] and torch.equal(ra._to_bhld(out, layout), want)
        out.sum().backward()
        for t in leaves:
            assert t.grad.shape == t.shape and not t.grad.any()
    assert not launches


def test_empty_batch_or_heads(device, gen):
    for shape in ((0, 2, 8, 16), (2, 0, 8, 16)):
        q, k, v = (randn(shape, torch.float32, device, gen).requires_grad_(True) for _ in range(3))
        out = crossfuse.relu_attention(q, k, v)
        out.sum().backward()
        assert out.shape == shape and all(t.grad.shape == shape for t in (q, k, v))
