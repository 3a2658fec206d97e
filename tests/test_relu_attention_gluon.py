"""The float32 attention in Gluon (crossfuse.ops.relu_attention.gluon_*): views, launch order, kernels."""

from __future__ import annotations

import math

import pytest
import torch
from _attention import kink_slack, randn
from crossfuse.ops import relu_attention as ra
from crossfuse.ops.relu_attention import gluon_launch
from crossfuse.reference import relu_attention_ref, tf32_truncate
from crossfuse.tolerances import relerr, relerr_with_slack, tolerance


def _fwd_tiles(t) -> ra.Tf32Tiles:
    """The forward's tiles as the parametrizations spell them: (BLOCK_M, BLOCK_N, STAGES, ASYNC, TRANS)."""
    return t if isinstance(t, ra.Tf32Tiles) else ra.Tf32Tiles(t[0], t[1], t[2], bool(t[3]), bool(t[4]))


def _kernel_tiles(t) -> ra.Tf32Tiles:
    return ra.Tf32Tiles(t[0], t[1], t[2], bool(t[3]), len(t) > 4 and bool(t[4]))


def _bwd_tiles(t) -> ra.Tf32BwdTiles:
    """The backward's tiles as the parametrizations spell them: the dK/dV kernel's and the dQ kernel's."""
    return t if isinstance(t, ra.Tf32BwdTiles) else ra.Tf32BwdTiles(_kernel_tiles(t[0]), _kernel_tiles(t[1]))


class Tables:
    """The float32 Gluon tables a test gives the launchers, as explicit :class:`ra.Choices`: ``fwd`` and
    ``bwd`` map (causal, long sequence) to tiles (``{}``: Triton's kernels), ``group`` forces the heads per
    group of the launch order; the launchers are called through it."""

    def __init__(self):
        self.fwd, self.bwd, self.group = ra.TF32_FWD, ra.TF32_BWD, None

    def choices(self) -> ra.Choices:
        fwd = {key: _fwd_tiles(t) for key, t in self.fwd.items()}
        bwd = {key: _bwd_tiles(t) for key, t in self.bwd.items()}
        return ra.Choices(tf32_fwd=fwd, tf32_bwd=bwd, head_group=self.group)

    def relu_attention_fwd(self, *args, **kwargs):
        return ra.relu_attention_fwd(*args, choices=self.choices(), **kwargs)

    def relu_attention_bwd(self, *args, **kwargs):
        return ra.relu_attention_bwd(*args, choices=self.choices(), **kwargs)


@pytest.fixture
def tables():
    return Tables()


def test_gluon_forward_row_views_address_every_element(gen):
    # the Gluon float32 kernels read q and k through 2-D views: row b*rb + h*rh + l, column h*ch + d must
    # be element (b, h, l, d) of the [B, H, L, D] view, for [B, H, L, D] and [B, L, H, D] storage alike
    B, H, L, D = 2, 3, 5, 4
    x = torch.randn(B, L, H, D, generator=gen)
    for t in (x.transpose(1, 2).contiguous(), x.transpose(1, 2), x.transpose(1, 2)[:, 1:]):
        view, rb, rh, ch = gluon_launch.rows_view(t)
        assert view.data_ptr() == t.data_ptr()
        b, h, ll, d = (torch.arange(n).view(*([1] * i), n, *([1] * (3 - i))) for i, n in enumerate(t.shape))
        assert torch.equal(view[b * rb + h * rh + ll, h * ch + d], t)
    # a head stride neither a multiple of the rows' nor past the heads' columns: no such view
    odd = torch.empty(64).as_strided((1, 3, 4, 4), (40, 6, 8, 1))
    assert gluon_launch.rows_view(odd) is None
    q = torch.zeros(1, 2, 128, 64)
    assert not gluon_launch.usable(q, q, True, 64, 64)  # the interpreter, or a CPU tensor: Triton's kernel
    tiles = ra.Tf32BwdTiles(ra.Tf32Tiles(32, 64, 2, True), ra.Tf32Tiles(64, 64, 2, True))
    assert not gluon_launch.usable_bwd(q, q, q, q, (q, q, q), (q, q, q), True, tiles)


def test_head_group_is_the_smallest_divisor_with_a_wave_of_programs():
    # the causal launch order's groups of heads: the smallest divisor of B*H whose heads have
    # `programs` programs (all heads where fewer); one head at a time where not causal; a forced group (a
    # probe's) as a divisor of B*H
    head_group = gluon_launch.head_group
    assert ra.GROUP_PROGRAMS == 256
    assert head_group(64, True, 16) == 16  # L=1024 in 64-row blocks
    assert head_group(64, True, 32) == 8
    assert head_group(60, True, 24) == 12  # 11 heads would do: 12 is the next divisor
    assert head_group(6, True, 2) == 6  # 12 programs in all: every head in one group
    assert head_group(13, True, 64) == 13  # prime
    assert head_group(64, True, 512) == 1
    assert head_group(64, False, 16) == 1
    assert head_group(64, True, 16, programs=512) == 32
    assert head_group(24, False, 4, force=16) == 8


def test_gluon_forward_folds_a_positive_scale():
    # the launcher's arithmetic of the forward's fold: a positive, finite scale goes with relu_scale
    # (squared: its square), any other stays with the scores
    fold_scale = gluon_launch.fold_scale
    assert fold_scale(0.125, 1 / 1024, False) == (True, 0.125 / 1024)
    assert fold_scale(0.1, 0.5, True) == (True, 0.5 * (0.1 * 0.1))
    for scale in (0.0, -0.125, math.inf, -math.inf, math.nan):
        assert fold_scale(scale, 0.25, False) == (False, 0.25), scale


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
def test_float32_gluon_forward(length, layout, causal, squared, tiles, gen, tables, launched, copies):
    # the float32 forward in Gluon (its products in flight where asynchronous, v transposed in the kernel
    # where trans; crossfuse.ops.relu_attention.gluon_fwd): against float64 on the tf32-truncated inputs and
    # against Triton's kernel; where the length is not a multiple of the query tile (L=100; L=320 with 128
    # rows) Triton's kernel runs, after v's copy, as does the Gluon kernel without TRANS
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon forward needs compute capability 9 or later")
    tables.fwd = dict.fromkeys(_EVERY_KEY, tiles)
    d = 64
    qb, kb, vb = _float32_gpu_inputs(3, length, layout, d, gen)
    v_before = vb.clone()
    scale, relu_scale = 1 / math.sqrt(d), 1 / length
    got = tables.relu_attention_fwd(qb, kb, vb, causal, squared, scale, relu_scale)
    gluon_ran = gluon_launch._attn_fwd_tf32_kernel in launched
    assert gluon_ran == (length % tiles[0] == 0)
    assert copies == ([] if gluon_ran and tiles[4] else [1]), copies  # v's copy, unless TRANS
    tables.fwd = {}
    triton_kernel = tables.relu_attention_fwd(qb, kb, vb, causal, squared, scale, relu_scale)
    refs = [tf32_truncate(t).double() for t in (qb, kb, vb)]
    want = relu_attention_ref(*refs, causal=causal, squared=squared, scale=scale, relu_scale=relu_scale)
    tol = tolerance("relu_attention", torch.float32, "fwd", tf32=True)
    assert relerr(got, want) <= tol, relerr(got, want)
    assert relerr(got, triton_kernel) <= 1e-5, relerr(got, triton_kernel)
    assert torch.equal(vb, v_before)  # v's tiles are transposed in shared memory, not in v


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [0.125, 0.1, -0.125], ids=["pow2", "other", "negative"])
@pytest.mark.parametrize("squared", [False, True], ids=["relu", "squared"])
def test_float32_gluon_forward_folds_the_scale(scale, squared, gen, tables, launched):
    # the Gluon forward applies a positive scale with relu_scale, to the output (relu(s * scale) = scale *
    # relu(s), squared: scale^2), and a scale that is not positive (which the raw launcher
    # takes) to the scores: both against float64 and against Triton's kernel, which scales the scores:
    # equal up to float32 rounding where the scale is a power of 2, else up to the tf32 rounding of p
    # (rounded before the scale here, after it there: 3.2e-4 apart at scale 0.1)
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon forward needs compute capability 9 or later")
    tables.fwd = dict.fromkeys(_EVERY_KEY, (128, 64, 2, 0, 1))
    qb, kb, vb = _float32_gpu_inputs(3, 256, "blhd", 64, gen)
    call = (True, squared, scale, 1 / 256)
    got = tables.relu_attention_fwd(qb, kb, vb, *call)
    assert launched == [gluon_launch._attn_fwd_tf32_kernel], launched
    tables.fwd = {}
    triton_kernel = tables.relu_attention_fwd(qb, kb, vb, *call)
    refs = [tf32_truncate(t).double() for t in (qb, kb, vb)]
    if scale < 0:  # the reference takes positive scales, as the public op: q k^T * s = (-q) k^T * |s|
        refs[0] = -refs[0]
    want = relu_attention_ref(*refs, causal=True, squared=squared, scale=abs(scale), relu_scale=1 / 256)
    tol = tolerance("relu_attention", torch.float32, "fwd", tf32=True)
    assert relerr(got, want) <= tol, relerr(got, want)
    between = 1e-5 if math.log2(abs(scale)).is_integer() else 2 * tol
    assert relerr(got, triton_kernel) <= between, relerr(got, triton_kernel)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float32_gluon_forward_transposes_v_or_reads_its_copy(causal, gen, tables, launched, copies):
    # TRANS: v's tiles transposed in shared memory, no copy; without it, v's copy; the same
    # products in the same order either way: equal bit for bit
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon forward needs compute capability 9 or later")
    qb, kb, vb = _float32_gpu_inputs(3, 256, "blhd", 64, gen)
    call = (qb, kb, vb, causal, False, 0.125, 1 / 256)
    results = []
    for trans in (1, 0):
        tables.fwd = dict.fromkeys(_EVERY_KEY, (128, 64, 2, 0, trans))
        copies.clear()
        launched.clear()
        results.append(tables.relu_attention_fwd(*call))
        assert launched == [gluon_launch._attn_fwd_tf32_kernel], launched
        assert copies == ([] if trans else [1]), (trans, copies)
    assert torch.equal(results[0], results[1]), relerr(results[0], results[1])


@pytest.mark.gpu
@pytest.mark.parametrize("tiles", [(128, 64, 2, 0, 0), (64, 64, 3, 1, 0)], ids=["128x64", "64x64a"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float32_gluon_forward_reads_l_major_v(causal, tiles, gen, tables, launched, copies):
    # a v with unit stride on L ([B, H, D, L] contiguous) is read as it is, its keys in their order (the
    # left operand p moved between lanes), where v's copy has them in sigma's order (p
    # relabelled): both against float64, and against each other up to float32 rounding
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon forward needs compute capability 9 or later")
    tables.fwd = dict.fromkeys(_EVERY_KEY, tiles)
    qb, kb, vb = _float32_gpu_inputs(3, 256, "blhd", 64, gen)
    v_l = vb.transpose(2, 3).contiguous().transpose(2, 3)
    call = (causal, False, 0.125, 1 / 256)
    got = tables.relu_attention_fwd(qb, kb, v_l, *call)
    assert copies == [] and launched == [gluon_launch._attn_fwd_tf32_kernel], (copies, launched)
    copied = tables.relu_attention_fwd(qb, kb, vb, *call)
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
def test_float32_gluon_forward_many_blocks(causal, tiles, gen, tables, launched):
    # 16 key blocks a program and more programs than the GPU holds at once: with p relabelled the
    # products in flight (ASYNC) once read a p the next block's relu had overwritten, which
    # the shorter sequences of test_float32_gluon_forward did not show
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon forward needs compute capability 9 or later")
    tables.fwd = dict.fromkeys(_EVERY_KEY, tiles)
    qb, kb, vb = _float32_gpu_inputs(3, 1024, "blhd", 64, gen)
    qb, kb, vb = (t.repeat(8, 1, 1, 1) for t in (qb, kb, vb))  # B=16, H=3
    call = (causal, False, 0.125, 1 / 1024)
    got = tables.relu_attention_fwd(qb, kb, vb, *call)
    assert gluon_launch._attn_fwd_tf32_kernel in launched
    tables.fwd = {}
    triton_kernel = tables.relu_attention_fwd(qb, kb, vb, *call)
    refs = [tf32_truncate(t[:2]).double() for t in (qb, kb, vb)]
    want = relu_attention_ref(*refs, causal=causal, squared=False, scale=0.125, relu_scale=1 / 1024)
    tol = tolerance("relu_attention", torch.float32, "fwd", tf32=True)
    assert relerr(got[:2], want) <= tol, relerr(got[:2], want)
    assert relerr(got, triton_kernel) <= 1e-5, relerr(got, triton_kernel)


def _tile_id(tiles):
    """A kernel's tiles (BLOCK_M, BLOCK_N, STAGES, ASYNC[, TRANS]) as a test id: 32x64a (ASYNC), t
    (TRANS)."""
    flags = [*tiles[3:], 0][:2]
    return f"{tiles[0]}x{tiles[1]}" + "".join(c * bool(f) for c, f in zip("at", flags, strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tiles",
    [((32, 64, 3, 1), (64, 64, 2, 1)), ((64, 64, 2, 0), (128, 64, 2, 0)), ((32, 128, 2, 1), (64, 32, 3, 0)),
     ((32, 64, 3, 1, 1), (64, 64, 2, 1, 1)), ((32, 64, 2, 1, 1), (64, 32, 3, 1, 0)),
     ((32, 64, 2, 0, 0), (64, 32, 3, 0, 1)), ((32, 128, 2, 1, 1), (128, 32, 2, 1, 1))],
    ids=lambda t: "-".join(_tile_id(x) for x in t),
)  # fmt: skip
@pytest.mark.parametrize("squared", [False, True], ids=["relu", "squared"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", ra.LAYOUTS)
@pytest.mark.parametrize("length", [128, 384, 100], ids=lambda n: f"L={n}")
def test_float32_gluon_backward(length, layout, causal, squared, tiles, gen, tables, launched, copies):
    # the float32 backward in Gluon (its kernels transposing their tiles of q and dout, or of k, themselves
    # where the tiles say TRANS; crossfuse.ops.relu_attention.gluon_bwd): against float64 on the
    # tf32-truncated inputs and against Triton's kernels; where the length is not a multiple of the tiles
    # (L=100; L=384 with 128-row tiles) Triton's kernels run, after the copies of q, dout and k
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon backward needs compute capability 9 or later")
    tables.bwd = dict.fromkeys(_EVERY_KEY, tiles)
    d = 64
    qb, kb, vb, dob = _float32_gpu_inputs(4, length, layout, d, gen)
    before = [t.clone() for t in (qb, kb, vb, dob)]
    scale, relu_scale = 1 / math.sqrt(d), 1 / length
    args = (qb, kb, vb, dob, causal, squared, scale, relu_scale)
    got = tables.relu_attention_bwd(*args)
    gluon = {gluon_launch._attn_bwd_dkdv_tf32_kernel, gluon_launch._attn_bwd_dq_tf32_kernel}
    multiple = math.lcm(tiles[0][1], tiles[1][0])
    ran = length % multiple == 0
    assert (gluon <= set(launched)) == ran, (launched, multiple)
    trans = [ran and len(t) > 4 and bool(t[4]) for t in tiles]
    # q and dout for the dK/dV kernel, k for the dQ kernel, unless the kernel transposes its tiles
    wanted = 2 * (not trans[0]) + (not trans[1])
    assert copies == ([wanted] if wanted else []), copies
    assert all(torch.equal(a, b) for a, b in zip((qb, kb, vb, dob), before, strict=True))
    tables.bwd = {}
    triton_kernels = tables.relu_attention_bwd(*args)
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
     ((64, 128, 2, 1), (128, 64, 2, 0, 1)), ((64, 128, 3, 1), (128, 128, 2, 1))],
    ids=lambda t: "-".join(_tile_id(x) for x in t),
)  # fmt: skip
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float32_gluon_backward_many_blocks(causal, tiles, gen, tables, launched):
    # L=1024 and more programs than the GPU holds at once, so that the second kernel's programs start
    # while the first one's last run
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon backward needs compute capability 9 or later")
    tables.bwd = dict.fromkeys(_EVERY_KEY, tiles)
    qb, kb, vb, dob = _float32_gpu_inputs(4, 1024, "blhd", 64, gen)
    qb, kb, vb, dob = (t.repeat(8, 1, 1, 1) for t in (qb, kb, vb, dob))  # B=16, H=3
    args = (qb, kb, vb, dob, causal, False, 0.125, 1 / 1024)
    got = tables.relu_attention_bwd(*args)
    assert {gluon_launch._attn_bwd_dkdv_tf32_kernel, gluon_launch._attn_bwd_dq_tf32_kernel} <= set(launched)
    tables.bwd = {}
    triton_kernels = tables.relu_attention_bwd(*args)
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
    "fwd_tiles, bwd_tiles",
    [((64, 64, 3, 1, 0), ((32, 64, 2, 1), (64, 32, 3, 1))),
     ((128, 64, 2, 0, 1), ((32, 64, 2, 1, 1), (64, 32, 3, 1, 1)))],
    ids=["copy", "trans"],
)  # fmt: skip
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float32_gluon_launch_orders(causal, fwd_tiles, bwd_tiles, gen, tables, launched):
    # the Gluon kernels' blocks in every launch order (heads in groups of 1, 2, 3, 6 of B*H = 6): the same
    # results bit for bit (each block is computed by one program whatever its place), and the same as Triton's
    # kernels up to float32 rounding
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon kernels need compute capability 9 or later")
    tables.fwd = dict.fromkeys(_EVERY_KEY, fwd_tiles)
    tables.bwd = dict.fromkeys(_EVERY_KEY, bwd_tiles)
    qb, kb, vb, dob = _float32_gpu_inputs(4, 256, "blhd", 64, gen)
    call = (qb, kb, vb, causal, False, 0.125, 1 / 256)
    results = {}
    for group in (1, 2, 3, 6):
        tables.group = group
        launched.clear()
        results[group] = (tables.relu_attention_fwd(*call),
                          *tables.relu_attention_bwd(qb, kb, vb, dob, *call[3:]))  # fmt: skip
        kernels = {gluon_launch._attn_fwd_tf32_kernel, gluon_launch._attn_bwd_dkdv_tf32_kernel,
                   gluon_launch._attn_bwd_dq_tf32_kernel}  # fmt: skip
        assert kernels <= set(launched), launched
    for group in (2, 3, 6):
        for name, a, b in zip(("out", "dq", "dk", "dv"), results[group], results[1], strict=True):
            assert torch.equal(a, b), (group, name, relerr(a, b))
    tables.fwd = {}
    tables.bwd = {}
    triton_kernels = (tables.relu_attention_fwd(*call),
                      *tables.relu_attention_bwd(qb, kb, vb, dob, *call[3:]))  # fmt: skip
    for name, a, b in zip(("out", "dq", "dk", "dv"), results[1], triton_kernels, strict=True):
        assert relerr(a, b) <= 1e-4, (name, relerr(a, b))


@pytest.mark.gpu
@pytest.mark.parametrize("tiles", [None, ((64, 128, 2, 1, 1), (64, 64, 2, 1, 1))], ids=["table", "trans"])
def test_float32_gluon_backward_in_a_cuda_graph(tiles, gen, tables, launched):
    # the Gluon float32 backward (its copies and dependent launches) captured into a CUDA graph: replays on
    # new values equal the eager backward bit for bit (the same kernels in the same order)
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon backward needs compute capability 9 or later")
    if tiles is not None:
        tables.bwd = dict.fromkeys(_EVERY_KEY, tiles)
    shape = (2, 128, 3, 64)  # [B, L, H, D], the seed's layout
    static = [randn(shape, torch.float32, "cuda", gen).transpose(1, 2) for _ in range(4)]
    call = (*static, True, False, 0.125, 1 / 128)
    tables.relu_attention_bwd(*call)
    assert gluon_launch._attn_bwd_dkdv_tf32_kernel in launched
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        tables.relu_attention_bwd(*call)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = tables.relu_attention_bwd(*call)
    for _ in range(2):
        for t in static:
            t.copy_(randn(t.shape, torch.float32, "cuda", gen))
        graph.replay()
        eager = tables.relu_attention_bwd(*call)
        for name, a, b in zip(("dq", "dk", "dv"), captured, eager, strict=True):
            assert torch.equal(a, b), (name, relerr(a, b))


@pytest.mark.gpu
@pytest.mark.parametrize("squared", [False, True], ids=["relu", "squared"])
@pytest.mark.parametrize("length", [4224, 4160], ids=lambda n: f"L={n}")
def test_float32_backward_past_the_longest_length(length, squared, gen, launched):
    # past LONGEST_L the card's TF32_BWD_LONGEST tiles run where they divide the length (L=4224, a multiple
    # of 128), else the long entry's (L=4160, of 64 only): the Gluon kernels either way, against float64
    # on the tf32-truncated inputs and against the long entry's tiles alone
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon backward needs compute capability 9 or later")
    qb, kb, vb, dob = _float32_gpu_inputs(4, length, "bhld", 64, gen)
    qb, kb, vb, dob = (t[:1, :2] for t in (qb, kb, vb, dob))  # B=1, H=2
    args = (qb, kb, vb, dob, False, squared, 0.125, 1 / length)
    got = ra.relu_attention_bwd(*args)
    assert {gluon_launch._attn_bwd_dkdv_tf32_kernel, gluon_launch._attn_bwd_dq_tf32_kernel} <= set(launched)
    alone = ra.relu_attention_bwd(*args, choices=ra.Choices(tf32_bwd_longest={}))
    refs = [tf32_truncate(t).double().requires_grad_(True) for t in (qb, kb, vb)]
    out = relu_attention_ref(*refs, squared=squared, scale=0.125, relu_scale=1 / length)
    grads = torch.autograd.grad(out, refs, dob.double())
    slack = kink_slack(qb, kb, vb, dob, False, squared, scale=0.125, relu_scale=1 / length)
    tol = tolerance("relu_attention", torch.float32, "bwd", tf32=True)
    for name, a, b, ref in zip(("dq", "dk", "dv"), got, alone, grads, strict=True):
        assert relerr_with_slack(a, ref, slack[name]) <= tol, (name, relerr(a, ref))
        assert relerr(a, b) <= 1e-4, (name, relerr(a, b))
