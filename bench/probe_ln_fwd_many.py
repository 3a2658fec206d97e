"""Probe: the whole-row layer-norm forward of many short rows (bf16 65536×1024 sits on the 90%-of-copy bar:
89.95% in run 186, 89.85% in run 188), every launch shape of the kernel against torch.compile and against a
copy of the same bytes, alternated in one process.

    python bench/probe_ln_fwd_many.py [--shapes 65536x1024] [--dtypes bfloat16] [--rounds 3]

The sessions' copy ceiling is a 1 GiB copy; a shape that moves 256 MB pays its fixed costs (launch, the
first and last waves, the write-back of the dirty lines the timer's L2 flush leaves) over fewer bytes. The
copy of the shape's own bytes (``y.copy_(x)``) says how much of the gap to the ceiling any kernel pays at
this size. Then torch.compile's training forward (the sessions' peer: inputs that require grad, so it also
writes the mean and rstd) and its inference forward (y alone); the code's launch; one program per tile of
1–8 rows on 1–8 warps (4–64 elements per thread), weight and bias loaded before or after the statistics;
persistent grids of 4 or 8 programs per SM that prefetch the next tile; persistent grids reading through
tensor descriptors (3 stages). GB/s (2·M·N·bytes) from the medians of the sessions' GPU timer over
``--rounds`` alternations, best first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from functools import partial

from ab_ln import probe_timing  # bench/ is this script's folder (sys.path[0]); it sets the path


def launches(ln, n: int) -> dict:
    """``{name: LaunchConfig}`` of the whole-row forward's launch shapes tried at rows of ``n``."""
    out = {}
    for bm in (1, 2, 4, 8):
        for warps in (1, 2, 4, 8):
            if not 4 <= bm * n // (32 * warps) <= 64:
                continue
            for kp in (False, True):
                out[f"tile ({bm}, {warps} warps{', keep' if kp else ''})"] = ln.LaunchConfig(
                    bm, n, warps, 0, keep_params=kp
                )
    for bm in (1, 2, 4):
        for warps in (2, 4):
            for per_sm in (4, 8):
                name = f"persistent prefetch ({bm}, {warps} warps, {per_sm}/SM)"
                out[name] = ln.LaunchConfig(bm, n, warps, per_sm, prefetch=True, keep_params=True)
    for bm in (2, 4):
        for warps in (2, 4):
            for per_sm in (4, 8):
                name = f"persistent tma ({bm}, {warps} warps, {per_sm}/SM)"
                out[name] = ln.LaunchConfig(bm, n, warps, per_sm, keep_params=True, tma_stages=3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="65536x1024", help="MxN,... (N at most 4096: whole rows)")
    ap.add_argument("--dtypes", default="bfloat16")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_ln_fwd_many.py")
    import torch
    from crossfuse import registry
    from crossfuse.harness import timing
    from crossfuse.ops import layer_norm as ln

    cfg = probe_timing()
    big = torch.empty(1 << 29, device="cuda", dtype=torch.bfloat16).normal_()
    big_out = torch.empty_like(big)
    for shape in args.shapes.split(","):
        m, n = (int(v) for v in shape.lower().split("x"))
        if n > 4096:
            print(f"{shape}: N = {n} is not a whole-row shape (at most 4096); skipped")
            continue
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            x = torch.randn(m, n, device="cuda", dtype=dtype)
            w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
            copy_out = torch.empty_like(x)
            grads = [t.detach().clone().requires_grad_() for t in (x, w, b)]
            fns = {
                "copy of the same bytes": partial(copy_out.copy_, x),
                "copy of 1 GiB (the sessions' ceiling)": partial(big_out.copy_, big),
                # the sessions' peer: the training forward (inputs that require grad: it also writes the
                # mean and rstd), then the inference forward (y alone), a different kernel
                "torch_compile (training)": partial(registry._torch_compile_layer_norm, *grads, 1e-5),
                "torch_compile (inference)": partial(registry._torch_compile_layer_norm, x, w, b, 1e-5),
                f"code {ln.launch_config(n, dtype, 'fwd', m)}": partial(ln.layer_norm_fwd, x, w, b, 1e-5),
            }
            for name, c in launches(ln, n).items():
                fns[name] = partial(ln.layer_norm_fwd, x, w, b, 1e-5, config=c)
            ref = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
            for name, fn in list(fns.items())[2:]:
                out = fn()
                y = out if isinstance(out, torch.Tensor) else out[0]
                err = (y.double() - ref).abs().max().item()
                if not err < 0.1:
                    raise AssertionError(f"{name}: max |y - float64 reference| = {err}")
            times = timing.alternate(fns, args.rounds, config=cfg)
            nbytes = 2 * m * n * x.element_size()
            print(f"{dtype_name} {m}x{n}, {args.rounds} rounds (GB/s, spread of the rounds):", flush=True)
            rates = {}
            for name, ts in times.items():
                size = 2 * big.numel() * big.element_size() if name.startswith("copy of 1 GiB") else nbytes
                rates[name] = (size / statistics.median(ts) / 1e6, size / max(ts) / 1e6, size / min(ts) / 1e6)
            for name, (mid, lo, hi) in sorted(rates.items(), key=lambda kv: -kv[1][0]):
                print(f"  {mid:6.0f}  ({lo:.0f}-{hi:.0f})  {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
