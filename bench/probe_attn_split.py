"""Probe: the forward with split tiles (``AttnConfig.split``) against the code's forward and SDPA.

Programs sharing an SM run equal query tiles, so they start and end together: each program's first loads
and last store leave the tensor cores idle at the same moments (at L=1024, 16 key blocks per program, ~3 µs
of each ~15 µs program beyond what the per-block rate at L=4096 accounts for). With ``split`` = S, the
first S x SMs tiles are each done by two programs, one launched first with a Fibonacci-hashed share of the
tile's key blocks and one launched last with the rest (the second to finish adds the two float32 sums), so
that the programs that follow on each SM start out of step, and the kernel ends on short programs.

This probe alternates, at the sessions' bf16 shapes (16k tokens; H=32 for D=64, 16 for D=128), the
code's forward, split 1, 2 and 4 of the code's tile, the same for the other kernel kind (pointers or
descriptors) with the code's tile, and SDPA's softmax forward; medians of ``--rounds`` alternations of
the sessions' GPU timer, TFLOP/s (4·B·H·L²·D, halved when causal), ratios to the code's and to SDPA's,
and the largest difference from the code's output.

    python bench/probe_attn_split.py [--rounds 3] [--lengths 1024,4096,16384] [--dims 128,64]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

TOKENS = 16384


def _forward(ra, tensors, kw, cfg):
    q, k, v = tensors
    return lambda: ra.relu_attention_fwd(q, k, v, **kw, config=cfg)


def _sdpa(tensors, causal):
    import torch.nn.functional as F

    return lambda: F.scaled_dot_product_attention(*tensors, is_causal=causal)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lengths", default="1024,4096,16384")
    ap.add_argument("--dims", default="128,64")
    ap.add_argument("--splits", default="1,2,4")
    args = ap.parse_args(argv)
    import torch
    from crossfuse.harness import timing
    from crossfuse.ops import relu_attention as ra

    cfgt = timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=40.0, cuda_min_reps=5, cuda_max_reps=100)
    splits = [int(x) for x in args.splits.split(",")]
    for d in (int(x) for x in args.dims.split(",")):
        h = 16 if d == 128 else 32
        for length in (int(x) for x in args.lengths.split(",")):
            b = TOKENS // length
            q, k, v = (torch.randn((b, h, length, d), device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for causal in (False, True):
                kw = dict(causal=causal, squared=False, scale=1 / math.sqrt(d), relu_scale=1 / length)
                code = ra.attention_config("fwd", d, q.dtype, causal, False, length)
                variants = {"code": code}
                for s in splits:
                    variants[f"split {s}"] = code._replace(split=s)
                other = code._replace(tma=not code.tma)
                variants["other kind"] = other
                for s in splits:
                    variants[f"other kind split {s}"] = other._replace(split=s)
                calls, errs = {}, {}
                ref = ra.relu_attention_fwd(q, k, v, **kw, config=code)
                for name, cfg in variants.items():
                    fn = _forward(ra, (q, k, v), kw, cfg)
                    try:
                        out = fn()
                    except Exception as e:  # say so, time the rest
                        errs[name] = f"{type(e).__name__}: {str(e)[:160]}"
                        continue
                    calls[name] = fn
                    errs[name] = f"{(out.float() - ref.float()).abs().max().item():.1e}"
                calls["sdpa"] = _sdpa((q, k, v), causal)
                times = {name: [] for name in calls}
                for _ in range(args.rounds):
                    for name, fn in calls.items():
                        times[name].append(timing.time_cuda(fn, config=cfgt).p50)
                flops = 4 * b * h * length * length * d * (0.5 if causal else 1.0)
                med = {name: statistics.median(t) for name, t in times.items()}
                print(f"D={d} L={length} causal={causal} (code: {tuple(code)})", flush=True)
                for name in [*variants, "sdpa"]:
                    if name not in med:
                        print(f"  {name:22s} failed: {errs[name]}", flush=True)
                        continue
                    tf = flops / med[name] / 1e9
                    print(f"  {name:22s} {tf:6.0f} TFLOP/s  x{med['code'] / med[name]:.3f} code  "
                          f"x{med['sdpa'] / med[name]:.3f} sdpa  {med[name]:8.1f} us  "
                          f"(max |d| {errs.get(name, '-')})", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
