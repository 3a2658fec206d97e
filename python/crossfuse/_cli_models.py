"""``crossfuse bench models``: the one bench name that is not a suite of ops (kept apart from
:mod:`crossfuse.cli` so that the command line's module stays readable in one sitting)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def bench_models(args, device: str, dtypes: list | None, out: Path) -> int:
    """``crossfuse bench models``: see :mod:`crossfuse.harness.models`. ``--rounds`` above 1 sets the
    rounds (default 5, 2 with --quick); --op, --impl, --suites, --append and --replace do not apply (a
    ``ValueError`` the command line reports as a usage error). ``device``, ``dtypes`` and ``out``: the
    command line's reading of --device, --dtype and --out."""
    from .harness import models

    given = [f for f, v in (("--op", args.op), ("--impl", args.impl), ("--suites", args.suites),
                            ("--append", args.append), ("--replace", args.replace)) if v]  # fmt: skip
    if given:
        raise ValueError(f"{', '.join(given)} do not apply to `crossfuse bench models`")
    dtypes = dtypes or [torch.bfloat16]
    if len(dtypes) != 1:
        raise ValueError(f"`crossfuse bench models` takes one --dtype, got {len(dtypes)}")
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    rounds = args.rounds if args.rounds > 1 else (2 if args.quick else 5)
    cfg = models.ModelsConfig(device=device, dtype=dtypes[0], quick=args.quick, rounds=rounds)
    try:
        rows, csv_path, md_path = models.bench_models(cfg, out)
    except models.Interrupted as stop:
        print(f"\ninterrupted: the {len(stop.rows)} rows measured so far are in {stop.csv_path} and "
              f"{stop.md_path}", file=sys.stderr)  # fmt: skip
        return 130
    print(md_path.read_text())
    errors = sum(r.status == "error" for r in rows)
    print(f"{len(rows)} rows ({errors} error rows) -> {csv_path}, {md_path}", file=sys.stderr)
    return 0
