"""Probe: the chunked layer-norm forward ending on row pieces (``tail_per_sm``, ``tail_pieces``).

Run 88 (``bench/probe_ln_fwd_rows.py``) timed the bf16 forward of 16384-column rows at 3960–8192 rows:
no step at multiples of the SM count, but a fixed cost of ~9 µs per call (4096 rows 71.4 µs, 8192 rows
133.4 µs: the second 4096 rows at 4329 GB/s). Part of it is the kernel's end, where each SM's last
whole-row programs run with fewer and fewer beside them. With ``tail_pieces`` = P the last
``tail_per_sm`` × (SM count) rows are written by P programs each (each computes the row's statistics
from the whole row, from L2 after the first, and writes every P-th chunk), so the kernel ends on
shorter programs. This probe alternates the code's configuration with such tails at the few-row shapes
of the chunked forward, ``--rounds`` times, medians of the sessions' GPU timer, and checks that every
variant's outputs equal the code's bit for bit.

    python bench/probe_ln_fwd_tail.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

SHAPES = (
    ("bfloat16", 4096, 16384),
    ("float32", 4096, 16384),
    ("bfloat16", 4096, 8192),
    ("float32", 4096, 8192),
)
TAILS = ((0, 2), (1, 2), (2, 2), (4, 2), (0, 4), (1, 4), (2, 4), (32, 2))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    import torch
    import triton
    from crossfuse.harness import timing
    from crossfuse.ops import layer_norm as ln

    cfgt = timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=40.0, cuda_min_reps=10, cuda_max_reps=200)
    for dname, m, n in SHAPES:
        dtype = getattr(torch, dname)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
        code = ln.launch_config(n, dtype, "fwd", m)
        if n <= code.block_n:
            print(f"{dname} {m}x{n}: the code's forward is not the chunked kernel ({code}); skipped")
            continue
        chunks = triton.cdiv(n, code.block_n)
        configs = {"code": code}
        for per_sm, pieces in TAILS:
            if pieces <= chunks:
                configs[f"tail {per_sm}/SM x{pieces}"] = code._replace(tail_per_sm=per_sm, tail_pieces=pieces)
        ref = ln.layer_norm_fwd(x, w, b, 1e-5, config=code)
        bad = []
        for name, cfg in configs.items():
            out = ln.layer_norm_fwd(x, w, b, 1e-5, config=cfg)
            if not all(torch.equal(a, c) for a, c in zip(out, ref, strict=True)):
                bad.append(name)
        times = {name: [] for name in configs}
        for _ in range(args.rounds):
            for name, cfg in configs.items():
                fn = lambda cfg=cfg, x=x, w=w, b=b: ln.layer_norm_fwd(x, w, b, 1e-5, config=cfg)  # noqa: E731
                times[name].append(timing.time_cuda(fn, config=cfgt).p50)
        base = statistics.median(times["code"])
        print(f"{dname} {m}x{n} (code: {code.block_n} x {code.num_warps} warps, unroll {code.unroll}, "
              f"shifted {code.shifted}; {chunks} chunks){'; NOT EQUAL: ' + ', '.join(bad) if bad else ''}",
              flush=True)  # fmt: skip
        for name in configs:
            t = statistics.median(times[name])
            gbs = 2 * m * n * dtype.itemsize / t / 1e6
            print(f"  {gbs:7.0f} GB/s {t * 1e3:7.1f} us {base / t:6.3f}  {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
