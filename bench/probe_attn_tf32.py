"""Probe: the float32 forward in Gluon (``crossfuse.ops._attn_tf32``, attention v26) against Triton's
float32 forward, at the seed's shapes (``bench/extras.py``'s float32 section: [B, L, H, D] as [B, H, L, D]
views, B=4, H=16, D=64, L = 1024, 2048, 4096, causal and not), each with v's copy, alternated ``--rounds``
times, medians of ``crossfuse.harness.timing.time_cuda``.

    python bench/probe_attn_tf32.py [--rounds 3] [--tiles 64:64:2,64:32:3,...]

Prints per shape: TFLOP/s of Triton's kernel and of each Gluon tile (BLOCK_M:BLOCK_N:STAGES), their ratio,
and the largest relative difference of the Gluon output from Triton's.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tiles", default="64:64:2,64:64:3,64:32:3,128:64:2,64:128:2")
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_attn_tf32.py")
    import torch
    from crossfuse.harness.timing import time_cuda
    from crossfuse.ops import relu_attention as ra
    from crossfuse.tolerances import relerr

    tiles = [tuple(int(x) for x in t.split(":")) for t in args.tiles.split(",")]
    B, H, D = 4, 16, 64
    saved = ra.TF32_FWD
    try:
        for L in (1024, 2048, 4096):
            for causal in (False, True):
                gen = torch.Generator(device="cuda").manual_seed(L + causal)
                q, k, v = (torch.randn(B, L, H, D, device="cuda", generator=gen).transpose(1, 2)
                           for _ in range(3))  # fmt: skip
                scale, relu_scale = 1 / math.sqrt(D), 1 / L
                flops = 4 * B * H * L * L * D * (0.5 if causal else 1.0)
                ra.TF32_FWD = {}
                ref = ra.relu_attention_fwd(q, k, v, causal, False, scale, relu_scale)
                variants = {"triton": None, **{":".join(map(str, t)): t for t in tiles}}
                times: dict[str, list[float]] = {name: [] for name in variants}
                diffs = {}
                for _ in range(args.rounds):
                    for name, cfg in variants.items():
                        ra.TF32_FWD = {} if cfg is None else {(causal, L > ra.SHORT_L): cfg}
                        try:
                            call = (q, k, v, causal, False, scale, relu_scale)
                            fn = lambda call=call: ra.relu_attention_fwd(*call)  # noqa: E731
                            out = fn()
                            diffs[name] = relerr(out, ref)
                            times[name].append(time_cuda(fn).p50)
                        except Exception as exc:  # a tile that does not fit: reported, not fatal
                            times[name].append(float("nan"))
                            diffs[name] = f"{type(exc).__name__}: {str(exc)[:80]}"
                base = statistics.median(times["triton"])
                line = [f"L={L} causal={causal}: triton {flops / base / 1e9:.1f} TFLOP/s"]
                for name in variants:
                    if name == "triton":
                        continue
                    t = statistics.median(times[name])
                    d = diffs[name]
                    dtxt = f"{d:.1e}" if isinstance(d, float) else d
                    line.append(f"{name} {flops / t / 1e9:.1f} ({base / t:.3f}x, diff {dtxt})")
                print("; ".join(line), flush=True)
    finally:
        ra.TF32_FWD = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
