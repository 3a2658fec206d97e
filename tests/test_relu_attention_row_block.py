"""The seed notebook's algorithm as a baseline peer (crossfuse.ops.relu_attention.row_block): forward and
gradients against float64, lengths that are no multiple of its block, Lq != Lk, causal and squared."""

import pytest
import torch
from _attention import kink_slack, qkv, randn
from crossfuse import registry
from crossfuse.ops.relu_attention.row_block import relu_attention_row_block
from crossfuse.reference import relu_attention_ref, tf32_truncate
from crossfuse.tolerances import relerr, relerr_with_slack, tolerance

CASES = [  # (Lq, Lk, D, causal): causal attention needs Lq = Lk
    *[(lq, lq, d, causal) for lq, d in ((80, 16), (130, 64), (1, 16)) for causal in (False, True)],
    (40, 100, 32, False), (130, 70, 64, False), (1, 5, 16, False),
]


@pytest.mark.parametrize("squared", [False, True], ids=["relu", "squared"])
@pytest.mark.parametrize("lq, lk, d, causal", CASES, ids=str)
def test_row_block_against_float64(lq, lk, d, causal, squared, device, gen):
    dtype = torch.float32
    q, k, v = (t.requires_grad_(True) for t in qkv(2, 3, lq, lk, d, dtype, device, gen))
    out = relu_attention_row_block(q, k, v, causal=causal, squared=squared)
    do = randn(out.shape, dtype, device, gen)
    out.backward(do)
    tf32 = device == "cuda"  # float32 dots run on tf32 on a GPU: the reference reads the same operands
    refs = [(tf32_truncate(t) if tf32 else t).detach().double().requires_grad_(True) for t in (q, k, v)]
    ref = relu_attention_ref(*refs, causal=causal, squared=squared)
    ref.backward(do.double())
    assert relerr(out, ref) <= tolerance("relu_attention", dtype, "fwd", tf32=tf32)
    slack = kink_slack(*refs, do.double(), causal, squared)
    for name, leaf, r in zip(("dq", "dk", "dv"), (q, k, v), refs, strict=True):
        err = relerr_with_slack(leaf.grad, r.grad, slack[name])
        assert err <= tolerance("relu_attention", dtype, "bwd", tf32=tf32), (name, err)


def test_row_block_is_a_registered_baseline_peer():
    impl = registry.get("relu_attention", "row_block")
    assert impl.peer and impl.same_function and impl.kernel == "triton"


def test_row_block_refuses_a_head_dim_it_has_no_tiles_for(device):
    q = torch.zeros(1, 1, 4, 24, device=device)
    with pytest.raises(ValueError, match="head dim"):
        relu_attention_row_block(q, q, q)


def test_row_block_takes_float32_only(device):
    q = torch.zeros(1, 1, 4, 16, device=device, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="float32"):
        relu_attention_row_block(q, q, q)
