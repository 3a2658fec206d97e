"""Probe: the layer-norm forward's one-tile launches at the anchor rows where a peer leads, alternated with
the peers in one process.

In run 86 torch.compile led the bf16 4096×1024 forward (1820 against our 1796 GB/s) and Liger the float32
4096×2048 and 4096×4096 ones; the table's entries there came from sweeps of single measurements of ~10 µs
calls. This probe times, ``--rounds`` times alternated, torch.compile's and Liger's forwards and ours at
the table's configuration and at every one-tile launch of 1–4 rows on 1–8 warps (weight and bias loaded
before or after the statistics), medians of the sessions' GPU timer, GB/s (2·M·N·bytes), best first.

    python bench/probe_ln_fwd_small.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

SHAPES = (("bfloat16", 4096, 1024), ("float32", 4096, 2048), ("float32", 4096, 4096))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    import torch
    from crossfuse import registry
    from crossfuse.harness import timing
    from crossfuse.ops import layer_norm as ln

    try:
        from liger_kernel.ops.layer_norm import layer_norm_forward as liger_fwd
    except ImportError as exc:
        print(f"needs Liger-Kernel: {exc}")
        return 1
    cfg = timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=25.0, cuda_min_reps=20, cuda_max_reps=200)
    for dtype_name, m, n in SHAPES:
        dtype = getattr(torch, dtype_name)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
        code = ln.launch_config(n, dtype, "fwd", m)
        fns = {
            "liger": partial(liger_fwd, x, w, b, 1e-5),
            "torch_compile": partial(registry._torch_compile_layer_norm, x, w, b, 1e-5),
            f"ours {tuple(code)[:4]} (code)": partial(ln.layer_norm_fwd, x, w, b, 1e-5),
        }
        for bm in (1, 2, 4):
            for warps in (1, 2, 4, 8):
                if bm * n // (32 * warps) < 4:  # at least 4 elements per thread
                    continue
                for kp in (False, True):
                    c = ln.LaunchConfig(bm, n, warps, 0, keep_params=kp)
                    if c != code:
                        fns[f"ours ({bm}, {n}, {warps}, 0{', keep' if kp else ''})"] = partial(
                            ln.layer_norm_fwd, x, w, b, 1e-5, config=c
                        )
        ref = torch.nn.functional.layer_norm(x.float(), (n,), w.float(), b.float(), 1e-5)
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
        rates = {name: nbytes / statistics.median(t) / 1e6 for name, t in times.items()}
        print(f"{dtype_name} {m}x{n}:", flush=True)
        for name, r in sorted(rates.items(), key=lambda kv: -kv[1]):
            print(f"  {r:6.0f}  {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
