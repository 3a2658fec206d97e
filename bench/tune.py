"""Sweep launch configurations of crossfuse's kernels on a GPU and pick the fastest per key.

    python bench/tune.py --out DIR [--only ln|attn] [--workers 16] [--quick]

Phase 1 compiles every candidate in parallel worker processes (each launches it once on real-shaped
inputs, filling Triton's on-disk cache); phase 2 times them one at a time in this process with
``triton.testing.do_bench`` (median); phase 3 writes ``tuning.csv`` (every candidate) and
``tuned.json`` (the winner per key), and prints the winners as the ``TUNED`` tables of
``crossfuse.ops.layer_norm`` and ``crossfuse.ops.relu_attention``.

Layer norm is timed at M=4096 and at a large M (M*N = 128M elements) and scored by the geometric
mean of both GB/s; attention at 16k tokens, L=4096 (B=4), H=32 for D=64 and H=16 for D=128, bf16.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import csv
import json
import math
import multiprocessing as mp
import os
import sys
import time

LN_NS = (1024, 2048, 4096, 8192, 16384)
LN_DTYPES = ("bfloat16", "float32")
ATTN_DS = (64, 128)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------------------------------
# Candidates
# ----------------------------------------------------------------------------------------------------


def ln_candidates(quick: bool) -> list[dict]:
    out = []
    for n in LN_NS[:2] if quick else LN_NS:
        for dtype in LN_DTYPES:
            for bm in (1, 2, 4, 8, 16):
                tile = bm * n
                if not 1024 <= tile <= 32768:
                    continue
                for ept in (8, 16, 32):  # elements per thread per tensor
                    warps = tile // (32 * ept)
                    if warps in (1, 2, 4, 8, 16, 32):
                        out.append(dict(kind="fwd", n=n, dtype=dtype, block_m=bm, num_warps=warps, pps=1))
                if tile > 16384:
                    continue
                for ept in (4, 8, 16):
                    warps = tile // (32 * ept)
                    if warps not in (2, 4, 8, 16, 32):
                        continue
                    for pps in (1, 2, 4, 8):
                        out.append(dict(kind="bwd", n=n, dtype=dtype, block_m=bm, num_warps=warps, pps=pps))
            for bn in (1024, 2048, 4096):  # the chunked forward: two passes over chunks of the row
                if bn < n and n >= 4096:
                    for warps in (4, 8):
                        out.append(dict(kind="fwd", n=n, dtype=dtype, block_m=1, block_n=bn,
                                        num_warps=warps, pps=1))  # fmt: skip
            if n >= 8192:  # the split backward: row sums first, then column chunks of several rows
                for bn in (1024, 2048):
                    for bm in (2, 4, 8):
                        for warps in (4, 8):
                            for pps in (1, 4):
                                out.append(dict(kind="bwd", n=n, dtype=dtype, block_m=bm, block_n=bn,
                                                num_warps=warps, pps=pps))  # fmt: skip
    return out


def _attn(kind, d, causal, bm, bn, warps, stages) -> dict:
    return dict(kind=kind, d=d, causal=causal, block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)


def attn_candidates(quick: bool) -> list[dict]:
    out = []
    for d in ATTN_DS:
        for causal in (False, True):
            for bm, bn in ((64, 32), (64, 64), (128, 32), (128, 64), (128, 128)):
                for warps in (4, 8):
                    for stages in (2, 3, 4):
                        out.append(_attn("fwd", d, causal, bm, bn, warps, stages))
            for bm, bn in ((16, 64), (32, 64), (64, 64), (16, 128), (32, 128), (64, 128)):
                for warps in (4, 8):
                    for stages in (2, 3):
                        out.append(_attn("dkdv", d, causal, bm, bn, warps, stages))
            for bm, bn in ((64, 16), (64, 32), (64, 64), (128, 16), (128, 32), (128, 64)):
                for warps in (4, 8):
                    for stages in (2, 3):
                        out.append(_attn("dq", d, causal, bm, bn, warps, stages))
    if quick:
        out = out[::9]
    return out


# ----------------------------------------------------------------------------------------------------
# One candidate: build inputs and a launch closure
# ----------------------------------------------------------------------------------------------------


def ln_shapes(n: int) -> list[tuple[int, int]]:
    return [(4096, n), ((128 << 20) // n, n)]


def attn_shape(d: int) -> tuple[int, int, int, int]:
    return (4, 32 if d == 64 else 16, 4096, d)


def make_launch(c: dict, shape):
    """(launch, units) for candidate ``c`` at ``shape``: units are bytes (ln) or FLOPs (attention)."""
    import torch

    if "n" in c:
        from crossfuse.ops import layer_norm as ln

        dtype = getattr(torch, c["dtype"])
        m, n = shape
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        b = torch.randn(n, device="cuda", dtype=dtype)
        bn = c.get("block_n", ln.triton.next_power_of_2(n))
        cfg = ln.LaunchConfig(c["block_m"], bn, c["num_warps"], c["pps"])
        if c["kind"] == "fwd":
            return (lambda: ln.layer_norm_fwd(x, w, b, 1e-5, config=cfg)), 2 * m * n * x.element_size()
        _, mean, rstd = ln.layer_norm_fwd(x, w, b, 1e-5)
        dy = torch.randn_like(x)
        return (
            lambda: ln.layer_norm_bwd(dy, x, w, mean, rstd, True, True, config=cfg)
        ), 3 * m * n * x.element_size()
    from crossfuse.ops import relu_attention as ra

    b_, h, l, d = shape
    q, k, v, do = (torch.randn(b_, h, l, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    cfg = ra.AttnConfig(c["block_m"], c["block_n"], c["num_warps"], c["num_stages"])
    scale, relu_scale = 1 / math.sqrt(d), 1 / l
    fwd_flops = 4 * b_ * h * l * l * d * (0.5 if c["causal"] else 1.0)
    if c["kind"] == "fwd":
        return (
            lambda: ra.relu_attention_fwd(q, k, v, c["causal"], False, scale, relu_scale, config=cfg)
        ), fwd_flops
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    default = ra.attention_config("dq" if c["kind"] == "dkdv" else "dkdv", d, torch.bfloat16, c["causal"])
    configs = (cfg, default) if c["kind"] == "dkdv" else (default, cfg)
    # dkdv does 4 of the 7 backward matmuls, dq 3: time the pair with the other kernel at its default
    return (lambda: ra.relu_attention_bwd(q, k, v, do, c["causal"], False, scale, relu_scale, dq, dk, dv,
                                          configs=configs)), 2.5 * fwd_flops  # fmt: skip


def shapes_of(c: dict):
    return ln_shapes(c["n"]) if "n" in c else [attn_shape(c["d"])]


def _compile_one(c: dict) -> tuple[dict, str]:
    """Worker: launch once per shape so Triton compiles and caches the kernels."""
    import torch

    try:
        for shape in shapes_of(c)[:1]:
            fn, _ = make_launch(c, shape)
            fn()
        torch.cuda.synchronize()
        return c, "ok"
    except Exception as exc:
        return c, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", choices=("ln", "ln-split", "ln-chunked", "attn"))
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    import torch
    import triton

    os.makedirs(args.out, exist_ok=True)
    cands = []
    if args.only in (None, "ln", "ln-split", "ln-chunked"):
        cands += ln_candidates(args.quick)
    if args.only == "ln-split":  # the backward of long rows: fused and split candidates side by side
        cands = [c for c in cands if c["kind"] == "bwd" and c["n"] >= 8192]
    if args.only == "ln-chunked":  # the forward of long rows: one-tile and chunked candidates side by side
        cands = [c for c in cands if c["kind"] == "fwd" and c["n"] >= 4096]
    if args.only in (None, "attn"):
        cands += attn_candidates(args.quick)
    log(f"{len(cands)} candidates; compiling with {args.workers} workers")
    status = {}
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(args.workers, mp_context=ctx) as pool:
        for i, (c, st) in enumerate(pool.map(_compile_one, cands, chunksize=2)):
            status[json.dumps(c, sort_keys=True)] = st
            if (i + 1) % 50 == 0:
                log(f"compiled {i + 1}/{len(cands)}")
    log("timing")
    rows = []
    for i, c in enumerate(cands):
        st = status[json.dumps(c, sort_keys=True)]
        for shape in shapes_of(c):
            row = dict(c, shape="x".join(map(str, shape)), ms=None, rate=None, status=st)
            if st == "ok":
                try:
                    fn, units = make_launch(c, shape)
                    ms = triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
                    row.update(ms=ms, rate=units / ms / 1e6 if "n" in c else units / ms / 1e9)
                except Exception as exc:
                    row["status"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                torch.cuda.empty_cache()
            rows.append(row)
        if (i + 1) % 50 == 0:
            log(f"timed {i + 1}/{len(cands)}")
    fields = sorted({k for r in rows for k in r})
    with open(os.path.join(args.out, "tuning.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(rows)
    # winners: geometric mean of the rate over the shapes of each candidate
    best: dict[str, tuple[float, dict]] = {}
    for c in cands:
        rates = [
            r["rate"]
            for r in rows
            if r["status"] == "ok" and r["rate"] and all(r.get(k) == v for k, v in c.items())
        ]
        if len(rates) != len(shapes_of(c)):
            continue
        score = math.exp(sum(math.log(x) for x in rates) / len(rates))
        key = (
            f"ln/{c['kind']}/{c['dtype']}/{c['n']}"
            if "n" in c
            else f"attn/{c['kind']}/{c['d']}/{c['causal']}"
        )
        if key not in best or score > best[key][0]:
            best[key] = (score, c)
    with open(os.path.join(args.out, "tuned.json"), "w") as f:
        json.dump({k: dict(v[1], score=v[0]) for k, v in sorted(best.items())}, f, indent=1)
    log("winners (score: GB/s for ln, TFLOP/s for attention):")
    for k, (score, c) in sorted(best.items()):
        print(f"  {k:28s} {score:8.1f}  {c}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
