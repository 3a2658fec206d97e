"""Probe: the causal attention forward's program order (``relu_attention.CAUSAL_GROUP_BYTES``).

The forward's grid is (query blocks, B·H), launched with the query blocks varying fastest and each
(batch, head) pair's heaviest causal block first: so the last pair's heaviest block starts near the end
and the kernel ends on it. Ordering the programs by groups of pairs (the heaviest blocks of every pair of
a group first, ``_block_order``) makes the kernel end on light blocks, while a group's keys and values
(``CAUSAL_GROUP_BYTES``) stay in L2. This probe alternates group sizes of one pair (the order before) and
of 4, 16 and 64 MiB of keys and values at the sessions' causal bf16 shapes (16k tokens; D=64 with H=32,
D=128 with H=16), ``--rounds`` times, medians of the sessions' GPU timer, and checks each output against
the one-pair order's.

    python bench/probe_attn_order.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

TOKENS = 16384
GROUP_BYTES = (0, 4 << 20, 16 << 20, 64 << 20)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    import torch
    from crossfuse.harness import timing
    from crossfuse.ops import relu_attention as ra

    cfgt = timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=40.0, cuda_min_reps=10, cuda_max_reps=200)
    for d, h in ((64, 32), (128, 16)):
        for length in (1024, 4096, 16384):
            b = TOKENS // length
            q, k, v = (torch.randn((b, h, length, d), device="cuda", dtype=torch.bfloat16) for _ in range(3))
            kw = dict(causal=True, squared=False, scale=1 / math.sqrt(d), relu_scale=1 / length)

            def call(gb, q=q, k=k, v=v, kw=kw):
                ra.CAUSAL_GROUP_BYTES = gb
                return ra.relu_attention_fwd(q, k, v, **kw)

            ref = call(0)
            errs = {gb: (call(gb).float() - ref.float()).abs().max().item() for gb in GROUP_BYTES}
            times = {gb: [] for gb in GROUP_BYTES}
            for _ in range(args.rounds):
                for gb in GROUP_BYTES:
                    ra.CAUSAL_GROUP_BYTES = gb
                    times[gb].append(timing.time_cuda(lambda gb=gb: call(gb), config=cfgt).p50)
            flops = 2 * b * h * length * length * d
            base = statistics.median(times[0])
            cells = []
            for gb in GROUP_BYTES:
                ra.CAUSAL_GROUP_BYTES = gb
                t = statistics.median(times[gb])
                pairs, tf = ra._causal_group(k), flops / t / 1e9
                cells.append(f"{gb >> 20} MiB ({pairs} pairs) {tf:.0f} {base / t:.3f} [{errs[gb]:.0e}]")
            print(f"D={d} L={length} causal: " + " | ".join(cells), flush=True)
    ra.CAUSAL_GROUP_BYTES = 16 << 20
    return 0


if __name__ == "__main__":
    sys.exit(main())
