"""The harness's runner: rounds, interrupts, error and skip rows, suites, profiles, memory tables and the
report's details (GPU-only parts are marked ``gpu``)."""

from __future__ import annotations

import collections
import json
import math
import time

import pandas as pd
import pytest
import torch
from _harness import _raise_runtime, registered, row, tiny_suite
from crossfuse import _backend, registry
from crossfuse.harness import (
    memory,
    plots,
    point_data,
    profile,
    report,
    runner,
    schema,
    suite,
    timing,
)


def test_bench_passes_rounds_to_the_runner(tmp_path):
    from crossfuse import cli

    out = tmp_path / "b"
    args = ["bench", "layer_norm", "--quick", "--device=cpu", "--impl=python/torch", "--op=layer_norm"]
    assert cli.main([*args, "--dtype=float32", "--rounds=3", "--out", str(out)]) == 0
    rows = schema.read_csv(out / "results.csv")
    timed = rows[(rows["status"] == "ok") & (rows["op"] == "layer_norm")]  # not the copy ceiling's row
    assert len(timed) > 0 and timed["note"].str.startswith("median of 3 of 3 rounds").all()


def test_a_failing_implementation_is_an_error_row_and_the_run_goes_on(tmp_path):
    fake = registry.Implementation("layer_norm", "test_broken", "python", _raise_runtime)
    path = tmp_path / "r.csv"
    with registered(fake), schema.CsvWriter(path) as w:
        rows = runner.Runner("cpu", w, quick=True).run(
            tiny_suite(), impls=["torch", "test_broken", "python/layernorm"]
        )
    by = {(r.impl, r.mode): r for r in rows}
    assert by["test_broken", "fwd"].status == "error"
    assert "RuntimeError: deliberately broken" in by["test_broken", "bwd"].note
    for impl in ("torch", "layernorm"):
        for mode in ("fwd", "bwd"):
            r = by[impl, mode]
            assert r.status == "ok" and r.ms_p50 > 0 and r.gbps > 0 and r.alloc_bytes > 0
            assert r.relerr < 1e-5
    assert len(schema.read_csv(path)) == 6


def _grad_one_percent_off(inputs, dy):
    x, w, b = (inputs[k].detach().requires_grad_(True) for k in ("x", "weight", "bias"))
    out = torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, inputs["eps"])
    gx, gw, gb = torch.autograd.grad(out, (x, w, b), dy)
    return out.detach(), {"x": gx * 1.01, "weight": gw, "bias": gb}


def test_relerr_is_per_mode():
    # an exact forward with a gradient 1% off: fwd's relerr is the forward's, bwd's and fwd+bwd's the
    # gradient's (the largest of output and gradients)
    fake = registry.Implementation("layer_norm", "test_grad_off", "python",
                                   lambda x, weight, bias, eps: torch.nn.functional.layer_norm(
                                       x, (x.shape[-1],), weight, bias, eps),
                                   vjp=_grad_one_percent_off)  # fmt: skip
    with registered(fake):
        s = tiny_suite(modes=("fwd", "bwd", "fwd+bwd"))
        rows = runner.Runner("cpu", quick=True).run(s, impls=["test_grad_off"])
    by = {r.mode: r.relerr for r in rows}
    assert by["fwd"] < 1e-6 and by["bwd"] == pytest.approx(0.01, rel=1e-3)
    assert by["fwd+bwd"] == pytest.approx(0.01, rel=1e-3)


def test_unavailable_excluded_and_out_of_time_are_skip_rows_with_reasons():
    s = tiny_suite(exclude=[{"impl": "layernorm", "device": "cpu", "reason": "excluded for the test"}])
    rows = runner.Runner("cpu", quick=True).run(s, impls=["liger", "python/layernorm"])
    notes = {r.impl: r.note for r in rows}
    assert all(r.status == "skip" for r in rows)
    assert notes["liger"] == "runs on cuda only" and notes["layernorm"] == "excluded for the test"
    late = runner.Runner("cpu", quick=True, deadline=time.monotonic() - 1).run(tiny_suite(), impls=["torch"])
    assert [r.status for r in late] == ["skip", "skip"] and "time budget" in late[0].note


def test_interpreted_triton_is_not_timed_but_has_relerr():
    if not _backend.interpreter_requested():
        pytest.skip("the Triton interpreter is off here (a GPU machine): Triton runs on cuda only")
    rows = runner.Runner("cpu", quick=True).run(tiny_suite(), impls=["fused"])
    assert [r.status for r in rows] == ["not timed", "not timed"]
    assert "interpreter" in rows[0].note and rows[0].ms_p50 is None
    assert rows[0].relerr < 1e-5 and rows[1].relerr < 1e-5


def test_interpreted_triton_that_raises_is_an_error_row():
    # the one interpreted run is all there is of a Triton kernel on the CPU: when it raises, the rows say
    # error (was "not timed", counted as no error)
    if not _backend.interpreter_requested():
        pytest.skip("the Triton interpreter is off here (a GPU machine): Triton runs on cuda only")
    s = tiny_suite(ops=("relu_attention",), shape=(1, 1, 16, 48))  # head dim 48: not supported
    rows = runner.Runner("cpu", quick=True).run(s, impls=["python/triton"])
    assert rows and all(r.status == "error" for r in rows)
    assert "head dim D=48 is not supported" in rows[0].note


def test_report_flags_figures_above_the_copy_ceiling_and_repeated_runs():
    rows = [
        row(op="copy", impl="torch_copy", peer=False, shape="1024", gbps=2.0),
        row(impl="torch", gbps=28.0),
        row(impl="torch", gbps=1.0),  # a second run of the same measurement
        row(impl="torch", gbps=2.0),
    ]
    md = report.render(rows)
    assert "| 4096x1024 | 2 | 100% (torch) |" in md  # the median of 28, 1 and 2
    assert "3 rows repeat a measurement" in md
    md = report.render(rows[:2])
    assert "1400% ⚠ (torch)" in md and md.count("⚠ above the copy ceiling") == 1
    two = [*rows[:2], row(impl="torch", dtype="float16", gbps=30.0)]  # two flagged tables, one note
    md = report.render(two)
    assert md.count("% ⚠ (torch)") == 2 and md.count("⚠ above the copy ceiling") == 1
    assert "repeat a measurement" not in md and "Julia: no rows" in md


def test_side_measure_and_vjp_are_used():
    def measure(shape, dtype, device, mode, options):
        return {"ms_p20": 1.0, "ms_p50": 2.0, "ms_p80": 3.0, "alloc_bytes": 10, "versions": "julia=1.11"}

    def vjp(inputs, dy):
        return registry.get("layer_norm", "torch").forward_backward(inputs, dy)

    ln = registry.get("layer_norm", "torch").fn
    measured = registry.Implementation("layer_norm", "test_measured", "python", ln, measure=measure)
    with_vjp = registry.Implementation("layer_norm", "test_vjp", "python", ln, vjp=vjp)
    s = tiny_suite(modes=("fwd", "bwd", "fwd+bwd"))
    with registered(measured, with_vjp):
        rows = runner.Runner("cpu", quick=True).run(s, impls=["test_measured", "test_vjp"])
    by = {(r.impl, r.mode): r for r in rows}
    m = by["test_measured", "fwd"]
    assert (m.ms_p50, m.alloc_bytes, m.versions) == (2.0, 10, "julia=1.11")
    assert m.gbps == pytest.approx(2 * 8 * 32 * 4 / 2e-3 / 1e9) and m.relerr < 1e-5
    assert by["test_vjp", "bwd"].status == "skip" and "not separable" in by["test_vjp", "bwd"].note
    assert by["test_vjp", "fwd+bwd"].status == "ok" and by["test_vjp", "fwd+bwd"].ms_p50 > 0


def test_bwd_times_the_graph_of_a_later_call_than_the_first():
    # a shape's first calls may build a graph with another backward than later calls do (crossfuse's
    # layer norm: Triton's dispatch, then the forward's and the backward's programs recorded, their graphs
    # keeping the Python backward): the bwd row times the graph of a call after three whose backwards ran,
    # whatever the correctness check before it called
    calls, ran = [], []

    class Tagged(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y, index):
            ctx.index = index
            return y.clone()

        @staticmethod
        def backward(ctx, dy):
            ran.append(ctx.index)
            return dy, None

    ln = registry.get("layer_norm", "torch").fn

    def fn(**kw):
        calls.append(len(calls))
        return Tagged.apply(ln(**kw), calls[-1])

    tagged = registry.Implementation("layer_norm", "test_tagged", "python", fn)
    with registered(tagged):
        (r,) = runner.Runner("cpu", quick=True).run(tiny_suite(modes=("bwd",)), impls=["test_tagged"])
    assert r.status == "ok", r.note
    timed, count = collections.Counter(ran).most_common(1)[0]
    assert count > 2 and {timed - 3, timed - 2, timed - 1} <= set(ran[: ran.index(timed)]), ran


def test_speed_only_peer_gets_no_relerr():
    s = tiny_suite(ops=("relu_attention",), shape=(1, 1, 16, 8), modes=("fwd",))
    (r,) = runner.Runner("cpu", quick=True).run(s, impls=["sdpa_softmax"])
    assert r.status == "ok" and r.relerr is None and "speed-only" in r.note and r.tflops > 0


def test_copy_ceiling_row():
    r = runner.Runner("cpu", quick=True).copy_row("t", torch.bfloat16, 1 << 16)
    assert (r.op, r.shape, r.status) == ("copy", "65536", "ok")
    assert r.gbps == pytest.approx(2 * (1 << 17) / (r.ms_p50 * 1e-3) / 1e9)


@pytest.mark.gpu
def test_runner_on_cuda():
    s = tiny_suite(shape=(256, 1024), modes=("fwd", "bwd", "fwd+bwd"))
    rows = runner.Runner("cuda", quick=True).run(s, impls=["torch", "fused"])
    assert len(rows) == 6 and all(r.status == "ok" and r.gbps > 0 and r.alloc_bytes > 0 for r in rows)


# ----------------------------------------------------------------------------------------------------
# suites and profile
# ----------------------------------------------------------------------------------------------------


def test_suite_file_defines_the_three_suites_as_specified():
    suites = suite.load_suites()
    assert {"layer_norm", "attention", "memory"} <= set(suites)
    ln = suites["layer_norm"].groups[0]
    assert ln.ops == ("layer_norm",) and (65536, 1024) in ln.shapes and (32768, 4096) in ln.shapes
    assert [s[1] for s in ln.shapes if s[0] == 4096] == [1024, 2048, 4096, 8192, 16384]
    for b, h, l, d in suites["attention"].groups[0].shapes:
        assert b * l == 16384 and h == {64: 32, 128: 16}[d]
    for s in suites.values():  # quick variants stay tiny
        for g in s.groups:
            for op in g.ops:
                assert all(runner.work(op, sh) <= 1 << 17 for sh in g.quick_shapes)


def test_grid_suites_cover_the_space_users_hit():
    # the layer norm grid: N from 64 to 65536 with the widths that are not powers of two, one row to a
    # million rows, every float dtype, never over 2^28 elements; attention: every head dim, lengths that
    # are not multiples of 64, few heads and small batches
    suites = suite.load_suites()
    ln = suites["layer_norm_grid"].groups[0]
    ns = {n for _, n in ln.shapes}
    assert {64, 65536, 768, 1000, 2560, 5000, 12288} <= ns and len(ns) >= 16
    ms = {m for m, _ in ln.shapes}
    assert {1, 131072, 1048576} <= ms and max(m * n for m, n in ln.shapes) <= 1 << 28
    assert all(max(m for m, n2 in ln.shapes if n2 == n) * n >= 1 << 26 for n in ns)  # each N reaches 64M
    assert {str(d) for d in ln.dtypes} == {"torch.bfloat16", "torch.float16", "torch.float32"}
    attn = suites["attention_grid"].groups[0]
    assert {d for *_, d in attn.shapes} == {16, 32, 64, 128, 256}
    assert any(length % 64 for _, _, length, _ in attn.shapes) and min(b for b, *_ in attn.shapes) == 1
    assert {o["causal"] for o in attn.options} == {False, True}
    # float32 against the seed notebook's algorithm: its shapes (B=4, H=16, D=64) up to L=8192
    fp32 = suites["attention_fp32"].groups[0]
    assert {(4, 16, length, 64) for length in (1024, 4096, 8192)} <= set(fp32.shapes)
    assert [str(d) for d in fp32.dtypes] == ["torch.float32"]


def test_bad_suite_data_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown op 'nope'"):
        suite.parse_suite("x", {"groups": [{"ops": ["nope"], "shapes": [(1, 2)]}]})
    with pytest.raises(ValueError, match="unknown keys"):
        suite.parse_suite("x", {"groups": [{"ops": ["layer_norm"], "shapes": [(1, 2)], "size": 1}]})
    with pytest.raises(ValueError, match="dims"):
        suite.parse_suite("x", {"groups": [{"ops": ["relu_attention"], "shapes": [(1, 2)]}]})
    # values of the wrong kind: a ValueError naming the suite, never a TypeError or KeyError
    ln = {"ops": ["layer_norm"], "shapes": [(4, 64)]}
    for data, said in (({"groups": [{**ln, "shapes": [64, 128]}]}, "each shape must be a list of ints"),
                       ({"groups": [ln], "copy_ceiling": {"quick_numel": 4}}, "copy_ceiling must be"),
                       ({"groups": [{**ln, "options": [1]}]}, "malformed suite data"),
                       ({"groups": "layer_norm"}, "groups must be a list of dicts")):  # fmt: skip
        with pytest.raises(ValueError, match=f"suite 'x': .*{said}"):
            suite.parse_suite("x", data)


def test_profile_attention_on_the_cpu(tmp_path):
    res = profile.profile_attention("cpu", (1, 2, 32, 16), torch.float32, out_dir=tmp_path)
    labels = {s.label: s for s in res.subjects}
    assert list(labels) == ["softmax_naive", "sdpa_softmax", "naive", "triton"]
    assert labels["softmax_naive"].kernels and {k.phase for k in labels["naive"].kernels} == {"fwd", "bwd"}
    if _backend.interpreter_requested():
        assert "interpreter" in labels["triton"].reason and not labels["triton"].kernels
    trace = json.loads(res.trace.read_text())
    names = [e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"]
    assert any(n.startswith("softmax_naive:") for n in names) and any(n.startswith("naive:") for n in names)
    assert res.timeline.read_bytes()[:4] == b"\x89PNG"
    assert "aten::_softmax" in res.markdown and "torch.profiler table" in res.markdown


def test_memory_report_shows_multiples_of_the_input():
    rows = [row(op="normalise", impl="normal_now", peer=False, shape="100x1000", mode=m, alloc_bytes=a,
                peak_bytes=a, suite="memory") for m, a in (("fwd", 1_600_000), ("bwd", 400_000))]  # fmt: skip
    md = report.memory_section(schema.rows_frame(rows))
    assert "| normal_now | 1.5 MiB (4.00×) | 1.5 MiB (4.00×) | 0.4 MiB (1.00×) | 0.4 MiB (1.00×) |" in md


def test_speed_suites_get_a_peak_memory_table_of_fwd_bwd():
    rows = [row(impl=i, peer=i == "torch", mode="fwd+bwd", status="ok", peak_bytes=p, suite="layer_norm")
            for i, p in (("fused", 17 * 2**20), ("torch", 16 * 2**20))]  # fmt: skip
    rows.append(row(impl="fused", mode="fwd", status="ok", peak_bytes=2**30, suite="layer_norm"))  # not in it
    md = report.peak_section(schema.rows_frame(rows))
    assert "### peak memory of fwd+bwd · layer_norm · cpu · float32" in md
    assert "| 4096x1024 | 17.0 MiB | 16.0 MiB |" in md and "1024.0 MiB" not in md


def test_pandas_frame_from_rows_has_schema_types():
    df = schema.rows_frame([row(alloc_bytes=5)])
    assert df["alloc_bytes"].dtype == "float64" and df["peer"].dtype == bool
    assert isinstance(df, pd.DataFrame)


def test_no_ratio_where_a_peer_was_left_out_for_the_time_budget():
    # the best peer of that row is unknown: no ratio, rather than one against a slower peer
    rows = []
    for impl, peer, shape, value, status, note in (
        ("triton", False, "a", 600.0, "ok", ""),
        ("sdpa", True, "a", 500.0, "ok", ""),
        ("naive", True, "a", 50.0, "ok", ""),
        ("triton", False, "b", 600.0, "ok", ""),
        ("sdpa", True, "b", None, "skip", schema.BUDGET_SPENT),
        ("naive", True, "b", 50.0, "ok", ""),
        ("triton", False, "c", 600.0, "ok", ""),
        ("sdpa", True, "c", None, "error", "OutOfMemoryError: boom"),
        ("naive", True, "c", 50.0, "ok", ""),
    ):
        rows.append(row(op="relu_attention", impl=impl, peer=peer, shape=shape, tflops=value, status=status,
                        note=note, dtype="bfloat16", suite="attention"))  # fmt: skip
    md = report.render(schema.rows_frame(rows), source="r.csv")
    lines = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ")}
    assert "1.20×" in lines["a"]
    assert "×" not in lines["b"] and lines["b"].rstrip().endswith("|  |")
    assert "12.00×" in lines["c"]  # a peer that failed (here: out of memory) is not a faster unknown


# ----------------------------------------------------------------------------------------------------
# what a mutation audit found no test holding (each test fails with the bug it names)
# ----------------------------------------------------------------------------------------------------


def test_cpu_timing_is_in_milliseconds():
    t = timing.time_cpu(lambda: time.sleep(0.005), timing.QUICK)  # not seconds (0.005), not microseconds
    assert 4.0 <= t.p50 <= 50.0


def test_alternate_takes_each_round_s_median(monkeypatch):
    monkeypatch.setattr(timing, "time_call", lambda fn, device, config: timing.Timing(1.0, 2.0, 3.0, 5))
    assert timing.alternate({"a": lambda: None}, 2, "cpu") == {"a": [2.0, 2.0]}


def test_memory_records_count_allocations_and_the_running_peak():
    # +100, -100, +50: 150 bytes handed out, never more than 100 held at once
    assert memory.summarise_records([(0, 100), (1, -100), (2, 50)]) == memory.Memory(150, 100)


def test_throughput_comes_from_the_median_time(monkeypatch):
    times = timing.Timing(1.0, 2.0, 4.0, 5, gpu_p50=0.5, host_us=30.0)
    monkeypatch.setattr(timing, "measure", lambda fn, device, config, eager=None: times)
    (r,) = runner.Runner("cpu", quick=True).run(tiny_suite(modes=("fwd",)), impls=["python/torch"])
    assert r.ms_p50 == 2.0 and r.gbps == pytest.approx(2 * 8 * 32 * 4 / 2e-3 / 1e9)  # eager, not GPU-only
    assert (r.gpu_ms_p50, r.host_us) == (0.5, 30.0)


def _forward_off(inputs, dy):
    out, grads = _grad_one_percent_off(inputs, dy)
    return out * 1.05, {k: g / 1.01 if k == "x" else g for k, g in grads.items()}


def _weight_grad_nan(inputs, dy):
    out, grads = _grad_one_percent_off(inputs, dy)
    return out, {**grads, "x": grads["x"] / 1.01, "weight": grads["weight"] * float("nan")}


def test_fwd_bwd_relerr_is_the_largest_and_nan_anywhere_stays_nan():
    ln = registry.get("layer_norm", "torch").fn
    off = registry.Implementation("layer_norm", "test_fwd_off", "python", ln, vjp=_forward_off)
    nan = registry.Implementation("layer_norm", "test_nan_dw", "python", ln, vjp=_weight_grad_nan)
    s = tiny_suite(modes=("bwd", "fwd+bwd"))
    with registered(off, nan):
        rows = runner.Runner("cpu", quick=True).run(s, impls=["test_fwd_off", "test_nan_dw"])
    by = {(r.impl, r.mode): r for r in rows}
    # the forward 5% off, the gradients right: fwd+bwd's relerr is the forward's, and it is flagged
    assert by["test_fwd_off", "bwd"].relerr < 1e-6
    assert by["test_fwd_off", "fwd+bwd"].relerr == pytest.approx(0.05, rel=1e-3)
    assert "relerr above the tolerance" in by["test_fwd_off", "fwd+bwd"].note
    # a NaN weight gradient after a finite dx: NaN, not the finite dx's error
    assert math.isnan(by["test_nan_dw", "bwd"].relerr) and math.isnan(by["test_nan_dw", "fwd+bwd"].relerr)


def test_long_attention_compares_at_least_one_head():
    assert point_data.relerr_heads("relu_attention", (1, 4, 32768, 64)) == 1
    assert point_data.relerr_heads("relu_attention", (1, 2, 64, 64)) is None


def test_attention_rows_keep_causal():
    group = {"ops": ["relu_attention"], "shapes": [(1, 1, 16, 16)], "quick_shapes": [(1, 1, 16, 16)],
             "dtypes": ["float32"], "modes": ["fwd"], "options": [{"causal": True}]}  # fmt: skip
    s = suite.parse_suite("t", {"groups": [group]})
    rows = runner.Runner("cpu", quick=True).run(s, impls=["python/naive"])
    assert rows and all(r.causal is True for r in rows)


def test_copy_ceiling_is_the_best_copy():
    rows = [row(op="copy", impl="torch_copy", peer=False, shape="1024", gbps=g) for g in (100.0, 200.0)]
    df = schema.rows_frame([*rows, row(impl="torch", gbps=150.0)])
    assert report.copy_ceiling(df, "cpu") == 200.0
    assert "| 4096x1024 | 150 | 75% (torch) |" in report.render(df)


def test_memory_table_shows_the_peak_column():
    rows = [row(suite="memory", impl="torch", mode=m, alloc_bytes=64 << 20, peak_bytes=32 << 20)
            for m in ("fwd", "bwd")]  # fmt: skip
    md = report.memory_section(schema.rows_frame(rows))
    ref = 4096 * 1024 * 4
    assert f"| {report.fmt_bytes(64 << 20, ref)} | {report.fmt_bytes(32 << 20, ref)} |" in md


def test_csv_keeps_every_digit_of_a_float(tmp_path):
    path = tmp_path / "r.csv"
    with schema.CsvWriter(path) as w:
        w.write(row(ms_p50=0.123456789012345, gbps=1234.56789012345))
    df = schema.read_csv(path)
    assert df["ms_p50"].iloc[0] == 0.123456789012345 and df["gbps"].iloc[0] == 1234.56789012345


def test_plots_draw_the_median_of_repeated_runs(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = []
    runs = ((1024, 1.0), (1024, 9.0), (1024, 2.0), (2048, 4.0))  # three runs at 1024: median 2
    df = schema.rows_frame([row(impl="torch", shape=f"4096x{n}", gbps=g) for n, g in runs])
    df = report.with_labels(df)
    df["N"] = [1024, 1024, 1024, 2048]
    fig, ax = plt.subplots()
    monkeypatch.setattr(ax, "plot", lambda x, y, **kw: drawn.append((list(x), list(y))))
    plots._lines(ax, df, "N", "gbps", "t", "GB/s")
    plt.close(fig)
    assert drawn == [([1024, 2048], [2.0, 4.0])]
