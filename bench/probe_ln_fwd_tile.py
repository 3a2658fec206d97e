"""Probe (v32, runs 177-179): the chunked layer-norm forward of long rows with several rows per program,
and with the shift of its one-pass sums taken from the row's first element instead of its first chunk's
mean.

The code's forward of bf16 4096×16384 then (the two-pass chunked kernel: sums about the first chunk's
mean, then y from an L2 re-read; one row per program, 16 warps) reached 89% of the copy ceiling, 1% under
the issue's bar. Each row paid two block reductions (the shift's, then the pair of sums), each a trip
through shared memory with barriers. Here, on [rows, chunk] tiles:

* ``rows``: several rows per program, so one trip of each reduction serves ``rows`` rows;
* ``shift`` 0 (``chunk``): the first chunk's mean, one reduction before the loop (the code's then);
  1 (``x0``): the row's first element, a scalar load and no reduction; the variance's cancellation is
  then bounded only by (x0 - mean)^2 / var <= N; 2 (``x0+fallback``): the same, with the sums taken again
  about the mean they give where that ratio exceeds 16 (what became ``_ln_fwd_shifted_kernel``).

Every variant's y, mean and rstd are checked against float64 before timing (and their errors printed on
rows with a large first feature too); times are medians of ``--rounds`` alternations with the sessions'
timer, beside the code's forward and the copy ceiling (``y.copy_(x)`` of 2^29 bf16 elements, as the
sessions measure it) in the same process.

    python bench/probe_ln_fwd_tile.py [--rounds 3] [--shapes 4096x16384,4096x8192] [--rows 1,2,4]
                                      [--chunks 2048,4096,8192] [--warps 8,16,32] [--shifts 0,1]
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
def _add_pairs(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _moments_about(xp, cols, shift, acc1, acc2, start0, N: tl.constexpr, BLOCK_N: tl.constexpr):
    """``(corr, var)`` of each row from its sums of x - shift and its square (chunks from ``start0``
    added to ``acc1``, ``acc2``; the loads kept in L2): the mean is shift + corr."""
    for start in tl.range(start0, N, BLOCK_N):
        x = tl.load(xp + start + cols, eviction_policy="evict_last").to(tl.float32)
        xc = x - shift
        acc1 += xc
        acc2 += xc * xc
    s1, s2 = tl.reduce((acc1, acc2), 1, _add_pairs)
    corr = s1 * (1.0 / N)
    return corr, tl.maximum(s2 * (1.0 / N) - corr * corr, 0.0)


@triton.jit(do_not_specialize=["M"])
def _fwd_tile_kernel(X, Y, W, B, Mean, Rstd, stride_x, stride_y, M, eps, N: tl.constexpr, ROWS: tl.constexpr,
                     BLOCK_N: tl.constexpr, SHIFT_X0: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M
    rows_c = tl.minimum(rows, M - 1).to(tl.int64)  # rows past M read the last row; nothing stored for them
    xp = X + rows_c[:, None] * stride_x
    yp = Y + rows_c[:, None] * stride_y
    cols = tl.arange(0, BLOCK_N)[None, :]
    if SHIFT_X0 > 0:
        shift = tl.load(xp).to(tl.float32)  # [ROWS, 1]
        acc1 = tl.zeros([ROWS, BLOCK_N], tl.float32)
        acc2 = tl.zeros([ROWS, BLOCK_N], tl.float32)
        start0 = 0
    else:
        x = tl.load(xp + cols, eviction_policy="evict_last").to(tl.float32)
        shift = (tl.sum(x, axis=1) * (1.0 / BLOCK_N))[:, None]
        acc1 = x - shift
        acc2 = acc1 * acc1
        start0 = BLOCK_N
    corr, var = _moments_about(xp, cols, shift, acc1, acc2, start0, N, BLOCK_N)
    if SHIFT_X0 == 2:
        # the shift was far from the mean (corr^2 > 16 var): the sums again, about shift + corr, from L2
        if tl.max(corr * corr - 16.0 * var, axis=0) > 0:
            shift = shift + corr[:, None]
            zero = tl.zeros([ROWS, BLOCK_N], tl.float32)
            corr, var = _moments_about(xp, cols, shift, zero, zero, 0, N, BLOCK_N)
    rstd = 1.0 / tl.sqrt(var + eps)
    for start in tl.range(0, N, BLOCK_N):
        x = tl.load(xp + start + cols, eviction_policy="evict_first").to(tl.float32)
        y = ((x - shift) - corr[:, None]) * rstd[:, None]
        y = y * tl.load(W + start + cols).to(tl.float32) + tl.load(B + start + cols).to(tl.float32)
        tl.store(yp + start + cols, y.to(Y.dtype.element_ty), mask=row_ok[:, None], cache_modifier=".cs")
    tl.store(Mean + rows, tl.reshape(shift, [ROWS]) + corr, mask=row_ok)
    tl.store(Rstd + rows, rstd, mask=row_ok)


def tile_fwd(x, w, b, eps, rows, chunk, warps, shift_x0):
    import torch

    m, n = x.shape
    y = torch.empty_like(x)
    mean = torch.empty(m, device=x.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    _fwd_tile_kernel[(triton.cdiv(m, rows),)](x, y, w, b, mean, rstd, x.stride(0), y.stride(0), m, eps, N=n,
                                              ROWS=rows, BLOCK_N=chunk, SHIFT_X0=shift_x0,
                                              num_warps=warps, num_stages=1)  # fmt: skip
    return y, mean, rstd


def _code_fwd(x, w, b, config):
    from crossfuse.ops import layer_norm as ln

    return ln.layer_norm_fwd(x, w, b, 1e-5, config=config)


def _tile_fwd_of(x, w, b, spec):
    return tile_fwd(x, w, b, 1e-5, *spec)


def _errors(fn, x, w, b):
    """Relative errors of ``fn``'s y (against the largest |y|), mean (against the largest |mean|) and rstd
    (elementwise) against float64, on input ``x``."""
    xd = x.double()
    mu = xd.mean(1)
    rs = (xd.var(1, unbiased=False) + 1e-5).rsqrt()
    ref = ((xd - mu[:, None]) * rs[:, None]) * w.double() + b.double()
    y, mean, rstd = fn(x)
    return (
        ((y.double() - ref).abs().max() / ref.abs().max()).item(),
        ((mean.double() - mu).abs().max() / mu.abs().max()).item(),
        ((rstd.double() - rs).abs() / rs).max().item(),
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default="4096x16384,4096x8192")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rows", default="1,2,4")
    ap.add_argument("--chunks", default="2048,4096,8192")
    ap.add_argument("--warps", default="8,16,32")
    ap.add_argument("--shifts", default="0,1", help="0: the first chunk's mean, 1: x0, 2: x0 with fallback")
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_ln_fwd_tile.py")
    import torch
    from crossfuse.harness import timing
    from crossfuse.ops import layer_norm as ln

    dtype = getattr(torch, args.dtype)
    cfg = timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=20.0, cuda_min_reps=10, cuda_max_reps=100)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", flush=True)
    src = torch.ones(1 << 29, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ceilings = []
    for shape in args.shapes.split(","):
        m, n = (int(v) for v in shape.split("x"))
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        x[:, : n // 3] += 3.0  # rows whose first element and first chunk sit away from the mean
        w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
        fns = {"code": partial(_code_fwd, w=w, b=b, config=None)}
        for rows, chunk, warps, shift_x0 in itertools.product(
            (int(v) for v in args.rows.split(",")), (int(v) for v in args.chunks.split(",")),
            (int(v) for v in args.warps.split(",")), (int(v) for v in args.shifts.split(",")),
        ):  # fmt: skip
            per_thread = rows * chunk // (32 * warps)
            if chunk >= n or not 8 <= per_thread <= 64:
                continue
            name = f"rows{rows} chunk{chunk} w{warps} {('chunk', 'x0', 'x0+fallback')[shift_x0]}"
            fns[name] = partial(_tile_fwd_of, w=w, b=b, spec=(rows, chunk, warps, shift_x0))
        # a row like a transformer's with a massive activation in its first feature: the worst case
        # of a shift taken from the row's first elements
        xa = torch.randn(m, n, device="cuda", dtype=dtype)
        xa[:, 0] = 1000.0
        errs = {}
        for name, fn in fns.items():
            errs[name] = _errors(fn, x, w, b) + _errors(fn, xa, w, b)
            assert errs[name][0] < 2e-2 and errs[name][1] < 1e-5 and errs[name][2] < 1e-4, (name, errs[name])
        times = {name: [] for name in fns}
        times_a = {name: [] for name in fns}
        for _ in range(args.rounds):
            ceilings.append(timing.time_cuda(lambda: dst.copy_(src), config=cfg).p50)
            for name, fn in fns.items():
                times[name].append(timing.time_cuda(partial(fn, x), config=cfg).p50)
                times_a[name].append(timing.time_cuda(partial(fn, xa), config=cfg).p50)
        ceiling = 2 * src.numel() * 2 / statistics.median(ceilings) / 1e6
        nbytes = 2 * m * n * x.element_size()
        rates = {k: nbytes / statistics.median(v) / 1e6 for k, v in times.items()}
        rates_a = {k: nbytes / statistics.median(v) / 1e6 for k, v in times_a.items()}
        print(f"\n== {args.dtype} {m}x{n}: copy ceiling {ceiling:.0f} GB/s (so far); code's entry "
              f"{ln.launch_config(n, dtype, 'fwd', m)}", flush=True)  # fmt: skip
        print(f"{'GB/s':>7} {'% ceil':>6} {'/code':>6} {'massive':>7}  {'name':<34} relerr y, mean, rstd (vs "
              "float64); the same with a massive first feature; 'massive': GB/s on that input")  # fmt: skip
        for k, v in sorted(rates.items(), key=lambda kv: -kv[1]):
            e = errs[k]
            print(f"{v:7.0f} {100 * v / ceiling:6.1f} {v / rates['code']:6.3f} {rates_a[k]:7.0f}  {k:<34} "
                  + " ".join(f"{v:.2e}" for v in e), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
