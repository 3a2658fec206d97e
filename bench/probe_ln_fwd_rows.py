"""Probe: the layer-norm forward of long rows across row counts near 4096, to see what the last rows cost.

At bf16 4096×16384 the forward reaches ~89% of copy with 4096 rows and ~98% with 16384 rows (the same
kernel's "many rows" entry). 4096 rows over 132 SMs is 31.03 rows per SM: if the kernel's end (the last
programs running on part of the SMs, each SM's last programs draining) is what costs the few-rows regime,
the rate per byte rises where the row count is a multiple of 132 and falls just past it. This probe times
the code's forward (the table's configuration for each row count) at M = 132·k - 4 … 132·k + 4 around
4096 and at multiples of 132, alternated ``--rounds`` times, medians of the sessions' GPU timer, and prints
GB/s (2·M·N·bytes) and the launch configuration used.

    python bench/probe_ln_fwd_rows.py [--n 16384] [--dtypes bfloat16,float32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys

from ab_ln import probe_timing  # bench/ is this script's folder (sys.path[0]); it sets the path

ROWS = (3960, 4092, 4096, 4100, 4224, 4356, 8184, 8192)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_ln_fwd_rows.py")
    import torch
    from crossfuse.harness import timing
    from crossfuse.ops import layer_norm as ln

    cfg = probe_timing()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()} ({sms} SMs), N={args.n}", flush=True)
    for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
        n = args.n
        w = torch.randn(n, device="cuda", dtype=dtype)
        b = torch.randn(n, device="cuda", dtype=dtype)
        xs = {m: torch.randn(m, n, device="cuda", dtype=dtype) for m in ROWS}
        calls = {m: functools.partial(ln.layer_norm_fwd, xs[m], w, b, 1e-5) for m in ROWS}
        times = timing.alternate(calls, args.rounds, config=cfg)
        print(f"{dtype}: M, rows per SM, GB/s, us, config", flush=True)
        for m in ROWS:
            t = statistics.median(times[m])
            gbs = 2 * m * n * dtype.itemsize / t / 1e6
            cfg_m = ln.launch_config(n, dtype, "fwd", m)
            print(f"  {m:6d} {m / sms:6.2f} {gbs:7.0f} {t * 1e3:8.1f}  {cfg_m}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
