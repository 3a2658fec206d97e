"""Probe: the shifted chunked forward (sums about the row's first element, taken again about the mean
where (mean - x0)^2 / var exceeds a ratio) at several such ratios, against the code's forward: speed on
Gaussian rows and accuracy on rows whose first element lies 0.9, 1.9 and 3.9 standard deviations out.

    python bench/probe_ln_fwd_shifted.py [--rounds 3] [--dtypes float32,bfloat16] [--ratios 1,4,16]

For each (shape, dtype): GB/s (medians of ``--rounds`` alternations with the sessions' timer) and the
relative error ``||y - ref|| / ||ref||`` against float64 (torch's too), per launch of the shifted kernel
(the winning launches of run 181's sweep) and ratio. ``shifted_max_ratio`` is replaced for each call.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

# run 181's winners of the shifted forward ((dtype, N, many rows) -> (block_n, warps, unroll))
LAUNCHES = {
    ("float32", 4096, False): (2048, 8, 1),
    ("float32", 16384, False): (4096, 32, 2),
    ("float32", 16384, True): (4096, 32, 2),
    ("bfloat16", 4096, False): (2048, 4, 2),
    ("bfloat16", 8192, False): (2048, 8, 2),
    ("bfloat16", 16384, False): (4096, 16, 1),
}
ORIGINAL = None  # crossfuse.ops.layer_norm.shifted_max_ratio, set by main
SHAPES = {4096: [(4096, 4096)], 8192: [(4096, 8192)], 16384: [(4096, 16384), (16384, 16384)]}


def _call(x, w, b, launch, ratio):
    """The forward of ``x``: the code's table where ``launch`` is None, else ``launch`` with the shifted
    kernel's ratio replaced by ``ratio``; torch's where ``launch`` is "torch"."""
    import torch
    from crossfuse.ops import layer_norm as ln

    if launch == "torch":
        return (torch.nn.functional.layer_norm(x, (x.shape[1],), w, b, 1e-5),)
    ln.shifted_max_ratio = ORIGINAL if ratio is None else (lambda _dtype: ratio)
    try:
        return ln.layer_norm_fwd(x, w, b, 1e-5, config=launch)
    finally:
        ln.shifted_max_ratio = ORIGINAL


def _case(m, n, dtype, launch, ratios, rounds, cfg):
    import torch
    from crossfuse.harness import timing
    from crossfuse.ops import layer_norm as ln
    from crossfuse.tolerances import relerr, tolerance

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, n, device="cuda", dtype=torch.float64, generator=gen)
    w = torch.randn(n, device="cuda", dtype=torch.float64, generator=gen).to(dtype)
    b = torch.randn(n, device="cuda", dtype=torch.float64, generator=gen).to(dtype)
    inputs = {"gaussian": x.to(dtype)}
    for k in (0.9, 1.9, 3.9):
        xk = x.clone()
        xk[:, 0] = xk[:, 1:].mean(1) + k * xk[:, 1:].std(1)
        inputs[f"x0 {k} sd"] = xk.to(dtype)
    refs = {
        k: torch.nn.functional.layer_norm(v.double(), (n,), w.double(), b.double(), 1e-5)
        for k, v in inputs.items()
    }
    fns = {"code": partial(_call, w=w, b=b, launch=None, ratio=None)}
    for r in ratios:
        fns[f"shifted R<={r:g}"] = partial(_call, w=w, b=b, launch=launch, ratio=r)
    fns["torch"] = partial(_call, w=w, b=b, launch="torch", ratio=None)
    errs = {k: {i: relerr(fn(v)[0], refs[i]) for i, v in inputs.items()} for k, fn in fns.items()}
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            times[k].append(timing.time_cuda(partial(fn, inputs["gaussian"]), config=cfg).p50)
    nbytes = 2 * m * n * inputs["gaussian"].element_size()
    print(f"\n== {dtype} {m}x{n}: shifted launch {launch}; code's {ln.launch_config(n, dtype, 'fwd', m)}; "
          f"tolerance {tolerance('layer_norm', dtype):g}", flush=True)  # fmt: skip
    print(f"{'GB/s':>7} {'/code':>6}  {'':<16} " + " ".join(f"{i:>11}" for i in inputs))
    code_rate = nbytes / statistics.median(times["code"]) / 1e6
    for k in fns:
        rate = nbytes / statistics.median(times[k]) / 1e6
        errors = " ".join(f"{errs[k][i]:11.2e}" for i in inputs)
        print(f"{rate:7.0f} {rate / code_rate:6.3f}  {k:<16} {errors}", flush=True)


def main(argv=None) -> int:
    global ORIGINAL
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--ratios", default="1,4,16")
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_ln_fwd_shifted.py")
    import torch
    from crossfuse.harness import timing
    from crossfuse.ops import layer_norm as ln

    ORIGINAL = ln.shifted_max_ratio
    cfg = timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=20.0, cuda_min_reps=10, cuda_max_reps=100)
    ratios = [float(r) for r in args.ratios.split(",")]
    for (name, n, many), (block_n, warps, unroll) in LAUNCHES.items():
        if name not in args.dtypes.split(","):
            continue
        launch = ln.LaunchConfig(1, block_n, warps, 0, unroll, shifted=True)
        for m, n_ in SHAPES[n]:
            if (m >= ln.MANY_ROWS) == many:
                _case(m, n_, getattr(torch, name), launch, ratios, args.rounds, cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
