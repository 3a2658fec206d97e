"""``crossfuse bench models``: the one bench name that is not a suite of ops (kept apart from
:mod:`crossfuse.cli` so that the command line's module stays readable in one sitting)."""

from __future__ import annotations

import sys

import torch


def bench_models(args) -> int:
    """``crossfuse bench models``: see :mod:`crossfuse.harness.models`. ``--rounds`` above 1 sets the
    rounds (default 5, 2 with --quick); --op, --impl, --suites, --append and --replace do not apply."""
    from .cli import UsageError, _device, _dtypes, _out_folder
    from .harness import models

    given = [f for f, v in (("--op", args.op), ("--impl", args.impl), ("--suites", args.suites),
                            ("--append", args.append), ("--replace", args.replace)) if v]  # fmt: skip
    if given:
        raise UsageError(f"{', '.join(given)} do not apply to `crossfuse bench models`")
    dtypes = _dtypes(args.dtype) or [torch.bfloat16]
    if len(dtypes) != 1:
        raise UsageError(f"`crossfuse bench models` takes one --dtype, got {len(dtypes)}")
    if args.rounds < 1:
        raise UsageError(f"--rounds must be >= 1, got {args.rounds}")
    rounds = args.rounds if args.rounds > 1 else (2 if args.quick else 5)
    cfg = models.ModelsConfig(device=_device(args.device), dtype=dtypes[0], quick=args.quick, rounds=rounds)
    out = _out_folder(args.out)
    try:
        rows, csv_path, md_path = models.bench_models(cfg, out)
    except KeyboardInterrupt:
        print("\ninterrupted: `bench models` writes its files at the end, none written", file=sys.stderr)
        return 130
    print(md_path.read_text())
    errors = sum(r.status == "error" for r in rows)
    print(f"{len(rows)} rows ({errors} error rows) -> {csv_path}, {md_path}", file=sys.stderr)
    return 0
