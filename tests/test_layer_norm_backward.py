"""The layer norm's Triton backward under each launch configuration: whole rows, split, cooperative, the
partial sums kept in dx, their reduction, dependent launches."""

from __future__ import annotations

import crossfuse
import pytest
import torch
from _layer_norm_checks import check_against_reference, check_backward_and_repeat, ln_tol, randn
from crossfuse.ops import layer_norm as ln_mod
from crossfuse.ops._runtime.device import device_parallelism
from crossfuse.ops.layer_norm import launch, launch_bwd
from crossfuse.reference import layer_norm_ref
from crossfuse.tolerances import relerr


@pytest.mark.parametrize(
    "cfg",
    [ln_mod.LaunchConfig(4, 128, 4, 1), ln_mod.LaunchConfig(4, 128, 4, 1, prefetch=True),
     ln_mod.LaunchConfig(2, 512, 4, 1, prefetch=True), ln_mod.LaunchConfig(4, 512, 4, 1, tma_stages=2),
     ln_mod.LaunchConfig(2, 512, 4, 2, tma_stages=3), ln_mod.LaunchConfig(4, 512, 4, 1, coop=True),
     ln_mod.LaunchConfig(4, 128, 4, 1, prefetch=True, coop=True)],
    ids=["split", "split, prefetch", "fused, prefetch", "fused, descriptors", "fused, descriptors, 3 stages",
         "cooperative, one slab", "cooperative, 3 slabs (the split under the interpreter)"],
)  # fmt: skip
def test_backward_variants_equal_default(cfg, device, gen):
    # the tuning table may pick the split backward (row sums, then column chunks) for long rows, or the
    # cooperative one (column slabs that exchange their row sums), and loops that prefetch the next row
    # tile, or that read through tensor descriptors (TMA on Hopper; rows past M and columns past N arrive
    # as zeros): forced here on a short row, 37 rows (a masked tail tile; on the CPU one program walks
    # every tile), each must give the default kernel's answer
    m, n = 37, 300
    x = randn((m, n), torch.float32, device, gen)
    w = randn((n,), torch.float32, device, gen)
    dy = randn((m, n), torch.float32, device, gen)
    _, mean, rstd = ln_mod.layer_norm_fwd(x, w, None, 1e-5)
    default = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, True, True)
    variant = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, True, True, config=cfg)
    for a, b in zip(default, variant, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("grads", [(True, True), (False, True), (False, False)],
                         ids=["dw and db", "db only", "dx only"])  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize(
    "cfg",
    [pytest.param(ln_mod.LaunchConfig(2, 512, 4, 1, prefetch=True), id="whole rows"),
     pytest.param(ln_mod.LaunchConfig(2, 512, 4, 1, tma_stages=2), id="whole rows, descriptors"),
     pytest.param(ln_mod.LaunchConfig(4, 128, 4, 1), id="split"),
     pytest.param(ln_mod.LaunchConfig(2, 512, 4, 1, coop=True), id="cooperative, one slab"),
     pytest.param(ln_mod.LaunchConfig(4, 128, 4, 1, prefetch=True, coop=True),
                  id="cooperative, 3 slabs (the split under the interpreter)")],
)  # fmt: skip
def test_backward_keeps_its_partial_sums_in_dx(cfg, dtype, grads, device, gen, monkeypatch):
    # the backward allocates only dx, dw and db: the float32 partial sums of dw and db (and the split
    # backward's row sums) live in dx's last R rows, whose dx the main kernels leave unwritten (they
    # still sum those rows into dw and db); after the reduction a last launch writes it. Against float64,
    # and against the same kernels with a buffer of their own for the sums (what few rows get); the
    # other rows of dx come from the same kernels either way, so they are equal bit for bit
    m, n = 24 * device_parallelism(torch.empty(0, device=device)), 300
    x = randn((m, n), dtype, device, gen, mean=1.0)
    w = randn((n,), dtype, device, gen, mean=1.0, std=0.5)
    dy = randn((m, n), dtype, device, gen)
    var, mean = torch.var_mean(x.float(), dim=1, correction=0)
    rstd = torch.rsqrt(var + 1e-5)
    rows, scratch = [], launch_bwd.scratch_rows

    def spy(*args):
        got = scratch(*args)
        rows.append(got[0])
        return got

    ln_mod.clear_plans()  # the plans decide where the sums live: built afresh under each stand-in
    monkeypatch.setattr(launch_bwd, "scratch_rows", spy)
    in_dx = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, *grads, config=cfg)
    ln_mod.clear_plans()
    monkeypatch.setattr(launch_bwd, "scratch_rows", lambda *args: (0, 0))
    never = ln_mod.FewRowsConfig(max_rows=0)  # the partials' own buffer, not the few-rows kernel
    own = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, *grads, config=cfg, few=never)
    ln_mod.clear_plans()
    split = n > cfg.block_n or cfg.coop  # row sums (or the cooperative kernel's shares and counters) kept
    if any(grads) or split:
        assert len(rows) == 1 and 0 < rows[0] <= m // 4, rows
        assert torch.equal(in_dx[0][: m - rows[0]], own[0][: m - rows[0]])
    else:  # nothing to keep: no scratch
        assert rows == []
    leaves = [t.double().requires_grad_(True) for t in (x, w, torch.zeros(n, dtype=dtype, device=device))]
    layer_norm_ref(*leaves, 1e-5).backward(dy.double())
    for i, (kind, want) in enumerate(zip(("bwd", "reduced", "reduced"), (True, *grads), strict=True)):
        for got in (in_dx[i], own[i]):
            if not want:
                assert got is None
                continue
            tol = ln_tol(dtype, kind, m, got.dtype)
            assert relerr(got, leaves[i].grad) <= tol, (i, relerr(got, leaves[i].grad), tol)


@pytest.mark.gpu
@pytest.mark.parametrize("grads", [(True, True), (False, False)], ids=["dw and db", "dx only"])
@pytest.mark.parametrize(
    "m, n, cfg",
    [pytest.param(1000, ln_mod.FUSED_MAX_N + 3, ln_mod.LaunchConfig(2, 4096, 8, 2, prefetch=True, coop=True),
                  id="1000x16387, 5 slabs (the last of 3 columns), prefetch"),
     pytest.param(4101, 8192, ln_mod.LaunchConfig(1, 1024, 4, 4, coop=True), id="4101x8192, 8 slabs"),
     pytest.param(20000, 5000, ln_mod.LaunchConfig(4, 2048, 8, 2, prefetch=True, coop=True),
                  id="20000x5000, 3 slabs, partials in dx"),
     pytest.param(3000, 16384, ln_mod.LaunchConfig(1, 1024, 8, 32, coop=True),
                  id="3000x16384, 16 slabs, more programs than fit on the GPU at once")],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_cooperative_backward_against_float64(dtype, m, n, cfg, grads, gen):
    # the cooperative backward's programs wait for the other column slabs of their row group, so it runs
    # on the GPU only (the interpreter runs one program at a time): rows far from zero mean, masked tail
    # rows and columns, a grid larger than the GPU holds at once (programs take their place from a ticket
    # counter when they start, so the ones running can always finish); then the same gradients bit for bit
    # when run again (the shares of each row are added in slab order, whichever program comes last)
    x = randn((m, n), dtype, "cuda", gen, mean=3.0, std=2.0)
    w = randn((n,), dtype, "cuda", gen, mean=1.0, std=0.5)
    dy = randn((m, n), dtype, "cuda", gen)
    _, mean, rstd = ln_mod.layer_norm_fwd(x, w, None, 1e-5)
    got = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, *grads, config=cfg)
    check_backward_and_repeat(got, dy, x, w, w, mean, rstd, grads, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("grads", [(True, True), (False, True), (False, False)],
                         ids=["dw and db", "db only", "dx only"])  # fmt: skip
@pytest.mark.parametrize(
    "m, n, cfg",
    [pytest.param(4096, 1024, None, id="4096x1024, the table"),
     pytest.param(20000, 1000, ln_mod.LaunchConfig(2, 1024, 4, 2, tma_stages=3),
                  id="20000x1000, whole rows, descriptors, partials in dx"),
     pytest.param(20000, 1000, ln_mod.LaunchConfig(2, 1024, 4, 2, prefetch=True),
                  id="20000x1000, whole rows, pointers, partials in dx"),
     pytest.param(5000, 16387, ln_mod.LaunchConfig(2, 2048, 8, 2, prefetch=True), id="5000x16387, split"),
     pytest.param(5000, 16387, ln_mod.LaunchConfig(2, 4096, 16, 1, prefetch=True, coop=True),
                  id="5000x16387, cooperative")],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_dependent_launches_change_nothing(dtype, m, n, cfg, grads, gen, monkeypatch):
    # on compute capability 9+ each kernel of the backward after the first starts while the one before
    # it ends (programmatic dependent launch) and waits for it inside: the gradients must be those of
    # plain launches, bit for bit (the same kernels, the same sums), whichever kernels the backward runs
    if not launch_bwd.gdc_usable(torch.empty(0, device="cuda")):
        pytest.skip("needs grid dependency control (compute capability 9+, Triton 3.4+)")
    x = randn((m, n), dtype, "cuda", gen, mean=1.0)
    w = randn((n,), dtype, "cuda", gen, mean=1.0, std=0.5)
    dy = randn((m, n), dtype, "cuda", gen)
    _, mean, rstd = ln_mod.layer_norm_fwd(x, w, None, 1e-5)
    chained = [ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, *grads, config=cfg) for _ in range(3)]
    plain = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, *grads, config=cfg, pdl=False)
    for got in chained:
        for a, b in zip(got, plain, strict=True):
            assert (a is None and b is None) or torch.equal(a, b)


def test_cooperative_backward_zeroes_its_counters_in_a_step_of_its_own(device, gen):
    # the counters the cooperative kernel's programs wait on are zeroed by the plan's Zeroing step, its
    # first, which the compiled path records as a memset: the counters' bytes in dx's scratch rows, no more
    m, n = 24 * device_parallelism(torch.empty(0, device=device)), 300
    cfg = ln_mod.LaunchConfig(2, 512, 4, 1, coop=True)
    x = randn((m, n), torch.float32, device, gen, mean=1.0)
    w = randn((n,), torch.float32, device, gen, mean=1.0, std=0.5)
    dy = randn((m, n), torch.float32, device, gen)
    var, mean = torch.var_mean(x, dim=1, correction=0)
    rstd = torch.rsqrt(var + 1e-5)
    plan = launch_bwd.BwdPlan(dy, x, w, True, True, cfg)
    assert plan.path == "coop" and plan.launches[0] is plan.zero and plan.R > 0
    seen = []

    def zero(view):
        seen.append((view.data_ptr(), view.numel() * view.element_size()))
        view.zero_()

    plan.zero.go = zero
    dx, dw, db = plan(dy, x, w, mean, rstd)
    start = dx.data_ptr() + plan.start + plan.at_c2 * 4
    assert seen == [(start, (plan.programs + 1) * 4)]
    want = launch_bwd.BwdPlan(dy, x, w, True, True, cfg)(dy, x, w, mean, rstd)
    for a, c in zip((dx, dw, db), want, strict=True):
        assert torch.equal(a, c)


def test_backward_is_deterministic_and_repeatable(device, gen):
    # no atomics: the same gradients bit for bit on every call, and a second backward through the same
    # graph (retain_graph) finds the saved tensors intact; rows enough for the partials to live in dx
    m, n = 24 * device_parallelism(torch.empty(0, device=device)), 300
    x = randn((m, n), torch.bfloat16, device, gen).requires_grad_(True)
    w = randn((n,), torch.bfloat16, device, gen, mean=1.0).requires_grad_(True)
    b = randn((n,), torch.bfloat16, device, gen).requires_grad_(True)
    dy = randn((m, n), torch.bfloat16, device, gen)
    y = crossfuse.layer_norm(x, (n,), w, b)
    first = torch.autograd.grad(y, (x, w, b), dy, retain_graph=True)
    second = torch.autograd.grad(y, (x, w, b), dy)
    for a, c in zip(first, second, strict=True):
        assert torch.equal(a, c)
    check_against_reference(x, w, b, gen=gen)


@pytest.mark.parametrize(
    "n, p, max_p, acc, out_dtype",
    [
        (100, 3000, 3000, torch.float32, torch.bfloat16),  # 4-column blocks, 2 steps of 2 x 1024 rows
        (1000, 528, 528, torch.float32, torch.float32),  # 8-column blocks, masked last block, one step
        (16384, 300, 528, torch.float32, torch.bfloat16),  # 64-column blocks of 64 rows: 3 steps
        (4096, 77, 132, torch.float64, torch.float64),  # float64 partials (float64 inputs)
        (300, 77, 132, torch.float64, torch.bfloat16),  # float64 inputs, a bfloat16 weight
        (4096, 1, 132, torch.float32, torch.float16),  # one partial row
    ],
    ids=["N=100 P=3000", "N=1000 P=528", "N=16384 P=300", "float64", "float64 into bfloat16", "P=1"],
)
@pytest.mark.parametrize("which", ["dw and db", "dw", "db"])
def test_dwdb_reduction_sums_every_partial_row(n, p, max_p, acc, out_dtype, which, device, gen):
    # the backward's reduction of its (programs, N) partial sums on its own, against float64 column
    # sums: every row of every column block, in each loop step, with rows past p (up to the block)
    # masked; a skipped sum leaves its output untouched
    dw_part = randn((p, n), acc, device, gen)
    db_part = randn((p, n), acc, device, gen)
    dw = torch.full((n,), 7.0, dtype=out_dtype, device=device)
    db = torch.full((n,), 7.0, dtype=out_dtype, device=device)
    ln_mod.reduce_partials(dw_part if which != "db" else None, db_part if which != "dw" else None, dw, db, p,
                           n, max_p)  # fmt: skip
    # float32 (or float64) sums of up to 3000 rows, rounded once to the output dtype: that rounding (in
    # 16 bits), or the float32 sums' own error (sqrt(P) ulps), is the error
    tol = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
    tol = tol[out_dtype]
    for got, part, made in ((dw, dw_part, which != "db"), (db, db_part, which != "dw")):
        if made:
            want = part.double().sum(0)
            assert relerr(got, want) <= tol, relerr(got, want)
        else:
            assert torch.all(got == 7.0)


def test_descriptor_kernels_need_aligned_rows(device, gen):
    # tensor descriptors need 16-byte aligned rows: bfloat16 rows of 97 elements (194 bytes) take the
    # pointer kernels even where the config asks for descriptors, with the same results; rows of 96 do not
    x = randn((40, 97), torch.bfloat16, device, gen)
    assert not launch.tma_usable(x)
    assert launch.tma_usable(x[:, :96].contiguous()) == (launch.TensorDescriptor is not None and (
        device == "cpu" or torch.cuda.get_device_capability()[0] >= 9))  # fmt: skip
    w, dy = randn((97,), torch.bfloat16, device, gen), randn((40, 97), torch.bfloat16, device, gen)
    for tma_stages in (0, 2):
        cfg = ln_mod.LaunchConfig(2, 128, 4, 1, tma_stages=tma_stages)
        y, mean, rstd = ln_mod.layer_norm_fwd(x, w, None, 1e-5, config=cfg)
        grads = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, True, True, config=cfg)
        if tma_stages == 0:
            expected = (y, mean, rstd, *grads)
        else:
            for a, c in zip(expected, (y, mean, rstd, *grads), strict=True):
                torch.testing.assert_close(a, c, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bfloat16", "float32"])
@pytest.mark.parametrize(
    "shape",
    [(4096, 1024), (65536, 1024), (4096, 16384), (3000, 5000), (4096, 20000),
     (1, 768), (7, 2560), (128, 1024), (1000, 768), (1000, 2560), (1, 65536), (128, 65536)],
    ids=str,
)  # fmt: skip
def test_peak_memory_of_forward_and_backward_within_torchs(shape, dtype, gen):
    # what torch's layer norm allocates for a forward and backward (y, dx, dw, db, the saved mean and
    # rstd) is all the fused kernels allocate too: their partial sums live in dx (whole rows, split
    # backward, masked columns at N = 5000, the chunked forward and the rule's configuration at 20000), or,
    # with few rows, the few-rows kernel needs none
    n = shape[1]
    x = randn(shape, dtype, "cuda", gen).requires_grad_(True)
    w = randn((n,), dtype, "cuda", gen).requires_grad_(True)
    b = randn((n,), dtype, "cuda", gen).requires_grad_(True)
    dy = randn(shape, dtype, "cuda", gen)

    def peak(fn):
        for _ in range(2):  # the first call compiles
            for t in (x, w, b):
                t.grad = None
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fn(x, (n,), w, b, 1e-5).backward(dy)
            torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    ours, theirs = peak(crossfuse.layer_norm), peak(torch.nn.functional.layer_norm)
    assert ours <= theirs, (ours, theirs)
