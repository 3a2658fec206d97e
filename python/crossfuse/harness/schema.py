"""The benchmark result schema: long format, one row per measurement, the same for both sides.

Columns, in order: the shared columns ``op .. timestamp`` (Julia's ``CrossFuse.RESULT_FIELDS`` too), then
five of the harness's own:

* ``status``: ``ok`` (measured), ``not timed`` (ran, e.g. under the Triton interpreter, but a time would
  mean nothing), ``skip`` (not run: unavailable, excluded, out of time budget) or ``error`` (raised,
  e.g. out of memory). ``note`` says why, for every status other than ``ok`` and for caveats. A run
  cut short adds one marker row of status ``stopped`` (op ``run``) whose note says why: the CSV then
  holds a partial run, and reports say so.
* ``note``: free text (the reason, how relerr was obtained, ...).
* ``suite``: the suite that produced the row (one CSV can hold several suites).
* ``gpu_ms_p50``: the median GPU-only time (launch overhead hidden: what the kernels cost).
* ``host_us``: the CPU's time per call, in microseconds (calls back to back without a synchronisation).

``ms_p20``/``ms_p50``/``ms_p80`` are the **eager** time, the call as a user makes it with its host time
in view (:mod:`crossfuse.harness.timing` says how each clock is read). Units: times in milliseconds
(20th/50th/80th percentile over the repeats), ``gbps`` in 1e9 bytes/s and ``tflops`` in 1e12 FLOP/s,
both from the eager median time; bytes as integers. ``shape`` is a string
``"4096x1024"`` (``M x N``) or ``"16x32x1024x64"`` (``B x H x L x D``); ``dtype`` is torch's name
without ``torch.`` (``bfloat16``). Empty cells mean "not measured", never zero.

Rows are appended to the CSV and flushed one at a time (:class:`CsvWriter`), so an interrupted run keeps
everything measured so far. Non-finite numbers are never written (an empty cell, the note says what
it was), and :func:`read_csv` refuses a CSV that is truncated, joined with another or holds a cell
that is not what its column takes (:func:`check_csv`: the file, the line and the problem).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import functools
import importlib.metadata
import io
import math
import os
import platform
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

#: The columns both sides share (Julia's ``CrossFuse.RESULT_FIELDS``), in order.
DESIGN_COLUMNS: tuple[str, ...] = (
    "op",
    "impl",
    "side",
    "peer",
    "device",
    "device_name",
    "dtype",
    "shape",
    "causal",
    "mode",
    "ms_p20",
    "ms_p50",
    "ms_p80",
    "gbps",
    "tflops",
    "alloc_bytes",
    "peak_bytes",
    "relerr",
    "versions",
    "timestamp",
)
#: The version of the columns below: it grows when columns are added (a CSV of an earlier version still
#: reads, its new columns empty); rows say it in ``versions`` (``schema=2``).
SCHEMA_VERSION = 2
#: The columns of version 1 (before the GPU-only and host times), which :func:`read_csv` still reads.
COLUMNS_V1: tuple[str, ...] = (*DESIGN_COLUMNS, "status", "note", "suite")
#: All columns of a result CSV, in order.
COLUMNS: tuple[str, ...] = (*COLUMNS_V1, "gpu_ms_p50", "host_us")

MODES: tuple[str, ...] = ("fwd", "bwd", "fwd+bwd")
# the note of rows a run left out because its time budget was spent
BUDGET_SPENT = "not measured: the time budget of this run was spent"
# the status of a run's marker row, written where a run stopped before measuring all it was asked for
# (interrupted, out of time budget, rows that raised, a crash): its note says why (:func:`stopped_row`)
STOPPED = "stopped"
STATUSES: tuple[str, ...] = ("ok", "not timed", "skip", "error", STOPPED)

_FLOAT_COLUMNS = ("ms_p20", "ms_p50", "ms_p80", "gbps", "tflops", "relerr", "gpu_ms_p50", "host_us")
_INT_COLUMNS = ("alloc_bytes", "peak_bytes")
_BOOL_COLUMNS = ("peer", "causal")


@dataclass
class Row:
    """One measurement. ``None`` is "not measured" (an empty CSV cell)."""

    op: str
    impl: str
    side: str
    peer: bool
    device: str
    device_name: str
    dtype: str
    shape: str
    causal: bool
    mode: str
    ms_p20: float | None = None
    ms_p50: float | None = None
    ms_p80: float | None = None
    gbps: float | None = None
    tflops: float | None = None
    alloc_bytes: int | None = None
    peak_bytes: int | None = None
    relerr: float | None = None
    versions: str = field(default_factory=lambda: versions())
    timestamp: str = field(default_factory=lambda: now())
    status: str = "ok"
    note: str = ""
    suite: str = ""
    gpu_ms_p50: float | None = None
    host_us: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {self.status!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_csv(self) -> dict[str, str]:
        """The row as CSV cells: ``None`` and NaN become empty cells; an infinity too, the note saying
        which (a CSV holds finite numbers only: :func:`check_csv`)."""
        out, infinite = {}, []
        for name in COLUMNS:
            v = getattr(self, name)
            if isinstance(v, float) and math.isinf(v):
                infinite.append(f"{name} was {v}")
                out[name] = ""
            elif v is None or (isinstance(v, float) and math.isnan(v)):
                out[name] = ""
            elif isinstance(v, bool):
                out[name] = "True" if v else "False"
            elif isinstance(v, float):
                out[name] = repr(v)
            else:
                out[name] = str(v)
        if infinite:
            out["note"] = "; ".join(s for s in (out["note"], *infinite) if s)
        return out

    def update(self, fields: dict) -> Row:
        """Set schema fields from a dict (e.g. what a Julia ``measure`` returned); unknown keys raise."""
        unknown = set(fields) - set(COLUMNS)
        if unknown:
            raise ValueError(
                f"not result-schema fields: {', '.join(sorted(unknown))}; known: {', '.join(COLUMNS)}"
            )
        for k, v in fields.items():
            setattr(self, k, v)
        return self


def shape_str(shape: Sequence[int]) -> str:
    """``(4096, 1024)`` -> ``"4096x1024"``."""
    return "x".join(str(int(s)) for s in shape)


def parse_shape(text: str) -> tuple[int, ...]:
    """``"4096x1024"`` -> ``(4096, 1024)``; a ``ValueError`` naming the text otherwise."""
    try:
        dims = tuple(int(s) for s in str(text).lower().replace(",", "x").split("x"))
    except ValueError:
        raise ValueError(
            f"shape must look like 4096x1024 (positive integers joined by 'x'), got {text!r}"
        ) from None
    if not dims or any(d <= 0 for d in dims):
        raise ValueError(f"shape must have positive dimensions, got {text!r}")
    return dims


def dtype_str(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    """``"bfloat16"``/``"bf16"`` -> ``torch.bfloat16``; a ``ValueError`` for anything else."""
    aliases = {
        "bf16": "bfloat16",
        "fp16": "float16",
        "half": "float16",
        "fp32": "float32",
        "float": "float32",
        "fp64": "float64",
        "double": "float64",
    }
    key = aliases.get(str(name).lower(), str(name).lower().removeprefix("torch."))
    dt = getattr(torch, key, None)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        raise ValueError(f"unknown dtype {name!r}; expected one of float32, bfloat16, float16, float64")
    return dt


def now() -> str:
    """ISO-8601 UTC timestamp, seconds resolution."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> str:
    """``python=3.12.3 torch=2.11.0 triton=3.6.0 crossfuse=0.1.0 schema=2 cuda=12.8`` (``schema``:
    :data:`SCHEMA_VERSION`), and in a process with a GPU (its CPU rows too) whether the CUDA timer resets
    persisting L2 lines before each repeat, ``l2reset=on`` or ``off`` (:mod:`crossfuse.harness.timing`;
    off where the driver refused), and the ptxas that builds Triton kernels for that GPU now,
    ``ptxas=13.0.88(torch)``: both read at each call, since either may change mid-run (torch.compile may
    switch the ptxas: :mod:`crossfuse.harness.toolchain`, which asks Triton's CUDA backend there); before
    them, the launch tables the GPU reads, ``tables=H100,H200`` (``rule`` where none serves it). Without a
    GPU nothing here imports Triton."""
    from .timing import persisting_l2_reset
    from .toolchain import ptxas_in_use

    if not torch.cuda.is_available():
        return _versions()
    ptxas = ptxas_in_use()
    l2reset = "on" if persisting_l2_reset() is not None else "off"
    tables = _tables()
    return (_versions() + (f" tables={tables}" if tables else "") + f" l2reset={l2reset}"
            + (f" ptxas={ptxas}" if ptxas else ""))  # fmt: skip


def _tables() -> str | None:
    """The launch tables the current GPU reads (``crossfuse.ops._runtime.device.tables_label``), first
    to last: both ops keep tables of the same models. None where that cannot be read (no Triton to
    import the ops with, a device that does not answer): a label of the rows, never why a run fails."""
    try:
        from ..ops import layer_norm
        from ..ops._runtime.device import current_card, tables_label

        return tables_label(current_card(), layer_norm.OVERRIDES, layer_norm.TABLES)
    except Exception:
        return None


@functools.cache
def _versions() -> str:
    from .. import __version__

    parts = [f"python={platform.python_version()}", f"torch={torch.__version__}"]
    triton = _version("triton")
    if triton:
        parts.append(f"triton={triton}")
    parts.append(f"crossfuse={__version__}")
    parts.append(f"schema={SCHEMA_VERSION}")
    if torch.version.cuda:
        parts.append(f"cuda={torch.version.cuda}")
    return " ".join(parts)


@functools.cache
def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_name(device: str | torch.device) -> str:
    """Human name of a device: the GPU's name, or the CPU model with the thread count torch uses."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    if dev.type == "cpu":
        return f"{_cpu_name()} ({torch.get_num_threads()} threads)"
    return str(dev)


class CsvWriter:
    """Appends rows to a result CSV, flushing each one to disk as it is written.

    A new (or empty) file gets the header; an existing file must have exactly :data:`COLUMNS` as its
    header (otherwise a ``ValueError``: write to a new file instead of mixing schemas).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        if not fresh:
            with open(self.path, newline="") as f:
                header = next(csv.reader(f), [])
            if tuple(header) != COLUMNS:
                raise ValueError(
                    f"{self.path} exists with a different header ({', '.join(header[:5])}, ...): "
                    "choose another output folder, or pass --replace to keep it under a dated name"
                )
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) not in (b"\n", b"\r"):  # rows appended to it would run into the cut one
                    raise ValueError(
                        f"{self.path} ends in a row cut short (a run stopped while writing it): delete its "
                        "last line, or choose another output folder"
                    )
        self._file = open(self.path, "a", newline="", encoding="utf-8")  # closed in close()
        self._writer = csv.DictWriter(self._file, fieldnames=COLUMNS)
        if fresh:
            self._writer.writeheader()
            self._sync()
        self.count = 0

    def _sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def write(self, row: Row) -> None:
        self._writer.writerow(row.to_csv())
        self._sync()
        self.count += 1

    def write_all(self, rows: Iterable[Row]) -> None:
        for row in rows:
            self.write(row)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> CsvWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_csv(path: str | os.PathLike):
    """A result CSV as a pandas DataFrame with the schema's column types (rows of a :data:`COLUMNS_V1`
    file get empty new columns); a :class:`MalformedCsv` (a ``ValueError``)
    naming the file, the line and the problem where it is not a whole, well-formed result CSV."""
    import pandas as pd

    path = Path(path)
    check_csv(path)
    df = pd.read_csv(
        path,
        dtype={c: str for c in COLUMNS if c not in _FLOAT_COLUMNS + _INT_COLUMNS},
        keep_default_na=False,
        na_values={c: [""] for c in _FLOAT_COLUMNS + _INT_COLUMNS},
    )
    if tuple(df.columns) == COLUMNS_V1:
        df = df.reindex(columns=list(COLUMNS))
    if tuple(df.columns) != COLUMNS:
        raise ValueError(
            f"{path} is not a crossfuse result CSV: columns {list(df.columns)[:6]}..., "
            f"expected {list(COLUMNS)[:6]}..."
        )
    return rows_frame(df)


def rows_frame(df_or_rows):
    """Normalise a DataFrame (or a list of :class:`Row`) to the schema's column types."""
    import pandas as pd

    if isinstance(df_or_rows, pd.DataFrame):
        df = df_or_rows.copy()
    else:
        df = pd.DataFrame([r.to_dict() for r in df_or_rows], columns=list(COLUMNS))
    for c in _FLOAT_COLUMNS + _INT_COLUMNS:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    for c in _BOOL_COLUMNS:
        df[c] = (
            df[c].map(lambda v: v if isinstance(v, bool) else str(v).strip().lower() == "true").astype(bool)
        )
    for c in COLUMNS:
        if c not in _FLOAT_COLUMNS + _INT_COLUMNS + _BOOL_COLUMNS:
            df[c] = df[c].fillna("").astype(str)
    return df


def why_partial(rows: Sequence[Row], stopped: str | None = None) -> str | None:
    """Why a run's rows fall short of what it was asked to measure, or None for a whole run: ``stopped``
    (what cut it short: an interrupt, a crash), the rows left out for the time budget, the rows that
    raised (out of memory, an implementation's failure; their notes say how)."""
    parts = [stopped] if stopped else []
    budget = sum(r.status == "skip" and r.note == BUDGET_SPENT for r in rows)
    if budget:
        parts.append(f"the time budget was spent: {budget} rows not measured")
    errors = [r for r in rows if r.status == "error"]
    if errors:
        first = f"{errors[0].op}/{errors[0].impl} {errors[0].shape} {errors[0].mode}: {errors[0].note}"
        parts.append(f"{len(errors)} rows raised (the first: {first[:200]})")
    return "; ".join(parts) or None


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, ``kill``, a batch scheduler or ``docker stop``) where Ctrl-C would raise
    KeyboardInterrupt (the command line's handler raises it): whatever keeps a run's rows on Ctrl-C keeps
    them on SIGTERM too."""


def stop_reason(exc: KeyboardInterrupt) -> tuple[str, int]:
    """``(what stopped the run, the command's exit code)``: 130 for Ctrl-C, 143 (128 + 15) for SIGTERM."""
    if isinstance(exc, Terminated):
        return "terminated (SIGTERM)", 143
    return "interrupted (Ctrl-C)", 130


def stopped_row(suite: str, device: str, why: str) -> Row:
    """The marker row of a run cut short (status ``stopped``, op ``run``): it names no measurement, and
    its note says why the CSV holds only part of what the run was asked to measure."""
    return Row(op="run", impl="crossfuse bench", side="python", peer=False, device=device,
               device_name=device_name(device), dtype="", shape="", causal=False, mode="fwd",
               status=STOPPED, note=f"partial run: {why}", suite=suite)  # fmt: skip


# ----------------------------------------------------------------------------------------------------
# strict reading: every problem of a result CSV named with the file, the line and what is wrong
# ----------------------------------------------------------------------------------------------------
#
# Strict reading of a result CSV: every problem named with the file, the line and what is wrong.
#
# A report drawn from a damaged CSV would look like a real one: a run cut short while writing a row (a
# truncated last line), two CSVs joined with ``cat`` (a second header in the middle), a CSV of another
# program (other columns), or a number that is not one (``inf``, ``nan``, ``1.2.3``). :func:`check_csv`
# reads the file once, row by row, and raises :class:`MalformedCsv` at the first such problem; the CSVs
# that :class:`crossfuse.harness.schema.CsvWriter` writes always pass.
#
# What each cell may hold (the schema's column groups, so columns added to them are checked too):
#
# * numbers (times, throughputs, relerr, bytes): empty ("not measured") or a finite number >= 0; bytes
#   are whole numbers;
# * ``peer``, ``causal``: ``True`` or ``False``;
# * ``mode``, ``status``: one of the schema's values; ``dtype`` a dtype name, ``shape`` positive integers
#   joined by ``x`` (both may be empty in a run's ``stopped`` marker row, which names no measurement);
# * ``op``, ``impl``, ``side``, ``device``: not empty.

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
    if cells["mode"] not in MODES:
        return f"column mode: {cells['mode']!r} is not one of {', '.join(MODES)}"
    if cells["status"] not in STATUSES:
        return f"column status: {cells['status']!r} is not one of {', '.join(STATUSES)}"
    for c in _BOOL_COLUMNS:
        if cells[c].strip().lower() not in ("true", "false"):
            return f"column {c}: {cells[c]!r} is not True or False"
    for c in _FLOAT_COLUMNS + _INT_COLUMNS:
        problem = _number(c, cells[c].strip(), whole=c in _INT_COLUMNS)
        if problem:
            return problem
    marker = cells["status"] == STOPPED
    if cells["dtype"] or not marker:
        try:
            parse_dtype(cells["dtype"])
        except ValueError as exc:
            return f"column dtype: {exc}"
    if cells["shape"] or not marker:
        try:
            parse_shape(cells["shape"])
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
    accepted = (COLUMNS, COLUMNS_V1) if columns is None else (tuple(columns),)
    path = Path(path)
    if path.is_dir():
        raise FileNotFoundError(f"{path} is a folder, not a result CSV (the CSV a bench writes is "
                                f"{path / 'results.csv'})")  # fmt: skip
    if not path.is_file():
        raise FileNotFoundError(f"no result CSV at {path}")
    reader = csv.reader(io.StringIO(_text(path), newline=""))
    try:
        header = tuple(next(reader))
        if header not in accepted:
            raise MalformedCsv(path, 1, _header_problem(list(header), accepted[0]))
        columns = header  # a file of the first schema lacks the newer columns: their cells read as empty
        blank = dict.fromkeys(COLUMNS, "")
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
