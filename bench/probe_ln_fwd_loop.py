"""Probe: why torch.compile's looped layer-norm forward (one row per program, [1, R] chunks, 16 warps, the
row read twice with eviction hints) outruns our forward of long bf16 rows (run 59: 3682 against 3548 GB/s
at 4096×16384), while our own looped kernels written like it (v13–v15) measured ~2900 at its launch.

    python bench/probe_ln_fwd_loop.py [--rounds 3] [--shapes 4096x16384,4096x8192]

Times, alternated in one process (medians of ``time_cuda``, the sessions' timer, GB/s of 2·M·N·bytes):
torch.compile's training forward (x, weight and bias requiring grad, as the sessions time it) and its
inference forward, our forward with the code's table, and a looped kernel defined here over the factors
that differ between inductor's kernel and ours:

* ``welford``: per-lane Welford updates (inductor's) or per-lane sums about the first chunk's mean (v13);
* ``const_n``: N a compile-time constant (inductor specialises on it) or a runtime argument (ours);
* ``R`` (chunk columns) and warps.

Both algorithms centre on a per-row reference (the row's first element for Welford, the first chunk's
mean for the sums) and store the mean and rstd, as the training forward must. Every variant's output is
checked against torch's before it is timed.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import triton
import triton.language as tl


@triton.jit
def _welford_merge(m_a, q_a, n_a, m_b, q_b, n_b):
    n = n_a + n_b
    d = m_b - m_a
    f = tl.where(n > 0, n_b / tl.maximum(n, 1.0), 0.0)
    return m_a + d * f, q_a + q_b + d * d * n_a * f, n


@triton.jit
def _loop_fwd_kernel(X, Y, W, B, Mean, Rstd, stride_x, stride_y, n_rt, eps, N_C: tl.constexpr,
                     R: tl.constexpr, WELFORD: tl.constexpr, CONST_N: tl.constexpr):  # fmt: skip
    if CONST_N:
        n = N_C
    else:
        n = n_rt
    row = tl.program_id(0).to(tl.int64)
    X += row * stride_x
    Y += row * stride_y
    cols = tl.arange(0, R)[None, :]
    if WELFORD:
        ref = tl.load(X).to(tl.float32)
        m = tl.zeros([1, R], tl.float32)
        q = tl.zeros([1, R], tl.float32)
        c = tl.zeros([1, R], tl.float32)
        for start in tl.range(0, n, R):
            ok = start + cols < n
            x = tl.load(X + start + cols, mask=ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
            x -= ref
            c_new = c + 1.0
            d = x - m
            m_new = m + d / c_new
            q_new = q + d * (x - m_new)
            m = tl.where(ok, m_new, m)
            q = tl.where(ok, q_new, q)
            c = tl.where(ok, c_new, c)
        mc, q_sum, _ = tl.reduce((m, q, c), 1, _welford_merge)
        corr = mc[:, None]
        var = q_sum[:, None] / n
        shift = ref
    else:
        x0 = tl.load(X + cols, eviction_policy="evict_last").to(tl.float32)
        shift = tl.sum(x0, axis=1)[:, None] / R
        a1 = x0 - shift
        a2 = a1 * a1
        for start in tl.range(R, n, R):
            ok = start + cols < n
            x = tl.load(X + start + cols, mask=ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
            xc = tl.where(ok, x - shift, 0.0)
            a1 += xc
            a2 += xc * xc
        s1 = tl.sum(a1, axis=1)[:, None]
        s2 = tl.sum(a2, axis=1)[:, None]
        corr = s1 / n
        var = tl.maximum(s2 / n - corr * corr, 0.0)
    rstd = 1.0 / tl.sqrt(var + eps)
    for start in tl.range(0, n, R):
        ok = start + cols < n
        x = tl.load(X + start + cols, mask=ok, other=0.0, eviction_policy="evict_first").to(tl.float32)
        w = tl.load(W + start + cols, mask=ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
        b = tl.load(B + start + cols, mask=ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
        y = ((x - shift) - corr) * rstd * w + b
        tl.store(Y + start + cols, y.to(Y.dtype.element_ty), mask=ok)
    zero = tl.zeros([1, 1], tl.int32)
    tl.store(Mean + row + zero, shift + corr)
    tl.store(Rstd + row + zero, rstd)


def loop_fwd(x, w, b, eps, r, warps, welford, const_n):
    import torch

    m, n = x.shape
    y = torch.empty_like(x)
    mean = torch.empty(m, device=x.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    _loop_fwd_kernel[(m,)](x, y, w, b, mean, rstd, x.stride(0), y.stride(0), n, eps, N_C=n, R=r,
                           WELFORD=welford, CONST_N=const_n, num_warps=warps, num_stages=1)  # fmt: skip
    return y, mean, rstd


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default="4096x16384,4096x8192")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--chunks", default="1024,2048,4096")
    ap.add_argument("--warps", default="4,8,16")
    ap.add_argument("--ours", default="", help="also our chunked forward at CHUNK:WARPS,...")
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_ln_fwd_loop.py")
    import torch
    from crossfuse import registry
    from crossfuse.harness import timing
    from crossfuse.ops import layer_norm as ln

    dtype = getattr(torch, args.dtype)
    cfg = timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=20.0, cuda_min_reps=10, cuda_max_reps=100)
    for shape in args.shapes.split(","):
        m, n = (int(v) for v in shape.split("x"))
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
        xg, wg, bg = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
        fns = {
            "torch_compile_train": partial(registry._torch_compile_layer_norm, xg, wg, bg, 1e-5),
            "torch_compile_infer": partial(registry._torch_compile_layer_norm, x, w, b, 1e-5),
            "ours_code": partial(ln.layer_norm_fwd, x, w, b, 1e-5),
        }
        for spec in filter(None, args.ours.split(",")):
            r, warps = (int(v) for v in spec.split(":"))
            for shifted in (True, False):
                launch = ln.LaunchConfig(1, r, warps, 0, shifted=shifted)
                fns[f"ours_R{r}_w{warps}_{'shifted' if shifted else 'three_pass'}"] = partial(
                    ln.layer_norm_fwd, x, w, b, 1e-5, config=launch
                )
        for r, warps, welford, const_n in itertools.product(
            (int(v) for v in args.chunks.split(",")), (int(v) for v in args.warps.split(",")), (1, 0), (1, 0)
        ):
            if r < n:
                algo, nkind = "welford" if welford else "sums", "constN" if const_n else "rtN"
                name = f"loop_R{r}_w{warps}_{algo}_{nkind}"
                fns[name] = partial(loop_fwd, x, w, b, 1e-5, r, warps, welford, const_n)
        ref = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
        mu = x.double().mean(1)
        for name, fn in fns.items():
            out = fn()
            y = out if isinstance(out, torch.Tensor) else out[0]
            err = (y.double() - ref).abs().max().item()
            assert err < 0.1, (name, err)
            if not name.startswith("torch"):
                assert (out[1].double() - mu).abs().max().item() < 1e-4, name
        times = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                times[name].append(timing.time_cuda(fn, config=cfg).p50)
        nbytes = 2 * m * n * x.element_size()
        rates = {k: nbytes / statistics.median(v) / 1e6 for k, v in times.items()}
        print(f"== {args.dtype} {m}x{n} (code: {ln.launch_config(n, dtype, 'fwd', m)})", flush=True)
        for k, v in sorted(rates.items(), key=lambda kv: -kv[1]):
            print(f"{v:7.0f}  {k}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
