"""Sweep launch configurations of crossfuse's kernels on a GPU and pick the fastest per key.

    python bench/tune.py --out DIR [--only GROUP,...] [--kind KIND] [--base code|tuned.json] [--workers 16]
                         [--quick]

Phase 1 compiles every candidate in parallel worker processes (each launches it once on real-shaped
inputs, filling Triton's on-disk cache); phase 2 times them one at a time in this process with
``crossfuse.harness.timing.time_cuda`` (median GPU time, L2 flushed, the CPU's enqueue time hidden
behind a GPU spin: small shapes are not scored on launch overhead); phase 3 writes ``tuning.csv``
(every candidate) and ``tuned.json`` (the winner per key), and prints the winners as the ``TUNED`` tables of
``crossfuse.ops.layer_norm`` and ``crossfuse.ops.relu_attention``.

Layer norm is timed at M=4096 (the "few rows" regime of ``crossfuse.ops.layer_norm.TUNED``) and at a
large M (M*N = 128M elements, at least 16384 rows: "many rows"); each regime gets its own winner.
``ln-shifted`` tunes the chunked forward in two passes (``shifted``) against the code's entries
(with ``--base code``) for N >= 4096.
``ln-tma`` tunes the persistent whole-row kernels that read through tensor descriptors (``tma_stages``).
``ln-coop`` tunes the cooperative backward of long rows (``coop``), N = 8192 and 16384.
``--kind bwd`` (or ``fwd``) times the chosen groups' candidates of that kind only (``bwd`` includes the
attention's ``dkdv`` and ``dq`` candidates); ``tuned.json`` keeps the base's entries of the other kinds;
a selection with no candidate is an error.
Attention runs at 16k tokens, H=32 for D=64 and H=16 for D=128, bf16: at L=4096 (B=4), and with
``attn128`` (D=128 only) also at L=1024 (B=16), each length its own winner ("short" is L <= 2048).
``attn-fp32`` tunes float32 (tf32 dots) at the seed's shapes (B=4, H=16, D=64, L=4096 and L=1024);
``attn-fp32-fwd`` its forward alone, with 4 stages too. ``attn-tma`` tunes the bf16 kernels that read
through tensor descriptors (TMA), D=64 and 128 at both lengths.
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


def _timing_config():
    from crossfuse.harness import timing

    return timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=20.0, cuda_min_reps=10, cuda_max_reps=100)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------------------------------
# Candidates
# ----------------------------------------------------------------------------------------------------


def _row_tiles(n: int, block_ms, epts, warp_options, max_tile: int, min_tile: int = 1024):
    """(block_m, elements per thread per tensor, warps) of whole-row tiles of ``block_m`` rows of ``n``
    between ``min_tile`` and ``max_tile`` elements, whose warp count is one of ``warp_options``."""
    for bm in block_ms:
        tile = bm * n
        if not min_tile <= tile <= max_tile:
            continue
        for ept in epts:
            warps = tile // (32 * ept)
            if warps in warp_options:
                yield bm, ept, warps


def ln_candidates(quick: bool) -> list[dict]:
    out = []
    for n in LN_NS[:2] if quick else LN_NS:
        for dtype in LN_DTYPES:
            for bm in (1, 2, 4, 8, 16):
                for _, ept, warps in _row_tiles(n, (bm,), (8, 16, 32), (1, 2, 4, 8, 16, 32), 32768):
                    out.append(dict(kind="fwd", n=n, dtype=dtype, block_m=bm, num_warps=warps, pps=0))
                    if ept == 16 and not quick:  # the persistent forward
                        for pps in (4, 8):
                            out.append(dict(kind="fwd", n=n, dtype=dtype, block_m=bm, num_warps=warps,
                                            pps=pps))  # fmt: skip
                for _, _, warps in _row_tiles(n, (bm,), (4, 8, 16), (2, 4, 8, 16, 32), 16384):
                    for pps in (1, 2, 4, 8):
                        out.append(dict(kind="bwd", n=n, dtype=dtype, block_m=bm, num_warps=warps, pps=pps))
            for bn in (1024, 2048, 4096, 8192):  # the chunked forward: three passes over chunks of the row
                if bn < n and n >= 4096:
                    for warps in (4, 8, 16, 32):
                        if bn // (32 * warps) < 2:  # at least two elements per thread
                            continue
                        for unroll in (1, 2):
                            out.append(dict(kind="fwd", n=n, dtype=dtype, block_m=1, block_n=bn,
                                            num_warps=warps, pps=0, unroll=unroll))  # fmt: skip
            if n >= 8192:  # the split backward: row sums first, then column chunks of several rows
                for bn in (1024, 2048):
                    for bm in (2, 4, 8):
                        for warps in (4, 8):
                            for pps in (1, 4):
                                out.append(dict(kind="bwd", n=n, dtype=dtype, block_m=bm, block_n=bn,
                                                num_warps=warps, pps=pps))  # fmt: skip
    return out


def ln_unroll_candidates() -> list[dict]:
    """Persistent loops unrolled (two row tiles per iteration: the second tile's loads issue before the
    first tile's reductions) against the same loops not unrolled, N <= 4096, timed at many rows only."""
    out = []
    for n in (1024, 2048, 4096):
        for dtype in LN_DTYPES:
            for bm, _, warps in _row_tiles(n, (1, 2, 4), (4, 8, 16), (1, 2, 4, 8, 16), 1 << 30, min_tile=0):
                base = dict(n=n, dtype=dtype, block_m=bm, num_warps=warps, many_only=True)
                for unroll in (1, 2):
                    for pps in (1, 2, 4, 8):
                        out.append(dict(base, kind="bwd", pps=pps, unroll=unroll))
                    for pps in (2, 4, 8):
                        out.append(dict(base, kind="fwd", pps=pps, unroll=unroll))
                out.append(dict(base, kind="fwd", pps=0))
    return out


def ln_prefetch_candidates(pps_options=(1, 2, 4)) -> list[dict]:
    """Persistent loops that load the next row tile before reducing their own (``prefetch``): the
    forward and the fused backward with the whole row in one tile, and the split backward of long rows."""
    out = []
    for n in LN_NS:
        for dtype in LN_DTYPES:
            for bm in (1, 2, 4, 8):
                for kind, epts in (("fwd", (8, 16, 32)), ("bwd", (4, 8, 16))):
                    if kind == "bwd" and n > 8192:
                        continue
                    for _, _, warps in _row_tiles(n, (bm,), epts, (2, 4, 8, 16, 32), 16384):
                        for pps in pps_options:
                            base = dict(n=n, dtype=dtype, block_m=bm, num_warps=warps, pps=pps)
                            out.append(dict(base, kind=kind, prefetch=True))
            if n >= 8192:
                for bn in (1024, 2048):
                    for bm in (2, 4, 8):
                        for warps in (4, 8):
                            for pps in pps_options:
                                out.append(dict(kind="bwd", n=n, dtype=dtype, block_m=bm, block_n=bn,
                                                num_warps=warps, pps=pps, prefetch=True))  # fmt: skip
    return out


def ln_tma_candidates() -> list[dict]:
    """Whole-row persistent kernels reading through tensor descriptors (``tma_stages``: the copy engine
    fills 2 or 3 shared-memory buffers), forward and backward, every N of the tables."""
    out = []
    for n in LN_NS:
        for dtype in LN_DTYPES:
            for bm, _, warps in _row_tiles(n, (1, 2, 4, 8), (8, 16), (2, 4, 8, 16, 32), 16384):
                for stages in (2, 3):
                    base = dict(n=n, dtype=dtype, block_m=bm, num_warps=warps, tma_stages=stages)
                    for pps in (1, 2, 4):
                        out.append(dict(base, kind="bwd", pps=pps))
                    for pps in (1, 2, 4, 8):
                        out.append(dict(base, kind="fwd", pps=pps))
    return out


def ln_coop_candidates() -> list[dict]:
    """The cooperative backward of long rows (``coop``: column slabs of one row group exchange their row
    sums and wait for each other, x and dy read once), N = 8192 and 16384, against the code's entries."""
    out = []
    for n in (8192, 16384):
        for dtype in LN_DTYPES:
            for bn in (1024, 2048, 4096):
                for bm, _, warps in _row_tiles(bn, (1, 2, 4), (8, 16), (2, 4, 8, 16), 16384):
                    for pps in (1, 2, 4):
                        for prefetch in (False, True):
                            c = dict(kind="bwd", n=n, dtype=dtype, block_m=bm, block_n=bn, num_warps=warps,
                                     pps=pps, coop=True)  # fmt: skip
                            out.append(dict(c, prefetch=True) if prefetch else c)
    return out


def code_tables() -> dict:
    """The configurations in the code (``TUNED`` of both ops) as ``tuned.json`` entries, for ``--base
    code``: this run's candidates must beat them in the same run."""
    from crossfuse.ops import layer_norm as ln
    from crossfuse.ops import relu_attention as ra

    names = {2: "bfloat16", 4: "float32"}
    out = {}
    for (kind, esize, n, many), c in ln.TUNED.items():
        rows = "many" if many else "few"
        entry = dict(kind=kind, n=n, dtype=names[esize], block_m=c.block_m, num_warps=c.num_warps,
                     pps=c.programs_per_sm, rows=rows)  # fmt: skip
        if c.block_n != n:
            entry["block_n"] = c.block_n
        if c.unroll != 1:
            entry["unroll"] = c.unroll
        if c.prefetch:
            entry["prefetch"] = True
        if c.keep_params:
            entry["keep_params"] = True
        if c.shifted:
            entry["shifted"] = True
        if c.tma_stages:
            entry["tma_stages"] = c.tma_stages
        if c.coop:
            entry["coop"] = True
        if c.smem_rows:
            entry["smem_rows"] = True
        if c.slices > 1:
            entry["slices"] = c.slices
            entry["lag"] = c.lag
        if c.paired:
            entry["paired"] = True
        out[f"ln/{kind}/{names[esize]}/{n}/{rows}"] = entry
    for (kind, d, esize, causal, long), c in ra.TUNED.items():
        length = "long" if long else "short"
        out[f"attn/{kind}/{names[esize]}/{d}/{causal}/{length}"] = dict(
            kind=kind, d=d, causal=causal, dtype=names[esize], block_m=c.block_m, block_n=c.block_n,
            num_warps=c.num_warps, num_stages=c.num_stages, length=length,
        )  # fmt: skip
        if c.tma:
            out[f"attn/{kind}/{names[esize]}/{d}/{causal}/{length}"]["tma"] = True
    return out


def _attn(kind, d, causal, bm, bn, warps, stages) -> dict:
    return dict(kind=kind, d=d, causal=causal, block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)


def attn_candidates(quick: bool, ds=ATTN_DS, dtype="bfloat16") -> list[dict]:
    out = []
    for d in ds:
        for causal in (False, True):
            for bm, bn in ((64, 32), (64, 64), (128, 32), (128, 64), (128, 128)):
                for warps in (4, 8):
                    for stages in (2, 3, 4) if dtype != "float32" else (1, 2, 3):
                        out.append(_attn("fwd", d, causal, bm, bn, warps, stages))
            for bm, bn in ((16, 64), (32, 64), (64, 64), (16, 128), (32, 128), (64, 128)):
                for warps in (4, 8):
                    for stages in (2, 3):
                        out.append(_attn("dkdv", d, causal, bm, bn, warps, stages))
            for bm, bn in ((64, 16), (64, 32), (64, 64), (128, 16), (128, 32), (128, 64)):
                for warps in (4, 8):
                    for stages in (2, 3):
                        out.append(_attn("dq", d, causal, bm, bn, warps, stages))
    if dtype != "bfloat16":
        out = [dict(c, dtype=dtype) for c in out]
    if quick:
        out = out[::9]
    return out


def attn_tma_candidates() -> list[dict]:
    """bf16 kernels reading through tensor descriptors (TMA), D=64 and 128 at both lengths (16k tokens).
    (Run 26 also tried Triton's warp specialization of their loops: wrong results, so no longer offered.)"""
    tiles = {
        "fwd": ((64, 64), (128, 32), (128, 64), (128, 128)),
        "dkdv": ((32, 64), (64, 64), (32, 128), (64, 128)),
        "dq": ((64, 32), (64, 64), (128, 32), (128, 64)),
    }
    out = []
    for d in ATTN_DS:
        for causal in (False, True):
            for kind, kind_tiles in tiles.items():
                for bm, bn in kind_tiles:
                    for warps in (4, 8):
                        for stages in (3,) if kind == "fwd" else (2, 3, 4):
                            c = _attn(kind, d, causal, bm, bn, warps, stages)
                            out.append(dict(c, tma=True, short=True))
    return out


def of_kind(cands: list[dict], kind: str) -> list[dict]:
    """The candidates of ``--kind``: ``bwd`` is every backward candidate, the layer norm's and the
    attention's (its paired backward, and its dK/dV and dQ kernels, each timed in the whole backward)."""
    kinds = {"bwd", "dkdv", "dq"} if kind == "bwd" else {kind}
    return [c for c in cands if c.get("kind") in kinds]


def pair_candidates(paths: str, top: int = 5) -> list[dict]:
    """The backward as a pair: the ``top`` dK/dV and dQ configurations of earlier sweeps (``paths``, their
    tuning.csv files, comma-separated; each was timed with the other kernel at its default) combined, to
    be timed together."""
    rows = []
    for path in paths.split(","):
        with open(path, newline="") as f:
            rows += [r for r in csv.DictReader(f) if r.get("d") and r["status"] == "ok" and r["rate"]]
    out = []
    for d, dtype, causal in sorted({(int(r["d"]), r.get("dtype") or "bfloat16", r["causal"]) for r in rows}):
        tops = {}
        for kind in ("dkdv", "dq"):
            mine = [
                r
                for r in rows
                if r["kind"] == kind
                and int(r["d"]) == d
                and r["causal"] == causal
                and (r.get("dtype") or "bfloat16") == dtype
                and int(r["shape"].split("x")[2]) > 2048
            ]
            mine.sort(key=lambda r: -float(r["rate"]))
            tops[kind] = [
                [int(r[k]) for k in ("block_m", "block_n", "num_warps", "num_stages")] for r in mine[:top]
            ]
        for a in tops["dkdv"]:
            for b in tops["dq"]:
                c = dict(kind="bwd", d=d, causal=causal == "True", dkdv=a, dq=b, short=True)
                out.append(c if dtype == "bfloat16" else dict(c, dtype=dtype))
    return out


def base_candidates(base: dict, cands: list[dict]) -> list[dict]:
    """The entries of an earlier tuned.json whose (kind, dtype, N or D, causal) this run tunes, as
    candidates timed at the same shapes as this run's own candidates for that key."""
    meta = ("score", "rows", "length", "paired")

    def ident(c):
        return (c["kind"], c.get("dtype", "bfloat16"), c.get("n"), c.get("d"), c.get("causal"))

    flags = {}
    for c in cands:
        if c["kind"] != "bwd" or "n" in c:  # attention pairs are split into dkdv/dq entries below
            flags.setdefault(ident(c), {k: c[k] for k in ("many_only", "short") if k in c})
        else:
            for kind in ("dkdv", "dq"):
                flags.setdefault(ident(dict(c, kind=kind)), {"short": True} if c.get("short") else {})
    out = []
    for entry in base.values():
        c = {k: v for k, v in entry.items() if k not in meta}
        if ident(c) in flags:
            out.append(dict(c, **flags[ident(c)]))
    return out


# ----------------------------------------------------------------------------------------------------
# One candidate: build inputs and a launch closure
# ----------------------------------------------------------------------------------------------------


def ln_shapes(n: int) -> list[tuple[int, int]]:
    return [(4096, n), (max(16384, (128 << 20) // n), n)]


def attn_shapes(c: dict) -> list[tuple[int, int, int, int]]:
    d = c["d"]
    if c.get("dtype", "bfloat16") == "float32":  # the seed's shapes: B=4, H=16, L from 1024 to 4096
        return [(4, 16, 4096, d)] + ([(4, 16, 1024, d)] if c.get("short") else [])
    h = 32 if d == 64 else 16
    return [(4, h, 4096, d)] + ([(16, h, 1024, d)] if c.get("short") else [])


def make_launch(c: dict, shape):
    """(launch, units) for candidate ``c`` at ``shape``: units are bytes (ln) or FLOPs (attention)."""
    import torch

    if "n" in c:
        from crossfuse import _tuning
        from crossfuse.ops import layer_norm as ln

        dtype = getattr(torch, c["dtype"])
        m, n = shape
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        b = torch.randn(n, device="cuda", dtype=dtype)
        cfg = _tuning.layer_norm_config(ln.LaunchConfig, c)  # candidates' N are powers of 2: block_n = N
        if c["kind"] == "fwd":
            return (lambda: ln.layer_norm_fwd(x, w, b, 1e-5, config=cfg)), 2 * m * n * x.element_size()
        _, mean, rstd = ln.layer_norm_fwd(x, w, b, 1e-5)
        dy = torch.randn_like(x)
        return (
            lambda: ln.layer_norm_bwd(dy, x, w, mean, rstd, True, True, config=cfg)
        ), 3 * m * n * x.element_size()
    from crossfuse.ops import relu_attention as ra

    b_, h, l, d = shape
    dtype = getattr(torch, c.get("dtype", "bfloat16"))
    q, k, v, do = (torch.randn(b_, h, l, d, device="cuda", dtype=dtype) for _ in range(4))
    cfg = (
        ra.AttnConfig(c["block_m"], c["block_n"], c["num_warps"], c["num_stages"], c.get("tma", False))
        if "block_m" in c
        else None
    )
    scale, relu_scale = 1 / math.sqrt(d), 1 / l
    fwd_flops = 4 * b_ * h * l * l * d * (0.5 if c["causal"] else 1.0)
    if c["kind"] == "fwd":
        return (
            lambda: ra.relu_attention_fwd(q, k, v, c["causal"], False, scale, relu_scale, config=cfg)
        ), fwd_flops
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if c["kind"] == "bwd":  # a pair
        pair = (ra.AttnConfig(*c["dkdv"]), ra.AttnConfig(*c["dq"]))
        return (lambda: ra.relu_attention_bwd(q, k, v, do, c["causal"], False, scale, relu_scale, dq, dk, dv,
                                              configs=pair)), 2.5 * fwd_flops  # fmt: skip
    default = ra.attention_config("dq" if c["kind"] == "dkdv" else "dkdv", d, dtype, c["causal"], length=l)
    configs = (cfg, default) if c["kind"] == "dkdv" else (default, cfg)
    # dkdv does 4 of the 7 backward matmuls, dq 3: time the pair with the other kernel at its default
    return (lambda: ra.relu_attention_bwd(q, k, v, do, c["causal"], False, scale, relu_scale, dq, dk, dv,
                                          configs=configs)), 2.5 * fwd_flops  # fmt: skip


def shapes_of(c: dict):
    if "n" in c:
        return ln_shapes(c["n"])[1:] if c.get("many_only") else ln_shapes(c["n"])
    return attn_shapes(c)


def regime(c: dict, shape) -> str:
    """The table regime a timed shape stands for: few/many rows (ln), short/long sequences (attention),
    by the thresholds the ops use to pick a table entry."""
    from crossfuse.ops import layer_norm as ln
    from crossfuse.ops import relu_attention as ra

    if "n" in c:
        return "many" if shape[0] > ln.MANY_ROWS else "few"
    return "short" if shape[2] <= ra.SHORT_L else "long"


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
    groups = (
        "ln",
        "ln-split",
        "ln-chunked",
        "ln-unroll",
        "ln-shifted",
        "ln-tma",
        "ln-coop",
        "ln-fwd",
        "ln-prefetch",
        "ln-fwd-params",
        "ln-prefetch-wide",
        "attn",
        "attn128",
        "attn-fp32",
        "attn-pairs",
        "attn-fp32-fwd",
        "attn-tma",
    )
    ap.add_argument("--only", help=f"comma-separated subset of {', '.join(groups)} (default: ln and attn)")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--pairs-from",
        help="attn-pairs: tuning.csv files (comma-separated) whose best dK/dV and dQ configs to pair",
    )
    ap.add_argument(
        "--base",
        help="tuned.json of an earlier run, or 'code' for the tables in the code: its entries are timed "
        "again in this run, and stay where this run has no winner",
    )
    ap.add_argument(
        "--kind",
        help="time only candidates of this kind (fwd; bwd, which takes attention's dkdv and dq too; dkdv; "
        "dq), the base's too",
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="stop timing after this many seconds (from the start); the rest is marked 'budget'",
    )
    from crossfuse.harness import toolchain

    toolchain.add_argument(ap)
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/tune.py")
    toolchain.pin_for(ap, args.ptxas)  # before any compile, here and in the workers (they inherit it)
    log(f"ptxas: {toolchain.ptxas_in_use()}")
    only = set(args.only.split(",")) if args.only else {"ln", "attn"}
    if only - set(groups):
        ap.error(f"unknown --only groups {sorted(only - set(groups))}; known: {', '.join(groups)}")
    t0 = time.monotonic()
    import torch
    from crossfuse.harness import timing

    os.makedirs(args.out, exist_ok=True)
    cands = []
    ln_all = ln_candidates(args.quick)
    if "ln" in only:
        cands += ln_all
    if "ln-split" in only:  # the backward of long rows: fused and split candidates side by side
        cands += [c for c in ln_all if c["kind"] == "bwd" and c["n"] >= 8192]
    if "ln-fwd" in only:
        cands += [c for c in ln_all if c["kind"] == "fwd"]
    if "ln-chunked" in only:  # the forward of long rows: one-tile and chunked candidates side by side
        cands += [c for c in ln_all if c["kind"] == "fwd" and c["n"] >= 4096]
    if "ln-shifted" in only:  # the chunked forward in two passes (sums about a shift)
        chunked = [c for c in ln_all if c["kind"] == "fwd" and c["n"] >= 4096 and "block_n" in c]
        cands += [dict(c, shifted=True) for c in chunked]
    if "ln-tma" in only:
        cands += ln_tma_candidates()
    if "ln-coop" in only:
        cands += ln_coop_candidates()
    if "ln-unroll" in only:
        cands += ln_unroll_candidates()
    if "ln-prefetch" in only:
        cands += ln_prefetch_candidates()
    if "ln-prefetch-wide" in only:  # more programs per SM than ln-prefetch
        cands += ln_prefetch_candidates(pps_options=(8, 16))
    if "ln-fwd-params" in only:  # one-tile and prefetching forwards with weight and bias loaded first
        one_tile = [c for c in ln_all if c["kind"] == "fwd" and c["pps"] == 0 and "block_n" not in c]
        prefetching = [c for c in ln_prefetch_candidates() if c["kind"] == "fwd"]
        cands += [dict(c, keep_params=True) for c in one_tile + prefetching]
    if "attn" in only:
        cands += attn_candidates(args.quick)
    if "attn128" in only:  # D=128 at two lengths, each its own winner
        cands += [dict(c, short=True) for c in attn_candidates(args.quick, ds=(128,))]
    if "attn-fp32" in only:  # float32 (tf32 dots) at the seed's shapes, D=64, two lengths
        cands += [dict(c, short=True) for c in attn_candidates(args.quick, ds=(64,), dtype="float32")]
    if "attn-fp32-fwd" in only:  # the float32 forward alone (its value tiles stream from a transposed copy)
        fp32 = attn_candidates(args.quick, ds=(64,), dtype="float32")
        fp32 += [dict(c, num_stages=4) for c in fp32 if c["num_stages"] == 3]
        cands += [dict(c, short=True) for c in fp32 if c["kind"] == "fwd"]
    if "attn-tma" in only:
        cands += attn_tma_candidates()
    if "attn-pairs" in only:
        if not args.pairs_from:
            ap.error("attn-pairs needs --pairs-from TUNING_CSV")
        cands += pair_candidates(args.pairs_from)
    base = {}
    if args.base == "code":
        base = code_tables()
    elif args.base:
        with open(args.base) as f:
            base = json.load(f)
    # the base competes again, in this run (timed first, so a --budget-s cut never leaves it out): a winner
    # must beat it here
    cands = base_candidates(base, cands) + cands
    cands = list({json.dumps(c, sort_keys=True): c for c in cands}.values())  # groups may overlap
    if args.kind:  # the others keep the base's entries
        cands = of_kind(cands, args.kind)
        if not cands:
            ap.error(f"no candidate of --only {args.only or 'ln,attn'} is of --kind {args.kind}")
    log(f"{len(cands)} candidates; compiling with {args.workers} workers")
    status = {}
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(args.workers, mp_context=ctx) as pool:
        for i, (c, st) in enumerate(pool.map(_compile_one, cands, chunksize=2)):
            status[json.dumps(c, sort_keys=True)] = st
            if (i + 1) % 50 == 0:
                log(f"compiled {i + 1}/{len(cands)}")
    timing_cfg = _timing_config()
    log("timing")
    rows = []
    for i, c in enumerate(cands):
        st = status[json.dumps(c, sort_keys=True)]
        for shape in shapes_of(c):
            row = dict(c, shape="x".join(map(str, shape)), ms=None, rate=None, status=st)
            if st == "ok" and args.budget_s is not None and time.monotonic() - t0 > args.budget_s:
                row["status"] = "budget"
            elif st == "ok":
                try:
                    fn, units = make_launch(c, shape)
                    ms = timing.time_cuda(fn, config=timing_cfg).p50
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
    # winners: the fastest per key and regime (each timed shape is one regime of the tables)
    best: dict[str, tuple[float, dict]] = {}
    for r in rows:
        if r["status"] != "ok" or not r["rate"]:
            continue
        c = {k: r[k] for k in r if k not in ("shape", "ms", "rate", "status", "short", "many_only")}
        shape = tuple(int(x) for x in r["shape"].split("x"))
        reg = regime(c, shape)
        if "n" in c:
            key = f"ln/{c['kind']}/{c['dtype']}/{c['n']}/{reg}"
            c["rows"] = reg
        else:
            key = f"attn/{c['kind']}/{c.get('dtype', 'bfloat16')}/{c['d']}/{c['causal']}/{reg}"
            c["length"] = reg
        if key not in best or r["rate"] > best[key][0]:
            best[key] = (r["rate"], c)
    for key in [k for k in best if k.startswith("attn/bwd/")]:  # a pair: one entry per kernel
        rate, c = best.pop(key)
        if any(best.get(key.replace("/bwd/", f"/{kind}/"), (0.0,))[0] >= rate for kind in ("dkdv", "dq")):
            continue  # a single-kernel candidate (from --base) timed as fast as the best pair
        for kind in ("dkdv", "dq"):
            bm, bn, warps, stages = json.loads(c[kind]) if isinstance(c[kind], str) else c[kind]
            entry = {k: v for k, v in c.items() if k not in ("dkdv", "dq")}
            entry.update(kind=kind, block_m=bm, block_n=bn, num_warps=warps, num_stages=stages, paired=True)
            best[key.replace("/bwd/", f"/{kind}/")] = (rate, entry)
    tuned = dict(base)
    tuned.update({k: dict(v[1], score=v[0]) for k, v in best.items()})
    with open(os.path.join(args.out, "tuned.json"), "w") as f:
        json.dump(dict(sorted(tuned.items())), f, indent=1)
    log("winners (GB/s for ln, TFLOP/s for attention, at the regime's shape):")
    for k, (score, c) in sorted(best.items()):
        print(f"  {k:28s} {score:8.1f}  {c}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
