"""The output of ``crossfuse bench models`` (:mod:`crossfuse.harness.models`): its CSV and markdown,
written as each case ends, and what an interrupt keeps."""

from __future__ import annotations

import csv
import dataclasses
import math
import sys
import time
from pathlib import Path

import torch

from .models import AGAIN, COLUMNS, ModelsConfig, Row, run_models
from .schema import stop_reason


def write_csv(rows: list[Row], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if v is None else (repr(v) if isinstance(v, float) else v)
                        for k, v in dataclasses.asdict(r).items()})  # fmt: skip


def _f(v, unit: str = "", digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{v:.{digits}g}{unit}"


def render(rows: list[Row], title: str, stopped: str | None = None) -> str:
    """The markdown report: the models table, the blocks table, then what was not measured; ``stopped``:
    why the run ended before its last case (a line says so first)."""
    from .report import markdown_table

    parts = [f"## {title}"]
    if stopped:
        parts.append(f"**Partial run**: {stopped}. The tables hold only the cases measured before it "
                     "stopped.")  # fmt: skip
    if rows:
        r0 = rows[0]
        parts.append(f"- {r0.device}: {r0.device_name}; {r0.dtype}; eager; versions: {r0.versions}\n"
                     "- train: zero_grad(set_to_none) + forward + loss + backward, no optimizer step; infer: "
                     "forward under no_grad; times are medians over rounds of eager medians, the "
                     "implementations' batches interleaved in each round "
                     "(crossfuse.harness.timing.time_cuda_eager_interleaved); speed = the median over the "
                     "rounds of torch's time / this one's in the same round "
                     "(> 1: faster)\n- errors: relative, of the loss and of all gradients as one vector "
                     "(‖g − g_ref‖/‖g_ref‖), against the unswapped model in the same dtype and against a "
                     "float32 copy\n- torch again (A/A control): the unswapped model a second time, timed "
                     "alongside; its speed is the run's noise: a crossfuse speed within its distance of 1× "
                     "is no measured difference")  # fmt: skip
    for table, ref in (("models", "torch"), ("blocks", "torch_relu")):
        rs = [r for r in rows if r.table == table and r.status in ("ok", "not timed")]
        if not rs:
            continue
        header = ["model", "case", "impl", "train ms", "train speed", "infer ms", "infer speed", "peak MiB",
                  f"loss err vs {ref}", f"grad err vs {ref}", "loss err vs fp32",
                  "grad err vs fp32"]  # fmt: skip
        at = header.index("peak MiB")  # the blocks' crossfuse against the speed peer, paired, before it
        if table == "blocks":
            header[at:at] = ["train vs torch_sdpa", "infer vs torch_sdpa"]
        body = []
        for r in rs:
            impl = r.impl + (f" ({r.swapped} LN swapped)" if r.swapped is not None else "")
            if r.impl == AGAIN:
                impl = "torch again (A/A control)"
            body.append([r.model, f"{r.case} (B={r.batch}, L={r.seq})", impl, _f(r.train_ms),
                         _f(r.train_speedup, "×"), _f(r.infer_ms), _f(r.infer_speedup, "×"),
                         _f(r.peak_mib, digits=4), _f(r.loss_err_vs_torch, digits=2),
                         _f(r.grad_err_vs_torch, digits=2), _f(r.loss_err_vs_fp32, digits=2),
                         _f(r.grad_err_vs_fp32, digits=2)])  # fmt: skip
            if table == "blocks":
                body[-1][at:at] = [_f(r.train_vs_peer, "×"), _f(r.infer_vs_peer, "×")]
        if table == "models":
            what = "### models: every nn.LayerNorm swapped for crossfuse.nn.LayerNorm, against the unswapped"
        else:
            what = ("### pre-norm blocks: crossfuse LayerNorm + ReLUAttention, against the same math in "
                    "torch (torch_relu) and torch LayerNorm + SDPA (torch_sdpa, speed peer)")  # fmt: skip
        parts.append(what + "\n\n" + markdown_table(header, body, left=3))
    missing = [r for r in rows if r.status not in ("ok", "not timed") or r.note]
    if missing:
        body = [[r.table, r.model, r.case, r.impl, r.status, r.note] for r in missing]
        header = ["table", "model", "case", "impl", "status", "why"]
        parts.append("### notes\n\n" + markdown_table(header, body, left=6))
    return "\n\n".join(parts) + "\n"


def bench_models(cfg: ModelsConfig, out: Path, stream=None) -> tuple[list[Row], Path, Path]:
    """Run :func:`run_models` and write its CSV and markdown into ``out``; progress lines go to ``stream``
    (default stderr). Returns the rows and the two paths."""
    stream, out = stream or sys.stderr, Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    def say(text: str) -> None:
        print(f"[models {time.monotonic() - t0:6.1f} s] {text}", file=stream, flush=True)

    csv_path, md_path = output_paths(cfg, out)
    stem = csv_path.stem
    title = f"{stem}: {'tiny configurations (a smoke test)' if cfg.quick else 'real model sizes'}"
    rows: list[Row] = []

    def keep(new: list[Row], stopped: str | None = None) -> None:  # both files, as each case ends
        rows.extend(new)
        write_csv(rows, csv_path)
        md_path.write_text(render(rows, title, stopped))

    try:
        run_models(cfg, say, keep)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM
        reason, code = stop_reason(exc)
        keep([], reason)
        raise Interrupted(rows, csv_path, md_path, reason, code) from exc
    keep([])
    return rows, csv_path, md_path


def output_paths(cfg: ModelsConfig, out: Path) -> tuple[Path, Path]:
    """The CSV and markdown :func:`bench_models` writes into ``out``."""
    stem = f"models{'-quick' if cfg.quick else ''}-{torch.device(cfg.device).type}"
    return Path(out) / f"{stem}.csv", Path(out) / f"{stem}.md"


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during :func:`bench_models`: the cases measured before it are in ``csv_path`` and
    ``md_path`` (marked as a partial run); ``reason`` and ``code`` as :func:`.schema.stop_reason` gives."""

    def __init__(self, rows: list[Row], csv_path: Path, md_path: Path, reason: str, code: int):
        super().__init__(f"{len(rows)} rows kept in {csv_path} and {md_path}")
        self.rows, self.csv_path, self.md_path = rows, csv_path, md_path
        self.reason, self.code = reason, code
