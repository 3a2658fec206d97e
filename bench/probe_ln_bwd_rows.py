"""Probe: the layer-norm backward of long rows read once (``crossfuse.ops._ln_bwd_rows``, Gluon: each row
brought into shared memory by the copy engine, read from there twice, dw and db accumulated in registers)
against the code's backward, bf16, alternated ``--rounds`` times, medians of the sessions' GPU timer.

For each shape and each launch variant (warps, row buffers, programs per SM) it checks dx, dw and db
against a float64 reference (relative error, ‖a − b‖ / ‖b‖, with the code's backward beside it) and prints
GB/s (3·M·N·bytes: x and dy read, dx written).

    python bench/probe_ln_bwd_rows.py [--shapes 4096x16384,...] [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys

from ab_ln import probe_timing  # bench/ is this script's folder (sys.path[0]); it sets the path

SHAPES = "4096x16384,8192x16384,4096x8192,16384x8192,4096x4096,32768x4096"


def variants(n: int) -> list[tuple[int, int, float]]:
    """(warps, row buffers, programs per SM) to try at row length ``n`` (more programs per SM only where
    their registers fit beside each other: sm_90 compiles here, 103 registers at 8 warps for n = 4096;
    fewer than one per SM: fewer partial sums to write and reduce, fewer SMs streaming)."""
    w = n // 512  # 8 elements of each half row per thread
    out = [(w, 3, 1), (w, 3, 0.75), (w, 3, 0.5), (max(4, w // 2), 3, 1)]
    if n <= 4096:
        out += [(w, 3, 2), (w, 2, 2)]
    return out


def rows_backward(dy, x, w, mean, rstd, programs, warps, stages):
    """``(dx, dw, db)`` by the Gluon kernel and the code's reduction of its partial sums."""
    import torch
    from crossfuse.ops import _ln_bwd_rows as rows
    from crossfuse.ops import layer_norm as ln

    m, n = x.shape
    part = torch.empty((2, programs, n), device=x.device, dtype=torch.float32)
    dx, dw, db = torch.empty_like(x), torch.empty_like(w), torch.empty_like(w)
    rows.launch(dx, dy, x, w, mean, rstd, part[0], part[1], programs, m, True, True, warps, stages)
    ln.reduce_partials(part[0], part[1], dw, db, programs, n, programs)
    return dx, dw, db


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_ln_bwd_rows.py")
    import torch
    from crossfuse.harness import timing
    from crossfuse.ops import _ln_bwd_rows as rows
    from crossfuse.ops import layer_norm as ln
    from crossfuse.tolerances import relerr

    cfg = probe_timing()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()} ({sms} SMs)", flush=True)
    for shape in args.shapes.split(","):
        m, n = (int(s) for s in shape.split("x"))
        dtype = torch.bfloat16
        x = torch.randn(m, n, device="cuda", dtype=dtype) * 2 + 0.5
        w = torch.randn(n, device="cuda", dtype=dtype)
        b = torch.randn(n, device="cuda", dtype=dtype)
        dy = torch.randn(m, n, device="cuda", dtype=dtype)
        _, mean, rstd = ln.layer_norm_fwd(x, w, b, 1e-5)
        xd, dyd, wd = x.double().requires_grad_(), dy.double(), w.double().requires_grad_()
        bd = b.double().requires_grad_()
        y = torch.nn.functional.layer_norm(xd, (n,), wd, bd, 1e-5)
        ref = torch.autograd.grad(y, (xd, wd, bd), dyd)
        calls = {"code": functools.partial(ln.layer_norm_bwd, dy, x, w, mean, rstd, True, True)}
        for warps, stages, per_sm in variants(n):
            if not rows.usable(x, dy, w, False) or rows.stages_that_fit(n, 2, True) < stages:
                continue
            programs = min(m, int(sms * per_sm))
            calls[f"rows w{warps} s{stages} p{per_sm}"] = functools.partial(
                rows_backward, dy, x, w, mean, rstd, programs, warps, stages
            )
        print(f"\n{m}x{n} bf16: name, GB/s, us, relerr dx dw db (vs float64)", flush=True)
        errs = {}
        for name, fn in calls.items():
            try:
                got = fn()
                torch.cuda.synchronize()
                errs[name] = [relerr(g.double(), r) for g, r in zip(got, ref, strict=True)]
            except Exception as exc:  # a variant that does not compile or launch: say so, go on
                print(f"  {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", flush=True)
        times = timing.alternate({name: calls[name] for name in errs}, args.rounds, config=cfg)
        for name in errs:
            t = statistics.median(times[name])
            gbs = 3 * m * n * dtype.itemsize / t / 1e6
            e = " ".join(f"{v:.2e}" for v in errs[name])
            print(f"  {name:18s} {gbs:7.0f} {t * 1e3:8.1f}  {e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
