"""Probe: the backward with the scores' signs passed from the dK/dV kernel to the dQ kernel as bits.

The dQ kernel computes ``s = q k^T`` only for ``[s > 0]`` (relu's derivative; not squared): one of its
three products. With ``relu_attention_bwd(..., signs=True)`` the dK/dV kernel, which computes the
(transposed) scores anyway, writes those signs as bits (B·H·Lq·Lk/8 bytes) and the dQ kernel reads them
instead: two products and a load of BLOCK_M·BLOCK_N/8 bytes per step. This probe alternates, at the
sessions' bf16 shapes (16k tokens; D=64 with H=32, D=128 with H=16), the code's backward with the signed
one (the dQ kernel a dependent launch waiting for the dK/dV kernel at its start, ``pdl``, or launched
after it, ``seq``), and each kernel alone with and without the signs; medians of the sessions' GPU timer.
It prints TFLOP/s (2.5 × 4·B·H·L²·D, halved when causal), ratios to the code's backward, and the largest
difference of the gradients (the signs may differ from the dQ kernel's own where a score is 0 up to
rounding, the products being summed in another order).

    python bench/probe_attn_dqmask.py [--rounds 3] [--dims 64,128] [--lengths 1024,4096,16384]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

TOKENS = 16384


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--lengths", default="1024,4096,16384")
    args = ap.parse_args(argv)
    import torch
    from crossfuse.harness import timing
    from crossfuse.ops import _gdc
    from crossfuse.ops import relu_attention as ra

    cfgt = timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=40.0, cuda_min_reps=5, cuda_max_reps=100)
    print("D L causal | backward TFLOP/s: code, signs pdl, signs seq (ratios) | kernels alone: dkdv, dkdv+signs, "
          "dq, dq from signs | max |signs - code| of dq, dk, dv", flush=True)  # fmt: skip
    for d in (int(x) for x in args.dims.split(",")):
        h = 2048 // d
        for length in (int(x) for x in args.lengths.split(",")):
            b = TOKENS // length
            q, k, v, do = (torch.randn((b, h, length, d), device="cuda", dtype=torch.bfloat16) for _ in range(4))
            for causal in (False, True):
                scale, rs = 1 / math.sqrt(d), 1 / length
                cd = ra.attention_config("dkdv", d, q.dtype, causal, False, length)
                cq = ra.attention_config("dq", d, q.dtype, causal, False, length)
                tma = ra._tma_usable(False, q, k, v, do)
                gdc = _gdc.usable(q, False)
                common = (causal, False, scale, rs, False, False)
                mask = ra.sign_buffer(q, k, cd, cq)
                dk, dv, dq = (torch.empty_like(q) for _ in range(3))

                def seq():
                    ra._bwd_dkdv(q, k, v, do, dk, dv, cd, tma and cd.tma, *common, order={}, signs=mask)
                    ra._bwd_dq(q, k, v, do, dq, cq, tma and cq.tma, *common, order={}, signs=mask)

                calls = {
                    "code": lambda: ra.relu_attention_bwd(q, k, v, do, causal, False, scale, rs),
                    "pdl": lambda: ra.relu_attention_bwd(q, k, v, do, causal, False, scale, rs, signs=True),
                    "seq": seq,
                    "dkdv": lambda: ra._bwd_dkdv(q, k, v, do, dk, dv, cd, tma and cd.tma, *common, order={}),
                    "dkdv+signs": lambda: ra._bwd_dkdv(q, k, v, do, dk, dv, cd, tma and cd.tma, *common, order={},
                                                       signs=mask),  # fmt: skip
                    "dq": lambda: ra._bwd_dq(q, k, v, do, dq, cq, tma and cq.tma, *common, order={}),
                    "dq<-signs": lambda: ra._bwd_dq(q, k, v, do, dq, cq, tma and cq.tma, *common, order={},
                                                    signs=mask),  # fmt: skip
                }
                ref = calls["code"]()
                got = calls["pdl"]()
                err = [f"{(a.float() - c.float()).abs().max().item():.1e}" for a, c in zip(got, ref, strict=True)]
                seq()
                err_seq = max((a.float() - c.float()).abs().max().item() for a, c in zip((dq, dk, dv), ref))
                times = {name: [] for name in calls}
                for _ in range(args.rounds):
                    for name, fn in calls.items():
                        times[name].append(timing.time_cuda(fn, config=cfgt).p50)
                med = {name: statistics.median(t) for name, t in times.items()}
                flops = 2.5 * 4 * b * h * length * length * d * (0.5 if causal else 1.0)
                tf = {name: flops / t / 1e9 for name, t in med.items()}
                print(f"{d} {length} {causal} | {tf['code']:.0f}, {tf['pdl']:.0f} ({med['code'] / med['pdl']:.3f}), "
                      f"{tf['seq']:.0f} ({med['code'] / med['seq']:.3f}) | "
                      f"{med['dkdv'] * 1e3:.1f} / {med['dkdv+signs'] * 1e3:.1f} us, "
                      f"{med['dq'] * 1e3:.1f} / {med['dq<-signs'] * 1e3:.1f} us | {', '.join(err)} (seq {err_seq:.1e})"
                      f"{'' if gdc else ' (no pdl here)'}", flush=True)  # fmt: skip
                del mask
    return 0


if __name__ == "__main__":
    sys.exit(main())
