"""Probe: the layer-norm forward at the rows where a peer leads (README, run 55), peer and ours alternated
in one process, with our kernel also at the peer's own launch shape.

    python bench/probe_ln_fwd_peers.py [--rounds 3] [--launches]

For each shape: Liger's ``layer_norm_forward`` (one row per program, warps from its
``calculate_settings``), torch.compile of ``F.layer_norm`` (the sessions' entry, ``dynamic=False``; run
58 compiled it with the default dynamic shapes, whose recompiled kernels are not the sessions'), our
forward with the code's table, and our one-tile kernel with Liger's launch shape (one row per program,
the same warps, weight and bias loaded first). GB/s (2·M·N·bytes) from the medians of ``time_cuda`` (the
sessions' timer) over ``--rounds`` alternations. If our kernel at Liger's launch shape is as fast as
Liger, the difference in the sessions is the table's choice; if not, it is in the kernels or the calls.
With ``--launches`` (run 98, five rounds), the rows of N <= 4096 also time every one-tile launch of 1–4
rows on 1–8 warps (at least 4 elements per thread; weight and bias loaded before or after the statistics)
and print every rate, best first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

SHAPES = [("float32", 4096, 2048), ("float32", 4096, 4096), ("float32", 4096, 8192), ("bfloat16", 4096, 1024),
          ("bfloat16", 4096, 16384)]  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--launches", action="store_true", help="also every one-tile launch (N <= 4096)")
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_ln_fwd_peers.py")
    import torch
    from crossfuse import registry
    from crossfuse.harness import timing
    from crossfuse.ops import layer_norm as ln

    try:
        from liger_kernel.ops.layer_norm import layer_norm_forward as liger_fwd
        from liger_kernel.ops.utils import calculate_settings
    except ImportError as exc:
        print(f"needs Liger-Kernel: {exc}")
        return 1
    cfg = timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=25.0, cuda_min_reps=10, cuda_max_reps=100)
    print("dtype shape " + " ".join(("liger", "torch_compile", "ours_code", "ours_liger_shape")) + "  (GB/s)")
    for dtype_name, m, n in SHAPES:
        dtype = getattr(torch, dtype_name)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
        block, warps = calculate_settings(n)
        liger_shape = ln.LaunchConfig(1, block, warps, 0, keep_params=True)
        fns = {
            "liger": partial(liger_fwd, x, w, b, 1e-5),
            "torch_compile": partial(registry._torch_compile_layer_norm, x, w, b, 1e-5),
            "ours_code": partial(ln.layer_norm_fwd, x, w, b, 1e-5),
            "ours_liger_shape": partial(ln.layer_norm_fwd, x, w, b, 1e-5, config=liger_shape),
        }
        if args.launches and n <= 4096:
            fns.update(_one_tile_launches(ln, x, w, b))
        ref = fns["liger"]()[0].float()
        for name, fn in fns.items():
            out = fn()
            y = out if isinstance(out, torch.Tensor) else out[0]
            err = (y.float() - ref).abs().max().item()
            assert err < 0.05, (name, err)
        times = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                times[name].append(timing.time_cuda(fn, config=cfg).p50)
        nbytes = 2 * m * n * x.element_size()
        code = ln.launch_config(n, dtype, "fwd", m)
        if args.launches and n <= 4096:
            print(f"{dtype_name} {m}x{n} (code: {code}):", flush=True)
            rates = {k: nbytes / statistics.median(v) / 1e6 for k, v in times.items()}
            for k, v in sorted(rates.items(), key=lambda kv: -kv[1]):
                print(f"  {v:6.0f}  {k}", flush=True)
            continue
        rates = " ".join(f"{nbytes / statistics.median(times[k]) / 1e6:.0f}" for k in fns)
        print(f"{dtype_name} {m}x{n} {rates}  (code: {code})", flush=True)
    return 0


def _one_tile_launches(ln, x, w, b) -> dict:
    """Our forward at every one-tile launch of 1–4 rows on 1–8 warps with at least 4 elements per thread,
    weight and bias loaded after or before the statistics, keyed by a readable name."""
    n = x.shape[1]
    out = {}
    for bm in (1, 2, 4):
        for warps in (1, 2, 4, 8):
            if bm * n // (32 * warps) < 4:
                continue
            for kp in (False, True):
                c = ln.LaunchConfig(bm, n, warps, 0, keep_params=kp)
                out[f"ours ({bm}, {n}, {warps}, 0{', keep' if kp else ''})"] = partial(
                    ln.layer_norm_fwd, x, w, b, 1e-5, config=c
                )
    return out


if __name__ == "__main__":
    sys.exit(main())
