"""Where the command line's results go, and what stops a command: the output folder, earlier results kept
rather than overwritten, and SIGTERM taken as Ctrl-C (:class:`.harness.schema.Terminated`). Kept apart
from :mod:`crossfuse.cli` so that the command line's module stays readable in one sitting."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from pathlib import Path

from .harness.schema import Terminated

# the first line of a report.md that `crossfuse report` wrote (and may rewrite without --force)
REPORT_MARK = "<!-- written by `crossfuse report`"


def report_mark(csv_path) -> str:
    """The first line of a report.md written from ``csv_path`` by `crossfuse report`."""
    return f"{REPORT_MARK} from {csv_path}; running it again rewrites this file -->"


def report_source(md_path: Path) -> Path | None:
    """The CSV a report.md was written from by `crossfuse report` (:func:`report_mark`); None for any other
    file (a GPU session's report, the user's own) or none."""
    if not md_path.is_file():
        return None
    with open(md_path, encoding="utf-8", errors="replace") as f:
        first = f.readline()
    head, sep, tail = first.partition(f"{REPORT_MARK} from ")
    if head or not sep or "; running it again" not in tail:
        return None
    return Path(tail.rpartition("; running it again")[0])


class UsageError(Exception):
    """Bad command-line input: reported on stderr with exit code 2."""


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM raises :class:`Terminated` inside the block (main thread only: elsewhere no handler can be
    set, and SIGTERM keeps its own action)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum, frame):
        raise Terminated("SIGTERM")

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def out_folder(path: str | None, flag: str = "--out") -> Path:
    """``--out`` as a folder: a usage error naming the flag where a file stands at that path or above it."""
    out = Path(path)
    for p in (out, *out.parents):
        if p.exists():
            if not p.is_dir():
                where = "is a file" if p == out else f"is under {p}, which is a file"
                raise UsageError(f"{flag} must be a folder, and {out} {where} (results are written into it)")
            break
    return out


def keep_earlier(paths: list[Path], stamp: str | None = None) -> list[tuple[Path, Path]]:
    """Each existing file of ``paths`` renamed ``NAME.STAMP.SUFFIX`` (``STAMP-2`` and on where that name is
    taken: never over an earlier kept file); returns ``(old, new)`` pairs."""
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    moved = []
    for p in paths:
        if not p.is_file():
            continue
        kept, n = p.with_name(f"{p.stem}.{stamp}{p.suffix}"), 1
        while kept.exists():
            n += 1
            kept = p.with_name(f"{p.stem}.{stamp}-{n}{p.suffix}")
        p.rename(kept)
        moved.append((p, kept))
    return moved


def make_room(csv_path: Path, suite_name: str, md_path: Path, append: bool, replace: bool) -> None:
    """Refuse to mix a second run of a suite into a CSV that holds one (the report would mix the runs'
    measurements) unless ``append``; with ``replace`` the old CSV is kept under a dated name first, and with
    it the reports that describe it (the run's markdown ``md_path`` and a ``report.md`` that `crossfuse
    report` wrote from it, its first line then naming the kept CSV)."""
    from .harness.schema import MalformedCsv, read_csv

    if not csv_path.exists() or csv_path.stat().st_size == 0:
        return
    if replace:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        ((_, kept),) = keep_earlier([csv_path], stamp)
        report = csv_path.with_name("report.md")
        source = report_source(report)
        ours = source is not None and source.resolve() == csv_path.resolve()
        same_stamp = kept.stem.removeprefix("results.")
        from .harness.plots import PLOT_NAMES

        plots = [csv_path.with_name(n) for n in PLOT_NAMES] if ours else []  # the report's own pictures
        moved = dict(keep_earlier([md_path, *([report] if ours else []), *plots], same_stamp))
        if report in moved:  # it names the CSV it was written from and its plots: now the kept ones
            text = moved[report].read_text(encoding="utf-8").partition("\n")[2]
            for p in plots:
                if p in moved:
                    text = text.replace(f"]({p.name})", f"]({moved[p].name})")
            moved[report].write_text(report_mark(kept) + "\n" + text, encoding="utf-8")
        print(f"crossfuse bench: the earlier {csv_path} is kept as {kept}, its reports likewise",
              file=sys.stderr)  # fmt: skip
        return
    try:
        earlier = int((read_csv(csv_path)["suite"] == suite_name).sum())
    except MalformedCsv as exc:
        if exc.line == 1:
            return  # CsvWriter names the problem (another header)
        raise UsageError(
            f"{exc}; the rows of this run would be added to a damaged CSV: pass --replace to start it anew "
            "(the old file is kept under a dated name), or another --out"
        ) from None
    if earlier and not append:
        raise UsageError(
            f"{csv_path} already holds {earlier} rows of suite {suite_name!r} from an earlier run: pass "
            "--replace to start the CSV anew (the whole file, other suites' rows too, is kept under a dated "
            "name), --append to add this run's rows (the report then shows the median of the repeated "
            "measurements), or another --out"
        )
