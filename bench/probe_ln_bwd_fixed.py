"""Probe: what a call of the Gluon layer-norm backward (v28, ``crossfuse.ops._ln_bwd_rows``) pays whatever
its row count, against a copy of the same bytes under the same timer.

At bf16 N = 16384 it times, alternated ``--rounds`` times (medians of the sessions' GPU timer):

* the kernel alone (its partial sums in a buffer of their own, not reduced) at M = 132·k rows (one
  program per SM, k rows each), so that a line through the times gives the cost per row and the cost per
  call (the intercept);
* the dw/db reduction of the 132 partial rows alone;
* at the smallest and largest k, the kernel launched twice per call, with 2 row buffers instead of 3,
  without a weight, and without dw and db (no partial sums stored);
* ``y.copy_(x)`` moving the bytes of the kernel's x, dy and dx (1.5·M·N bf16 elements read, as many
  written: 6·M·N bytes), and a one-element fill: the timer's own floor.

    python bench/probe_ln_bwd_fixed.py [--ks 1,2,4,8,16,31] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from ab_ln import probe_timing  # bench/ is this script's folder (sys.path[0]); it sets the path

N = 16384


def line(xs, ys):
    """Least-squares ``(intercept, slope)`` of ys on xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", default="1,2,4,8,16,31")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_ln_bwd_fixed.py")
    import torch
    from crossfuse.harness import timing
    from crossfuse.ops import _ln_bwd_rows as rows
    from crossfuse.ops import layer_norm as ln

    cfg = probe_timing()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()} ({sms} SMs), bf16 N = {N}", flush=True)
    ks = [int(k) for k in args.ks.split(",")]
    calls = {}
    part = torch.empty((2, sms, N), device="cuda", dtype=torch.float32)
    w = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    for k in ks:
        m = sms * k
        x = torch.randn(m, N, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(m, N, device="cuda", dtype=torch.bfloat16)
        _, mean, rstd = ln.layer_norm_fwd(x, w, None, 1e-5)
        dx = torch.empty_like(x)

        def launch(weight=w, stages=3, dwdb=True, x=x, dy=dy, mean=mean, rstd=rstd, dx=dx, m=m):
            rows.launch(dx, dy, x, weight, mean, rstd, part[0], part[1], sms, m, dwdb, dwdb, 16, stages)

        calls[f"kernel k={k}"] = launch
        src = torch.randn(3 * m * N // 2, device="cuda", dtype=torch.bfloat16)  # 6·M·N bytes moved in all
        dst = torch.empty_like(src)
        calls[f"copy k={k}"] = lambda src=src, dst=dst: dst.copy_(src)
        if k in (1, ks[-1]):  # what the per-call cost is made of: variants of the kernel at these k
            calls[f"kernel k={k} twice"] = lambda launch=launch: (launch(), launch())
            calls[f"kernel k={k} 2 buffers"] = lambda launch=launch: launch(stages=2)
            calls[f"kernel k={k} no weight"] = lambda launch=launch: launch(weight=None)
            calls[f"kernel k={k} no dw, db"] = lambda launch=launch: launch(dwdb=False)
    dw, db = torch.empty_like(w), torch.empty_like(w)
    calls[f"reduction of {sms} rows"] = lambda: ln.reduce_partials(part[0], part[1], dw, db, sms, N, sms)
    one = torch.empty(1, device="cuda")
    calls["fill of one element"] = lambda: one.fill_(1.0)
    times = timing.alternate(calls, args.rounds, config=cfg)
    med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    for name, t in med.items():
        print(f"  {name:24s} {t:8.1f} us", flush=True)
    for what in ("kernel", "copy"):
        a, b = line(ks, [med[f"{what} k={k}"] for k in ks])
        gbs = 3 * sms * N * 2 / (b * 1e-6) / 1e9
        print(f"{what}: {a:.1f} us per call + {b:.2f} us per row per SM ({gbs:.0f} GB/s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
