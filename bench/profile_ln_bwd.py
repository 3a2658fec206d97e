"""Where the layer-norm backward's GPU time goes, kernel by kernel (torch.profiler's CUDA activity).

    python bench/profile_ln_bwd.py [--reps 20] [--module OLD_LAYER_NORM_PY]

For each anchor shape and dtype: the backward of ``crossfuse.ops.layer_norm`` is run ``--reps`` times
(the L2 flushed before each, its persisting lines reset first, and a GPU spin while the CPU queues the
launches, as the sessions' timer does), and the mean GPU time of each kernel it launches is printed in
launch order, with their sum and the time from the first kernel's start to the last one's end (so the gaps
between kernels show). The code's tables are used (``CROSSFUSE_TUNED_CONFIGS`` if set), or with
``--module`` those of an earlier ``layer_norm.py`` (for example
``git show REV:python/crossfuse/ops/layer_norm.py > /tmp/old.py``).
"""

from __future__ import annotations

import argparse
import sys

from ab_ln import inputs, load_ops_module  # bench/ is this script's folder (sys.path[0]); it sets the path

SHAPES = [(4096, 1024), (4096, 8192), (4096, 16384), (65536, 1024), (32768, 4096)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--module", help="an earlier crossfuse/ops/layer_norm.py to profile instead")
    ap.add_argument("--shapes", help="MxN,... (default: the anchor shapes)")
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/profile_ln_bwd.py")
    import torch
    from crossfuse.harness.timing import flush_l2
    from crossfuse.ops import layer_norm as ln
    from torch.profiler import ProfilerActivity, profile

    if args.module:
        ln = load_ops_module(args.module, "_profiled_layer_norm")

    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    for m, n in shapes:
        for dtype in (torch.bfloat16, torch.float32):
            x, w, _, dy, mean, rstd = inputs(ln, m, n, dtype)
            for _ in range(3):  # compile, warm up
                ln.layer_norm_bwd(dy, x, w, mean, rstd, True, True)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.reps):
                    flush_l2("cuda")
                    torch.cuda._sleep(5_000_000)  # ~2.5 ms: the GPU busy while the CPU queues the launches
                    ln.layer_norm_bwd(dy, x, w, mean, rstd, True, True)
                    torch.cuda.synchronize()
            events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                            key=lambda e: e.time_range.start)  # fmt: skip
            # each repetition: the flush's fill, the spin, then the backward's kernels (its own memsets
            # among them) up to the next repetition's fill
            spins = [i for i, e in enumerate(events) if any(k in e.name.lower() for k in ("spin", "sleep"))]
            reps = [events[s + 1 : (spins[r + 1] - 1 if r + 1 < len(spins) else len(events))]
                    for r, s in enumerate(spins)]  # fmt: skip
            per_rep = min(len(rep) for rep in reps)
            span = sum(rep[-1].time_range.end - rep[0].time_range.start for rep in reps) / args.reps
            nbytes = 3 * m * n * x.element_size()
            lines = []
            busy = 0.0
            for i in range(per_rep):
                mean_us = sum(rep[i].time_range.elapsed_us() for rep in reps) / args.reps
                gap = sum(rep[i].time_range.start - rep[i - 1].time_range.end for rep in reps) / args.reps
                busy += mean_us
                after = f" ({gap:.1f} us after the one before)" if i else ""
                lines.append(f"    {mean_us:8.1f} us  {reps[0][i].name[:80]}{after}")
            print(f"{m}x{n} {str(dtype)[6:]}: kernels {busy:.1f} us, first start to last end {span:.1f} us "
                  f"({nbytes / span / 1e3:.0f} GB/s)", flush=True)  # fmt: skip
            print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
