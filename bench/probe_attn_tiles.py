"""The float32 attention forward at several tiles, this checkout's kernels against those of another
``relu_attention.py`` (an experiment's file), alternated in one process at the seed's layout and shapes
(float32 [B, L, H, D] as [B, H, L, D] views, B=4, H=16, D=64).

    python bench/probe_attn_tiles.py OTHER_RELU_ATTENTION_PY [--rounds 3] [--lengths 1024,4096]

Prints one line per (L, causal, tile): TFLOP/s of the code's kernel and of the other's at that tile (the
``config`` argument of their ``relu_attention_fwd``), their ratio (other / code) and the largest
difference of the two outputs. Medians of ``crossfuse.harness.timing.alternate`` rounds.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys

from ab_attn import SEED_BHD, seed_inputs, timing_config
from ab_ln import load_ops_module  # bench/ is this script's folder (sys.path[0]); it sets the path

TILES = ((64, 64, 4, 3), (128, 32, 8, 4), (128, 64, 8, 3), (64, 32, 4, 3), (128, 64, 8, 2), (64, 64, 4, 4))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("other", help="another crossfuse/ops/relu_attention.py")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lengths", default="1024,4096")
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_attn_tiles.py")
    from crossfuse.harness import timing
    from crossfuse.ops import relu_attention as code

    other = load_ops_module(args.other, "_probe_other_relu_attention")
    cfg = timing_config()
    b, h, d = SEED_BHD
    print("L causal tile code_TFLOPs other_TFLOPs other/code", flush=True)
    for length in (int(n) for n in args.lengths.split(",")):
        q, k, v = seed_inputs(length, 3)
        for causal in (False, True):
            kw = dict(causal=causal, squared=False, scale=1 / math.sqrt(d), relu_scale=1 / length)
            flops = 4 * b * h * length * length * d * (0.5 if causal else 1.0)
            for tile in TILES:
                mods = {"code": code, "other": other}
                calls = {
                    name: functools.partial(m.relu_attention_fwd, q, k, v, config=m.AttnConfig(*tile), **kw)
                    for name, m in mods.items()
                }
                err = (calls["code"]() - calls["other"]()).abs().max().item()
                times = timing.alternate(calls, args.rounds, config=cfg)
                c, o = statistics.median(times["code"]), statistics.median(times["other"])
                rates = f"{flops / c / 1e9:.0f} {flops / o / 1e9:.0f} {c / o:.3f}"
                tag = "x".join(map(str, tile))
                print(f"{length} {causal} {tag} {rates} (max |other-code| {err:.2e})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
