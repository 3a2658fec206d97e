"""``crossfuse report`` (and every reader of a result CSV) refuses a malformed CSV with the file, the line
and the problem, and a non-zero exit; what the harness writes always reads back."""

from __future__ import annotations

import pytest
from crossfuse import cli
from crossfuse.harness import schema
from crossfuse.harness.schema import COLUMNS, CsvWriter, Row


def _row(**fields) -> Row:
    base = dict(op="layer_norm", impl="torch", side="python", peer=True, device="cpu",
                device_name="cpu (1 threads)", dtype="float32", shape="64x256", causal=False, mode="fwd",
                ms_p20=0.01, ms_p50=0.02, ms_p80=0.03, gbps=12.5, relerr=1e-7, alloc_bytes=65536,
                peak_bytes=65536, suite="layer_norm")  # fmt: skip
    return Row(**{**base, **fields})


@pytest.fixture
def good(tmp_path):
    """A well-formed result CSV of three rows: the header on line 1, rows on lines 2, 3 and 4-5 (a quoted
    line break in the last one's note: lines are the file's lines)."""
    path = tmp_path / "good.csv"
    with CsvWriter(path) as w:
        w.write(_row())
        w.write(_row(mode="bwd"))
        w.write(_row(impl="fused", peer=False, status="not timed", ms_p20=None, ms_p50=None, ms_p80=None,
                     gbps=None, alloc_bytes=None, peak_bytes=None,
                     note="a note, with a comma and \"quotes\"\nand a line break"))  # fmt: skip
    return path


def _lines(path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def _refused(path, capsys, line: int, *words: str) -> str:
    """``crossfuse report`` exits 2 naming ``path:line:`` and the words; returns the message."""
    assert cli.main(["report", str(path), "--no-plots", "--out", str(path.parent / "rep")]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{line}: " in err, err
    for w in words:
        assert w in err, err
    assert not (path.parent / "rep" / "report.md").exists()
    return err


def test_the_harness_csv_reads_back_and_reports(good, capsys):
    assert schema.check_csv(good) == 3
    assert len(schema.read_csv(good)) == 3
    assert cli.main(["report", str(good), "--no-plots"]) == 0
    assert "a note, with a comma" in (good.parent / "report.md").read_text()


def test_a_truncated_last_row_is_refused(good, capsys):
    text = good.read_text()
    good.write_text(text[: len(text) - 12])  # cut inside the last row: no line break at the end
    _refused(good, capsys, 5, "cut short")


def test_a_row_with_fields_missing_is_refused(good, capsys):
    lines = _lines(good)
    lines[2] = ",".join(lines[2].split(",")[:10]) + "\r\n"  # a row cut at a field boundary, then a newline
    good.write_text("".join(lines))
    _refused(good, capsys, 3, "10 fields where the header has")


def test_two_csvs_joined_are_refused(good, capsys):
    text = good.read_text()
    good.write_text(text + text)
    _refused(good, capsys, 6, "the header again", "joined")


def test_an_empty_line_is_refused(good, capsys):
    lines = _lines(good)
    good.write_text("".join([*lines[:2], "\r\n", *lines[2:]]))
    _refused(good, capsys, 3, "empty line")


@pytest.mark.parametrize(
    "header, words",
    [
        ([c for c in COLUMNS if c != "ms_p50"], ["missing columns ms_p50"]),
        ([*COLUMNS, "extra"], ["unknown columns extra"]),
        ([c if c != "gbps" else "GBps" for c in COLUMNS], ["missing columns gbps", "unknown columns GBps"]),
        ([COLUMNS[1], COLUMNS[0], *COLUMNS[2:]], ["another order"]),
        ([*COLUMNS[:-1], "op"], [f"missing columns {COLUMNS[-1]}", "repeated columns op"]),
        (["a", "b", "c"], ["missing columns op"]),
    ],
    ids=["missing", "unknown", "renamed", "reordered", "repeated", "another program"],
)
def test_wrong_or_missing_columns_are_refused(good, capsys, header, words):
    lines = _lines(good)
    good.write_text(",".join(header) + "\r\n" + "".join(lines[1:]))
    _refused(good, capsys, 1, "not a crossfuse result header", *words)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "NaN", "Infinity", "1e999"])
@pytest.mark.parametrize("column", ["ms_p50", "gbps", "relerr", "peak_bytes"])
def test_non_finite_numbers_are_refused(good, capsys, column, value):
    _set_cell(good, 3, column, value)
    _refused(good, capsys, 3, f"column {column}", "not a finite number")


@pytest.mark.parametrize(
    "column, value, words",
    [
        ("ms_p50", "fast", ["'fast' is not a number"]),
        ("ms_p20", "1.2.3", ["'1.2.3' is not a number"]),
        ("tflops", "0x10", ["is not a number"]),
        ("ms_p80", "-0.5", ["negative"]),
        ("alloc_bytes", "12.5", ["not a whole number"]),
        ("peer", "yes", ["column peer", "not True or False"]),
        ("causal", "", ["column causal"]),
        ("mode", "forward", ["column mode", "'forward'"]),
        ("status", "done", ["column status", "'done'"]),
        ("dtype", "int8", ["column dtype", "unknown dtype 'int8'"]),
        ("shape", "64x0", ["column shape", "positive"]),
        ("shape", "big", ["column shape"]),
        ("op", "", ["column op is empty"]),
        ("timestamp", "yesterday", ["column timestamp"]),
    ],
)
def test_cells_that_are_not_what_their_column_takes_are_refused(good, capsys, column, value, words):
    _set_cell(good, 2, column, value)
    _refused(good, capsys, 2, *words)


def _set_cell(path, line: int, column: str, value: str) -> None:
    import csv
    import io

    rows = list(csv.reader(io.StringIO(path.read_text(), newline="")))
    rows[line - 1][COLUMNS.index(column)] = value
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    path.write_text(buf.getvalue(), newline="")


def test_empty_binary_and_header_only_files(tmp_path, capsys):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    _refused(empty, capsys, 1, "empty")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b",".join(c.encode() for c in COLUMNS) + b"\r\n\x00\x01\xff\xfe\r\n")
    _refused(binary, capsys, 2, "not UTF-8")
    nul = tmp_path / "nul.csv"
    nul.write_bytes(b",".join(c.encode() for c in COLUMNS) + b"\r\nop\x00\r\n")
    _refused(nul, capsys, 2, "NUL")
    header_only = tmp_path / "header.csv"
    with CsvWriter(header_only):
        pass
    assert cli.main(["report", str(header_only), "--no-plots"]) == cli.NOTHING_DONE
    assert "no rows: nothing to report" in capsys.readouterr().err


def test_a_folder_or_missing_file_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path), "--no-plots"]) == 2
    assert f"{tmp_path} is a folder, not a result CSV" in capsys.readouterr().err
    assert cli.main(["report", str(tmp_path / "none.csv"), "--no-plots"]) == 2
    assert "no result CSV at" in capsys.readouterr().err


def test_non_finite_numbers_are_never_written(tmp_path):
    path = tmp_path / "r.csv"
    with CsvWriter(path) as w:
        w.write(_row(relerr=float("inf"), gbps=float("nan"), note="wrong answer"))
    df = schema.read_csv(path)  # reads back: the infinity became an empty cell that the note names
    assert df["relerr"].isna().all() and df["gbps"].isna().all()
    assert df["note"].iloc[0] == "wrong answer; relerr was inf"


def test_rows_are_not_appended_to_a_truncated_csv(good, tmp_path, capsys):
    text = good.read_text()
    good.write_text(text[:-5])
    with pytest.raises(ValueError, match="ends in a row cut short"):
        CsvWriter(good)
    out = tmp_path / "res"
    out.mkdir()
    (out / "results.csv").write_text(text + text)  # a joined CSV in the bench's folder
    args = ["bench", "layer_norm", "--quick", "--device", "cpu", "--op", "layer_norm", "--dtype", "float32",
            "--impl", "python/torch", "--out", str(out)]  # fmt: skip
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "the header again" in err and "--replace" in err


def test_a_partial_run_is_shown_by_the_report(good, capsys):
    with CsvWriter(good) as w:
        w.write(schema.stopped_row("layer_norm", "cpu", "interrupted (Ctrl-C) after 3 of 9 rows"))
    assert schema.check_csv(good) == 4
    assert cli.main(["report", str(good), "--no-plots"]) == 0
    md = (good.parent / "report.md").read_text()
    assert "**Partial run**: suite layer_norm: interrupted (Ctrl-C) after 3 of 9 rows" in md
    assert "crossfuse bench" not in md.split("**Partial run**")[1]  # the marker is in no table
