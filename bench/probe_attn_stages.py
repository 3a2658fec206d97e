"""Probe: four pipeline stages for the attention kernels at D=128 (the sweeps offered the backward 2 or 3,
the descriptor forward 3).

At D=128 a backward step's tiles take 32 KB of shared memory per stage (q and dout in the dK/dV kernel;
k and v in the dQ kernel) beside 64 KB held for the program's own tiles: 160 KB at 3 stages, 192 KB at 4,
still one program per SM. Run 87 found the dQ kernel not held by its product count, so it may be waiting
on its loads. This probe alternates, at the sessions' D=128 bf16 shapes (16k tokens, H=16), the code's
backward against the same tiles with 4 stages in the dK/dV kernel, the dQ kernel or both (and the dK/dV
kernel through tensor descriptors with 4 stages where the code uses pointers), and the code's forward
against 4 stages (pointer and descriptor kernels); medians of ``--rounds`` alternations of the sessions'
GPU timer, TFLOP/s (4·B·H·L²·D forward, 2.5× that backward, halved when causal), ratios to the code's,
and the largest difference from the code's results.

    python bench/probe_attn_stages.py [--rounds 3] [--lengths 1024,4096,16384]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

TOKENS = 16384


def _call(ra, kind, cfg, tensors, kw):
    """The raw forward (``cfg``) or backward (``cfg`` = the two kernels' configs) as a call."""
    q, k, v, do = tensors
    if kind == "fwd":
        return lambda: ra.relu_attention_fwd(q, k, v, **kw, config=cfg)
    return lambda: ra.relu_attention_bwd(q, k, v, do, **kw, configs=cfg)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lengths", default="1024,4096,16384")
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_attn_stages.py")
    import torch
    from crossfuse.harness import timing
    from crossfuse.ops import relu_attention as ra

    cfgt = timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=40.0, cuda_min_reps=5, cuda_max_reps=100)
    d, h = 128, 16
    for length in (int(x) for x in args.lengths.split(",")):
        b = TOKENS // length
        q, k, v, do = (torch.randn((b, h, length, d), device="cuda", dtype=torch.bfloat16) for _ in range(4))
        for causal in (False, True):
            kw = dict(causal=causal, squared=False, scale=1 / math.sqrt(d), relu_scale=1 / length)
            cf = ra.attention_config("fwd", d, q.dtype, causal, False, length)
            cd = ra.attention_config("dkdv", d, q.dtype, causal, False, length)
            cq = ra.attention_config("dq", d, q.dtype, causal, False, length)
            s4 = dict(num_stages=4)
            variants = {
                "fwd code": ("fwd", cf),
                "fwd 4 stages": ("fwd", cf._replace(**s4)),
                "fwd 4 stages tma": ("fwd", cf._replace(num_stages=4, tma=True)),
                "bwd code": ("bwd", (cd, cq)),
                "bwd dkdv 4": ("bwd", (cd._replace(**s4), cq)),
                "bwd dq 4": ("bwd", (cd, cq._replace(**s4))),
                "bwd both 4": ("bwd", (cd._replace(**s4), cq._replace(**s4))),
            }
            if not cd.tma:
                variants["bwd dkdv tma 4"] = ("bwd", (cd._replace(num_stages=4, tma=True), cq))
                variants["bwd dkdv tma 3"] = ("bwd", (cd._replace(tma=True), cq))
            calls, errs = {}, {}
            for name, (kind, cfg) in variants.items():
                fn = _call(ra, kind, cfg, (q, k, v, do), kw)
                try:
                    out = fn()
                except Exception as e:  # a launch that does not fit (shared memory): say so, time the rest
                    errs[name] = f"{type(e).__name__}: {str(e)[:120]}"
                    continue
                calls[name] = fn
                ref = calls[f"{kind} code"]() if name != f"{kind} code" else out
                outs = out if isinstance(out, tuple) else (out,)
                refs = ref if isinstance(ref, tuple) else (ref,)
                err = max((a.float() - c.float()).abs().max().item() for a, c in zip(outs, refs, strict=True))
                errs[name] = f"{err:.1e}"
            times = {name: [] for name in calls}
            for _ in range(args.rounds):
                for name, fn in calls.items():
                    times[name].append(timing.time_cuda(fn, config=cfgt).p50)
            flops = 4 * b * h * length * length * d * (0.5 if causal else 1.0)
            code = f"fwd {tuple(cf)}, dkdv {tuple(cd)}, dq {tuple(cq)}"
            print(f"D={d} L={length} causal={causal} (code: {code})", flush=True)
            for name in variants:
                if name not in times:
                    print(f"  {name:18s} failed: {errs[name]}", flush=True)
                    continue
                kind = name.split()[0]
                t = statistics.median(times[name])
                base = statistics.median(times[f"{kind} code"])
                tf = flops * (2.5 if kind == "bwd" else 1.0) / t / 1e9
                print(f"  {name:18s} {tf:6.0f} TFLOP/s {base / t:6.3f}  (max |d| {errs[name]})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
