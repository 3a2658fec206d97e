"""The layer norm's Gluon backward of long rows (GPU only, compute capability 9+), the kernel that finishes
its scratch rows from the posted row sums, and where each falls back to the Triton kernels."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pytest
import torch
from _layer_norm_checks import check_backward_and_repeat, ln_tol, randn
from crossfuse.ops import layer_norm as ln_mod
from crossfuse.ops.layer_norm import launch, launch_bwd
from crossfuse.reference import layer_norm_ref
from crossfuse.tolerances import relerr

# the whole-row Gluon entry of bf16 rows of 16384 before the grouped kernel took the table's place
_WHOLE_16384 = ln_mod.LaunchConfig(1, 16384, 16, 1, tma_stages=3, smem_rows=True)
# the kernels under test, not the few-rows kernel that takes short inputs whose partials need a buffer
NEVER = ln_mod.FewRowsConfig(max_rows=0)


def _gluon_launches(monkeypatch, launcher: str, programs_arg: int) -> list:
    """Records, for each call of ``crossfuse.ops.layer_norm.gluon_bwd.<launcher>`` by a backward plan
    built from here on (the plans are cleared), its argument ``programs_arg`` (the programs, or the groups,
    it launches)."""
    ln_mod.clear_plans()
    calls, launch = [], getattr(ln_mod.gluon_bwd, launcher)

    def spy(*args, **kwargs):
        calls.append(args[programs_arg])
        return launch(*args, **kwargs)

    monkeypatch.setattr(ln_mod.gluon_bwd, launcher, spy)
    return calls


def _smem_rows_launches(monkeypatch) -> list:
    """The programs of each launch of the whole-row Gluon backward."""
    return _gluon_launches(monkeypatch, "rows_launch", 4)


# every combination of the parameters' gradients, for the Gluon backwards' tests
_GRADS = pytest.mark.parametrize("grads", [(True, True), (True, False), (False, True), (False, False)],
                                 ids=["dw and db", "dw only", "db only", "dx only"])  # fmt: skip


@pytest.mark.gpu
@_GRADS
@pytest.mark.parametrize(
    "m, n, cfg, weight",
    [pytest.param(4101, 16384, _WHOLE_16384, True, id="4101x16384, 16 warps (partials in dx)"),
     pytest.param(300, 8192, None, True, id="300x8192, the table (partials in a buffer of their own)"),
     pytest.param(20000, 4096, None, False, id="20000x4096, the table, no weight"),
     pytest.param(5, 16384, _WHOLE_16384, True, id="5 rows: fewer rows than programs"),
     pytest.param(2000, 4096, ln_mod.LaunchConfig(1, 4096, 4, 3, tma_stages=2, smem_rows=True), True,
                  id="2000x4096, 4 warps, 2 buffers, 3 programs per SM")],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_smem_rows_backward_against_float64(dtype, m, n, cfg, weight, grads, gen, monkeypatch):
    # the Gluon backward that reads each row once (GPU only: Gluon does not run under the interpreter):
    # rows far from zero mean, every combination of gradients, with and without weight, the partial sums
    # in dx's last rows and in a buffer, fewer rows than programs; then the same gradients bit for bit
    # when run again (each program adds its rows in order; the partials are reduced in program order)
    x = randn((m, n), dtype, "cuda", gen, mean=3.0, std=2.0)
    w = randn((n,), dtype, "cuda", gen, mean=1.0, std=0.5) if weight else None
    dy = randn((m, n), dtype, "cuda", gen)
    if not ln_mod.gluon_bwd.usable(x, dy, w, False):
        pytest.skip("needs Gluon in Triton 3.6 (GLUON_TRITON) and compute capability 9+")
    calls = _smem_rows_launches(monkeypatch)
    _, mean, rstd = ln_mod.layer_norm_fwd(x, w, None, 1e-5)
    got = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, *grads, config=cfg, few=NEVER)
    assert len(calls) == 1 and 1 <= calls[0] <= m, calls  # the Gluon kernel ran, with at most m programs
    ones = torch.ones(n, device="cuda")  # without weight, dw is the gradient of a weight of ones
    check_backward_and_repeat(got, dy, x, w, w if weight else ones, mean, rstd, grads, cfg, NEVER)


def _grouped(n: int, slices: int, stages: int, lag: int, warps: int, paired: bool = False, per_sm: int = 1):
    """A grouped entry (the Gluon kernel that splits each row between ``slices`` programs; ``paired``: two
    groups' dw and db partials added into one row)."""
    return ln_mod.LaunchConfig(1, n, warps, per_sm, tma_stages=stages, smem_rows=True, slices=slices, lag=lag,
                               paired=paired)  # fmt: skip


def _group_launches(monkeypatch) -> list:
    """The groups of each launch of the grouped Gluon backward."""
    return _gluon_launches(monkeypatch, "groups_launch", 4)


@pytest.mark.gpu
@_GRADS
@pytest.mark.parametrize(
    "m, n, cfg, weight",
    [pytest.param(4101, 16384, None, True, id="4101x16384, the table (partials in dx)"),
     pytest.param(5, 16384, None, True, id="5 rows, the table: fewer rows than groups"),
     pytest.param(4101, 16384, _grouped(16384, 4, 8, 2, 16), True, id="4101x16384, 4 slices, partials in dx"),
     pytest.param(4101, 16384, _grouped(16384, 2, 6, 1, 16), True, id="4101x16384, 2 slices, lag 1"),
     pytest.param(300, 8192, _grouped(8192, 4, 6, 3, 8), True, id="300x8192, lag 3, partials in a buffer"),
     pytest.param(20000, 4096, _grouped(4096, 8, 4, 2, 2), False, id="20000x4096, 8 slices, no weight"),
     pytest.param(5, 16384, _grouped(16384, 4, 8, 2, 16), True, id="5 rows: fewer rows than groups"),
     pytest.param(1, 16384, _grouped(16384, 2, 3, 1, 16), True, id="one row: the lag past the end"),
     pytest.param(4101, 16384, _grouped(16384, 8, 4, 2, 2, True, 6), True, id="4101x16384, paired groups"),
     pytest.param(300, 8192, _grouped(8192, 4, 6, 3, 8, True), False, id="300x8192, paired, no weight"),
     pytest.param(5, 16384, _grouped(16384, 4, 8, 2, 16, True), True, id="5 rows paired: a group alone"),
     pytest.param(1, 16384, _grouped(16384, 2, 3, 1, 16, True), True, id="one row paired: one group")],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=["bfloat16", "float16", "float32"])  # fmt: skip
def test_grouped_backward_against_float64(dtype, m, n, cfg, weight, grads, gen, monkeypatch):
    # the Gluon backward that splits each row between a group of programs, which exchange their shares
    # of the row sums through L2 and use them `lag` rows later (GPU only): rows far from zero mean, every
    # combination of gradients, with and without weight, the partial sums in dx's last rows and in a
    # buffer, fewer rows than groups, a single row; then the same gradients bit for bit when run again
    # (the shares are added in slice order whichever program posts last); float32 rows take fewer
    # buffers, as many as fit
    x = randn((m, n), dtype, "cuda", gen, mean=3.0, std=2.0)
    w = randn((n,), dtype, "cuda", gen, mean=1.0, std=0.5) if weight else None
    dy = randn((m, n), dtype, "cuda", gen)
    if cfg is None:  # the table's entry
        cfg = ln_mod.launch_config(n, dtype, "bwd", m)
        assert cfg.smem_rows and cfg.slices > 1, cfg
    if not ln_mod.gluon_bwd.groups_usable(x, dy, w, False, cfg.slices):
        pytest.skip("needs Gluon in Triton 3.6 (GLUON_TRITON) and compute capability 9+")
    fit = ln_mod.gluon_bwd.group_stages_that_fit(n, x.element_size(), cfg.slices)
    cfg = cfg.replace(tma_stages=min(cfg.tma_stages, fit))
    calls = _group_launches(monkeypatch)
    plans, plan = [], launch_bwd.finish_plan  # where the partials live, how its scratch rows end
    monkeypatch.setattr(launch_bwd, "finish_plan", lambda *a: plans.append(plan(*a)) or plans[-1])
    _, mean, rstd = ln_mod.layer_norm_fwd(x, w, None, 1e-5)
    got = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, *grads, config=cfg, few=NEVER)
    assert len(calls) == 1 and 1 <= calls[0] <= m, calls  # the grouped kernel ran, at most a group a row
    # the scratch rows from the posted sums (_ln_bwd_finish_kernel), not the two-pass kernel (where the sums
    # of 16-bit scratch rows of 4096 in 8 slices take 6 rows too: five of them are stored in parallel)
    assert None not in plans, plans
    ones = torch.ones(n, device="cuda", dtype=dtype)  # without weight, dw is the gradient of a weight of ones
    check_backward_and_repeat(got, dy, x, w, w if weight else ones, mean, rstd, grads, cfg, NEVER)


def _post(v: torch.Tensor) -> torch.Tensor:
    """float32 ``v`` as the grouped kernel posts it: its bits below a tag of 1 (int64)."""
    return (v.float().view(torch.int32).to(torch.int64) & 0xFFFFFFFF) | (1 << 32)


@pytest.mark.parametrize("weight", [True, False], ids=["weight", "no weight"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bfloat16", "float32"])
@pytest.mark.parametrize(
    "m, n, slices, programs, parallel",  # parallel: the hot tiles stored in parallel, in bfloat16
    [(80, 2048, 2, 2, 0), (67, 4096, 4, 2, 0), (40, 8192, 2, 1, 0), (309, 2048, 8, 16, 2),
     (1400, 4096, 8, 80, 5)],
    ids=["80x2048, 2 slices", "67x4096, 4 slices", "40x8192, one group",
         "309x2048, 8 slices: three hot tiles in bf16, two of them in parallel",
         "1400x4096, 8 slices: six hot rows in bf16, five in parallel"],
)
def test_grouped_backward_finishes_its_scratch_rows_from_posted_sums(m, n, slices, programs, parallel, dtype,
                                                                     weight, device, gen):  # fmt: skip
    # what runs after the grouped kernel (which needs the GPU) when its partials live in dx's last rows:
    # the kernel that writes those rows' dx from the row sums the grouped kernel posted, the tiles that
    # hold other rows' sums once those rows' programs have read them (in parallel), its last program
    # taking the tiles that hold the hot rows' sums and the counter once every other program has read.
    # Here the scratch is laid out as layer_norm_bwd lays it out, the partials garbage, the sums posted
    # from float64 as the grouped kernel posts them (each slice its share, rstd folded into the first),
    # the counter at its value after the grouped kernel; dx of the scratch rows against float64, the rows
    # above left as they were
    x = randn((m, n), dtype, device, gen, mean=3.0, std=2.0)
    w = randn((n,), dtype, device, gen, mean=1.0, std=0.5) if weight else None
    dy = randn((m, n), dtype, device, gen)
    mean = x.float().mean(1)  # the statistics as the forward saves them (float32)
    rstd = torch.rsqrt(x.float().var(1, correction=0) + 1e-5)
    part, shares_n = launch_bwd.align(programs * n), launch_bwd.align(4 * slices * m)
    total = 2 * part + shares_n + launch_bwd.align(1)
    dx = torch.full((m, n), 7.0, dtype=dtype, device=device)
    R, start = launch_bwd.scratch_rows(m, n * dx.element_size(), total * 4)
    scratch = dx.view(torch.uint8).view(-1)[start : start + total * 4].view(torch.float32)
    assert 0 < R < m
    scratch[: 2 * part] = float("nan")  # the partials, read by now
    shares = scratch[2 * part : 2 * part + shares_n].view(torch.int64)[: 2 * slices * m].view(m, 2, slices)
    count = scratch[2 * part + shares_n :][:1].view(torch.int32)
    g = dy.double() * (w.double() if weight else 1.0)
    xc = x.double() - mean.double()[:, None]
    s1 = (xc * g).view(m, slices, -1).sum(-1) * rstd.double()[:, None]
    shares[:, 0], shares[:, 1] = _post(s1), _post(g.view(m, slices, -1).sum(-1))
    count.fill_(programs * slices)
    plan = launch_bwd.finish_plan(m, n, dx.element_size(), R, shares.data_ptr() - dx.data_ptr(), slices)
    assert plan is not None
    if dtype == torch.bfloat16:  # HOT_TILE to LAST_TILE: the cases take both branches of the kernel
        assert plan[1] - plan[0] == parallel, plan
    ln_mod.finish_from_shares(dx, dy, x, w, mean, rstd, shares, count, R, slices, programs * slices, plan)
    xhat = xc * rstd.double()[:, None]
    want = (g - (xhat * (xhat * g).mean(1, keepdim=True) + g.mean(1, keepdim=True))) * rstd.double()[:, None]
    assert torch.equal(dx[: m - R], torch.full_like(dx[: m - R], 7.0))
    err, tol = relerr(dx[m - R :], want[m - R :]), ln_tol(dtype, "bwd", m)
    assert err <= tol, (err, tol)


# A backward under compute-sanitizer (run as its own process): dx a whole number of 2 MiB, so that the
# caching allocator gives it a segment of its own and the scratch in its last rows ends where the
# allocation does; a read past the shares of the row sums is then outside every allocation, which memcheck
# reports (and which faults the kernel on a real run whenever nothing is mapped after the segment)
_SANITIZED_BACKWARD = """
import sys, torch
from crossfuse.ops import layer_norm as ln
for m, n, dtype, slices, stages, lag, warps, paired in {cases}:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    w = torch.randn(n, device="cuda", dtype=dtype, generator=g)
    dy = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    _, mean, rstd = ln.layer_norm_fwd(x, w, None, 1e-5)
    cfg = ln.LaunchConfig(1, n, warps, 1, tma_stages=stages, smem_rows=True, slices=slices, lag=lag,
                          paired=paired)
    ln.layer_norm_bwd(dy, x, w, mean, rstd, True, True, config=cfg)
    torch.cuda.synchronize()
print("done")
"""


def _compute_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    return found or next(iter(sorted(glob.glob("/usr/local/cuda*/bin/compute-sanitizer"))), None)


@pytest.mark.gpu
def test_grouped_backward_reads_nothing_past_its_buffers(gen):
    # the grouped kernel's last iterations finish the rows still waiting (LAG of them) and ask for shares
    # of rows past the last: those addresses must stay in bounds, whatever they read
    x = randn((8, 16384), torch.bfloat16, "cuda", gen)
    if not ln_mod.gluon_bwd.groups_usable(x, x, x[0], False, 2):
        pytest.skip("needs Gluon in Triton 3.6 (GLUON_TRITON) and compute capability 9+")
    sanitizer = _compute_sanitizer()
    if sanitizer is None:
        pytest.skip("compute-sanitizer not found (CUDA's toolkit)")
    cases = [(256, 16384, "torch.bfloat16", 8, 12, 3, 8, False),
             (2048, 16384, "torch.bfloat16", 2, 4, 2, 8, False),
             (1024, 16384, "torch.float32", 2, 3, 1, 16, False),
             (2048, 16384, "torch.bfloat16", 8, 4, 2, 2, True)]  # fmt: skip
    for m, n, dtype, *_ in cases:  # dx a whole number of 2 MiB, its scratch in its last rows
        assert m * n * (2 if "bfloat16" in dtype else 4) % (2 << 20) == 0
    listed = ", ".join(f"({', '.join(map(str, case))})" for case in cases)
    code = _SANITIZED_BACKWARD.format(cases=f"[{listed}]")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    cmd = [sanitizer, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, "-c", code]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0 and "done" in run.stdout, (run.returncode, run.stdout[-3000:], run.stderr)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["whole rows", "grouped"])
def test_smem_rows_backward_only_where_it_can_run(kind, gen, monkeypatch):
    # where a Gluon kernel cannot run, a table entry that asks for it takes the Triton kernels of
    # SMEM_ROWS_FALLBACK, with results within the same tolerances. The whole-row kernel: float32, rows that
    # are not contiguous, N not a power of 2 or below 4096, another Triton. The grouped one (which takes
    # float32): rows that are not contiguous, N not a power of 2, N = 2048 (slices with fewer box rows than
    # the entry has warps), another Triton
    if kind == "whole rows":
        cfg = ln_mod.LaunchConfig(1, 16384, 16, 1, tma_stages=3, smem_rows=True)
        usable, launch = ln_mod.gluon_bwd.usable, "rows_launch"
    else:
        cfg = ln_mod.launch_config(16384, torch.bfloat16, "bwd", 4096)
        box_rows_2048 = 2048 // cfg.slices // ln_mod.gluon_bwd.BOX_W  # of a slice of a row of 2048
        assert cfg.smem_rows and cfg.slices > 1 and cfg.num_warps > box_rows_2048, cfg

        def usable(x, dy, w, interpreted):
            rows = ln_mod.gluon_bwd
            fits = not rows.groups_launch_unfit(x.shape[1], x.element_size(), cfg.slices, cfg.num_warps,
                                                cfg.tma_stages, cfg.lag)  # fmt: skip
            return rows.groups_usable(x, dy, w, interpreted, cfg.slices) and fits

        launch = "groups_launch"
    base = randn((64, 2 * 16384), torch.bfloat16, "cuda", gen)
    cases = {
        "strided rows": base[:, :16384],
        "N = 12288": randn((64, 12288), torch.bfloat16, "cuda", gen),
        "N = 2048": randn((64, 2048), torch.bfloat16, "cuda", gen),
    }
    if kind == "whole rows":
        cases["float32"] = randn((64, 16384), torch.float32, "cuda", gen)
    good = randn((64, 16384), torch.bfloat16, "cuda", gen)
    if not usable(good, good, good[0], False):
        pytest.skip("needs Gluon in Triton 3.6 (GLUON_TRITON) and compute capability 9+")
    # Gluon's API changes between Triton releases: another version than the one the kernel was tested
    # with takes the Triton kernels
    monkeypatch.setattr(ln_mod.gluon_bwd, "triton_version", lambda: (3, 9))
    assert not usable(good, good, good[0], False)
    monkeypatch.undo()
    calls = _gluon_launches(monkeypatch, launch, 0)
    for name, x in cases.items():
        n = x.shape[1]
        w = randn((n,), x.dtype, "cuda", gen)
        dy = randn(x.shape, x.dtype, "cuda", gen)
        assert not usable(x, dy, w, False), name
        _, mean, rstd = ln_mod.layer_norm_fwd(x, w, None, 1e-5)
        dx, dw, db = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, True, True, config=cfg)
        leaves = [t.double().requires_grad_(True) for t in (x, w, torch.zeros(n, device="cuda"))]
        layer_norm_ref(*leaves, 1e-5).backward(dy.double())
        for got, leaf, kind_ in zip((dx, dw, db), leaves, ("bwd", "reduced", "reduced"), strict=True):
            tol = ln_tol(x.dtype, kind_, x.shape[0], got.dtype)
            assert relerr(got, leaf.grad) <= tol, (name, kind_, relerr(got, leaf.grad), tol)
    assert calls == []


@pytest.mark.parametrize(
    "programs, warps, stages, words",
    [(0, 16, 3, "programs must be from 1 to the row count 8"), (9, 16, 3, "programs must be"),
     (4, 64, 3, "warps must be a power of 2 from 1 to N / 512 = 32"), (4, 12, 3, "warps must be"),
     (4, 16, 1, "stages must be from 2"), (4, 16, 4, "stages must be")],
)  # fmt: skip
def test_smem_rows_launch_rejects_a_launch_that_cannot_run(programs, warps, stages, words):
    # the Gluon kernel's launcher checks what its kernel assumes before anything is compiled: at most one
    # program per row (each reads its first row's statistics), warps that tile half a row, row buffers
    # that fit in shared memory (4 x 64 KB do not, beside the weight)
    x = torch.zeros((8, 16384), dtype=torch.bfloat16)
    w, stats = torch.ones(16384, dtype=torch.bfloat16), torch.zeros(8)
    part = torch.zeros((programs or 1, 16384))
    rows = ln_mod.gluon_bwd
    with pytest.raises(ValueError, match=words):
        rows.launch(x, x, x, w, stats, stats, part, part, programs, 8, True, True, warps, stages)


@pytest.mark.parametrize(
    "groups, slices, warps, stages, lag, words",
    [(0, 4, 16, 8, 2, "groups must be from 1 to the row count 8"), (9, 4, 16, 8, 2, "groups must be"),
     (2, 4, 32, 8, 2, "warps must be a power of 2 from 1 to N / slices / 256 = 16"),
     (2, 4, 12, 8, 2, "warps must be"), (2, 4, 16, 8, 0, "lag must be at least 1"),
     (2, 4, 16, 3, 2, "stages from lag \\+ 2"), (2, 4, 16, 15, 2, "to what fits in shared memory")],
)  # fmt: skip
def test_grouped_launch_rejects_a_launch_that_cannot_run(groups, slices, warps, stages, lag, words):
    # the grouped kernel's launcher checks what its kernel assumes before anything is compiled: at most a
    # group per row, warps that tile a slice's box rows, buffers for the rows waiting on their shares and
    # at least one loading, no more than fit in shared memory (15 x 16 KB do not)
    x = torch.zeros((8, 16384), dtype=torch.bfloat16)
    w, stats = torch.ones(16384, dtype=torch.bfloat16), torch.zeros(8)
    part = torch.zeros((max(groups, 1), 16384))
    shares, tickets = torch.zeros(8 * 2 * slices, dtype=torch.int64), torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match=words):
        ln_mod.gluon_bwd.launch_groups(x, x, x, w, stats, stats, shares, tickets, tickets, part, part,
                                          groups, 8, True, True, slices, warps, stages, lag)  # fmt: skip


def test_grouped_table_entries_fit_their_programs_on_an_sm():
    # the table's grouped entries can launch (warps, lag and buffers as the launcher checks them), and
    # their programs_per_sm programs fit one SM's shared memory together (228 KB on sm_90, of which 1 KB
    # a program is the system's): a table entry whose buffers did not would run fewer programs an SM than
    # it was measured with, correct but slower, with nothing to say so
    rows = ln_mod.gluon_bwd
    grouped = {key: cfg for table in ln_mod.TABLES.values() for key, cfg in table.items()
               if cfg.smem_rows and cfg.slices > 1}  # fmt: skip
    assert grouped
    for (kind, esize, n, _), cfg in grouped.items():
        assert kind == "bwd" and cfg.programs_per_sm >= 1, cfg
        assert rows.groups_launch_unfit(n, esize, cfg.slices, cfg.num_warps, cfg.tma_stages, cfg.lag) is None
        buffers = cfg.tma_stages * 2 * (n // cfg.slices) * esize + 8 * cfg.tma_stages  # x and dy, barriers
        assert cfg.programs_per_sm * (buffers + 1024) <= 228 * 1024, (n, esize, cfg)


@pytest.mark.parametrize("cfg", [ln_mod.LaunchConfig(1, 4096, 8, 2, tma_stages=3, smem_rows=True),
                                 _grouped(4096, 4, 6, 2, 4)], ids=["whole rows", "grouped"])  # fmt: skip
def test_smem_rows_entry_falls_back_off_the_gpu(cfg, device, gen):
    # under the interpreter (CI) the table's Gluon entries are never launched: the backward runs the
    # fallback's Triton kernels and matches the same entry run as the fallback itself, bit for bit
    m, n = 8, 4096
    x = randn((m, n), torch.bfloat16, device, gen, mean=1.0)
    w, dy = randn((n,), torch.bfloat16, device, gen), randn((m, n), torch.bfloat16, device, gen)
    interpreted = launch.INTERPRETED
    if ln_mod.gluon_bwd.usable(x, dy, w, interpreted) or ln_mod.gluon_bwd.groups_usable(
        x, dy, w, interpreted, cfg.slices
    ):
        pytest.skip("the Gluon kernels run here: the GPU tests cover them")
    _, mean, rstd = ln_mod.layer_norm_fwd(x, w, None, 1e-5)
    fallback = ln_mod.smem_rows_fallback(cfg, n, x.element_size(), m)
    got = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, True, True, config=cfg)
    want = ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, True, True, config=fallback)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
