"""Exit codes that tell the truth: every ``crossfuse`` command asked to check, measure, report or profile
something that it could do none of exits non-zero with the reason; a run cut short keeps its rows and
says so (``--version`` too)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import re
import subprocess
import sys
import time

import pytest
import torch
from crossfuse import __version__, cli, registry
from crossfuse.harness import profile, schema


@contextlib.contextmanager
def registered(*impls):
    for impl in impls:
        registry.register(impl)
    try:
        yield
    finally:
        for impl in impls:
            registry._REGISTRY.pop(impl.key, None)


def _raises(*_, **__):
    raise RuntimeError("deliberately broken")


def _out_of_memory(**_):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (a stand-in)")


def _slow_layer_norm(x, weight, bias, eps):
    time.sleep(0.5)
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def _unavailable_raises_at_the_second_point():
    asked = []

    def probe(device):
        asked.append(device)
        if len(asked) > 1:  # once per point: the first point's rows are measured
            raise RuntimeError("the availability probe crashed")

    return probe


BENCH = ["bench", "layer_norm", "--quick", "--device", "cpu", "--op", "layer_norm", "--dtype", "float32"]


def test_help_lists_every_command_tested_here(capsys):
    assert cli.main(["--help"]) == 0
    listed = re.search(r"\{([a-z,]+)\}", capsys.readouterr().out).group(1).split(",")
    # each command has a test of its exit codes in this file
    assert set(listed) == {"check", "bench", "report", "profile", "info"}


def test_version_from_the_distribution_or_the_package(capsys, monkeypatch):
    assert cli.main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    assert re.fullmatch(r"crossfuse \d+\.\d+\.\d+\S*", out), out
    try:
        assert out == f"crossfuse {importlib.metadata.version('crossfuse')}"
    except importlib.metadata.PackageNotFoundError:
        assert out == f"crossfuse {__version__}"

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert cli.crossfuse_version() == __version__


def test_version_in_a_fresh_process():
    res = subprocess.run([sys.executable, "-m", "crossfuse.cli", "--version"], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("crossfuse ")


def test_info_exits_0(capsys):
    assert cli.main(["info"]) == 0
    assert capsys.readouterr().out.startswith("crossfuse ")


# ------------------------------------------------------------------------------------------------ check


def test_check_with_every_entry_skipped_exits_3(capsys):
    assert cli.main(["check", "--device", "cpu", "--impl", "liger", "--dtype", "float32"]) == cli.NOTHING_DONE
    captured = capsys.readouterr()
    assert "nothing was checked" in captured.err
    assert "runs on cuda only" in captured.out  # the reason, in the table


def test_check_with_every_entry_excluded_exits_3(capsys):
    args = ["check", "--device", "cpu", "--impl", "python/torch", "--op", "layer_norm", "--dtype", "float32",
            "--skip", "torch"]  # fmt: skip
    assert cli.main(args) == cli.NOTHING_DONE
    assert "excluded by --skip" in capsys.readouterr().out


def test_check_errors_exit_1_and_a_pass_beside_skips_exits_0(capsys):
    broken = registry.Implementation("layer_norm", "test_exit_raises", "python", _raises)
    with registered(broken):
        assert cli.main(["check", "--device", "cpu", "--impl", "test_exit_raises", "--dtype", "float32"]) == 1
    capsys.readouterr()
    args = [
        "check",
        "--device",
        "cpu",
        "--op",
        "layer_norm",
        "--impl",
        "python/torch,liger",
        "--dtype",
        "float32",
    ]
    assert cli.main(args) == 0  # one pass: something was checked


# ------------------------------------------------------------------------------------------------ bench


def test_bench_with_every_row_skipped_for_the_budget_exits_3(tmp_path, capsys):
    out = tmp_path / "res"
    assert cli.main([*BENCH, "--impl", "python/torch", "--budget-s", "1e-9", "--out", str(out)]) == 3
    assert "nothing was measured" in capsys.readouterr().err
    df = schema.read_csv(out / "results.csv")
    assert df["status"].iloc[-1] == "stopped"
    assert "**Partial run**" in (out / "layer_norm-quick-cpu.md").read_text()


def test_bench_with_every_row_raising_exits_3(tmp_path, capsys):
    out = tmp_path / "res"
    broken = registry.Implementation("layer_norm", "test_exit_raises", "python", _raises)
    with registered(broken):
        assert cli.main([*BENCH, "--impl", "test_exit_raises", "--out", str(out)]) == 3
    df = schema.read_csv(out / "results.csv")
    ln = df[df["op"] == "layer_norm"]
    assert len(ln) == 6 and (ln["status"] == "error").all()
    assert "6 rows raised" in df["note"].iloc[-1] and "deliberately broken" in df["note"].iloc[-1]


def test_bench_keeps_other_rows_when_one_implementation_runs_out_of_memory(tmp_path, capsys):
    out = tmp_path / "res"
    oom = registry.Implementation("layer_norm", "test_exit_oom", "python", _out_of_memory)
    with registered(oom):
        assert cli.main([*BENCH, "--impl", "python/torch,test_exit_oom", "--out", str(out)]) == 0
    df = schema.read_csv(out / "results.csv")
    assert ((df["impl"] == "torch") & (df["status"] == "ok")).sum() == 6
    assert ((df["impl"] == "test_exit_oom") & (df["status"] == "error")).sum() == 6
    marker = df.iloc[-1]
    assert marker["status"] == "stopped" and "OutOfMemoryError" in marker["note"]
    md = (out / "layer_norm-quick-cpu.md").read_text()
    assert "**Partial run**: suite layer_norm: 6 rows raised" in md
    assert "partial run: 6 rows raised" in capsys.readouterr().err


def test_bench_cut_short_by_its_budget_keeps_what_it_measured(tmp_path, capsys):
    # a suite without a copy row: torch's first point is measured at once, the slow entry spends the budget
    suites = tmp_path / "suites.py"
    suites.write_text(
        'SUITES = {"tiny": {"description": "tiny", "groups": [{"ops": ["layer_norm"], '
        '"shapes": [(8, 32), (8, 64), (8, 128)], "dtypes": ["float32"], "modes": ["fwd"]}]}}\n'
    )
    out = tmp_path / "res"
    slow = registry.Implementation("layer_norm", "test_exit_slow", "python", _slow_layer_norm)
    args = ["bench", "tiny", "--suites", str(suites), "--quick", "--device", "cpu", "--impl",
            "python/torch,test_exit_slow", "--budget-s", "1.5", "--out", str(out)]  # fmt: skip
    with registered(slow):
        assert cli.main(args) == 0
    df = schema.read_csv(out / "results.csv")
    assert ((df["impl"] == "torch") & (df["status"] == "ok")).any()
    budget = df["note"] == schema.BUDGET_SPENT
    assert budget.any()
    assert df["status"].iloc[-1] == "stopped"
    assert f"the time budget was spent: {int(budget.sum())} rows not measured" in df["note"].iloc[-1]


def test_bench_crash_outside_a_measurement_keeps_the_rows_and_marks_them(tmp_path, capsys):
    out = tmp_path / "res"
    crashing = registry.Implementation("layer_norm", "test_exit_crash", "python", _raises,
                                       check_available=_unavailable_raises_at_the_second_point())  # fmt: skip
    with registered(crashing), pytest.raises(RuntimeError, match="availability probe crashed"):
        cli.main([*BENCH, "--impl", "python/torch,test_exit_crash", "--out", str(out)])
    df = schema.read_csv(out / "results.csv")
    assert ((df["impl"] == "torch") & (df["status"] == "ok")).sum() >= 3  # the first point's rows
    assert df["status"].iloc[-1] == "stopped" and "crashed after" in df["note"].iloc[-1]
    assert "**Partial run**" in (out / "layer_norm-quick-cpu.md").read_text()
    assert "marked partial" in capsys.readouterr().err


def test_bench_memory_quick_on_the_cpu_is_fast(tmp_path, capsys):
    t0 = time.monotonic()
    assert cli.main(["bench", "memory", "--device", "cpu", "--quick", "--out", str(tmp_path)]) == 0
    took = time.monotonic() - t0
    df = schema.read_csv(tmp_path / "results.csv")
    fused = df[df["impl"] == "fused"]
    assert (
        len(fused) and (fused["status"] == "skip").all() and fused["note"].str.contains("interpreter").all()
    )
    assert ((df["status"] == "ok") & df["alloc_bytes"].notna()).sum() >= 12  # torch's and the seed's variants
    assert took < 60, f"bench memory --quick took {took:.0f} s on the CPU"  # ~5 s on an idle 2-core machine


# ----------------------------------------------------------------------------------------------- report


def test_report_of_a_header_only_csv_exits_3(tmp_path, capsys):
    path = tmp_path / "results.csv"
    schema.CsvWriter(path).close()
    assert cli.main(["report", str(path), "--no-plots"]) == cli.NOTHING_DONE
    assert "nothing to report" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- profile


def test_profile_with_nothing_profiled_exits_3(tmp_path, capsys, monkeypatch):
    def broken_subjects(device, dtype=None):
        return [profile.Subject("broken", "raises", _raises), profile.Subject("absent", "", None, "not here")]

    monkeypatch.setattr(profile, "subjects", broken_subjects)
    args = ["profile", "attention", "--device", "cpu", "--shape", "1x1x16x16", "--out", str(tmp_path)]
    assert cli.main(args) == cli.NOTHING_DONE
    captured = capsys.readouterr()
    assert "no implementation was profiled" in captured.err
    assert "failed: RuntimeError: deliberately broken" in captured.out and "not here" in captured.out
