"""The layer norm's forward kernels under each launch configuration: persistent grids, one program per
tile, chunked and shifted statistics."""

from __future__ import annotations

import math

import crossfuse
import pytest
import torch
import triton
from _layer_norm_checks import randn
from crossfuse.ops import layer_norm as ln_mod
from crossfuse.ops.layer_norm import kernels_bwd, kernels_finish, kernels_fwd
from crossfuse.reference import layer_norm_ref
from crossfuse.tolerances import relerr, tolerance


@pytest.mark.parametrize("keep_params", [False, True], ids=["params after stats", "params first"])
@pytest.mark.parametrize("prefetch", [False, True], ids=["loads in turn", "next tile prefetched"])
def test_persistent_forward_equals_one_program_per_tile(prefetch, keep_params, device, gen):
    # a config with programs_per_sm > 0 runs the forward on a persistent grid (programs loop over row
    # tiles): 4 rows per tile, 103 rows (a masked tail tile), more tiles than programs; with prefetch
    # each iteration loads the next tile first (past the last tile: masked, nothing read); "prefetch"
    # here also stands for reading through tensor descriptors, which keep tiles in flight the same way
    m, n = 103, 200
    x = randn((m, n), torch.bfloat16, device, gen, mean=2.0)
    w, b = randn((n,), torch.bfloat16, device, gen), randn((n,), torch.bfloat16, device, gen)
    one = ln_mod.layer_norm_fwd(x, w, b, 1e-5, config=ln_mod.LaunchConfig(4, 256, 4, 0))
    cfg = ln_mod.LaunchConfig(4, 256, 4, 1, prefetch=prefetch, keep_params=keep_params)
    if prefetch:
        # the same sums, but a tile from shared memory may be spread over the threads differently, so
        # the reductions may add in another order: the statistics within float32 rounding (seen: 1 ulp
        # of the mean in 2 of 103 rows), y within bfloat16's
        tma = ln_mod.LaunchConfig(4, 256, 4, 1, keep_params=keep_params, tma_stages=2)
        for a, c in zip(one, ln_mod.layer_norm_fwd(x, w, b, 1e-5, config=tma), strict=True):
            torch.testing.assert_close(a, c)
    persistent = ln_mod.layer_norm_fwd(x, w, b, 1e-5, config=cfg)
    for a, c in zip(one, persistent, strict=True):
        torch.testing.assert_close(a, c, rtol=0, atol=0)


@pytest.mark.parametrize("n", [256, 200], ids=["N = BLOCK_N, a power of 2", "masked columns"])
@pytest.mark.parametrize("keep_params", [False, True], ids=["params after stats", "params first"])
def test_one_row_per_program_forward(n, keep_params, device, gen):
    # one row per program and a program per row: the kernel runs without its tile loop and without row
    # masks; it must give the persistent loop's answer bit for bit, and float64's within tolerance
    m = 37
    x = randn((m, n), torch.float32, device, gen, mean=-1.5)
    w, b = randn((n,), torch.float32, device, gen), randn((n,), torch.float32, device, gen)
    one_cfg = ln_mod.LaunchConfig(1, 256, 2, 0, keep_params=keep_params)  # a program per row
    one = ln_mod.layer_norm_fwd(x, w, b, 1e-5, config=one_cfg)
    cfg = ln_mod.LaunchConfig(1, 256, 2, 1, keep_params=keep_params)  # persistent: one program per SM
    looped = ln_mod.layer_norm_fwd(x, w, b, 1e-5, config=cfg)
    for a, c in zip(one, looped, strict=True):
        torch.testing.assert_close(a, c, rtol=0, atol=0)
    ref = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
    torch.testing.assert_close(one[0].double(), ref, rtol=1e-5, atol=1e-5)


SHIFTED = [pytest.param(False, id="three passes"), pytest.param(True, id="two passes (shifted sums)")]


@pytest.mark.parametrize("shifted", SHIFTED)
@pytest.mark.parametrize("unroll", [1, 2], ids=["unroll 1", "unroll 2: 3 chunks leave a remainder"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_chunked_forward_equals_fused(dtype, unroll, shifted, device, gen):
    # the tuning table may pick the chunked forward (passes over chunks, per-lane statistics) for long
    # rows: forced here on a row of 2.3 chunks, it must match the one-tile kernel
    m, n = 19, 300
    x = randn((m, n), dtype, device, gen, mean=3.0)
    w, b = randn((n,), dtype, device, gen), randn((n,), dtype, device, gen)
    fused = ln_mod.layer_norm_fwd(x, w, b, 1e-5)
    cfg = ln_mod.LaunchConfig(1, 128, 4, 0, unroll=unroll, shifted=shifted)
    chunked = ln_mod.layer_norm_fwd(x, w, b, 1e-5, config=cfg)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    for a, c in zip(fused, chunked, strict=True):
        torch.testing.assert_close(a, c, **tol)


@pytest.mark.parametrize("shifted", SHIFTED)
def test_chunked_forward_statistics_are_exact_and_stable(shifted, device, gen):
    # the chunked kernel's statistics keep the fused kernel's guarantees: a row of equal values gives
    # y == bias exactly (zero variance, x - mean exactly 0), and rows of 1e4 + randn keep the variance
    # (the error bound of test_large_mean_keeps_precision_where_single_pass_loses_it)
    m, n = 6, 300
    cfg = ln_mod.LaunchConfig(1, 128, 4, 0, shifted=shifted)
    x = randn((m, n), torch.float32, device, gen)
    x[1] = 0.7134
    x[3] = -3.25e3
    w, b = randn((n,), torch.float32, device, gen), randn((n,), torch.float32, device, gen)
    y, _, _ = ln_mod.layer_norm_fwd(x, w, b, 1e-5, config=cfg)
    assert torch.equal(y[1], b) and torch.equal(y[3], b)
    x = randn((16, n), torch.float32, device, gen, mean=1e4)
    y, _, _ = ln_mod.layer_norm_fwd(x, None, None, 1e-5, config=cfg)
    assert relerr(y, layer_norm_ref(x)) <= 1e-3


# (whole rows take the shifted statistics in 16 bits only: in float32 these run the two reductions)
SHIFTED_LAUNCHES = [
    # 2000 columns in chunks of 64: a partial last chunk
    pytest.param(ln_mod.LaunchConfig(1, 64, 4, 0, shifted=True), 2000, id="chunked, two passes"),
    # 250 of 256 columns: masked columns out of the sums
    pytest.param(ln_mod.LaunchConfig(2, 256, 4, 0, shifted=True), 250, id="whole rows, a program per 2 rows"),
    # 6 rows in tiles of 4: masked rows in the second tile
    pytest.param(
        ln_mod.LaunchConfig(4, 256, 4, 1, prefetch=True, shifted=True), 256, id="whole rows, persistent"
    ),
]


@pytest.mark.parametrize(("cfg", "n"), SHIFTED_LAUNCHES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_shifted_forward_keeps_the_tolerance_whatever_the_first_element(dtype, cfg, n, device, gen):
    # the sums about the first element lose about 1 + R roundings, R = (mean - x0)^2 / var, kept at most
    # shifted_max_ratio (1 in float32, 16 in 16 bits) by the second sums: rows whose first element lies
    # just inside (no second sums: the worst the kernel keeps) and just outside that ratio, and 3.9 and
    # 100 standard deviations out, each within the forward's tolerance against float64, the mean within
    # 1e-5 standard deviations and rstd within 2e-5 (chunked, under the interpreter, 12 seeds: 2.1e-7 and
    # 3.3e-7 in float32, 6.4e-7 and 3.3e-6 in bfloat16)
    m = 6
    r = ln_mod.shifted_max_ratio(dtype)
    x = randn((m, n), torch.float64, device, gen)
    for i, k in enumerate((0.0, 0.98 * math.sqrt(r), -0.98 * math.sqrt(r), 1.02 * math.sqrt(r), 3.9, 100.0)):
        x[i, 0] = x[i, 1:].mean() + k * x[i, 1:].std()
    x = x.to(dtype)
    w, b = randn((n,), dtype, device, gen), randn((n,), dtype, device, gen)
    y, mean, rstd = ln_mod.layer_norm_fwd(x, w, b, 1e-5, config=cfg)
    x64 = x.double()
    for i in range(m):
        want = layer_norm_ref(x64[i : i + 1], w.double(), b.double())
        assert relerr(y[i : i + 1], want) <= tolerance("layer_norm", dtype), i
    std = x64.std(1, unbiased=False)
    assert ((mean.double() - x64.mean(1)).abs() <= 1e-5 * std).all(), (mean.double() - x64.mean(1)) / std
    want_rstd = 1 / (x64.var(1, unbiased=False) + 1e-5).sqrt()
    torch.testing.assert_close(rstd.double(), want_rstd, rtol=2e-5, atol=0)


@pytest.mark.parametrize(("cfg", "n"), SHIFTED_LAUNCHES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_shifted_forward_keeps_equal_rows_exact(dtype, cfg, n, device, gen):
    # the shifted statistics keep the fused kernel's guarantee: a row of equal values (its first element
    # among them) gives mean == that value, and y == bias exactly; with a weight, in 16 bits
    x = randn((6, n), dtype, device, gen)
    x[1] = 0.7134
    x[4] = -325.0
    w, b = randn((n,), dtype, device, gen), randn((n,), dtype, device, gen)
    y, mean, _ = ln_mod.layer_norm_fwd(x, w, b, 1e-5, config=cfg)
    assert torch.equal(y[1], b) and torch.equal(y[4], b)
    assert mean[1].item() == x[1, 0].float().item() and mean[4].item() == x[4, 0].float().item()


@pytest.mark.parametrize(("cfg", "n"), SHIFTED_LAUNCHES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_shifted_forward_when_the_sums_of_squares_overflow(dtype, cfg, n, device, gen):
    # a first element 3e18 (or -3e18) from the rest: (x - x0)^2 summed over the row passes float32's
    # range, so the variance about x0 is inf; the sums are taken again about the mean (without that, rstd
    # was 0 and y the bias, 0.58 from float64, where the three-pass sums hold such rows). In float32 any
    # kernel loses the other elements' spread in such a row (x - mean rounds to -mean: the three-pass
    # kernel's y is 3e-6 from float64 there), so y is held to 1e-4 here, the statistics to the usual bounds
    x = randn((3, n), dtype, device, gen)
    x[0, 0] = 3e18
    x[1, 0] = -3e18
    y, mean, rstd = ln_mod.layer_norm_fwd(x, None, None, 1e-5, config=cfg)
    x64 = x.double()
    assert relerr(y, layer_norm_ref(x64)) <= max(1e-4, tolerance("layer_norm", dtype))
    std = x64.std(1, unbiased=False)
    assert ((mean.double() - x64.mean(1)).abs() <= 1e-5 * std).all(), (mean.double() - x64.mean(1)) / std
    want_rstd = 1 / (x64.var(1, unbiased=False) + 1e-5).sqrt()
    torch.testing.assert_close(rstd.double(), want_rstd, rtol=2e-5, atol=0)


def test_shifted_chunked_forward_when_the_first_element_is_far_from_the_mean(device, gen):
    # the two-pass kernel sums about the row's first element and, where that lies more than one standard
    # deviation from the mean (float32), sums again about the mean it found: rows with one large first
    # feature (1e4 before randn), a first chunk of 1e4 + randn, a first element 3.9 standard deviations
    # out, -1e3 + 1e-2 * randn before randn, rows whose only spread is in the first chunk, rows of 1e4 +
    # 1e-3 * randn
    n, bn = 1000, 128
    x = randn((7, n), torch.float32, device, gen)
    x[0, 0] = 1e4
    x[1, :bn] += 1e4
    x[2, 0] = x[2, 1:].mean() + 3.9 * x[2, 1:].std()
    x[3, :bn] = -1e3 + 1e-2 * x[3, :bn]
    x[4, bn:] = 5.0
    x[5] = 1e4 + 1e-3 * x[5]
    x[6, 0] = -1e4
    cfg = ln_mod.LaunchConfig(1, bn, 4, 0, shifted=True)
    y, mean, rstd = ln_mod.layer_norm_fwd(x, None, None, 1e-5, config=cfg)
    want = layer_norm_ref(x.double())
    assert relerr(y, want) <= 1e-4
    x64 = x.double()
    # the mean to a millionth of the row's largest value, each row's rstd to 1e-5 (without the second
    # sums the rows with a large first element miss both)
    err = mean.double() - x64.mean(1)
    assert (err.abs() <= 1e-6 * x64.abs().amax(1)).all(), err
    want_rstd = 1 / (x64.var(1, unbiased=False) + 1e-5).sqrt()
    assert ((rstd.double() - want_rstd).abs() <= 1e-5 * want_rstd).all(), rstd.double() / want_rstd - 1



@pytest.mark.gpu
@pytest.mark.parametrize("n", [1024, 16384])
def test_no_recompilation_across_row_counts(n, gen):
    # the row count M is never specialised on: new batch sizes reuse the compiled kernels. The tuning
    # table has two regimes (few rows, many rows: ln_mod.MANY_ROWS) that may pick different tiles, so a
    # kernel compiles at most once per regime: one row count of each first, then no more compilations.
    # Every kernel of the module counts (N = 16384: long rows' kernels, whichever the table picks)
    modules = (kernels_fwd, kernels_bwd, kernels_finish, ln_mod.gluon_bwd)
    kernels = [k for mod in modules for k in vars(mod).values()
               if isinstance(k, triton.runtime.jit.JITFunction)]  # fmt: skip

    def run(m):
        x = randn((m, n), torch.bfloat16, "cuda", gen).requires_grad_(True)
        w = torch.ones(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        crossfuse.layer_norm(x, (n,), w, None).backward(torch.ones(m, n, device="cuda", dtype=torch.bfloat16))
        torch.cuda.synchronize()

    def compiled():
        return sum(len(cache) for k in kernels for cache in _kernel_caches(k))

    run(4096)
    run(ln_mod.MANY_ROWS + 1)
    before = compiled()
    for m in (1, 7, 16, 100, 1000, 4097, ln_mod.MANY_ROWS, 65536):
        run(m)
    assert compiled() == before, "a new row count triggered a recompilation"


def _kernel_caches(kernel):
    """The per-device compiled-kernel dicts of a JITFunction (Triton 3.x keeps them in device_caches)."""
    caches = getattr(kernel, "device_caches", None)
    if caches is None:
        pytest.skip("this Triton version keeps no device_caches on JITFunction")
    return [entry[0] for entry in caches.values()]
