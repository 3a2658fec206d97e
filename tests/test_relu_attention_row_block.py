"""The seed notebook's algorithm as a baseline peer (crossfuse.ops.relu_attention.row_block): forward and
gradients against float64, lengths that are no multiple of its block, Lq != Lk, causal and squared."""

import pytest
import torch
from _attention import kink_slack, qkv, randn
from crossfuse import registry
from crossfuse.ops.relu_attention import row_block
from crossfuse.ops.relu_attention.row_block import relu_attention_row_block
from crossfuse.reference import relu_attention_ref, tf32_truncate
from crossfuse.tolerances import relerr, relerr_with_slack, tolerance
from triton.runtime.errors import OutOfResources

CASES = [  # (Lq, Lk, D, causal): causal attention needs Lq = Lk
    *[(lq, lq, d, causal) for lq, d in ((80, 16), (130, 64), (1, 16)) for causal in (False, True)],
    (40, 100, 32, False), (130, 70, 64, False), (1, 5, 16, False),
]


@pytest.mark.parametrize("squared", [False, True], ids=["relu", "squared"])
@pytest.mark.parametrize("lq, lk, d, causal", CASES, ids=str)
def test_row_block_against_float64(lq, lk, d, causal, squared, device, gen):
    q, k, v = (t.requires_grad_(True) for t in qkv(2, 3, lq, lk, d, torch.float32, device, gen))
    _check_against_float64(q, k, v, causal, squared, device, gen)


def _check_against_float64(q, k, v, causal, squared, device, gen):
    dtype = torch.float32
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


class _SharedMemoryOf:
    """A kernel that Triton refuses to launch on blocks of more than ``fits`` rows, as it refuses one whose
    tiles need more shared memory than the GPU has (the backward at D=256 on 64-row blocks: 384 KB)."""

    def __init__(self, kernel, fits: int):
        self.kernel, self.fits, self.blocks = kernel, fits, []

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.blocks.append(meta["BLOCK"])
            if meta["BLOCK"] > self.fits:
                raise OutOfResources(meta["BLOCK"] * 6144, self.fits * 6144, "shared memory")
            return self.kernel[grid](*args, **meta)

        return launch


def test_row_block_halves_its_blocks_until_they_fit_the_gpu(monkeypatch, device, gen):
    # the seed's 64-row blocks where they fit; where Triton refuses them for shared memory, 32 rows, and
    # every later call starts there
    bwd = _SharedMemoryOf(row_block._row_block_bwd_kernel, 32)
    monkeypatch.setattr(row_block, "_row_block_bwd_kernel", bwd)
    monkeypatch.setattr(row_block, "_BLOCK_THAT_FITS", {})
    for _ in range(2):
        q, k, v = (t.requires_grad_(True) for t in qkv(1, 2, 100, 100, 16, torch.float32, device, gen))
        _check_against_float64(q, k, v, False, False, device, gen)
    assert bwd.blocks == [64, 32, 32]
    assert row_block._BLOCK_THAT_FITS == {(bwd, 16, q.device): 32}


def test_row_block_raises_what_no_block_fits(monkeypatch, device):
    fwd = _SharedMemoryOf(row_block._row_block_fwd_kernel, 8)
    monkeypatch.setattr(row_block, "_row_block_fwd_kernel", fwd)
    monkeypatch.setattr(row_block, "_BLOCK_THAT_FITS", {})
    q = torch.zeros(1, 1, 64, 16, device=device)
    with pytest.raises(OutOfResources):
        relu_attention_row_block(q, q, q)
    assert fwd.blocks == [64, 32, 16]  # halved down to the dots' smallest operand, then Triton's error


@pytest.mark.gpu
def test_row_block_d256_backward_on_the_gpu(device, gen):
    # the case the halving exists for: the backward at D=256 asks for 384 KB of shared memory on 64-row
    # blocks, more than an H100 or H200 has; it runs on smaller blocks, against float64
    q, k, v = (t.requires_grad_(True) for t in qkv(1, 2, 130, 130, 256, torch.float32, device, gen))
    _check_against_float64(q, k, v, False, False, device, gen)
    fits = row_block._BLOCK_THAT_FITS.get((row_block._row_block_bwd_kernel, 256, q.device), 64)
    assert fits < 64, "64-row blocks of the D=256 backward fitted: a GPU with over 384 KB of shared memory"
