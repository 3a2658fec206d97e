"""Bad command lines, table-driven, for every ``crossfuse`` command: each exits 2 with the reason on
stderr and writes nothing."""

from __future__ import annotations

from collections import Counter

import pytest
from crossfuse import cli
from crossfuse.harness import schema

CLI = [
    ("(top level)", "no command", [], "required"),
    ("(top level)", "unknown command", ["compile"], "invalid choice"),
    ("(top level)", "unknown flag", ["--verbose", "info"], "unrecognized arguments"),
    ("check", "unknown device", ["check", "--device", "tpu"], "unknown device 'tpu'"),
    ("check", "unknown op", ["check", "--op", "softmax"], "unknown op 'softmax'"),
    ("check", "integer dtype", ["check", "--dtype", "int8"], "unknown dtype 'int8'"),
    (
        "check",
        "no implementation matches",
        ["check", "--impl", "nothing_like_this"],
        "no implementation matches",
    ),
    ("check", "negative seed", ["check", "--seed", "-1"], "argument --seed"),
    ("check", "seed not a number", ["check", "--seed", "one"], "argument --seed"),
    ("check", "unknown side", ["check", "--side", "rust"], "invalid choice"),
    ("bench", "unknown suite", ["bench", "everything", "--device", "cpu"], "unknown suite 'everything'"),
    ("bench", "unknown device", ["bench", "layer_norm", "--device", "tpu"], "unknown device 'tpu'"),
    (
        "bench",
        "integer dtype",
        ["bench", "layer_norm", "--device", "cpu", "--dtype", "int32"],
        "unknown dtype",
    ),
    (
        "bench",
        "budget 0",
        ["bench", "layer_norm", "--device", "cpu", "--budget-s", "0"],
        "--budget-s must be",
    ),
    (
        "bench",
        "budget NaN",
        ["bench", "layer_norm", "--device", "cpu", "--budget-s", "nan"],
        "--budget-s must be",
    ),
    ("bench", "budget not a number", ["bench", "layer_norm", "--budget-s", "soon"], "argument --budget-s"),
    (
        "bench",
        "rounds 0",
        ["bench", "layer_norm", "--device", "cpu", "--rounds", "0"],
        "--rounds must be >= 1",
    ),
    (
        "bench",
        "threads -1",
        ["bench", "layer_norm", "--device", "cpu", "--threads", "-1"],
        "--threads must be",
    ),
    (
        "bench",
        "op outside the suite",
        ["bench", "layer_norm", "--device", "cpu", "--op", "relu_attention"],
        "no point of suite",
    ),
    ("bench", "missing suites file", ["bench", "layer_norm", "--suites", "/nonexistent/suites.py"], "suites"),
    ("report", "missing CSV", ["report", "/nonexistent/results.csv"], "no result CSV"),
    ("profile", "unknown subject", ["profile", "softmax"], "invalid choice"),
    ("profile", "shape of 2 dims", ["profile", "attention", "--device", "cpu", "--shape", "2x3"], "4 dims"),
    (
        "profile",
        "shape not numbers",
        ["profile", "attention", "--device", "cpu", "--shape", "axbxcxd"],
        "shape must look like",
    ),
    (
        "profile",
        "shape with a 0",
        ["profile", "attention", "--device", "cpu", "--shape", "1x1x0x16"],
        "positive",
    ),
    (
        "profile",
        "two dtypes",
        ["profile", "attention", "--device", "cpu", "--dtype", "bf16,fp32"],
        "one dtype",
    ),
    (
        "profile",
        "integer dtype",
        ["profile", "attention", "--device", "cpu", "--dtype", "int8"],
        "unknown dtype",
    ),
    ("profile", "unknown device", ["profile", "attention", "--device", "tpu"], "unknown device"),
    ("info", "an argument", ["info", "--all"], "unrecognized arguments"),
]


@pytest.mark.parametrize("argv, words", [c[2:] for c in CLI], ids=[f"{c[0]}: {c[1]}" for c in CLI])
def test_bad_command_lines_exit_2_with_the_reason(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written, wherever the defaults point
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert words in err, err
    assert not any(tmp_path.iterdir())


def test_a_malformed_csv_is_a_bad_report_input(tmp_path, capsys):
    path = tmp_path / "results.csv"
    path.write_text(",".join(schema.COLUMNS) + "\r\nlayer_norm,torch\r\n")
    assert cli.main(["report", str(path)]) == 2
    assert f"{path}:2: 2 fields" in capsys.readouterr().err


def test_every_command_has_cases(capsys):
    assert cli.main(["--help"]) == 0
    commands = capsys.readouterr().out.split("{", 1)[1].split("}", 1)[0].split(",")
    counts = Counter(c[0] for c in CLI)
    counts["report"] += 1  # the malformed CSV
    with capsys.disabled():
        print("\n" + "\n".join(f"{n:4d}  crossfuse {entry}" for entry, n in sorted(counts.items())))
    for command in commands:
        assert counts[command] >= 1, command
