"""The harness's three clocks: eager (a row's ``ms_p*``, the default), GPU-only (``gpu_ms_p50``) and host
time per call (``host_us``): how they reach rows, CSVs (an earlier schema's too) and reports."""

from __future__ import annotations

import csv
import time

import pytest
import torch
from crossfuse.harness import report, runner, schema, suite, timing


def row(**kw) -> schema.Row:
    base = dict(op="layer_norm", impl="torch", side="python", peer=True, device="cpu", device_name="cpu",
                dtype="float32", shape="4096x1024", causal=False, mode="fwd")  # fmt: skip
    return schema.Row(**{**base, **kw})


def tiny_suite() -> suite.Suite:
    group = {"ops": ["layer_norm"], "shapes": [(8, 32)], "quick_shapes": [(8, 32)], "dtypes": ["float32"],
             "modes": ["fwd"]}  # fmt: skip
    return suite.parse_suite("t", {"groups": [group]})


def test_cpu_timer_gives_host_time_as_the_mean_of_back_to_back_calls():
    t = timing.measure(lambda: time.sleep(0.002), "cpu", timing.QUICK)
    assert t.gpu_p50 is None  # no GPU-only time on the CPU
    assert 1500 <= t.host_us <= 50_000 and 1.5 <= t.p50 <= 50.0  # µs and ms


def test_host_time_excludes_the_first_call_and_counts_every_other():
    calls = []

    def fn():
        calls.append(None)
        if len(calls) == 1:
            time.sleep(0.2)  # the first call (compilation) is not host time

    config = timing.TimingConfig(host_calls=10)
    assert timing.host_time_us(fn, "cpu", config) < 50_000 and len(calls) == 11


def test_runner_rows_carry_the_three_clocks_on_the_cpu():
    (r,) = runner.Runner("cpu", quick=True).run(tiny_suite(), impls=["python/torch"])
    assert r.status == "ok" and r.ms_p50 > 0 and r.host_us > 0 and r.gpu_ms_p50 is None
    assert "schema=2" in r.versions


def test_a_csv_of_the_earlier_schema_still_reads(tmp_path):
    path = tmp_path / "v1.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=schema.COLUMNS_V1)
        w.writeheader()
        w.writerow({k: v for k, v in row(ms_p50=1.5, status="ok").to_csv().items() if k in schema.COLUMNS_V1})
    df = schema.read_csv(path)
    assert list(df.columns) == list(schema.COLUMNS) and df.loc[0, "ms_p50"] == 1.5
    assert df[["gpu_ms_p50", "host_us"]].isna().all().all()
    with pytest.raises(ValueError, match="different header"):  # no appending rows of another schema
        schema.CsvWriter(path)


def test_report_leads_with_eager_time_and_names_each_clock():
    rows = [row(impl="fused", peer=False, status="ok", ms_p50=0.2, gpu_ms_p50=0.005, host_us=160.0),
            row(impl="torch", status="ok", ms_p50=0.016, gpu_ms_p50=0.012, host_us=14.0)]  # fmt: skip
    rows[0].gbps, rows[1].gbps = 80.0, 1000.0
    md = report.render(rows)
    assert "— GB/s (eager median)" in md and "### time per call" in md and "eager:" in md
    assert md.index("GB/s (eager median)") < md.index("### time per call")
    fused, torch_ = "0.2 ms · GPU 0.005 ms · host 160 µs", "0.016 ms · GPU 0.012 ms · host 14.0 µs"
    assert f"| 4096x1024 | {fused} | {torch_} |" in md
    # a CPU row: no GPU-only time, said with a dash, not a zero
    cpu = report.times_section(schema.rows_frame([row(status="ok", ms_p50=1.0, host_us=1000.0)]))
    assert "| 1 ms · GPU – · host 1000 µs |" in cpu


@pytest.mark.gpu
def test_eager_time_includes_host_time_that_the_gpu_only_time_hides():
    x = torch.zeros(1024, device="cuda")

    def call():  # 1 ms of host work before a tiny kernel: what a slow host path looks like
        t = time.perf_counter()
        while time.perf_counter() - t < 1e-3:
            pass
        x.add_(1)

    t = timing.measure(call, "cuda", timing.QUICK)
    assert t.p50 >= 0.9 and t.host_us >= 900  # eager and host see the millisecond
    assert t.gpu_p50 < 0.2  # the GPU-only clock sees the kernel
    assert "eager" in timing.method("cuda")
