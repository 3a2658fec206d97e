"""One GPU session: every suite, the copy ceiling and the attention profile, in one call of at most
~6 minutes (a budget of 330 s by default, plus start-up).

    PYTHONUNBUFFERED=1 python bench/gpu_session.py OUT [--budget-s 330] [--stages a,b] [--quick]
                                                       [--ptxas torch|triton|PATH|unpinned] [--rounds N]

Stages, in order: ``layer_norm`` on cuda (its first row is the copy ceiling: a 1 GiB bf16 device copy),
``attention`` on cuda, ``memory`` on cuda and on the cpu, ``crossfuse profile attention`` on cuda, then
the report. Each stage has a deadline (its share of ``--budget-s``): what a stage cannot measure in
time becomes ``skip`` rows ("time budget"), and time a stage leaves over goes to the next.
``--stages`` runs a subset (e.g. two calls: ``layer_norm,memory-cuda,memory-cpu`` and
``attention,profile``), appending to the same CSV. Rows are appended to the CSV as each point's
implementations are measured (with ``--rounds``, as its rounds end), so a killed session keeps everything
measured so far.

Writes into OUT, flat, 7 files: ``results.csv`` (all suites), ``report.md`` (tables + profile),
``layer_norm_gbps.png``, ``attention_tflops.png``, ``memory.png``, ``profile_timeline.png``,
``profile_trace.json``. Needs no installation: it imports crossfuse from this checkout's ``python/``.
``--quick`` runs the quick suites (a check of this script on a CPU-only machine).

On a GPU the session first pins the ptxas that builds every Triton kernel it compiles, ours and the peers'
(``--ptxas``, default torch's bundled one where torch ships it): unpinned, torch.compile's first compile
would switch it from Triton's own to torch's mid-session, and the two builds of one kernel can differ by
several % (``crossfuse.harness.toolchain``). Every row's ``versions`` names the ptxas in use.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
os.environ.setdefault("PYTHONUNBUFFERED", "1")

from crossfuse import _backend, registry  # noqa: E402

_backend.enable_interpreter_if_no_gpu()  # before anything imports triton

import torch  # noqa: E402
from crossfuse.harness import plots, profile, report, runner, suite, timing, toolchain  # noqa: E402
from crossfuse.harness.progress import Progress  # noqa: E402
from crossfuse.harness.schema import CsvWriter, read_csv, versions  # noqa: E402

# This script needs no installation, so the crossfuse_julia plugin may not be registered: then the
# checkout's bridge/ registers the Julia entries, which become skip rows with their reason where Julia
# cannot run (without them the report would have no Julia rows and not say why).
if not registry.implementations(side="julia"):
    sys.path.insert(0, str(ROOT / "bridge"))
    from crossfuse_julia.registry import register as _register_julia

    _register_julia(registry)

T0 = time.monotonic()

# (stage, suite or "profile", device, share of the budget): a stage's deadline is the start plus the
# budget times the shares up to and including it, so time an early stage leaves over goes to the next.
STAGES = (
    ("layer_norm", "layer_norm", "cuda", 0.38),
    ("attention", "attention", "cuda", 0.37),
    ("memory-cuda", "memory", "cuda", 0.08),
    ("memory-cpu", "memory", "cpu", 0.10),
    ("profile", "profile", "cuda", 0.07),
)
REPORT_S = 10.0  # kept back for the report and plots
GPU_TIMING = timing.TimingConfig(
    cuda_warmup_ms=5.0, cuda_rep_ms=25.0, cuda_min_reps=10, cuda_max_reps=100, cpu_rep_s=0.1, cpu_min_reps=3
)
# the CPU memory stage is about bytes: three timed calls each are enough
CPU_MEMORY_TIMING = timing.TimingConfig(cpu_warmup_s=0.0, cpu_rep_s=0.0, cpu_min_reps=3, cpu_max_reps=3)


def log(msg: str) -> None:
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    print(f"[{time.monotonic() - T0:6.1f} s {stamp}] {msg}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output folder (flat)")
    ap.add_argument("--budget-s", type=float, default=330.0, help="wall-clock budget of the whole session")
    ap.add_argument("--quick", action="store_true", help="quick suites (to check this script on a CPU)")
    names = [st[0] for st in STAGES]
    ap.add_argument("--stages", default=",".join(names), help=f"comma-separated subset of {','.join(names)}")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure each point's implementations this many times, each round in another order, keeping "
        "each one's median round (crossfuse.harness.runner); a stage's deadline stays as it is, so more "
        "rounds may leave its last points as 'time budget' skip rows: raise --budget-s with them",
    )
    toolchain.add_argument(ap, "on cuda, ")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    chosen = [n for n in args.stages.split(",") if n]
    unknown = set(chosen) - set(names)
    if unknown:
        ap.error(f"unknown stages {sorted(unknown)}; known: {', '.join(names)}")
    stages = [st for st in STAGES if st[0] in chosen]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    if cuda:  # before anything compiles: every kernel of the session built by one ptxas
        toolchain.pin_for(ap, args.ptxas)
    log(f"crossfuse GPU session -> {out}; {versions()}; interpreter={_backend.interpreter_requested()}")
    log(f"devices: cuda={torch.cuda.get_device_name(0) if cuda else 'none'}; budget {args.budget_s:.0f} s")
    suites = suite.load_suites()
    csv_path = out / "results.csv"
    prof_md = ""
    total_share = sum(st[3] for st in stages)
    share = 0.0
    with CsvWriter(csv_path) as writer:
        for stage, what, device, frac in stages:
            share += frac
            deadline = T0 + (args.budget_s - REPORT_S) * share / total_share
            if device == "cuda" and not cuda:
                if what == "memory":
                    log(f"{stage}: no CUDA device (the cpu memory stage covers the cpu)")
                    continue
                log(f"{stage}: no CUDA device, running on the cpu instead")
                device = "cpu"
            log(f"== {stage} on {device}: {deadline - time.monotonic():.0f} s until its deadline")
            try:
                if what == "profile":
                    res = profile.profile_attention(device, out_dir=out)
                    prof_md = res.markdown
                    for s in res.subjects:
                        why = f" ({s.reason})" if s.reason else ""
                        log(f"profile {s.label}: {len(s.kernels)} kernels{why}")
                    continue
                r = runner.Runner(device, writer, quick=args.quick, deadline=deadline, rounds=args.rounds)
                if not args.quick:
                    r.config = CPU_MEMORY_TIMING if (what, device) == ("memory", "cpu") else GPU_TIMING
                s = suites[what]
                with Progress(r.count(s), f"{stage}/{device}", style="lines", stream=sys.stdout) as bar:
                    r.on_row = lambda row, bar=bar: bar.update(
                        f"{row.op}/{row.side}/{row.impl} {row.dtype} {row.shape}"
                        f"{' causal' if row.causal else ''} {row.mode}: {row.status}"
                        + (f" {row.ms_p50:.4g} ms" if row.ms_p50 is not None else "")
                        + (f" {row.note[:90]}" if row.status != "ok" else "")
                    )
                    rows = r.run(s)
                counts = {k: sum(x.status == k for x in rows) for k in ("ok", "not timed", "skip", "error")}
                log(f"{stage} on {device}: {len(rows)} rows {counts}")
            except KeyboardInterrupt:
                raise
            except Exception:  # a broken stage must not cost the others their time
                log(f"{stage} on {device} FAILED:\n{traceback.format_exc()}")
            finally:
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
    log("== report")
    df = read_csv(csv_path)
    written = plots.write_plots(df, out)
    md = report.render(df, title="crossfuse GPU session", source=csv_path.name)
    md += "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in written) + "\n"
    if prof_md:
        md += "\n" + prof_md + "\n![profile timeline](profile_timeline.png)\n"
    (out / "report.md").write_text(md)
    files = sorted(p.name for p in out.iterdir())
    log(f"done: {len(df)} rows; {len(files)} files in {out}: {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
