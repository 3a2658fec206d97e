"""Probe: the D=128 attention forward with a register cap (``AttnConfig.maxnreg``), so that two 8-warp
programs fit on an SM.

Compiled here for sm_90 (Triton 3.6): the code's short-sequence forward (pointer kernel, 64×64 tiles, 4
warps, 3 stages) takes 247 registers per thread and 80 KB of shared memory, so two 4-warp programs per
SM: 8 warps to hide each step's loads and the first loads and last store of each program, which at L=1024
(16 key blocks per program) weigh 4× what they weigh at L=4096. The descriptor kernel with 128×64 tiles,
8 warps and 2 stages takes 138 registers (one program per SM) and 122 with ``maxnreg=128``, without
spilling (two programs of 8 warps per SM, 96 KB of shared memory each). This probe alternates the code's
forward with such configurations at the sessions' D=128 bf16 shapes (16k tokens, H=16), ``--rounds``
times, medians of the sessions' GPU timer, and checks each against the code's output.

    python bench/probe_attn_fwd_regs.py [--rounds 3] [--lengths 1024,4096,16384]
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

TOKENS = 16384
# (name, block_m, block_n, warps, stages, tma, maxnreg)
VARIANTS = (
    ("tma 128x64 8w 2st", 128, 64, 8, 2, True, 0),
    ("tma 128x64 8w 2st r128", 128, 64, 8, 2, True, 128),
    ("tma 128x64 8w 3st r128", 128, 64, 8, 3, True, 128),
    ("ptr 128x64 8w 2st r128", 128, 64, 8, 2, False, 128),
    ("tma 128x32 8w 3st", 128, 32, 8, 3, True, 0),
    ("tma 64x64 4w 2st", 64, 64, 4, 2, True, 0),
    ("ptr 64x64 4w 2st r168", 64, 64, 4, 2, False, 168),
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lengths", default="1024,4096,16384")
    args = ap.parse_args(argv)
    import torch
    from crossfuse.harness import timing
    from crossfuse.ops import relu_attention as ra

    cfgt = timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=40.0, cuda_min_reps=10, cuda_max_reps=200)
    d, h = 128, 16
    for length in (int(x) for x in args.lengths.split(",")):
        b = TOKENS // length
        q, k, v = (torch.randn((b, h, length, d), device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for causal in (False, True):
            kw = dict(causal=causal, squared=False, scale=1 / math.sqrt(d), relu_scale=1 / length)
            code = ra.attention_config("fwd", d, q.dtype, causal, False, length)
            configs = {"code": code}
            for name, bm, bn, warps, stages, tma, maxnreg in VARIANTS:
                configs[name] = ra.AttnConfig(bm, bn, warps, stages, tma=tma, maxnreg=maxnreg)
            ref = ra.relu_attention_fwd(q, k, v, **kw, config=code)
            calls, notes = {}, {}
            for name, cfg in configs.items():
                fn = functools.partial(ra.relu_attention_fwd, q, k, v, **kw, config=cfg)
                try:
                    out = fn()
                except Exception as e:  # a launch that does not fit: say so, time the rest
                    notes[name] = f"failed: {type(e).__name__}: {str(e)[:100]}"
                    continue
                notes[name] = f"max |d| {(out.float() - ref.float()).abs().max().item():.1e}"
                calls[name] = fn
            times = {name: [] for name in calls}
            for _ in range(args.rounds):
                for name, fn in calls.items():
                    times[name].append(timing.time_cuda(fn, config=cfgt).p50)
            flops = 4 * b * h * length * length * d * (0.5 if causal else 1.0)
            base = statistics.median(times["code"])
            print(f"D={d} L={length} causal={causal} (code: {tuple(code)})", flush=True)
            for name in configs:
                if name not in times:
                    print(f"  {name:24s} {notes[name]}", flush=True)
                    continue
                t = statistics.median(times[name])
                tf = flops / t / 1e9
                print(f"  {name:24s} {tf:6.0f} TFLOP/s {base / t:6.3f}  ({notes[name]})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
