"""Profile target: the float32 attention at the seed's shapes, one warmed-up call per case between
``cudaProfilerStart`` and ``cudaProfilerStop``, for Nsight Compute with ``--profile-from-start off``.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight ... \\
        python3 bench/profile_attn_tf32.py [--lengths 1024,4096] [--causal no,yes] [--kind fwd,bwd]

Each case is the raw launcher (``relu_attention_fwd`` or ``relu_attention_bwd``) on [B, L, H, D] float32
tensors viewed as [B, H, L, D] (B=4, H=16, D=64, scale 1/sqrt(D), relu_scale 1/L), as ``bench/extras.py``
times them against the seed; the first call compiles, the second is profiled. Prints one line per case,
in the order profiled, so that the profiler's kernels can be matched to it.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from ab_attn import seed_inputs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="1024,4096", help="sequence lengths, comma-separated")
    ap.add_argument("--causal", default="no,yes", help="'no', 'yes' or both, comma-separated")
    ap.add_argument("--kind", default="fwd,bwd", help="'fwd', 'bwd' or both, comma-separated")
    args = ap.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    causals = [{"no": False, "yes": True}[x] for x in args.causal.split(",")]
    kinds = args.kind.split(",")
    if any(k not in ("fwd", "bwd") for k in kinds):
        ap.error(f"--kind: expected fwd and/or bwd, got {args.kind!r}")
    from crossfuse._backend import require_cuda

    require_cuda("bench/profile_attn_tf32.py")
    import torch
    from crossfuse.ops import relu_attention as ra

    cudart = torch.cuda.cudart()
    for length in lengths:
        q, k, v, do = seed_inputs(length, 4)
        kw = dict(squared=False, scale=1 / math.sqrt(q.shape[3]), relu_scale=1 / length)
        for causal in causals:
            for kind in kinds:
                if kind == "fwd":
                    call = functools.partial(ra.relu_attention_fwd, q, k, v, causal=causal, **kw)
                else:
                    call = functools.partial(ra.relu_attention_bwd, q, k, v, do, causal=causal, **kw)
                call()
                torch.cuda.synchronize()
                cudart.cudaProfilerStart()
                call()
                torch.cuda.synchronize()
                cudart.cudaProfilerStop()
                print(f"profiled: {kind} L={length} causal={causal}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
