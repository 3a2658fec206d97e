"""The attention's launchers: copies with unit stride on L, launch rules, stages, tensor descriptors."""

from __future__ import annotations

import math

import pytest
import torch
from _attention import DTYPES, kink_slack, qkv, randn
from crossfuse._backend import is_interpreted
from crossfuse.ops import relu_attention as ra
from crossfuse.ops._runtime import pdl
from crossfuse.ops.relu_attention.api import _empty_in_layout
from crossfuse.reference import relu_attention_ref, tf32_truncate
from crossfuse.tolerances import relerr, relerr_with_slack, tolerance
from triton.runtime.errors import OutOfResources


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("shape", [(2, 3, 100, 64), (1, 2, 1, 16), (1, 1, 130, 256), (2, 1, 0, 32)])
def test_l_major_copy_equals_torchs(shape, dtype, device, gen):
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
    small = (32, 16, 4)  # tiles smaller than D: several along D
    assert torch.equal(ra._l_contiguous(blhd, tile=small)[0], blhd)
    assert ra._l_contiguous(unit_l, tile=small)[0] is unit_l  # already unit stride on L: no copy


@pytest.mark.parametrize("shape", [(2, 3, 64, 64), (1, 2, 8, 16), (1, 1, 136, 32)])
def test_l_major_copy_in_sigma_order(shape, device, gen):
    # the float32 Gluon kernels read their copies with the keys (or queries) of each 8 in sigma's order
    # place 8g + sigma(c) of the copy holds row 8g + c, sigma(b0 + 2 b1 + 4 b2) = b1 + 2 b2
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


def test_l_major_copy_in_sigma_order_past_the_grid_limit(gen):
    # more than 65535 of the copy kernel's tiles along L: torch's copy instead, in the same order
    t = randn((1, 65544, 1, 2), torch.float32, "cpu", gen).transpose(1, 2)
    (got,) = ra._l_contiguous(t, sigma=True, tile=(1, 16, 4))
    assert got.stride(2) == 1 and torch.equal(got, t[:, :, ra.sigma_rows(65544)])


@pytest.mark.parametrize("lq, lk", [(70, 70), (17, 100), (100, 17)])
def test_peeled_first_block_changes_nothing(lq, lk, device, gen):
    # float32's non-causal loops take their first block in a loop of its own (ra._peel: ptxas serializes
    # their tf32 products otherwise); the blocks are added in the same order, so the results are those of
    # the single loop bit for bit, at lengths shorter than a block, with a tail, and unequal
    assert ra._peel(torch.float32, False)
    assert not ra._peel(torch.float32, True) and not ra._peel(torch.bfloat16, False)
    q, k, v = qkv(1, 2, lq, lk, 32, torch.float32, device, gen)
    do = randn(q.shape, torch.float32, device, gen)
    args = (q, k, v, False, False, 1 / math.sqrt(32), 1 / lk)
    peeled = (ra.relu_attention_fwd(*args), *ra.relu_attention_bwd(q, k, v, do, *args[3:]))
    unpeeled = ra.Choices(peel=False)
    plain = (ra.relu_attention_fwd(*args, choices=unpeeled),
             *ra.relu_attention_bwd(q, k, v, do, *args[3:], choices=unpeeled))  # fmt: skip
    for a, b in zip(peeled, plain, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("group, first", [(3, 5), (4, 0), (3, 0), (8, 0), (2, 6), (5, 3)])
def test_grouped_causal_order_changes_nothing(group, first, device, gen):
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
    if not ra._tma_usable(is_interpreted(ra._relu_attn_fwd_kernel), q, k, v):
        pytest.skip("the descriptor kernels need compute capability 9+ on GPUs")
    grouped = ra.relu_attention_fwd(*args, config=cfg, choices=ra.Choices(causal_order=(group, first)))
    plain = ra.relu_attention_fwd(*args, config=cfg, choices=ra.Choices(causal_order=(1, 0)))
    assert torch.equal(grouped, plain)
    ref = relu_attention_ref(q, k, v, causal=True, scale=0.125, relu_scale=0.01)
    assert relerr(grouped, ref) <= tolerance("relu_attention", dtype, tf32=q.is_cuda)


@pytest.mark.parametrize("length", [20, 70, 96, 128])
def test_folded_causal_blocks_change_nothing(length, device, gen):
    # float32's causal kernels give each program two blocks, a heavy one and its light mirror (ra._fold);
    # each block is computed as before, so the results are the unfolded kernels' bit for bit, with one
    # block (shorter than a block), an odd count whose middle block has no partner, a tail, an even count
    assert ra._fold(torch.float32, True)
    assert not ra._fold(torch.float32, False) and not ra._fold(torch.bfloat16, True)
    q, k, v = qkv(1, 2, length, length, 32, torch.float32, device, gen)
    do = randn(q.shape, torch.float32, device, gen)
    args = (q, k, v, True, False, 1 / math.sqrt(32), 1 / length)
    cfg = ra.AttnConfig(32, 32, 4, 2)  # blocks of 32 on GPUs too (the tables' tiles hold these lengths whole)

    def run(choices):
        grads = ra.relu_attention_bwd(q, k, v, do, *args[3:], configs=(cfg, cfg), choices=choices)
        return (ra.relu_attention_fwd(*args, config=cfg, choices=choices), *grads)

    folded = run(ra.DEFAULT)
    plain = run(ra.Choices(fold=False))
    for a, b in zip(folded, plain, strict=True):
        assert torch.equal(a, b)
    ref = relu_attention_ref(q, k, v, causal=True, scale=1 / math.sqrt(32), relu_scale=1 / length)
    assert relerr(folded[0], ref) <= tolerance("relu_attention", torch.float32, tf32=q.is_cuda)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kernels", ["pointers", "descriptors"])
@pytest.mark.parametrize("d", [64, 128])
def test_dependent_dq_launch_changes_nothing(d, kernels, causal, gen):
    # on compute capability 9+ the dQ kernel is a programmatic dependent launch that starts while the
    # dK/dV kernel ends (they read the same inputs and write different outputs) and waits for it at its
    # end: the gradients must be those of plain launches, bit for bit, and a following kernel must see
    # dk and dv complete (they are read right after, on the same stream)
    if not pdl.usable(torch.empty(0, device="cuda"), False):
        pytest.skip("needs grid dependency control (compute capability 9+, Triton 3.4+)")
    tma = kernels == "descriptors"
    configs = (ra.AttnConfig(64, 64, 4, 2, tma), ra.AttnConfig(64, 64, 4, 2, tma))
    q, k, v = qkv(4, 8, 1000, 1000, d, torch.bfloat16, "cuda", gen)
    do = randn(q.shape, torch.bfloat16, "cuda", gen)
    args = (q, k, v, do, causal, False, 1 / math.sqrt(d), 1e-3)
    chained = [tuple(t.clone() for t in ra.relu_attention_bwd(*args, configs=configs)) for _ in range(3)]
    plain = ra.relu_attention_bwd(*args, configs=configs, choices=ra.Choices(gdc=False))
    for got in chained:
        for a, b in zip(got, plain, strict=True):
            assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float32_kernels_chained_after_their_copies_change_nothing(causal, gen):
    # float32's kernels read copies with unit stride on L; on compute capability 9+ the forward and the
    # dK/dV kernel are dependent launches after the copy kernel, waiting for it at their start (and the dQ
    # kernel, which reads k's copy, starts only after the dK/dV kernel's programs waited): the results
    # must be those of plain launches, bit for bit, on inputs written just before by another kernel. Each
    # call takes other inputs, so a kernel reading a copy buffer before its copy completed (the allocator
    # hands the last call's buffers back) would read the last call's values
    if not pdl.usable(torch.empty(0, device="cuda"), False):
        pytest.skip("needs grid dependency control (compute capability 9+, Triton 3.4+)")
    b, h, length, d = 4, 16, 1000, 64
    base = [randn((b, length, h, d), torch.float32, "cuda", gen) for _ in range(4)]
    args = (causal, False, 1 / math.sqrt(d), 1e-3)

    def run(factor, choices=ra.DEFAULT):
        q, k, v, do = (t.mul(factor).transpose(1, 2) for t in base)  # [B, L, H, D] written by a kernel
        out = ra.relu_attention_fwd(q, k, v, *args, choices=choices).clone()
        return out, *ra.relu_attention_bwd(q, k, v, do, *args, choices=choices)

    factors = (1.0, -0.5, 2.0, 0.25)
    chained = [run(f) for f in factors]
    for f, got in zip(factors, chained, strict=True):
        for a, c in zip(got, run(f, ra.Choices(gdc=False)), strict=True):
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


def test_launch_takes_fewer_stages_where_shared_memory_is_smaller():
    # the tables were tuned on an H200; on a GPU with less shared memory the launcher steps the stages
    # down until the launch fits, once, and launches with those afterwards (each stand-in kernel its own)
    kernel = _KernelFitting(fits=2)
    key = ("cuda:0", torch.bfloat16, 128, ra.AttnConfig(64, 128, 8, 4))
    ra._launch(kernel, (1, 1), key, "arg", num_warps=8, num_stages=4)
    assert kernel.stages_tried == [4, 3, 2]
    ra._launch(kernel, (1, 1), key, "arg", num_warps=8, num_stages=4)
    assert kernel.stages_tried == [4, 3, 2, 2]
    fits_all = _KernelFitting(fits=4)
    ra._launch(fits_all, (1, 1), key, num_warps=8, num_stages=4)  # another kernel: its own stages
    assert fits_all.stages_tried == [4]


def test_launch_reraises_what_fewer_stages_cannot_fix():
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
    dq, dk, dv = (ra._to_bhld(_empty_in_layout(t, t.shape, layout), layout) for t in (qb, kb, vb))
    out = ra._to_bhld(_empty_in_layout(qb, qb.shape, layout), layout)
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


@pytest.mark.parametrize("scale", [0.0, -0.125, math.inf, math.nan])
def test_backward_refuses_a_scale_that_is_not_positive(scale):
    # the raw backward (the public API checks its arguments before): its kernels take relu's derivative
    # from the sign of the unscaled scores, which a negative scale flips (at scale -1/8 that formula's dq
    # is 1.35 from autograd's, relatively, in float64 on the CPU): refused, naming the argument, before
    # any launch
    q = torch.randn(1, 2, 16, 8)
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        ra.relu_attention_bwd(q, q, q, q, False, False, scale, 1 / 16)


def test_a_forward_that_leaves_sms_idle_takes_tiles_of_fewer_rows():
    # few (batch, head) pairs and short sequences: a grid of fewer programs than SMs takes
    # FEW_PROGRAMS_TILE where the table's tiles have more rows; a full grid, or tiles no taller, keeps them
    from crossfuse.ops._runtime.device import Card

    h100 = Card("NVIDIA H100 80GB HBM3", (9, 0), 232448)
    small = Card("NVIDIA RTX A6000", (8, 6), 101376)
    tall, tile = ra.AttnConfig(128, 64, 8, 3, tma=True), ra.FEW_PROGRAMS_TILE
    assert tile.block_m < tall.block_m
    assert ra.few_programs(tall, 64, 132, tile, 256, 2, h100) == tile
    assert ra.few_programs(tall, 132, 132, tile, 256, 2, h100) == tall
    assert ra.few_programs(ra.AttnConfig(64, 32, 4, 2), 4, 132, tile, 64, 2, h100).block_n == 32
    assert ra.few_programs(tall, 4, 132, None, 64, 2, h100) == tall
    assert ra.few_programs(tall, 4, 132, tile, 32, 2, h100) == tall  # below D=64 it lost: not taken
    # on a card with less shared memory the tile is fitted to it, as the rule's tiles are
    fitted = ra.few_programs(tall, 4, 84, tile, 256, 2, small)
    assert ra.shared_bytes("fwd", 256, 2, fitted) <= small.max_shared_mem
    assert small.max_shared_mem < ra.shared_bytes("fwd", 256, 2, tile)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_on_few_programs_against_the_tables_tiles(d, causal, gen):
    # B1 H4 L2000: 64 programs of the table's 128-row tiles for 132 SMs on an H100; the rule's tiles give
    # the same function (within the tolerance of the float64 reference, as the table's do)
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    q, k, v = qkv(1, 4, 2000, 2000, d, torch.bfloat16, "cuda", gen)
    args = (q, k, v, causal, False, 1 / math.sqrt(d), 1 / 2000)
    ref = relu_attention_ref(q, k, v, causal=causal, scale=args[5], relu_scale=args[6])
    for choices in (ra.DEFAULT, ra.Choices(few_programs_tile=None)):
        out = ra.relu_attention_fwd(*args, choices=choices)
        assert relerr(out, ref) <= tolerance("relu_attention", q.dtype)


def test_configurations_are_typed_and_frozen():
    # the tiles are dataclasses with named fields: tuned.json's entries and bench/tune.py spell the same
    cfg = ra.AttnConfig(64, 32, 4, 3, tma=True)
    assert (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages, cfg.tma) == (64, 32, 4, 3, True)
    assert ra.AttnConfig(64, 32, 4, 3) == ra.AttnConfig(block_m=64, block_n=32, num_warps=4, num_stages=3)
    with pytest.raises(AttributeError):
        cfg.block_m = 32
    for tiles in ra.TF32_FWD.values():
        assert isinstance(tiles, ra.Tf32Tiles) and tiles.block_m % tiles.block_n == 0
    for tiles in ra.TF32_BWD.values():
        assert isinstance(tiles, ra.Tf32BwdTiles)
        assert tiles.dkdv.block_n % tiles.dkdv.block_m == 0 and tiles.dq.block_m % tiles.dq.block_n == 0
    with pytest.raises(TypeError):
        ra.TF32_FWD[(False, False)] = ra.Tf32Tiles(64, 64, 2, False)  # the tables are read-only


def test_float32_backward_tiles_past_the_longest_length_by_card():
    # past LONGEST_L a card with TF32_BWD_LONGEST entries tries those first, then the long entry (where
    # they do not divide the lengths); at LONGEST_L and below, and on other cards, the long entry alone
    from crossfuse.ops._runtime.device import Card

    h100, h200 = Card("NVIDIA H100 80GB HBM3", (9, 0), 232448), Card("NVIDIA H200", (9, 0), 232448)
    longest, long = ra.TF32_BWD_LONGEST["H100"][False], ra.TF32_BWD[(False, True)]
    assert ra.tf32_bwd_tiles(ra.DEFAULT, False, 2 * ra.LONGEST_L, h100) == [longest, long]
    assert ra.tf32_bwd_tiles(ra.DEFAULT, False, ra.LONGEST_L, h100) == [long]
    assert ra.tf32_bwd_tiles(ra.DEFAULT, False, 2 * ra.LONGEST_L, h200) == [long]
    assert ra.tf32_bwd_tiles(ra.DEFAULT, False, 2 * ra.LONGEST_L, None) == [long]
    assert ra.tf32_bwd_tiles(ra.DEFAULT, True, 2 * ra.LONGEST_L, h100) == [ra.TF32_BWD[(True, True)]]
    assert ra.tf32_bwd_tiles(ra.DEFAULT, False, 1000, h100) == [ra.TF32_BWD[(False, False)]]
    # explicit choices: the caller's tables, none of the card's
    mine = ra.Choices(tf32_bwd={}, tf32_bwd_longest={})
    assert ra.tf32_bwd_tiles(mine, False, 2 * ra.LONGEST_L, h100) == []
    for by_causal in ra.TF32_BWD_LONGEST.values():
        for tiles in by_causal.values():
            assert isinstance(tiles, ra.Tf32BwdTiles)
            assert tiles.dkdv.block_n % tiles.dkdv.block_m == 0 and tiles.dq.block_m % tiles.dq.block_n == 0
            assert min(tiles.dkdv.block_n, tiles.dq.block_m) >= 64
