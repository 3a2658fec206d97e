"""The benchmark harness on the CPU: schema, formulas, pivot and ratio, the runner's error handling,
interruption, memory and timing; GPU-only parts are marked ``gpu``."""

from __future__ import annotations

import csv
import dataclasses
import math
import time

import pytest
import torch
from _harness import DESIGN, row, tiny_suite
from crossfuse.harness import memory, plots, point_data, report, runner, schema, timing

# ----------------------------------------------------------------------------------------------------
# schema
# ----------------------------------------------------------------------------------------------------


def test_columns_are_the_design_columns_then_the_harness_ones():
    assert schema.COLUMNS[:20] == tuple(DESIGN.split(", "))
    assert schema.COLUMNS[20:] == ("status", "note", "suite", "gpu_ms_p50", "host_us")
    assert [f.name for f in schema.dataclasses.fields(schema.Row)] == list(schema.COLUMNS)


def test_csv_round_trip_keeps_types_and_empty_cells(tmp_path):
    path = tmp_path / "r.csv"
    with schema.CsvWriter(path) as w:
        w.write(
            row(ms_p20=1.0, ms_p50=1.5, ms_p80=2.0, gbps=11.2, alloc_bytes=1024, peak_bytes=512, relerr=1e-7)
        )
        w.write(row(op="relu_attention", impl="naive", peer=False, shape="16x32x1024x64", causal=True,
                    mode="fwd+bwd", status="error", note="OutOfMemoryError: x, y"))  # fmt: skip
    df = schema.read_csv(path)
    assert list(df.columns) == list(schema.COLUMNS)
    assert df["shape"].tolist() == ["4096x1024", "16x32x1024x64"]
    assert df["peer"].tolist() == [True, False] and df["causal"].tolist() == [False, True]
    assert df.loc[0, "ms_p50"] == 1.5 and df.loc[0, "alloc_bytes"] == 1024
    assert math.isnan(df.loc[1, "ms_p50"]) and math.isnan(df.loc[1, "relerr"])
    assert df.loc[1, "note"] == "OutOfMemoryError: x, y" and df.loc[1, "status"] == "error"
    assert df.loc[0, "versions"].startswith("python=") and "torch=" in df.loc[0, "versions"]


def test_writer_flushes_every_row_and_appends(tmp_path):
    path = tmp_path / "r.csv"
    w = schema.CsvWriter(path)
    w.write(row())
    with open(path) as f:  # read while the writer is still open: the row is on disk already
        assert len(list(csv.reader(f))) == 2
    w.close()
    with schema.CsvWriter(path) as w2:
        w2.write(row(mode="bwd"))
    assert schema.read_csv(path)["mode"].tolist() == ["fwd", "bwd"]


def test_writer_refuses_a_file_with_another_header(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(ValueError, match="different header"):
        schema.CsvWriter(path)


def test_row_validation_and_shapes():
    with pytest.raises(ValueError, match="mode"):
        row(mode="forward")
    with pytest.raises(ValueError, match="status"):
        row(status="done")
    with pytest.raises(ValueError, match="not result-schema fields"):
        row().update({"ms": 1.0})
    assert schema.shape_str((16, 32, 1024, 64)) == "16x32x1024x64"
    assert schema.parse_shape("4096x1024") == (4096, 1024)
    for bad in ("4096x", "ax2", "0x4"):
        with pytest.raises(ValueError, match="shape"):
            schema.parse_shape(bad)
    assert schema.parse_dtype("bf16") is torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        schema.parse_dtype("int8")


# ----------------------------------------------------------------------------------------------------
# formulas
# ----------------------------------------------------------------------------------------------------


def test_gbps_counts_the_fewest_bytes_of_a_normalisation():
    m, n, ms = 4096, 1024, 0.5
    for mode, k in (("fwd", 2), ("bwd", 3), ("fwd+bwd", 5)):
        gbps, tflops = runner.throughput("layer_norm", (m, n), mode, torch.bfloat16, False, ms)
        assert gbps == pytest.approx(k * m * n * 2 / (ms * 1e-3) / 1e9)
        assert tflops is None
    gbps32, _ = runner.throughput("normalise", (m, n), "fwd", torch.float32, False, ms)
    assert gbps32 == pytest.approx(2 * m * n * 4 / (ms * 1e-3) / 1e9)
    assert runner.throughput("layer_norm", (m, n), "fwd", torch.float32, False, None) == (None, None)


def test_tflops_counts_attention_matmuls():
    b, h, l, d, ms = 16, 32, 1024, 64, 2.0
    fwd = 4 * b * h * l * l * d
    for mode, k in (("fwd", 1.0), ("bwd", 2.5), ("fwd+bwd", 3.5)):
        gbps, tf = runner.throughput("relu_attention", (b, h, l, d), mode, torch.bfloat16, False, ms)
        assert gbps is None
        assert tf == pytest.approx(k * fwd / (ms * 1e-3) / 1e12)
    _, causal = runner.throughput("relu_attention", (b, h, l, d), "fwd", torch.bfloat16, True, ms)
    assert causal == pytest.approx(0.5 * fwd / (ms * 1e-3) / 1e12)


def test_attention_relerr_runs_on_a_slice_when_the_reference_is_large(monkeypatch):
    assert point_data.relerr_heads("relu_attention", (2, 2, 64, 32)) is None
    assert point_data.relerr_heads("relu_attention", (1, 32, 16384, 64)) == 1
    assert point_data.relerr_heads("relu_attention", (4, 32, 4096, 64)) == 16
    assert point_data.relerr_heads("layer_norm", (65536, 1024)) is None
    # the sliced check agrees with the whole check where both are possible
    monkeypatch.setattr(point_data, "ATTENTION_RELERR_MAX_SCORES", 2 * 48 * 48)
    s = tiny_suite(ops=("relu_attention",), shape=(2, 3, 48, 16), modes=("fwd", "fwd+bwd"))
    rows = runner.Runner("cpu", quick=True).run(s, impls=["naive"])
    assert all(r.status == "ok" and 0 < r.relerr < 1e-5 for r in rows)
    assert "heads 0..1" in rows[0].note


# ----------------------------------------------------------------------------------------------------
# pivot, ratio, report
# ----------------------------------------------------------------------------------------------------


def _frame():
    rows = []
    vals = {  # shape -> impl -> gbps
        "4096x1024": {"fused": 900.0, "torch": 600.0, "torch_compile": 750.0, "layernorm": 150.0},
        "4096x2048": {"fused": 1000.0, "torch": 500.0, "torch_compile": None, "layernorm": 100.0},
    }
    peers = {"torch", "torch_compile"}
    for shape, per in vals.items():
        for impl, g in per.items():
            status = "ok" if g is not None else "error"
            note = "" if g else "OutOfMemoryError: boom"
            rows.append(row(impl=impl, peer=impl in peers, shape=shape, gbps=g, status=status, note=note,
                            suite="layer_norm"))  # fmt: skip
    rows.append(row(op="copy", impl="torch_copy", peer=False, shape="1024", gbps=2000.0, suite="layer_norm"))
    return schema.rows_frame(rows)


def test_pivot_and_ratio_to_the_best_peer():
    df = _frame()
    d = report.with_labels(df[df["op"] == "layer_norm"])
    table = report.pivot(d, "gbps")
    assert list(table.index) == ["4096x1024", "4096x2048"]
    assert list(table.columns) == ["fused", "torch", "torch_compile", "layernorm"]
    assert table.at["4096x1024", "torch_compile"] == 750.0
    assert math.isnan(table.at["4096x2048", "torch_compile"])  # the error row has no number
    ratio = report.peer_ratio(table, report.peers_of(d))
    assert list(ratio.columns) == ["fused ÷ best peer", "layernorm ÷ best peer"]
    assert ratio.at["4096x1024", "fused ÷ best peer"] == pytest.approx(900 / 750)
    assert ratio.at["4096x2048", "fused ÷ best peer"] == pytest.approx(1000 / 500)  # the only peer measured
    assert report.peer_ratio(table[["fused", "layernorm"]], {"torch"}).empty


def test_report_renders_tables_copy_share_and_what_was_not_measured():
    md = report.render(_frame(), source="r.csv")
    assert "### layer_norm · cpu · float32 · fwd — GB/s (eager median); copy ceiling 2000 GB/s" in md
    assert "| 4096x1024 | 900 | 600 | 750 | 150 | 1.20× | 0.20× | 45% (fused) |" in md
    assert "| 4096x2048 | 1000 | 500 | error | 100 | 2.00× | 0.20× | 50% (fused) |" in md
    assert "### not measured" in md and "OutOfMemoryError: boom" in md


def test_julia_twins_get_their_own_column():
    rows = [
        row(impl="layernorm", peer=False, gbps=10.0),
        row(impl="layernorm", side="julia", peer=False, gbps=20.0),
    ]
    table = report.pivot(report.with_labels(schema.rows_frame(rows)), "gbps")
    assert list(table.columns) == ["layernorm", "layernorm [julia]"]


def test_plots_write_pngs(tmp_path):
    rows = []
    for n, g in ((1024, 500.0), (2048, 700.0), (4096, 800.0)):
        for impl, f in (("fused", 1.0), ("torch", 0.7)):
            rows.append(
                row(impl=impl, peer=impl == "torch", shape=f"4096x{n}", gbps=g * f, suite="layer_norm")
            )
    for l in (1024, 4096):
        rows.append(row(op="relu_attention", impl="naive", peer=False, shape=f"{16384 // l}x32x{l}x64",
                        tflops=100.0 + l / 100, dtype="bfloat16", suite="attention"))  # fmt: skip
    for impl, a in (("normal_now", 5.0), ("normal_new", 2.0)):
        for mode in ("fwd", "bwd"):
            rows.append(row(op="normalise", impl=impl, peer=False, shape="100x1000", mode=mode,
                            alloc_bytes=int(a * 4e5), peak_bytes=int(a * 3e5), suite="memory"))  # fmt: skip
    written = plots.write_plots(schema.rows_frame(rows), tmp_path)
    assert [p.name for p in written] == ["layer_norm_gbps.png", "attention_tflops.png", "memory.png"]
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


# ----------------------------------------------------------------------------------------------------
# timing and memory
# ----------------------------------------------------------------------------------------------------


def test_cpu_timing_quantiles_are_ordered():
    t = timing.time_cpu(lambda: torch.ones(1000).sum(), timing.QUICK)
    assert 0 < t.p20 <= t.p50 <= t.p80 and t.reps >= timing.QUICK.cpu_min_reps


def test_timing_summary_is_the_20th_50th_and_80th_percentiles():
    times = [float(v) for v in torch.rand(101, generator=torch.Generator().manual_seed(7)) * 10]
    t = timing._summarise(times)
    ordered = sorted(times)  # 101 values: the k-th percentile is the (k)th value, no interpolation
    assert (t.p20, t.p50, t.p80, t.reps) == (ordered[20], ordered[50], ordered[80], 101)


def test_relerr_of_a_non_finite_output_fails_every_tolerance():
    from crossfuse.tolerances import relerr

    ref = torch.ones(4, dtype=torch.float64)
    for bad in (float("nan"), float("inf")):
        out = ref.clone()
        out[1] = bad
        err = relerr(out, ref)
        assert math.isnan(err) and not err <= 1.0
    assert relerr(ref * 1.01, ref) == pytest.approx(0.01)


def test_accuracy_section_shows_the_largest_relerr_of_each_kind():
    rows = [
        row(impl="torch", mode="fwd", relerr=1e-7, gbps=1.0),
        row(impl="torch", mode="fwd", shape="4096x2048", relerr=3e-7, gbps=1.0),
        row(impl="torch", mode="bwd", relerr=2e-6, gbps=1.0),
        row(impl="torch", mode="fwd+bwd", relerr=5e-6, gbps=1.0),
    ]
    md = report.accuracy_section(report.rows_frame(rows))
    assert "| layer_norm | cpu | float32 | torch | 3.00e-07 | 5.00e-06 |" in md


def test_alternate_takes_every_call_in_turn():
    # one untimed call each first, then rounds that take the calls in order: the order of the calls made
    # is a, b, then (a's repeats, b's repeats) per round, and each name gets one median per round
    order = []
    calls = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    config = timing.TimingConfig(cpu_warmup_s=0.0, cpu_rep_s=0.0, cpu_min_reps=2, cpu_max_reps=2)
    times = timing.alternate(calls, 3, "cpu", config)
    assert list(times) == ["a", "b"] and all(len(t) == 3 and all(v >= 0 for v in t) for t in times.values())
    runs = [name for i, name in enumerate(order) if i == 0 or order[i - 1] != name]
    assert runs == ["a", "b"] * 4  # the first calls, then three rounds of a's calls then b's


def test_cpu_memory_sees_torch_allocations():
    n = 1 << 20
    mem = memory.measure_cpu(lambda: torch.empty(n, dtype=torch.float32))
    assert 4 * n <= mem.alloc_bytes < 4 * n + 4096 and 4 * n <= mem.peak_bytes < 4 * n + 4096
    # a temporary freed inside the call counts as allocated, not as peak above the result
    mem = memory.measure_cpu(lambda: (torch.ones(n) * 2).sum())
    assert mem.alloc_bytes >= 8 * n and 4 * n <= mem.peak_bytes < 8 * n + 4096


@pytest.mark.gpu
def test_cuda_timing_and_memory():
    x = torch.randn(4096, 4096, device="cuda")
    t = timing.time_cuda(lambda: x @ x, "cuda", timing.QUICK)
    assert 0 < t.p20 <= t.p50 <= t.p80
    mem = memory.measure_cuda(lambda: torch.empty(1 << 20, device="cuda"))
    assert mem.alloc_bytes >= 4 << 20 and mem.peak_bytes >= 4 << 20


@pytest.mark.gpu
def test_interleaved_eager_timer_times_every_call_alike():
    # two calls of very different cost timed in one interleaved pass: each gets its own percentiles over
    # the same number of repeats, and the heavier one measures heavier
    x = torch.randn(2048, 2048, device="cuda")
    t = timing.time_cuda_eager_interleaved({"mm": lambda: x @ x, "add": lambda: x + 1}, "cuda", timing.QUICK)
    assert list(t) == ["mm", "add"] and t["mm"].reps == t["add"].reps >= timing.QUICK.cuda_min_reps
    assert all(0 < v.p20 <= v.p50 <= v.p80 for v in t.values()) and t["mm"].p50 > t["add"].p50


def test_persisting_l2_reset_falls_back_when_refused(monkeypatch):
    calls = []

    def refuse():
        calls.append(1)
        return 801  # CUDA_ERROR_NOT_SUPPORTED

    monkeypatch.setattr(timing, "_PERSISTING_RESET", [refuse])
    assert timing.persisting_l2_reset() is refuse
    with pytest.warns(RuntimeWarning, match="CUresult 801"):
        assert timing._reset_persisting_l2() is False and calls == [1]
    # refused once: not called again in this process, and the timer's method no longer claims it
    assert timing.persisting_l2_reset() is None and timing._reset_persisting_l2() is False and calls == [1]
    assert "persisting" not in timing.method("cuda")
    monkeypatch.setattr(timing, "_PERSISTING_RESET", [lambda: 0])
    assert timing._reset_persisting_l2() is True and "persisting lines reset" in timing.method("cuda")


def test_flush_l2_synchronises_whether_or_not_the_reset_runs(monkeypatch):
    """The timer's level must not depend on the driver: a refused or missing reset leaves the
    synchronisation before each repeat's flush in place (it alone moves 4096-row layer norms 1-5% on
    the H200); the reset, where it runs, always follows one."""
    events = []
    buf = torch.ones(8)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("sync"))
    monkeypatch.setattr(timing, "l2_flush_buffer", lambda device="cuda": buf)
    monkeypatch.setattr(timing, "_reset_persisting_l2", lambda device=None: events.append("reset") or True)

    monkeypatch.setattr(timing, "_PERSISTING_RESET", [None])  # no reset in this process
    timing.flush_l2("cuda")
    assert events == ["sync"] and not buf.any()
    events.clear()
    buf.fill_(1)
    timing.flush_l2("cuda", synchronize=False)
    assert events == [] and not buf.any()

    monkeypatch.setattr(timing, "_PERSISTING_RESET", [lambda: 0])
    events.clear()
    timing.flush_l2("cuda")
    assert events == ["sync", "reset"]
    events.clear()
    timing.flush_l2("cuda", synchronize=False)  # the reset still needs its synchronisation
    assert events == ["sync", "reset"]
    events.clear()
    timing.flush_l2("cuda", reset_persisting=False)
    assert events == ["sync"]


def test_persisting_l2_reset_is_none_without_a_driver(monkeypatch):
    import ctypes

    def no_library(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(timing, "_PERSISTING_RESET", [])
    monkeypatch.setattr(ctypes, "CDLL", no_library)
    assert timing.persisting_l2_reset() is None and timing._reset_persisting_l2() is False
    assert "persisting" not in timing.method("cuda")


def _host_then_gpu(host_ms: float, cycles: int):
    def call():
        t = time.perf_counter()
        while time.perf_counter() - t < host_ms * 1e-3:  # the host busy, as Python and launches keep it
            pass
        torch.cuda._sleep(cycles)  # the GPU busy for a known time

    return call


class _OneStream:
    """A host clock (ms) and one GPU stream, for the eager timer on the CPU: a call takes host time, then
    queues GPU time; an event records when the stream reaches it; a synchronisation waits for the stream."""

    def __init__(self, monkeypatch):
        self.host = self.gpu_free = 0.0
        self.batches: list[tuple[str, ...]] = []  # the calls between each pair of events
        stream, inside = self, []

        class Event:
            def __init__(self, enable_timing=False):
                self.at = 0.0

            def record(self):
                self.at = max(stream.host, stream.gpu_free)
                if inside:
                    stream.batches.append(tuple(inside[1:]))
                    inside.clear()
                else:
                    inside.append("start")

            def elapsed_time(self, end):
                return end.at - self.at

        self._inside = inside
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: self._wait())
        monkeypatch.setattr(timing.time, "perf_counter", lambda: self.host * 1e-3)

    def _wait(self):
        self.host = max(self.host, self.gpu_free)

    def call(self, name: str, host_ms: float, gpu_ms: float):
        def fn():
            self.host += host_ms
            self.gpu_free = max(self.gpu_free, self.host) + gpu_ms
            if self._inside:
                self._inside.append(name)

        return fn


def test_an_eager_batch_does_not_depend_on_the_call_listed_before_it(monkeypatch):
    # the previous call's warm-up still queued on the GPU must not count in this call's estimate: a 0.1 ms
    # host-bound call listed after a 2 ms GPU-bound one would get a batch of one, and the untimed first
    # call meant for GPU-bound calls
    config = timing.TimingConfig(flush_l2=False)
    sizes = {}
    for order in (("gpu", "host"), ("host", "gpu")):
        stream = _OneStream(monkeypatch)
        calls = {"gpu": stream.call("gpu", 0.02, 2.0), "host": stream.call("host", 0.1, 0.05)}
        timing.time_cuda_eager_interleaved({n: calls[n] for n in order}, "cuda", config)
        sizes[order] = {b.count("host") for b in stream.batches if "host" in b}
    assert sizes[("gpu", "host")] == sizes[("host", "gpu")] and min(sizes[("gpu", "host")]) > 1, sizes


@pytest.mark.gpu
def test_eager_time_overlaps_host_and_gpu_as_a_loop_does():
    per_mcycle = timing.time_cuda(lambda: torch.cuda._sleep(1_000_000), "cuda", timing.QUICK).p50
    cycles = int(2.0 / per_mcycle * 1e6)  # about 2 ms of GPU time
    # GPU-bound: 0.5 ms of host time a call hides behind the previous call's 2 ms of GPU time
    gpu_bound = _host_then_gpu(0.5, cycles)
    gpu = timing.time_cuda(gpu_bound, "cuda", timing.QUICK).p50
    eager = timing.time_cuda_eager(gpu_bound, "cuda", timing.QUICK).p50
    assert 1.5 < gpu < 3.0
    assert eager < gpu + 0.2, f"eager {eager:.2f} ms: the host's 0.5 ms added to the GPU's {gpu:.2f}"
    # host-bound: 3 ms of host time a call shows whole (no untimed call hides a part of it)
    eager_host = timing.time_cuda_eager(_host_then_gpu(3.0, cycles), "cuda", timing.QUICK).p50
    assert eager_host > 2.95


@pytest.mark.gpu
def test_cuda_timer_is_blind_to_persisting_l2_lines():
    """A kernel that loads x with evict_last leaves lines of x in L2 that zeroing the flush buffer does
    not evict; the timer resets them to normal before each flush, so a call that reads x measures the
    same after such a load as without it (on the H200, without the reset the whole-row forward read
    part of x from L2 and ran 5-9% faster). Skipped, saying so, on a GPU where the stale lines do not
    move the call even without the reset: there the test could not tell the timers apart. On the H200
    that happens when other processes share the GPU (every GPU test under pytest -n 8); run alone it
    passes."""
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("evict_last (persisting) L2 lines need compute capability 8+")
    from _l2_lines import stale_line_ratios  # tests/: needs Triton

    assert timing.persisting_l2_reset() is not None, "the driver's cuCtxResetPersistingL2Cache did not load"
    old_timer = dataclasses.replace(timing.QUICK, reset_persisting_l2=False, sync_each_repeat=False)
    without = stale_line_ratios(old_timer)
    if sorted(without)[len(without) // 2] > 0.97:
        pytest.skip(
            "stale persisting lines do not move the call here even unreset (other processes using the GPU at "
            "the same time, as under pytest -n, hide them: run this test alone, `pytest -m gpu "
            f"tests/test_harness.py`): {without}"
        )
    ratios = stale_line_ratios(timing.QUICK)
    assert sorted(ratios)[len(ratios) // 2] > 0.97, (ratios, without)
    assert "persisting lines reset" in timing.method("cuda")


# ----------------------------------------------------------------------------------------------------
# the runner
# ----------------------------------------------------------------------------------------------------


def test_cpu_tables_hold_only_what_was_timed_and_say_so():
    rows = [row(impl="torch", gbps=10.0, ms_p50=1.0),
            row(impl="fused", peer=False, status="not timed", note="runs only under the Triton interpreter"),
            row(impl="liger", status="skip", note="runs on cuda only")]  # fmt: skip
    md = report.render(schema.rows_frame(rows))
    table = md.split("### layer_norm · cpu · float32 · fwd")[1].split("\n\n")[1]
    assert table.splitlines()[0].split("|")[1:-1] == [" shape ", " torch "], table
    assert "checked, not timed" in md and "| fused | cpu | not timed |" in md
    gpu = schema.rows_frame([row(device="cuda", impl="torch", gbps=10.0), row(device="cuda", impl="fused",
                                                                             peer=False, status="skip")])
    assert "| fused |" in report.render(gpu).split("### layer_norm · cuda")[1].split("\n\n")[1]
