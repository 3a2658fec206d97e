"""Strict reading of a result CSV: every problem named with the file, the line and what is wrong.

A report drawn from a damaged CSV would look like a real one: a run cut short while writing a row (a
truncated last line), two CSVs joined with ``cat`` (a second header in the middle), a CSV of another
program (other columns), or a number that is not one (``inf``, ``nan``, ``1.2.3``). :func:`check_csv`
reads the file once, row by row, and raises :class:`MalformedCsv` at the first such problem; the CSVs
that :class:`crossfuse.harness.schema.CsvWriter` writes always pass.

What each cell may hold (the schema's column groups, so columns added to them are checked too):

* numbers (times, throughputs, relerr, bytes): empty ("not measured") or a finite number >= 0; bytes
  are whole numbers;
* ``peer``, ``causal``: ``True`` or ``False``;
* ``mode``, ``status``: one of the schema's values; ``dtype`` a dtype name, ``shape`` positive integers
  joined by ``x`` (both may be empty in a run's ``stopped`` marker row, which names no measurement);
* ``op``, ``impl``, ``side``, ``device``: not empty.
"""

from __future__ import annotations

import csv
import datetime
import io
import math
import os
from pathlib import Path

from . import schema

#: Columns that every row must fill.
REQUIRED = ("op", "impl", "side", "device", "mode", "status")


class MalformedCsv(ValueError):
    """A result CSV that cannot be trusted; the message is ``PATH:LINE: problem``."""

    def __init__(self, path: str | os.PathLike, line: int, problem: str):
        self.path, self.line, self.problem = str(path), line, problem
        super().__init__(f"{path}:{line}: {problem}")


def _text(path: Path) -> str:
    raw = path.read_bytes()
    if not raw.strip():
        raise MalformedCsv(path, 1, "the file is empty (not even a header): not a crossfuse result CSV")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise MalformedCsv(
            path, line, f"not UTF-8 text (byte {raw[exc.start]:#04x}): not a result CSV"
        ) from None
    if "\0" in text:
        line = text[: text.index("\0")].count("\n") + 1
        raise MalformedCsv(path, line, "holds a NUL byte: a binary file, or one damaged on disk")
    if not text.endswith(("\n", "\r")):
        line = text.count("\n") + 1
        raise MalformedCsv(
            path,
            line,
            "the last row ends without a line break: it was cut short (a run stopped while writing it, "
            "or a partial copy); delete that line to keep the rows before it",
        )
    return text


def _header_problem(header: list[str], columns: tuple[str, ...]) -> str:
    missing = [c for c in columns if c not in header]
    unknown = [c for c in header if c not in columns]
    repeated = sorted({c for c in header if header.count(c) > 1})
    parts = []
    if missing:
        parts.append(f"missing columns {', '.join(missing)}")
    if unknown:
        parts.append(f"unknown columns {', '.join(unknown)}")
    if repeated:
        parts.append(f"repeated columns {', '.join(repeated)}")
    if not parts:
        parts.append("the columns are in another order")
    return (
        "not a crossfuse result header: " + "; ".join(parts)
        + f" (expected the {len(columns)} columns {', '.join(columns)})"
    )  # fmt: skip


def _number(column: str, value: str, whole: bool) -> str | None:
    """The problem with a numeric cell, or None (empty cells are "not measured")."""
    if value == "":
        return None
    try:
        v = float(value)
    except ValueError:
        return f"column {column}: {value!r} is not a number"
    if not math.isfinite(v):
        return (
            f"column {column}: {value!r} is not a finite number (a measurement is finite; an empty cell "
            "says 'not measured')"
        )
    if v < 0:
        return f"column {column}: {value} is negative; it must be >= 0"
    if whole and v != int(v):
        return f"column {column}: {value} is not a whole number of bytes"
    return None


def _cell_problem(cells: dict[str, str]) -> str | None:
    """The first problem of one row's cells, or None."""
    for c in REQUIRED:
        if cells[c].strip() == "":
            return f"column {c} is empty"
    if cells["mode"] not in schema.MODES:
        return f"column mode: {cells['mode']!r} is not one of {', '.join(schema.MODES)}"
    if cells["status"] not in schema.STATUSES:
        return f"column status: {cells['status']!r} is not one of {', '.join(schema.STATUSES)}"
    for c in schema._BOOL_COLUMNS:
        if cells[c].strip().lower() not in ("true", "false"):
            return f"column {c}: {cells[c]!r} is not True or False"
    for c in schema._FLOAT_COLUMNS + schema._INT_COLUMNS:
        problem = _number(c, cells[c].strip(), whole=c in schema._INT_COLUMNS)
        if problem:
            return problem
    marker = cells["status"] == schema.STOPPED
    if cells["dtype"] or not marker:
        try:
            schema.parse_dtype(cells["dtype"])
        except ValueError as exc:
            return f"column dtype: {exc}"
    if cells["shape"] or not marker:
        try:
            schema.parse_shape(cells["shape"])
        except ValueError as exc:
            return f"column shape: {exc}"
    if cells["timestamp"]:
        try:
            datetime.datetime.fromisoformat(cells["timestamp"])
        except ValueError:
            return f"column timestamp: {cells['timestamp']!r} is not an ISO-8601 time"
    return None


def check_csv(path: str | os.PathLike, columns: tuple[str, ...] | None = None) -> int:
    """Raise :class:`MalformedCsv` at the first problem of the result CSV at ``path`` (``columns``: the
    expected header, the schema's by default); return how many rows it holds. ``FileNotFoundError`` where
    there is no file."""
    accepted = (schema.COLUMNS, schema.COLUMNS_V1) if columns is None else (tuple(columns),)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no result CSV at {path}")
    reader = csv.reader(io.StringIO(_text(path), newline=""))
    try:
        header = tuple(next(reader))
        if header not in accepted:
            raise MalformedCsv(path, 1, _header_problem(list(header), accepted[0]))
        columns = header  # a file of the first schema lacks the newer columns: their cells read as empty
        blank = dict.fromkeys(schema.COLUMNS, "")
        rows = 0
        for record in reader:
            line = reader.line_num
            if not record:
                raise MalformedCsv(path, line, "an empty line: a row was lost, or two files were joined")
            if tuple(record) == columns:
                raise MalformedCsv(
                    path,
                    line,
                    "the header again: two result CSVs were joined into one (keep one header; `crossfuse "
                    "bench --append` adds a run's rows to a CSV)",
                )
            if len(record) != len(columns):
                raise MalformedCsv(
                    path,
                    line,
                    f"{len(record)} fields where the header has {len(columns)}: a row cut short or run "
                    "into another (a truncated or joined file)",
                )
            problem = _cell_problem(blank | dict(zip(columns, record, strict=True)))
            if problem:
                raise MalformedCsv(path, line, problem)
            rows += 1
    except csv.Error as exc:
        raise MalformedCsv(path, reader.line_num, f"not CSV: {exc}") from None
    return rows
