"""Sweep launch configurations of crossfuse's kernels on a GPU and pick the fastest per key.

    python bench/tune.py --out DIR [--only GROUP,...] [--kind KIND] [--dtype DTYPE] [--base code|tuned.json]
                         [--workers 16] [--quick] [--budget-s S]

Phase 1 compiles every candidate in parallel worker processes (each launches it once on real-shaped
inputs, filling Triton's on-disk cache); phase 2 times them one at a time in this process with
``crossfuse.harness.timing.time_cuda`` (median GPU time, L2 flushed, the CPU's enqueue time hidden
behind a GPU spin: small shapes are not scored on launch overhead); phase 3 writes ``tuning.csv``
(every candidate) and ``tuned.json`` (the winner per key), and prints the winners, the entries of the tables
(``TABLES``, per GPU model) of ``crossfuse.ops.layer_norm`` and ``crossfuse.ops.relu_attention``.

Layer norm is timed at M=4096 (the "few rows" regime of the layer norm's tables) and at a
large M (M*N = 128M elements, at least 16384 rows: "many rows"); each regime gets its own winner.
``ln-shifted`` tunes the chunked forward in two passes (``shifted``) against the code's entries
(with ``--base code``) for N >= 4096.
``ln-tma`` tunes the persistent whole-row kernels that read through tensor descriptors (``tma_stages``).
``ln-coop`` tunes the cooperative backward of long rows (``coop``), N = 8192 and 16384.
``ln-long`` tunes rows past the whole-row kernels' (N = 32768 and 65536, the rule's configurations among
the candidates) at 1000 and 4096 rows ("few rows": the best geometric mean of the two wins) and, for
N = 32768, 16384 ("many"; at 65536 the few rows' entry serves both).
``--kind bwd`` (or ``fwd``) times the chosen groups' candidates of that kind only (``bwd`` includes the
attention's ``dkdv`` and ``dq`` candidates); ``tuned.json`` keeps the base's entries of the other kinds;
a selection with no candidate is an error.
Attention runs at 16k tokens, H=32 for D=64 and H=16 for D=128, bf16: at L=4096 (B=4), and with
``attn128`` (D=128 only) also at L=1024 (B=16), each length its own winner ("short" is L <= 2048).
``attn-fp32`` tunes float32 (tf32 dots) at the seed's shapes (B=4, H=16, D=64, L=4096 and L=1024);
``attn-fp32-fwd`` its forward alone, with 4 stages too. ``attn-fp32-dims`` tunes float32 at D=128 and
256 (Triton's kernels: the Gluon ones take D <= 64) at B=2, H=8, L=4096, and at L=1000 with B=4, H=16
and with B=1, H=4 (both stand for the short entry; the faster rate wins it, so tuning.csv shows how the
winner does with few programs). ``attn-tma`` tunes the bf16 kernels that read through tensor
descriptors (TMA), D=64 and 128 at both lengths.
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

from crossfuse.harness import sweep


def _timing_config():
    from crossfuse.harness import timing

    return timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=20.0, cuda_min_reps=10, cuda_max_reps=100)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------------------------------
# One candidate: build inputs and a launch closure
# ----------------------------------------------------------------------------------------------------


def ln_shapes(n: int) -> list[tuple[int, int]]:
    return [(4096, n), (max(16384, (128 << 20) // n), n)]


def attn_shapes(c: dict) -> list[tuple[int, int, int, int]]:
    d = c["d"]
    if c.get("dtype", "bfloat16") == "float32" and d > 64:  # the grid's shapes, and many heads at L=1000
        return [(2, 8, 4096, d)] + ([(4, 16, 1000, d), (1, 4, 1000, d)] if c.get("short") else [])
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
    from crossfuse.ops._runtime.device import card_of

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
    other = "dq" if c["kind"] == "dkdv" else "dkdv"
    default = ra.attention_config(other, d, dtype, c["causal"], length=l, card=card_of(q))
    configs = (cfg, default) if c["kind"] == "dkdv" else (default, cfg)
    # dkdv does 4 of the 7 backward matmuls, dq 3: time the pair with the other kernel at its default
    return (lambda: ra.relu_attention_bwd(q, k, v, do, c["causal"], False, scale, relu_scale, dq, dk, dv,
                                          configs=configs)), 2.5 * fwd_flops  # fmt: skip


def shapes_of(c: dict):
    if "n" in c and c.get("long_rows"):  # few rows twice; many rows up to 2^29 elements (else few serves)
        return [(1000, c["n"]), (4096, c["n"])] + ([(16384, c["n"])] if c["n"] <= 32768 else [])
    if "n" in c:
        return ln_shapes(c["n"])[1:] if c.get("many_only") else ln_shapes(c["n"])
    return attn_shapes(c)


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
    ap.add_argument(
        "--only", help=f"comma-separated subset of {', '.join(sweep.GROUPS)} (default: ln and attn)"
    )
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
        "--dtype",
        help="time only candidates of this dtype (bfloat16, float32), the base's too; the others keep the "
        "base's entries",
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
    if only - set(sweep.GROUPS):
        ap.error(
            f"unknown --only groups {sorted(only - set(sweep.GROUPS))}; known: {', '.join(sweep.GROUPS)}"
        )
    t0 = time.monotonic()
    import torch
    from crossfuse.harness import timing

    os.makedirs(args.out, exist_ok=True)
    if "attn-pairs" in only and not args.pairs_from:
        ap.error("attn-pairs needs --pairs-from TUNING_CSV")
    cands = sweep.candidates(only, args.quick, args.pairs_from)
    base = {}
    if args.base == "code":
        from crossfuse.ops._runtime.device import current_card

        base = sweep.code_tables(current_card())
    elif args.base:
        with open(args.base) as f:
            base = json.load(f)
    # the base competes again, in this run (timed first, so a --budget-s cut never leaves it out): a winner
    # must beat it here
    cands = sweep.base_candidates(base, cands) + cands
    cands = list({json.dumps(c, sort_keys=True): c for c in cands}.values())  # groups may overlap
    if args.kind:  # the others keep the base's entries
        cands = sweep.of_kind(cands, args.kind)
        if not cands:
            ap.error(f"no candidate of --only {args.only or 'ln,attn'} is of --kind {args.kind}")
    if args.dtype:
        cands = [c for c in cands if c.get("dtype", "bfloat16") == args.dtype]
        if not cands:
            ap.error(f"no candidate of --only {args.only or 'ln,attn'} is of --dtype {args.dtype}")
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
    best = sweep.winners(rows)
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
