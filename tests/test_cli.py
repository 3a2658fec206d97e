"""The ``crossfuse`` command: its subcommands and exit codes (in-process through ``main``, plus one fresh
process for the entry point and the interpreter switch)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import pytest
import torch
from crossfuse import cli, registry
from crossfuse.harness import schema


@contextlib.contextmanager
def registered(impl):
    registry.register(impl)
    try:
        yield impl
    finally:
        registry._REGISTRY.pop(impl.key, None)


def _bad_layer_norm(x, weight, bias, eps):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps) * 1.01  # 1% off


def _interrupt(**_):
    raise KeyboardInterrupt


def _transposed_layer_norm(x, weight, bias, eps):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps).transpose(-1, -2)


def _transposed_vjp(inputs, dy):  # an output of the wrong shape, and no gradients
    return _transposed_layer_norm(**inputs), {}


def test_info(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"torch     {torch.__version__}" in out and "interpreter: TRITON_INTERPRET=" in out
    assert "julia:" in out and "registry:" in out


def test_usage_errors_exit_2(capsys):
    assert cli.main([]) == 2
    assert cli.main(["bench", "no_such_suite", "--device", "cpu"]) == 2
    assert (
        "unknown suite 'no_such_suite'; known suites: layer_norm, attention, layer_norm_grid, "
        "attention_grid, attention_fp32, memory"
        in capsys.readouterr().err
    )
    assert cli.main(["bench", "layer_norm", "--device", "tpu"]) == 2
    assert "unknown device 'tpu'" in capsys.readouterr().err
    assert cli.main(["check", "--op", "no_such_op"]) == 2
    assert "unknown op 'no_such_op'" in capsys.readouterr().err
    assert cli.main(["bench", "layer_norm", "--device", "cpu", "--dtype", "int3"]) == 2
    assert cli.main(["report", "/nonexistent/results.csv"]) == 2
    assert "no result CSV" in capsys.readouterr().err
    assert cli.main(["profile", "attention", "--device", "cpu", "--shape", "2x3"]) == 2
    assert cli.main(["profile", "softmax"]) == 2  # argparse: invalid choice
    for seed in ("99999999999999999999", "-1", "1.5"):  # torch.Generator takes 0 to 2^63 - 1
        assert cli.main(["check", "--op", "layer_norm", "--seed", seed]) == 2
        assert "argument --seed" in capsys.readouterr().err


def test_cuda_without_a_gpu_is_a_usage_error(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert cli.main(["bench", "layer_norm", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_bench_quick_writes_csv_and_markdown_then_report(tmp_path, capsys):
    out = tmp_path / "res"
    args = ["bench", "layer_norm", "--quick", "--device", "cpu", "--op", "layer_norm", "--dtype", "float32",
            "--impl", "python/torch", "--impl", "liger", "--out", str(out)]  # fmt: skip
    threads = torch.get_num_threads()
    assert cli.main(args) == 0
    assert torch.get_num_threads() == threads  # --threads 1 (the default) held only while timing
    stdout = capsys.readouterr().out
    assert "### layer_norm · cpu · float32 · fwd — GB/s (eager median)" in stdout and "| 64x256 |" in stdout
    df = schema.read_csv(out / "results.csv")
    ln = df[df["op"] == "layer_norm"]
    assert set(ln["impl"]) == {"torch", "liger"} and len(ln) == 2 * 2 * 3  # impls x shapes x modes
    assert (ln[ln["impl"] == "torch"]["status"] == "ok").all()
    assert (ln[ln["impl"] == "liger"]["note"] == "runs on cuda only").all()
    assert (df["op"] == "copy").sum() == 1
    assert df["device_name"].str.endswith("(1 threads)").all()  # the rows say how they were timed
    assert (out / "layer_norm-quick-cpu.md").is_file()
    assert cli.main(["report", str(out / "results.csv"), "--no-plots"]) == 0
    assert "copy ceiling" in (out / "report.md").read_text()


def test_a_second_run_of_a_suite_into_one_csv_needs_append_or_replace(tmp_path, capsys, monkeypatch):
    # two runs' rows of one suite in one CSV would be mixed by the report: refused unless asked for
    out = tmp_path / "res"
    args = ["bench", "layer_norm", "--quick", "--device", "cpu", "--op", "layer_norm", "--dtype", "float32",
            "--impl", "python/torch", "--out", str(out)]  # fmt: skip
    assert cli.main(args) == 0
    first = schema.read_csv(out / "results.csv")
    capsys.readouterr()
    assert cli.main(args) == 2
    assert "already holds 7 rows of suite 'layer_norm'" in capsys.readouterr().err
    assert schema.read_csv(out / "results.csv").equals(first)  # untouched
    assert cli.main([*args, "--append"]) == 0
    both = schema.read_csv(out / "results.csv")
    assert len(both) == 2 * len(first)
    assert cli.main(["report", str(out / "results.csv"), "--no-plots"]) == 0
    assert "12 rows repeat a measurement" in (out / "report.md").read_text()  # 2 runs x 2 shapes x 3 modes
    assert cli.main([*args, "--replace"]) == 0
    kept = [p for p in out.iterdir() if p.name.startswith("results.") and p.name != "results.csv"]
    assert len(kept) == 1 and schema.read_csv(kept[0]).equals(both)
    assert len(schema.read_csv(out / "results.csv")) == len(first)
    # within the same second (the stamp held fixed): kept under another name, the earlier kept file intact
    monkeypatch.setattr(cli.time, "strftime", lambda fmt: kept[0].name.removeprefix("results.")[:-4])
    assert cli.main([*args, "--replace"]) == 0
    kept = [p for p in out.iterdir() if p.name.startswith("results.") and p.name != "results.csv"]
    assert len(kept) == 2 and any(schema.read_csv(k).equals(both) for k in kept)
    assert cli.main([*args, "--append", "--replace"]) == 2


def test_replace_keeps_the_reports_of_the_csv_it_keeps_and_append_reports_the_whole_file(tmp_path, capsys):
    out = tmp_path / "res"
    args = ["bench", "layer_norm", "--quick", "--device", "cpu", "--op", "layer_norm", "--dtype", "float32",
            "--impl", "python/torch", "--out", str(out)]  # fmt: skip
    assert cli.main(args) == 0
    csv_path = out / "results.csv"
    # an earlier run cut short: its rows, then its marker; appended to, the file is no partial run
    with schema.CsvWriter(csv_path) as w:
        w.write(schema.stopped_row("layer_norm", "cpu", "interrupted (Ctrl-C) after 7 of 7 rows"))
    assert cli.main([*args, "--append"]) == 0
    run_md = (out / "layer_norm-quick-cpu.md").read_text()
    assert "**Partial run**" not in run_md and "**An earlier run was cut short**, then appended to" in run_md
    assert f"{len(schema.read_csv(csv_path)) - 1} rows from `{csv_path}`" in run_md  # the whole file
    assert cli.main(["report", str(csv_path)]) == 0
    report_md = (out / "report.md").read_text()
    plots = sorted(p.name for p in out.glob("*.png"))
    assert "**Partial run**" not in report_md and plots and all(f"]({p})" in report_md for p in plots)
    capsys.readouterr()
    assert cli.main([*args, "--replace"]) == 0
    (kept_csv,) = [p for p in out.glob("results.*.csv")]
    stamp = kept_csv.name.removeprefix("results.").removesuffix(".csv")
    assert (out / f"layer_norm-quick-cpu.{stamp}.md").read_text() == run_md
    kept_report = (out / f"report.{stamp}.md").read_text()
    assert kept_report.splitlines()[0] == cli.report_mark(kept_csv)  # it names the CSV it describes now
    kept_plots = [p.replace(".png", f".{stamp}.png") for p in plots]  # its pictures kept with it
    assert all((out / p).is_file() and f"]({p})" in kept_report for p in kept_plots)
    assert kept_report.splitlines()[1:] == report_md.replace(".png)", f".{stamp}.png)").splitlines()[1:]
    assert not (out / "report.md").exists() and not list(out.glob("*[a-z].png"))
    assert cli.main(["report", str(csv_path)]) == 0  # the new run's report: nothing of the old in its way


def test_report_says_nothing_to_report_and_keeps_plots_it_did_not_write(tmp_path, capsys):
    only_marker = tmp_path / "m" / "results.csv"
    only_marker.parent.mkdir()
    with schema.CsvWriter(only_marker) as w:
        w.write(schema.stopped_row("layer_norm", "cpu", "interrupted (Ctrl-C) after 0 of 7 rows"))
    assert cli.main(["report", str(only_marker)]) == cli.NOTHING_DONE
    assert "only the marker of a run stopped before its first row" in capsys.readouterr().err
    out = tmp_path / "res"
    assert cli.main(["bench", "layer_norm", "--quick", "--device", "cpu", "--op", "layer_norm", "--dtype",
                     "float32", "--impl", "python/torch", "--out", str(out)]) == 0  # fmt: skip
    mine = out / "memory.png"
    mine.write_bytes(b"the user's own picture")
    assert cli.main(["report", str(out / "results.csv")]) == 2
    assert f"{mine} exist and no report of `crossfuse report` stands beside them" in capsys.readouterr().err
    assert mine.read_bytes() == b"the user's own picture" and not (out / "report.md").exists()
    assert cli.main(["report", str(out / "results.csv"), "--no-plots"]) == 0  # no plot written: no clash
    assert cli.main(["report", str(out / "results.csv")]) == 0  # beside its own report: its own to rewrite


def test_bench_filters_budget_and_paths_that_cannot_work_exit_2(tmp_path, capsys):
    base = ["bench", "layer_norm", "--quick", "--device", "cpu"]
    assert cli.main([*base, "--op", "relu_attention", "--out", str(tmp_path / "a")]) == 2
    assert "no point of suite 'layer_norm' matches the filters" in capsys.readouterr().err
    assert cli.main([*base, "--impl", "no_such_impl", "--out", str(tmp_path / "b")]) == 2
    for budget in ("-5", "0"):
        assert cli.main([*base, "--budget-s", budget, "--out", str(tmp_path / "c")]) == 2
        assert "--budget-s must be" in capsys.readouterr().err
    assert cli.main([*base, "--rounds", "0", "--out", str(tmp_path / "c")]) == 2
    assert "--rounds must be >= 1, got 0" in capsys.readouterr().err
    assert not any((tmp_path / d).exists() for d in "abc")  # nothing written
    a_file = tmp_path / "afile"
    a_file.write_text("not a folder")
    assert cli.main([*base, "--op", "layer_norm", "--impl", "python/torch", "--out", str(a_file)]) == 2
    assert f"error: --out must be a folder, and {a_file} is a file" in capsys.readouterr().err
    under = a_file / "sub"
    assert cli.main([*base, "--op", "layer_norm", "--impl", "python/torch", "--out", str(under)]) == 2
    said = capsys.readouterr().err
    assert f"error: --out must be a folder, and {under} is under {a_file}, which is a file" in said
    assert cli.main(["profile", "attention", "--device", "cpu", "--out", str(a_file)]) == 2
    assert "--out must be a folder" in capsys.readouterr().err
    assert cli.main([*base, "--threads", "-1", "--out", str(tmp_path / "d")]) == 2
    assert "--threads must be >= 0" in capsys.readouterr().err
    not_py = tmp_path / "suites.txt"
    not_py.write_text("SUITES = {}\n")
    assert cli.main([*base, "--suites", str(not_py)]) == 2
    assert "not a Python file" in capsys.readouterr().err
    suites = tmp_path / "broken_suites.py"
    suites.write_text("SUITES = {\n")
    assert cli.main([*base, "--suites", str(suites)]) == 2
    assert "not valid Python" in capsys.readouterr().err
    suites.write_text("SUITES = {undefined_name: 1}\n")
    assert cli.main([*base, "--suites", str(suites)]) == 2
    assert "running it raised NameError" in capsys.readouterr().err
    assert cli.main(["profile", "attention", "--device", "cpu", "--dtype", "bf16,fp32"]) == 2
    assert "one dtype" in capsys.readouterr().err


def test_report_rewrites_its_own_file_but_not_another(tmp_path, capsys):
    out = tmp_path / "res"
    args = ["bench", "layer_norm", "--quick", "--device", "cpu", "--op", "layer_norm", "--dtype", "float32",
            "--impl", "python/torch", "--out", str(out)]  # fmt: skip
    assert cli.main(args) == 0
    csv = str(out / "results.csv")
    assert cli.main(["report", csv, "--no-plots"]) == 0
    assert cli.main(["report", csv, "--no-plots"]) == 0  # its own report.md: rewritten
    assert cli.main(["report", csv, "--no-plots", "--out", csv]) == 2
    assert "--out must be a folder" in capsys.readouterr().err
    (out / "report.md").write_text("## crossfuse GPU session\n\n(a profile section)\n")
    capsys.readouterr()
    assert cli.main(["report", csv, "--no-plots"]) == 2
    assert "--force" in capsys.readouterr().err
    assert "(a profile section)" in (out / "report.md").read_text()
    assert cli.main(["report", csv, "--no-plots", "--force"]) == 0
    assert "(a profile section)" not in (out / "report.md").read_text()


def test_bench_interrupted_keeps_rows_and_exits_130(tmp_path):
    out = tmp_path / "res"
    fake = registry.Implementation("layer_norm", "test_interrupt", "python", _interrupt)
    args = ["bench", "layer_norm", "--quick", "--device", "cpu", "--op", "layer_norm", "--dtype", "float32",
            "--impl", "python/torch", "--impl", "test_interrupt", "--out", str(out)]  # fmt: skip
    with registered(fake):
        assert cli.main(args) == 130
    df = schema.read_csv(out / "results.csv")
    # the copy ceiling, then the marker of a partial run (the point's implementations are timed together:
    # the interrupt came before any of them was timed)
    assert list(df["impl"]) == ["torch_copy", "crossfuse bench"]
    assert df["status"].iloc[-1] == "stopped" and "interrupted" in df["note"].iloc[-1]


def test_check_passes_and_fails_with_exit_codes(capsys):
    args = ["check", "--device", "cpu", "--op", "normalise", "--impl", "python/torch,python/normal_new",
            "--dtype", "float32,bfloat16"]  # fmt: skip
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "| normalise | normal_new | python | cpu | bfloat16 | pass |" in out and "0 fail, 0 error" in out
    bad = registry.Implementation("layer_norm", "test_off_by_1pct", "python", _bad_layer_norm)
    with registered(bad):
        assert cli.main(["check", "--device", "cpu", "--impl", "test_off_by_1pct", "--dtype", "float32"]) == 1
    out = capsys.readouterr().out
    assert "| layer_norm | test_off_by_1pct | python | cpu | float32 | fail |" in out and "seed=" in out


def test_check_reports_an_output_of_the_wrong_shape_as_an_error(capsys):
    # an implementation's wrong output shape (a layout bug) is its error row; the other rows still come
    bad = registry.Implementation("layer_norm", "test_transposed", "python", _transposed_layer_norm,
                                  vjp=_transposed_vjp)  # fmt: skip
    args = ["check", "--device", "cpu", "--op", "layer_norm", "--impl", "test_transposed,python/torch",
            "--dtype", "float32"]  # fmt: skip
    with registered(bad):
        assert cli.main(args) == 1
    out = capsys.readouterr().out
    assert "| layer_norm | test_transposed | python | cpu | float32 | error |" in out
    assert "shape mismatch" in out
    assert "| layer_norm | torch | python | cpu | float32 | pass |" in out


def _raises(**_):
    raise RuntimeError("deliberately broken")


def test_check_with_only_error_rows_exits_1_and_an_interrupt_130(capsys):
    broken = registry.Implementation("layer_norm", "test_raises", "python", _raises)
    args = ["check", "--device", "cpu", "--impl", "test_raises", "--dtype", "float32"]
    with registered(broken):
        assert cli.main(args) == 1
    assert "| layer_norm | test_raises | python | cpu | float32 | error |" in capsys.readouterr().out
    stop = registry.Implementation("layer_norm", "test_interrupt", "python", _interrupt)
    with registered(stop):
        assert cli.main(["check", "--device", "cpu", "--impl", "test_interrupt", "--dtype", "float32"]) == 130


def test_check_shows_skips_with_reasons(capsys):
    # nothing could be checked here (both skip): exit 3 with the reasons
    assert cli.main(["check", "--device", "cpu", "--impl", "liger,sdpa_softmax", "--dtype", "float32"]) == 3
    out = capsys.readouterr().out
    assert "| layer_norm | liger | python | cpu | float32 | skip |" in out and "runs on cuda only" in out
    assert "speed-only peer" in out


def test_check_julia_entries_skip_fast_without_julia(capsys):
    julia = registry.implementations(side="julia")
    if not julia:
        pytest.skip("no Julia entries registered (the crossfuse_julia plugin is not installed)")
    if all(i.unavailable_reason("cpu") is None for i in julia):
        pytest.skip("Julia is available here: its entries run instead of skipping")
    t0 = time.monotonic()
    assert cli.main(["check", "--side", "julia", "--device", "cpu"]) == 3  # nothing checked
    assert time.monotonic() - t0 < 5.0
    assert "skip" in capsys.readouterr().out


def test_profile_attention_on_the_cpu(tmp_path, capsys):
    args = ["profile", "attention", "--device", "cpu", "--shape", "1x2x32x16", "--out", str(tmp_path)]
    assert cli.main(args) == 0
    assert "softmax_naive" in capsys.readouterr().out
    assert {p.name for p in tmp_path.iterdir()} == {
        "profile.md",
        "profile_trace.json",
        "profile_timeline.png",
    }


def test_fresh_process_entry_point_sets_the_interpreter_before_triton():
    code = (
        "import os, sys; import crossfuse.cli; "
        "print(os.environ.get('TRITON_INTERPRET'), 'triton' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    interp, imported = res.stdout.split()
    assert imported == "False"
    assert interp == ("None" if torch.cuda.is_available() else "1")
    res = subprocess.run([sys.executable, "-m", "crossfuse.cli", "--help"], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert res.returncode == 0 and "check" in res.stdout and "profile" in res.stdout


def _off_on_long_rows(x, weight, bias, eps):
    # right on the first check case (3 rows), 1% off on the second (64 rows)
    y = torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    return y * 1.01 if x.shape[0] == 64 else y


def _off_on_short_rows(x, weight, bias, eps):
    y = torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    return y * 1.01 if x.shape[0] == 3 else y


@pytest.mark.parametrize("fn", [_off_on_long_rows, _off_on_short_rows], ids=["second case", "first case"])
def test_check_fails_whichever_case_fails(fn, capsys):
    bad = registry.Implementation("layer_norm", "test_one_case_off", "python", fn)
    with registered(bad):
        args = ["check", "--device", "cpu", "--impl", "test_one_case_off", "--dtype", "float32"]
        assert cli.main([*args, "--seed", "7"]) == 1
    out = capsys.readouterr().out
    assert "| test_one_case_off | python | cpu | float32 | fail |" in out and "seed=7" in out


def test_skips_with_different_reasons_keep_each_reason(capsys):
    only32 = registry.Implementation("layer_norm", "test_f32_only", "python", _bad_layer_norm,
                                     devices=("cpu",), dtypes=(torch.float32,))  # fmt: skip
    args = ["check", "--device", "cpu", "--impl", "test_f32_only", "--dtype", "float16,bfloat16"]
    with registered(only32):
        assert cli.main(args) == 3  # nothing checked
    out = capsys.readouterr().out
    # both dtypes skipped for one reason each: "no float16 support", "no bfloat16 support", two rows
    assert "no float16 support" in out and "no bfloat16 support" in out


def test_a_spent_budget_leaves_skip_rows_that_say_so(tmp_path, capsys):
    out = tmp_path / "res"
    args = ["bench", "layer_norm", "--quick", "--device", "cpu", "--op", "layer_norm", "--dtype", "float32",
            "--impl", "python/torch", "--budget-s", "1e-9", "--out", str(out)]  # fmt: skip
    assert cli.main(args) == 3  # nothing measured
    df = schema.read_csv(out / "results.csv")
    assert df["status"].iloc[-1] == "stopped" and "time budget was spent: 6 rows" in df["note"].iloc[-1]
    ln = df[df["op"] == "layer_norm"]
    assert len(ln) and (ln["status"] == "skip").all() and ln["note"].str.contains("time budget").all()
