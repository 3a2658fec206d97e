"""The card's matrix rates in this run, beside the attention's, to place the float32 bar (3x the seed).

    python bench/probe_matmul_rates.py [--rounds 3] [--size 8192]

Times ``torch.matmul`` of two SIZE x SIZE matrices in bfloat16 and in float32 with tf32 allowed (cuBLAS),
and crossfuse's raw attention forward and backward at the seed's shapes (B=4, H=16, D=64, [B, L, H, D]
as [B, H, L, D] views; L = 1024 and 4096; causal and not) in float32 (tf32 dots) and in bfloat16, the
calls alternated ``--rounds`` times, medians of ``crossfuse.harness.timing.time_cuda`` (the sessions'
GPU timer). Prints TFLOP/s per line: the matrix products (2·SIZE³), the attention (4·B·H·L²·D forward,
halved when causal, 2.5x that backward), and for each attention row float32's share of bfloat16's rate
and of the tf32 product's.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys

from ab_attn import SEED_BHD, seed_inputs, timing_config


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=8192)
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_matmul_rates.py")
    import torch
    from crossfuse.harness import timing
    from crossfuse.ops import relu_attention as ra

    torch.backends.cuda.matmul.allow_tf32 = True
    cfg = timing_config()
    n = args.size
    mats = {
        dt: [torch.randn((n, n), device="cuda", dtype=dt) for _ in range(2)]
        for dt in (torch.bfloat16, torch.float32)
    }
    calls = {str(dt).removeprefix("torch."): functools.partial(torch.matmul, *ab) for dt, ab in mats.items()}
    times = timing.alternate(calls, args.rounds, config=cfg)
    product = {name: 2 * n**3 / statistics.median(t) / 1e9 for name, t in times.items()}
    for name, rate in product.items():
        print(f"matmul {n}^3 {name}: {rate:.0f} TFLOP/s", flush=True)
    del mats, calls
    b, h, d = SEED_BHD
    print("L causal pass float32_TFLOPs bfloat16_TFLOPs f32/bf16 f32/tf32_matmul", flush=True)
    for length in (1024, 4096):
        f32 = seed_inputs(length, 4)
        bf16 = [t.to(torch.bfloat16) for t in f32]
        for causal in (False, True):
            kw = dict(causal=causal, squared=False, scale=1 / math.sqrt(d), relu_scale=1 / length)
            for kind in ("fwd", "bwd"):
                launcher = ra.relu_attention_fwd if kind == "fwd" else ra.relu_attention_bwd
                ins = {"f32": f32, "bf16": bf16}  # q, k, v (forward) or q, k, v, dout (backward)
                calls = {
                    n: functools.partial(launcher, *t[: 3 if kind == "fwd" else 4], **kw)
                    for n, t in ins.items()
                }
                times = timing.alternate(calls, args.rounds, config=cfg)
                flops = 4 * b * h * length**2 * d * (0.5 if causal else 1.0) * (2.5 if kind == "bwd" else 1.0)
                r32, r16 = (flops / statistics.median(times[k]) / 1e9 for k in ("f32", "bf16"))
                print(f"{length} {causal} {kind} {r32:.0f} {r16:.0f} {r32 / r16:.3f} "
                      f"{r32 / product['float32']:.3f}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
