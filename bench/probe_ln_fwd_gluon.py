"""Probe: the layer-norm forward through shared memory (``crossfuse.ops._ln_fwd_rows``, Gluon: a persistent
grid, tiles of whole rows brought in by the copy engine, read into registers once) against the code's
forward, alternated ``--rounds`` times, medians of the sessions' GPU timer.

For each shape, dtype and launch variant (rows per tile, warps, warps along the tile's rows, tiles in
flight, programs per SM) it checks y, mean and rstd against a float64 reference (relative error, the
code's forward beside it) and prints GB/s (2·M·N·bytes: x read, y written).

    python bench/probe_ln_fwd_gluon.py [--shapes 4096x16384,...] [--dtypes bfloat16,float32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

SHAPES = "4096x16384,65536x1024,32768x4096,4096x8192,4096x4096,4096x2048,4096x1024"


def variants(n: int, esize: int) -> list[tuple[int, int, int, int, int]]:
    """(rows per tile, warps, warps along the rows, tiles in flight, programs per SM) to try at row length
    ``n``: tiles of 8-64 KB, 8-16 warps (32 for the longest rows), one program per SM with as many
    tiles in flight as shared memory holds, or two with half as many."""
    from crossfuse.ops import _ln_fwd_rows as fr

    out = []
    row = n * esize
    for tile_kb in (16, 32, 64):
        t = max(1, tile_kb * 1024 // row)
        if t * n // 256 > 256 or (t > 1 and t * row != tile_kb * 1024):
            continue
        for warps in (8, 16, 32):
            wt = min(t, warps)
            if warps // wt > n // 256 or (warps == 32 and n < 16384):
                continue
            fit = fr.stages_that_fit(n, esize, t)
            for per_sm, stages in ((1, fit), (2, fit // 2)):
                if stages >= 2:
                    out.append((t, warps, wt, stages, per_sm))
    return list(dict.fromkeys(out))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    import torch
    import triton
    from crossfuse.harness import timing
    from crossfuse.ops import _ln_fwd_rows as fr
    from crossfuse.ops import layer_norm as ln
    from crossfuse.tolerances import relerr

    cfg = timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=40.0, cuda_min_reps=10, cuda_max_reps=200)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()} ({sms} SMs)", flush=True)
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for shape in args.shapes.split(","):
            m, n = (int(s) for s in shape.split("x"))
            x = torch.randn(m, n, device="cuda", dtype=dtype) * 2 + 0.5
            w = torch.randn(n, device="cuda", dtype=dtype)
            b = torch.randn(n, device="cuda", dtype=dtype)
            xd = x.double()
            mu = xd.mean(1)
            rs = (xd.var(1, unbiased=False) + 1e-5).rsqrt()
            ref = ((xd - mu[:, None]) * rs[:, None] * w.double() + b.double(), mu, rs)

            def gluon_fwd(programs, t, warps, wt, stages, x=x, w=w, b=b, m=m):
                y = torch.empty_like(x)
                mean = torch.empty(m, device="cuda", dtype=torch.float32)
                rstd = torch.empty(m, device="cuda", dtype=torch.float32)
                fr.launch(y, x, w, b, mean, rstd, 1e-5, programs, t, warps, wt, stages)
                return y, mean, rstd

            calls = {"code": functools.partial(ln.layer_norm_fwd, x, w, b, 1e-5)}
            if fr.usable(x, w, b, False):
                for t, warps, wt, stages, per_sm in variants(n, x.element_size()):
                    tiles = triton.cdiv(m, t)
                    p = min(tiles, per_sm * sms)
                    p = triton.cdiv(tiles, triton.cdiv(tiles, p))
                    calls[f"T{t} w{warps}/{wt} s{stages} p{per_sm}"] = functools.partial(
                        gluon_fwd, p, t, warps, wt, stages
                    )
            print(f"\n{m}x{n} {dtype_name}: name, GB/s, us, relerr y mean rstd (vs float64)", flush=True)
            errs = {}
            for name, fn in calls.items():
                try:
                    got = fn()
                    torch.cuda.synchronize()
                    errs[name] = [relerr(g.double(), r) for g, r in zip(got, ref, strict=True)]
                except Exception as exc:  # a variant that does not compile or launch: say so, go on
                    print(f"  {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", flush=True)
            times = {name: [] for name in errs}
            for _ in range(args.rounds):
                for name in errs:
                    times[name].append(timing.time_cuda(calls[name], config=cfg).p50)
            for name in sorted(errs, key=lambda k: statistics.median(times[k])):
                t = statistics.median(times[name])
                gbs = 2 * m * n * dtype.itemsize / t / 1e6
                e = " ".join(f"{v:.2e}" for v in errs[name])
                print(f"  {name:22s} {gbs:7.0f} {t * 1e3:8.1f}  {e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
