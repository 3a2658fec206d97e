"""Probe: the spread of the attention's forward+backward, with the dQ kernel as a programmatic dependent
launch (the code) and without, alternated ``--rounds`` times in one process.

The sessions' forward+backward of our kernels has shown two levels within one measurement (run 124,
B=4 H=32 L=4096 D=64: p20 3.26 ms, median 3.51; run 108, D=128: p20 3.15, median 3.33) where SDPA's
p20–p80 stay within 0.2%. If the dependent launch (the dQ kernel starting on the SMs the dK/dV kernel's
last programs leave, the two kernels then sharing the GPU in an order the hardware picks) is the cause,
the spread goes without it; if the card's power state is, it stays. Each round prints p20, median and p80
(ms, the sessions' GPU timer) of both, and of SDPA's forward+backward as a control.

    python bench/probe_attn_pdl.py [--shapes 4x32x4096x64,4x16x4096x128] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="4x32x4096x64,4x16x4096x128")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_attn_pdl.py")
    import crossfuse
    import torch
    import torch.nn.functional as F
    from crossfuse.harness import timing
    from crossfuse.ops import _gdc

    usable = _gdc.usable
    print(torch.cuda.get_device_name(), flush=True)
    for shape in args.shapes.split(","):
        b, h, length, d = (int(s) for s in shape.split("x"))
        q, k, v, do = (torch.randn(b, h, length, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        leaves = [t.requires_grad_(True) for t in (q, k, v)]

        def ours(leaves=leaves, do=do):
            return torch.autograd.grad(crossfuse.relu_attention(*leaves), leaves, do)

        def sdpa(leaves=leaves, do=do):
            return torch.autograd.grad(F.scaled_dot_product_attention(*leaves), leaves, do)

        def pdl(on: bool):
            _gdc.usable = usable if on else (lambda *a, **kw: False)

        flops = 4 * b * h * length * length * d * 3.5
        print(f"\n{shape} (B, H, L, D), not causal: round, variant, p20 / median / p80 ms, TFLOP/s (median)")
        for on in (True, False):  # compile both variants
            pdl(on)
            ours()
        for r in range(args.rounds):
            for name, fn, on in (("PDL", ours, True), ("no PDL", ours, False), ("SDPA", sdpa, True)):
                pdl(on)
                t = timing.time_cuda(fn)
                rate = flops / t.p50 / 1e9
                print(f"  {r} {name:7s} {t.p20:.3f} / {t.p50:.3f} / {t.p80:.3f}  {rate:.0f}", flush=True)
        pdl(True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
