"""``crossfuse bench models``: the one bench name that is not a suite of ops (kept apart from
:mod:`crossfuse.cli` so that the command line's module stays readable in one sitting)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def bench_models(args, device: str, dtypes: list | None, out: Path) -> int:
    """``crossfuse bench models``: see :mod:`crossfuse.harness.models`. ``--rounds`` sets the rounds
    (default 5, 2 with --quick); an earlier run's files in ``out`` are refused unless ``--replace`` (then
    kept under dated names); --op, --impl, --suites, --append, --budget-s and --threads do not apply (a
    ``ValueError`` the command line reports as a usage error). ``device``, ``dtypes`` and ``out``: the
    command line's reading of --device, --dtype and --out."""
    from ._cli_out import keep_earlier
    from .harness import models, models_out

    given = [f for f, v in (("--op", args.op), ("--impl", args.impl), ("--suites", args.suites),
                            ("--append", args.append), ("--budget-s", args.budget_s is not None),
                            ("--threads", args.threads is not None)) if v]  # fmt: skip
    if given:
        raise ValueError(f"{', '.join(given)} do not apply to `crossfuse bench models`")
    dtypes = dtypes or [torch.bfloat16]
    if len(dtypes) != 1:
        raise ValueError(f"`crossfuse bench models` takes one --dtype, got {len(dtypes)}")
    rounds = args.rounds if args.rounds is not None else (2 if args.quick else 5)
    if rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {rounds}")
    cfg = models.ModelsConfig(device=device, dtype=dtypes[0], quick=args.quick, rounds=rounds)
    files = models_out.output_paths(cfg, out)
    earlier = [p for p in files if p.exists()]
    if earlier and not args.replace:
        raise ValueError(f"{earlier[0]} holds an earlier run's results: pass --replace to start anew (the "
                         "earlier files kept under dated names), or another --out")  # fmt: skip
    for old, kept in keep_earlier(list(files)):
        print(f"crossfuse bench: the earlier {old} is kept as {kept}", file=sys.stderr)
    try:
        rows, csv_path, md_path = models_out.bench_models(cfg, out)
    except models_out.Interrupted as stop:
        print(f"\n{stop.reason}: the {len(stop.rows)} rows measured so far are in {stop.csv_path} and "
              f"{stop.md_path}", file=sys.stderr)  # fmt: skip
        return stop.code
    print(md_path.read_text())
    errors = sum(r.status == "error" for r in rows)
    print(f"{len(rows)} rows ({errors} error rows) -> {csv_path}, {md_path}", file=sys.stderr)
    return 0
