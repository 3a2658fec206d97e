"""The layer norm's backward for few rows (:mod:`crossfuse.ops.layer_norm.kernels_few`): one launch, dw
and db summed by column programs straight into their outputs, nothing allocated but dx, dw and db."""

from __future__ import annotations

import crossfuse
import pytest
import torch
from _layer_norm_checks import check_backward_and_repeat, ln_tol, randn
from crossfuse.ops import layer_norm as ln_mod
from crossfuse.ops.layer_norm import launch_bwd
from crossfuse.tolerances import relerr

NEVER = ln_mod.FewRowsConfig(max_rows=0)


def _stats(x):
    _, mean, rstd = ln_mod.layer_norm_fwd(x, None, None, 1e-5)
    return mean, rstd


def _plan():
    (plan,) = launch_bwd.BWD_PLANS.plans.values()
    return plan


@pytest.mark.parametrize("grads", [(True, True), (True, False), (False, True)],
                         ids=["dw and db", "dw only", "db only"])  # fmt: skip
@pytest.mark.parametrize(
    "m, n",
    [(1, 1), (3, 1), (1, 64), (3, 300), (7, 1000), (13, 768), (2, ln_mod.FUSED_MAX_N + 3)],
    ids=["1x1", "3x1", "1x64", "3x300", "7x1000", "13x768", "2x16387 (rows in chunks)"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_few_rows_backward_against_float64(dtype, m, n, grads, device, gen):
    # rows far from zero mean, masked columns (N not a power of 2), one column (dx exactly 0), rows longer
    # than a register tile (two passes over chunks): one launch, within the tolerances of float64
    # autograd, the same bits when run again. The configuration of a row a program (the interpreter's
    # own would give few rows one program, whose partials fit in dx) sends every shape here
    x = randn((m, n), dtype, device, gen, mean=3.0, std=2.0)
    w = randn((n,), dtype, device, gen, mean=1.0, std=0.5)
    dy = randn((m, n), dtype, device, gen)
    mean, rstd = _stats(x)
    cfg = ln_mod.LaunchConfig(1, min(1 << (n - 1).bit_length(), 1024), 4, 1)
    ln_mod.clear_plans()
    got = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, *grads, config=cfg)
    plan = _plan()
    assert plan.path == "few" and len(plan.launches) == 1, (plan.path, plan.launches)
    check_backward_and_repeat(got, dy, x, w, w, mean, rstd, grads, cfg)
    if n == 1:
        assert torch.all(got[0] == 0)  # y is the bias whatever x is


@pytest.mark.parametrize("n", [300, ln_mod.FUSED_MAX_N + 3], ids=["whole rows", "rows in chunks"])
def test_few_rows_backward_of_dx_alone_and_without_weight(n, device, gen):
    # no weight: g = dy; no dw or db asked: no column programs (whole rows then need no scratch and take
    # the whole-row kernel; rows in chunks keep their row sums in dx where it holds them)
    m = 5
    x, dy = (randn((m, n), torch.float32, device, gen) for _ in range(2))
    mean, rstd = _stats(x)
    want = ln_mod.layer_norm_bwd(dy, x, None, mean, rstd, True, True, few=NEVER)
    for grads in ((True, True), (False, False)):
        ln_mod.clear_plans()
        got = ln_mod.layer_norm_bwd(dy, x, None, mean, rstd, *grads)
        assert _plan().path == "few" or not any(grads), _plan().path
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
        if grads[0]:
            for a, b in zip(got[1:], want[1:], strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_few_rows_kernel_only_where_dx_cannot_hold_the_scratch(device, gen):
    # enough rows: the partials live in dx's last rows as before; few rows: the few-rows kernel, unless
    # its row limit is 0 (then a buffer of the partials' own, as before it existed), with the same results
    # within float32 sums' rounding
    n = 256
    for m in (6, 4096):
        x, dy = (randn((m, n), torch.float32, device, gen) for _ in range(2))
        w = randn((n,), torch.float32, device, gen)
        mean, rstd = _stats(x)
        ln_mod.clear_plans()
        got = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, True, True)
        path, rows_in_dx = _plan().path, _plan().R
        assert (path == "few") == (m == 6) and (rows_in_dx > 0) == (m == 4096), (m, path, rows_in_dx)
        ln_mod.clear_plans()
        own = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, True, True, few=NEVER)
        assert _plan().path != "few"
        for a, b in zip(got, own, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_few_rows_backward_through_autograd_is_repeatable(device, gen):
    # as users call it: crossfuse.layer_norm's backward at 7 rows of 768 (a short batch of a small model),
    # retain_graph'd twice with the same bits, against float64
    x = randn((7, 768), torch.bfloat16, device, gen).requires_grad_(True)
    w = randn((768,), torch.bfloat16, device, gen, mean=1.0).requires_grad_(True)
    b = randn((768,), torch.bfloat16, device, gen).requires_grad_(True)
    dy = randn((7, 768), torch.bfloat16, device, gen)
    y = crossfuse.layer_norm(x, (768,), w, b)
    first = torch.autograd.grad(y, (x, w, b), dy, retain_graph=True)
    second = torch.autograd.grad(y, (x, w, b), dy)
    leaves = [t.detach().double().requires_grad_(True) for t in (x, w, b)]
    torch.nn.functional.layer_norm(leaves[0], (768,), *leaves[1:], 1e-5).backward(dy.double())
    for a, c, leaf, kind in zip(first, second, leaves, ("bwd", "reduced", "reduced"), strict=True):
        assert torch.equal(a, c)
        assert relerr(a, leaf.grad) <= ln_tol(torch.bfloat16, kind, 7, a.dtype), kind


def test_few_rows_kernel_takes_short_walks_and_small_inputs():
    # the few-rows kernel reads x and dy a second time: it takes inputs of up to max_bytes, or any input
    # of up to short_rows rows (their partials outweigh x), never more than max_rows rows
    few = ln_mod.FewRowsConfig(max_bytes=1000, short_rows=4, max_rows=50)
    assert few.takes(4, 10**6) and few.takes(10, 100) and not few.takes(11, 100) and not few.takes(51, 1)
    default = ln_mod.FewRowsConfig()
    assert default.takes(128, 65536 * 4) and default.takes(1000, 1024 * 2)
    assert not default.takes(1000, 8192 * 4) and not default.takes(2000, 5000 * 2)
