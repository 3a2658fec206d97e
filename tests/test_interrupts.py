"""Ctrl-C in the middle of a real run: SIGINT sent to a ``crossfuse`` process once its first rows are out.
``bench`` keeps every row measured so far on disk, marks the CSV and its report partial and exits 130;
``check`` prints the rows checked so far and exits 130. SIGTERM keeps what Ctrl-C keeps, exit 143."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from crossfuse.harness import schema

# a suite of many tiny points: it runs for a while on any CPU, and its first rows come within a second
SUITES = textwrap.dedent(
    """
    SUITES = {
        "many": {
            "description": "many tiny layer norms",
            "groups": [{"ops": ["layer_norm"], "shapes": [(8, 32 + 8 * i) for i in range(200)],
                        "dtypes": ["float32"], "modes": ["fwd", "bwd", "fwd+bwd"]}],
        },
    }
    """
)

# `crossfuse check` over an entry that takes a while per case (registered in the child, then the CLI)
SLOW_CHECK = textwrap.dedent(
    """
    import sys, time
    import torch
    from crossfuse import cli, registry

    def slow(x, weight, bias, eps):
        time.sleep(0.4)
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)

    registry.register(registry.Implementation("layer_norm", "slow", "python", slow))
    sys.exit(cli.main(sys.argv[1:]))
    """
)


def _default_sigint() -> None:
    """In the child: SIGINT's default disposition, whatever the test runner's worker set (an ignored
    SIGINT is inherited, and Python installs its KeyboardInterrupt handler only over the default)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(argv: list[str], stdout, stderr) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *argv], stdout=stdout, stderr=stderr, preexec_fn=_default_sigint,
                            env=os.environ.copy())  # fmt: skip


def _wait_for(predicate, proc: subprocess.Popen, what: str, timeout: float = 180.0) -> None:
    t0 = time.monotonic()
    while not predicate():
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() - t0 < timeout, f"no {what} within {timeout} s"
        time.sleep(0.05)


def _data_lines(path) -> int:
    """Whole rows on disk (lines after the header): a row is flushed with its line break."""
    try:
        return max(0, path.read_bytes().count(b"\n") - 1)
    except FileNotFoundError:
        return 0


@pytest.mark.parametrize(
    "sig, code, said",
    [(signal.SIGINT, 130, "interrupted (Ctrl-C)"), (signal.SIGTERM, 143, "terminated (SIGTERM)")],
    ids=["ctrl-c", "sigterm"],
)
def test_a_signal_during_bench_keeps_the_rows_and_marks_the_run_partial(tmp_path, sig, code, said):
    # SIGTERM is what timeout, kill, batch schedulers and docker stop send: kept as Ctrl-C keeps
    suites = tmp_path / "suites.py"
    suites.write_text(SUITES)
    out = tmp_path / "res"
    csv_path = out / "results.csv"
    argv = ["-m", "crossfuse.cli", "bench", "many", "--suites", str(suites), "--quick", "--device", "cpu",
            "--impl", "python/torch", "--out", str(out)]  # fmt: skip
    with open(tmp_path / "stdout", "wb") as so, open(tmp_path / "stderr", "wb") as se:
        proc = _start(argv, so, se)
        try:
            _wait_for(lambda: _data_lines(csv_path) >= 4, proc, "4 rows in the CSV")
            proc.send_signal(sig)
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    err = (tmp_path / "stderr").read_text()
    assert rc == code, err
    df = schema.read_csv(csv_path)  # a whole, well-formed CSV: no row cut short
    measured = df[df["status"] != "stopped"]
    assert 4 <= len(measured) < 600 and (measured["status"] == "ok").all()
    marker = df.iloc[-1]
    assert marker["status"] == "stopped" and said in marker["note"]
    assert f"after {len(measured)} of 600 rows" in marker["note"]
    assert f"{said.split(' (')[0]}: {len(measured)} rows kept in {csv_path}, marked partial" in err
    md = (out / "many-quick-cpu.md").read_text()
    assert f"**Partial run**: suite many: {said}" in md
    # the CSV reports again, partial
    report_rc = subprocess.run([sys.executable, "-m", "crossfuse.cli", "report", str(csv_path), "--no-plots"],
                               capture_output=True, text=True, timeout=120)  # fmt: skip
    assert report_rc.returncode == 0, report_rc.stderr
    assert "**Partial run**" in (out / "report.md").read_text()


def test_sigint_during_check_prints_the_rows_checked_so_far(tmp_path):
    script = tmp_path / "slow_check.py"
    script.write_text(SLOW_CHECK)
    argv = [str(script), "check", "--device", "cpu", "--impl", "python/slow", "--dtype",
            "float32,bfloat16,float16"]  # fmt: skip
    with open(tmp_path / "stdout", "wb") as so, open(tmp_path / "stderr", "wb") as se:
        proc = _start(argv, so, se)
        try:  # the progress lines on stderr: one per case, 2 cases per dtype
            _wait_for(lambda: b"check 3/" in (tmp_path / "stderr").read_bytes(), proc, "3 cases checked")
            proc.send_signal(signal.SIGINT)
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    out, err = (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()
    assert rc == 130, err
    assert "| layer_norm | slow | python | cpu | float32 | pass |" in out  # the first dtype's two cases
    assert "bfloat16" not in out and "float16" not in out  # never finished
    assert "1 pass, 0 fail, 0 error, 0 skip" in out
    assert "interrupted after 1 of 3 implementation x device x dtype checks" in err
