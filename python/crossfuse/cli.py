"""The ``crossfuse`` command: check, bench, report, profile, info.

    crossfuse check   [--device cpu|cuda] [--op OP ...] [--impl PATTERN ...] [--skip PATTERN ...]
                      [--dtype DTYPE ...] [--side python|julia] [--seed N]
    crossfuse bench   SUITE [--device cpu|cuda] [--dtype DTYPE ...] [--quick] [--out DIR]
                      [--op OP ...] [--impl PATTERN ...] [--suites FILE] [--budget-s S]
                      [--rounds N] [--append | --replace]
    crossfuse report  CSV [--out DIR] [--no-plots] [--force]
    crossfuse profile attention [--device cpu|cuda] [--shape BxHxLxD] [--dtype DTYPE] [--causal] [--out DIR]
    crossfuse info

    crossfuse --version

Exit codes: 0 success; 1 ``check`` found a failure or an error, or a command crashed (a ``bench``
keeps its rows, marked partial); 2 bad input (unknown suite, device, dtype, op, filters that select
nothing, a missing or malformed CSV, an output path that cannot be written); 3 nothing done: every
check skipped, no row measured, no row to report, no implementation profiled (the reason printed);
130 interrupted (``bench`` keeps the rows measured so far in its CSV, marked partial; ``check`` prints
the rows checked so far); 143 terminated by SIGTERM, which keeps what Ctrl-C keeps.

Triton reads ``TRITON_INTERPRET`` when it is first imported: this module switches the interpreter on
(when no GPU is present) before anything imports Triton.
"""

from __future__ import annotations

from . import _backend

_backend.enable_interpreter_if_no_gpu()  # before anything below can import triton

import argparse  # noqa: E402
import importlib.metadata  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from contextlib import ExitStack  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from ._cli_out import (  # noqa: E402
    UsageError,
    make_room,
    out_folder,
    report_mark,
    report_source,
    sigterm_as_interrupt,
)
from .harness.schema import stop_reason  # noqa: E402

DEVICES = ("cpu", "cuda")
CHECK_DTYPES = ("float32", "bfloat16", "float16")
# A couple of small cases per op for ``crossfuse check``: (shape, options). Odd sizes on purpose: a
# prime row length (masking), a single row / a non-power-of-two sequence length (tails).
CHECK_CASES = {
    "layer_norm": [((3, 37), {}), ((64, 256), {})],
    "normalise": [((3, 37), {}), ((64, 256), {})],
    "layer_norm_maxstd": [((3, 37), {}), ((64, 256), {})],
    "relu_attention": [((1, 2, 64, 32), {"causal": False}), ((2, 1, 67, 16), {"causal": True})],
}


# the exit code of a command that could check, measure, report or profile none of what it was asked
NOTHING_DONE = 3


def _devices(arg: str | None) -> list[str]:
    if arg is None:
        return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    return [_device(arg)]


def _device(arg: str | None) -> str:
    if arg is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if arg not in DEVICES:
        raise UsageError(f"unknown device {arg!r}; expected one of {', '.join(DEVICES)}")
    if arg == "cuda" and not torch.cuda.is_available():
        raise UsageError("device 'cuda' requested but torch sees no CUDA device on this machine")
    return arg


def _dtypes(names) -> list[torch.dtype] | None:
    if not names:
        return None
    from .harness.schema import parse_dtype

    try:
        return [parse_dtype(n) for name in names for n in name.split(",") if n]
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _ops(names) -> list[str] | None:
    if not names:
        return None
    from . import registry

    ops = [n for name in names for n in name.split(",") if n]
    for op in ops:
        if op not in registry.OPS:
            raise UsageError(f"unknown op {op!r}; known ops: {', '.join(registry.OPS)}")
    return ops


def _patterns(names) -> list[str] | None:
    return [n for name in names for n in name.split(",") if n] if names else None


# ----------------------------------------------------------------------------------------------------
# check
# ----------------------------------------------------------------------------------------------------


def cmd_check(args) -> int:
    from . import registry
    from ._check_jobs import RANK, collapse_skips, run_jobs
    from .harness.report import markdown_table
    from .harness.suite import matches

    devices = _devices(args.device)
    ops = _ops(args.op)
    dtypes = _dtypes(args.dtype) or [getattr(torch, d) for d in CHECK_DTYPES]
    impls = [i for i in registry.implementations(side=args.side) if ops is None or i.op in ops]
    pats = _patterns(args.impl)
    if pats is not None:
        impls = [i for i in impls if any(matches(i, p) for p in pats)]
    if not impls:
        raise UsageError(
            "no implementation matches the filters (see `crossfuse info` and --op/--impl/--side)"
        )
    skips = _patterns(args.skip) or []
    jobs = [(i, dev, dt) for i in impls for dev in devices for dt in dtypes]
    results = []
    t0 = time.monotonic()
    try:
        run_jobs(jobs, CHECK_CASES, skips, args.seed, results)
    except KeyboardInterrupt as exc:  # the rows checked so far are printed, then 130 (143 for SIGTERM)
        interrupted = stop_reason(exc)
    else:
        interrupted = None
    rows = []
    counts = dict.fromkeys(RANK, 0)
    for base, status, fwd, grad, note in collapse_skips(results):
        counts[status] += 1
        rows.append(
            [
                *base,
                status,
                "" if fwd is None else f"{fwd:.1e}",
                "" if grad is None else f"{grad:.1e}",
                note[:300],
            ]
        )
    header = ["op", "impl", "side", "device", "dtype", "status", "max fwd relerr", "max grad relerr", "note"]
    print(markdown_table(header, rows, left=6))
    print(
        f"\n{counts['pass']} pass, {counts['fail']} fail, {counts['error']} error, {counts['skip']} skip "
        f"({time.monotonic() - t0:.1f} s; interpreter {'on' if _backend.interpreter_requested() else 'off'})"
    )
    if interrupted:
        what, code = interrupted
        print(
            f"crossfuse check: {what.split(' (')[0]} after {len(results)} of {len(jobs)} implementation x "
            "device x dtype checks: the table holds those",
            file=sys.stderr,
        )
        return code
    if counts["fail"] or counts["error"]:
        return 1
    if not counts["pass"]:
        print(
            "crossfuse check: error: nothing was checked: every implementation asked for was skipped (the "
            "table's notes say why)",
            file=sys.stderr,
        )
        return NOTHING_DONE
    return 0


# ----------------------------------------------------------------------------------------------------
# bench
# ----------------------------------------------------------------------------------------------------


def cmd_bench(args) -> int:
    from .harness import runner, suite, toolchain

    if args.suite == "models":  # real models rather than a suite of ops (crossfuse.harness.models)
        from ._cli_models import bench_models

        try:
            return bench_models(args, _device(args.device), _dtypes(args.dtype), out_folder(args.out))
        except ValueError as exc:  # a flag that does not apply to it
            raise UsageError(str(exc)) from None
    try:
        suites = suite.load_suites(args.suites)
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if args.suite not in suites:
        raise UsageError(f"unknown suite {args.suite!r}; known suites: {', '.join(suites)}")
    device = _device(args.device)
    dtypes, ops, impls = _dtypes(args.dtype), _ops(args.op), _patterns(args.impl)
    s = suites[args.suite]
    if args.budget_s is not None and not args.budget_s > 0:
        raise UsageError(f"--budget-s must be a number of seconds > 0, got {args.budget_s}")
    rounds = 1 if args.rounds is None else args.rounds
    if rounds < 1:
        raise UsageError(f"--rounds must be >= 1, got {rounds}")
    cpu_threads = 1 if args.threads is None else args.threads
    if cpu_threads < 0:
        raise UsageError(f"--threads must be >= 0 (0: torch's default), got {cpu_threads}")
    if args.append and args.replace:
        raise UsageError("--append and --replace exclude each other")
    if not runner.Runner(device, None, quick=args.quick).plan(s, dtypes, ops, impls):
        raise UsageError(f"no point of suite {s.name!r} matches the filters (--op, --dtype, --impl)")
    out = out_folder(args.out)
    csv_path = out / "results.csv"
    md_path = out / f"{_run_name(s.name, args.quick, device)}.md"
    make_room(csv_path, s.name, md_path, args.append, args.replace)
    threads = torch.get_num_threads()
    if device == "cpu" and cpu_threads:
        torch.set_num_threads(cpu_threads)
    try:
        with ExitStack() as stack:
            if device == "cuda":  # one ptxas builds every kernel of the run (crossfuse.harness.toolchain)
                try:
                    stack.enter_context(toolchain.pinned(args.ptxas))
                except ValueError as exc:
                    raise UsageError(f"--ptxas: {exc}") from None
            return _run_bench(args, s, device, dtypes, ops, impls, out, csv_path, rounds)
    finally:
        torch.set_num_threads(threads)  # as it was: main() may be called in a process that goes on


def _run_name(suite: str, quick: bool, device: str) -> str:
    """The stem of a bench run's markdown: ``layer_norm-quick-cpu``."""
    return f"{suite}{'-quick' if quick else ''}-{device}"


def _run_bench(args, s, device, dtypes, ops, impls, out: Path, csv_path: Path, rounds: int) -> int:
    from .harness import report, runner, timing
    from .harness.progress import Progress
    from .harness.schema import CsvWriter, read_csv, stopped_row, why_partial

    try:
        writer = CsvWriter(csv_path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    deadline = time.monotonic() + args.budget_s if args.budget_s else None
    t0 = time.monotonic()
    stopped, code, crash = None, 0, None  # what cut the run short, the exit code, the exception
    with writer:
        r = runner.Runner(device, writer, quick=args.quick, deadline=deadline, rounds=rounds)
        total = r.count(s, dtypes, ops, impls)
        print(
            f"crossfuse bench {s.name}{' --quick' if args.quick else ''} on {device} ({r.device_name}): "
            f"{total} rows -> {csv_path}",
            file=sys.stderr,
        )
        print(f"times: {timing.method(device)}", file=sys.stderr)
        with Progress(total, s.name) as bar:
            r.on_row = lambda row: bar.update(
                f"{row.op}/{row.side}/{row.impl} {row.dtype} {row.shape} {row.mode} {row.status}"
            )
            try:
                r.run(s, dtypes, ops, impls)
            except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM
                stopped, code = stop_reason(exc)
            except Exception as exc:  # a crash outside any one measurement: its rows are kept, marked
                stopped, code, crash = "crashed", 1, exc
        rows, kept = list(r.rows), writer.count
        if stopped:
            stopped = f"{stopped} after {kept} of {total} rows" + (f": {crash!r}"[:300] if crash else "")
        why = why_partial(rows, stopped)
        if why:
            marker = stopped_row(s.name, device, why)
            writer.write(marker)
            rows.append(marker)
    name = _run_name(s.name, args.quick, device)
    what = "its quick shapes (tiny, for a smoke test)" if args.quick else s.description
    # appended: the report of the whole CSV, earlier runs' rows with this one's, as `crossfuse report` gives
    if args.append:  # this suite's rows of every run in the file (the others' suites are not this report's)
        every = read_csv(csv_path)
        shown = every[every["suite"] == s.name]
    else:
        shown = rows
    md = report.render(shown, title=f"{name}: {what}", source=str(csv_path))
    md_path = out / f"{name}.md"
    md_path.write_text(md)
    if code in (130, 143):
        print(
            f"\n{stopped.split(' (')[0]}: {kept} rows kept in {csv_path}, marked partial; {md_path}",
            file=sys.stderr,
        )
        return code
    if crash is not None:
        print(f"crossfuse bench: {kept} rows kept in {csv_path}, marked partial", file=sys.stderr)
        raise crash
    print(md)
    measured = [
        row
        for row in rows
        if row.op not in ("copy", "run") and (row.status == "ok" or row.relerr is not None)
    ]
    errors = sum(row.status == "error" for row in rows)
    print(
        f"{len(rows)} rows in {time.monotonic() - t0:.1f} s ({errors} error rows) -> {csv_path}, {md_path}"
        + (f"; partial run: {why}" if why else ""),
        file=sys.stderr,
    )
    if not measured:
        print(
            f"crossfuse bench: error: nothing was measured: every row of suite {s.name!r} was skipped or "
            "raised (the report's 'not measured' table says why)",
            file=sys.stderr,
        )
        return NOTHING_DONE
    return 0


# ----------------------------------------------------------------------------------------------------
# report, profile, info
# ----------------------------------------------------------------------------------------------------


def cmd_report(args) -> int:
    from .harness import plots, report
    from .harness.schema import STOPPED, read_csv

    try:
        df = read_csv(args.csv)
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if (df["status"] == STOPPED).all():
        what = "a header and no rows" if df.empty else "only the marker of a run stopped before its first row"
        print(f"crossfuse report: error: {args.csv} holds {what}: nothing to report", file=sys.stderr)
        return NOTHING_DONE
    out = out_folder(args.out) if args.out else Path(args.csv).parent
    md_path = out / "report.md"
    ours = report_source(md_path) is not None  # a report of ours: it and its plots may be rewritten
    if md_path.exists() and not args.force and not ours:
        raise UsageError(
            f"{md_path} exists and was not written by `crossfuse report` (a GPU session's report, "
            "with its profile section, or your own file): pass --force to overwrite it, or --out"
        )
    theirs = [out / n for n in plots.PLOT_NAMES if (out / n).exists()] if not args.no_plots else []
    if theirs and not args.force and not ours:
        raise UsageError(
            f"{', '.join(map(str, theirs))} exist and no report of `crossfuse report` stands beside them: "
            "pass --force to overwrite them, --no-plots, or --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    md = report_mark(args.csv) + "\n"
    md += report.render(df, source=str(args.csv))
    written = [] if args.no_plots else plots.write_plots(df, out)
    if written:
        md += "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in written) + "\n"
    md_path.write_text(md)
    print(md)
    print(f"wrote {out / 'report.md'}" + "".join(f", {p}" for p in written), file=sys.stderr)
    return 0


def cmd_profile(args) -> int:
    from .harness import profile
    from .harness.schema import parse_shape

    device = _device(args.device)
    try:
        shape = parse_shape(args.shape) if args.shape else None
        if shape is not None and len(shape) != 4:
            raise ValueError(f"--shape must be B x H x L x D (4 dims), got {args.shape!r}")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    dtypes = _dtypes([args.dtype] if args.dtype else None)
    if dtypes is not None and len(dtypes) != 1:
        raise UsageError(f"--dtype takes one dtype for a profile, got {args.dtype!r}")
    out = out_folder(args.out)
    res = profile.profile_attention(device, shape, dtypes[0] if dtypes else None, args.causal, out)
    (out / "profile.md").write_text(res.markdown)
    print(res.markdown)
    files = [out / "profile.md", res.trace, res.timeline]
    print("wrote " + ", ".join(str(f) for f in files if f is not None), file=sys.stderr)
    if not any(subject.kernels for subject in res.subjects):
        print(
            "crossfuse profile: error: no implementation was profiled (the table says why)", file=sys.stderr
        )
        return NOTHING_DONE
    return 0


def crossfuse_version() -> str:
    """The installed distribution's version, else (a checkout on ``PYTHONPATH``) the package's."""
    try:
        return importlib.metadata.version("crossfuse")
    except importlib.metadata.PackageNotFoundError:
        from . import __version__

        return __version__


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cmd_info(args) -> int:
    from . import __version__, registry

    print(f"crossfuse {__version__}")
    print(f"python    {platform.python_version()} ({sys.executable})")
    print(f"torch     {torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    print(
        f"triton    {_version('triton')}"
        + (f" ({_backend.triton_missing_reason()})" if not _backend.HAS_TRITON else "")
    )
    print(f"interpreter: TRITON_INTERPRET={'1 (on)' if _backend.interpreter_requested() else 'off'}")
    from .harness.schema import device_name

    print(f"devices:  cpu: {device_name('cpu')}")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            print(f"          cuda:{i}: {torch.cuda.get_device_name(i)}")
    else:
        print("          cuda: not available")
    if _backend.HAS_TRITON:
        from .ops._runtime import native

        why = native.usable_here() or native.missing()
        state = f"built on first CUDA use into {native.cache_dir()}" if why is None else f"off ({why})"
        print(f"eager:    the layer norm's compiled C++ path: {state}")
    impls = registry.implementations()
    print(f"registry: {len(impls)} implementations of {len(registry.OPS)} ops ({', '.join(registry.OPS)})")
    julia = [i for i in impls if i.side == "julia"]
    if not julia:
        print(
            "julia:    no Julia entries registered (the crossfuse_julia plugin is not installed, failed to "
            "load, or CROSSFUSE_PLUGINS=0)"
        )
    else:
        reasons: dict = {}
        for i in julia:
            for dev in _devices(None):
                reasons.setdefault(i.unavailable_reason(dev) or "available", []).append(f"{i.key}@{dev}")
        for reason, keys in reasons.items():
            more = ", ..." if len(keys) > 4 else ""
            print(f"julia:    {reason}: {len(keys)} entries ({', '.join(keys[:4])}{more})")
    return 0


# ----------------------------------------------------------------------------------------------------


def _seed(text: str) -> int:
    """``--seed``: an integer a torch.Generator takes (0 to 2^63 - 1), else argparse's usage error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"an integer expected, got {text!r}") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be from 0 to 2^63 - 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from .harness import toolchain

    p = argparse.ArgumentParser(
        prog="crossfuse", description="crossfuse: check, benchmark and profile the registered implementations"
    )
    p.add_argument("--version", action="version", version=f"crossfuse {crossfuse_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="{check,bench,report,profile,info}")

    c = sub.add_parser("check", help="every implementation against the float64 reference")
    c.add_argument("--device", help="cpu or cuda (default: cpu, and cuda when available)")
    c.add_argument("--op", action="append", help="only these ops (repeat or comma-separate)")
    c.add_argument(
        "--impl", action="append", help="only implementations matching (fnmatch on name, or side/name)"
    )
    c.add_argument(
        "--skip", action="append", help="skip implementations whose name matches, e.g. '*compile*'"
    )
    c.add_argument("--dtype", action="append", help=f"dtypes (default: {', '.join(CHECK_DTYPES)})")
    c.add_argument("--side", choices=("python", "julia"), help="only one side")
    c.add_argument(
        "--seed",
        type=_seed,
        help="seed of the random inputs, 0 to 2^63 - 1 (default: fresh, printed on failure)",
    )
    c.set_defaults(func=cmd_check)

    b = sub.add_parser("bench", help="run a benchmark suite (crossfuse.harness.suites), or `models`")
    b.add_argument(
        "suite", help="suite name (layer_norm, attention, memory, layer_norm_grid, attention_grid, ...), or "
        "'models' (real models, see docs)"
    )
    b.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    b.add_argument("--dtype", action="append", help="only these dtypes")
    b.add_argument("--op", action="append", help="only these ops")
    b.add_argument(
        "--impl", action="append", help="only implementations matching (fnmatch on name, or side/name)"
    )
    b.add_argument("--quick", action="store_true", help="tiny shapes, short timing (for the CPU)")
    b.add_argument(
        "--out", default="out/bench", help="output folder (default out/bench); see --append, --replace"
    )
    b.add_argument("--suites", help="suite file (default: the suites shipped in crossfuse.harness.suites)")
    b.add_argument(
        "--budget-s", type=float,
        help="stop measuring after this many seconds (later rows: skip rows saying so; default: no limit); "
        "not for `models`",
    )  # fmt: skip
    b.add_argument(
        "--rounds",
        type=int,
        help="measure each point's implementations this many times, each round in another order, and keep "
        "each one's median round (default 1: one measurement each, in the registry's order; `models`: 5, "
        "2 with --quick)",
    )
    b.add_argument(
        "--threads",
        type=int,
        help="torch's CPU threads while timing on the CPU (default 1: a pool of threads on a busy machine "
        "turns some calls into waits of milliseconds; 0: torch's default); not for `models`",
    )
    toolchain.add_argument(b, "on cuda, ")
    b.add_argument(
        "--append", action="store_true", help="add to an OUT/results.csv that already holds this suite's rows"
    )
    b.add_argument(
        "--replace", action="store_true",
        help="start OUT/results.csv (`models`: its CSV and markdown) anew, the old files kept, dated",
    )  # fmt: skip
    b.set_defaults(func=cmd_bench)

    r = sub.add_parser("report", help="markdown tables and plots from a result CSV")
    r.add_argument("csv", help="a result CSV written by `crossfuse bench`")
    r.add_argument("--out", help="output folder (default: the CSV's folder)")
    r.add_argument("--no-plots", action="store_true", help="markdown only")
    r.add_argument(
        "--force", action="store_true", help="overwrite any report.md and plots there, whoever wrote them"
    )
    r.set_defaults(func=cmd_report)

    pr = sub.add_parser("profile", help="PyTorch profiler tables, Chrome trace and timeline")
    pr.add_argument("what", choices=("attention",), help="what to profile")
    pr.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    pr.add_argument("--shape", help="B x H x L x D, e.g. 4x16x4096x128")
    pr.add_argument("--dtype", help="dtype (default: bfloat16 on cuda, float32 on cpu)")
    pr.add_argument("--causal", action="store_true")
    pr.add_argument("--out", default="out/profile", help="output folder (default out/profile)")
    pr.set_defaults(func=cmd_profile)

    i = sub.add_parser("info", help="versions, devices, interpreter, Julia availability")
    i.set_defaults(func=cmd_info)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or bad usage (2)
        return int(exc.code) if isinstance(exc.code, int) else 2
    try:
        with sigterm_as_interrupt():  # SIGTERM keeps what Ctrl-C keeps
            return args.func(args)
    except (UsageError, OSError) as exc:  # OSError: an output folder or file that cannot be written
        print(f"crossfuse {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        what, code = stop_reason(exc)
        print(f"\n{what}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
