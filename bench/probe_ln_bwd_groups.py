"""The layer-norm backward of long rows split between groups of programs (``crossfuse.ops._ln_bwd_rows``'s
grouped kernel) against the code's table entry, alternated in one process.

    python bench/probe_ln_bwd_groups.py [--rounds 3] [--shapes 4096x16384,...] [--dtypes bfloat16,float32]
                                        [--candidates S:STAGES:LAG:WARPS[:P[:R[:PAIRED]]],...]
                                        [--once S:STAGES:LAG:WARPS[:P[:R[:PAIRED]]]]

For each shape and dtype: the table's backward (``layer_norm_bwd`` with ``config=None``), the same with
the scratch rows of a grouped entry finished by the two-pass kernel (``FINISH_FROM_SHARES`` off), and each
grouped candidate (``slices`` S, ``tma_stages`` STAGES, ``lag`` LAG, ``num_warps`` WARPS,
``programs_per_sm`` P, 1 when not given; compiled with at most R registers a thread, ``maxnreg``, where
given and not 0; PAIRED 1: ``paired``, two groups' partials in one row), each first checked against the
table's gradients (largest difference of dx, dw, db: both are within their tolerances of float64 by the GPU
tests; here they differ by rounding), then timed ``--rounds`` times in turn with the sessions' GPU timer
(``crossfuse.harness.timing.time_cuda``, p50), the order reversed every other round. Prints GB/s
(3·M·N·bytes), the share of the copy ceiling measured in the same process (bf16 ``y.copy_(x)``, 512 MiB,
bytes read + written) and the ratio to the table's entry, medians of the rounds.
``--once`` runs one candidate's backward a few times and exits (for ``ncu``).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys

from ab_ln import inputs  # bench/ is this script's folder (sys.path[0]); it sets the path

# bf16 and float32 at N = 16384 (a candidate whose buffers do not fit a dtype is said and skipped)
DEFAULT_CANDIDATES = (
    "4:8:1:16,4:8:2:16,4:12:2:16,4:12:3:16,4:6:1:16,4:6:2:16,4:7:2:16,4:8:2:8,"
    "2:6:1:16,2:6:2:16,2:3:1:16,8:12:2:8,8:12:4:8,8:8:2:8"
)


def parse_candidate(text: str) -> tuple[int, int, int, int, int, int, int]:
    """``(slices, stages, lag, warps, programs per SM, register cap or 0, paired 0 or 1)`` of
    ``S:STAGES:LAG:WARPS[:P[:R[:PAIRED]]]``."""
    values = [int(v) for v in text.split(":")]
    if len(values) not in (4, 5, 6, 7) or (len(values) == 7 and values[6] not in (0, 1)):
        raise SystemExit(f"a candidate is S:STAGES:LAG:WARPS[:P[:R[:PAIRED]]] (PAIRED 0 or 1), got {text!r}")
    return tuple(values) + (1, 0, 0)[len(values) - 4 :]


def grouped_config(ln, n: int, cand):
    slices, stages, lag, warps, per_sm, _, paired = cand
    return ln.LaunchConfig(1, n, warps, per_sm, tma_stages=stages, smem_rows=True, slices=slices, lag=lag,
                           paired=bool(paired))  # fmt: skip


def with_attr(module, name: str, value, fn):
    """``fn`` with ``module.name`` set to ``value`` for the call (to compare), as it was after."""

    def call(**kwargs):
        before = getattr(module, name)
        setattr(module, name, value)
        try:
            return fn(**kwargs)
        finally:
            setattr(module, name, before)

    return call


def copy_ceiling(torch, timing, cfg_t) -> float:
    """GB/s of a bf16 ``y.copy_(x)`` of 512 MiB, bytes read + written."""
    src = torch.ones(1 << 28, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 2 / timing.time_cuda(functools.partial(dst.copy_, src), config=cfg_t).p50 / 1e6


def compare(torch, timing, ln, m, n, dtype, cands, rounds, cfg_t, copy_gbps) -> None:
    """The table's backward and each grouped candidate at one shape and dtype, alternated ``rounds``
    times; prints a line each."""
    x, w, _, dy, mean, rstd = inputs(ln, m, n, dtype)
    call = functools.partial(ln.layer_norm_bwd, dy, x, w, mean, rstd, True, True)
    # the table with the scratch rows of a grouped entry finished by the two-pass kernel (as before v36)
    fns = {"table": call, "table/two-pass finish": with_attr(ln, "FINISH_FROM_SHARES", False, call)}
    want = call()
    diffs = dict.fromkeys(fns, "-")
    for cand in cands:
        name = "S{}/st{}/lag{}/w{}".format(*cand) + (f"/p{cand[4]}" if cand[4] != 1 else "")
        name += (f"/r{cand[5]}" if cand[5] else "") + ("/paired" if cand[6] else "")
        cfg = grouped_config(ln, n, cand)
        capped = with_attr(ln._ln_bwd_rows, "GROUPS_MAXNREG", cand[5] or None, call)
        try:
            got = capped(config=cfg)
            torch.cuda.synchronize()
        except Exception as exc:  # a candidate that does not launch: said, not timed
            print(f"{m}x{n} {str(dtype)[6:]} {name}: {type(exc).__name__}: {exc}", flush=True)
            continue
        diffs[name] = " ".join(f"{(a.float() - b.float()).abs().max().item():.1e}"
                               for a, b in zip(got, want, strict=True))  # fmt: skip
        fns[name] = functools.partial(capped, config=cfg)
    times: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            times[name].append(timing.time_cuda(fns[name], config=cfg_t).p50)
    nbytes = 3 * m * n * x.element_size()
    base = statistics.median(times["table"])
    for name, ts in times.items():
        t = statistics.median(ts)
        gbps = nbytes / t / 1e6
        spread = f"rounds {min(ts) * 1e3:.1f}-{max(ts) * 1e3:.1f} us"
        print(f"{m}x{n} {str(dtype)[6:]} {name} {gbps:.0f} {100 * gbps / copy_gbps:.1f}% {base / t:.3f} "
              f"({diffs[name]}) {spread}", flush=True)  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default="4096x16384", help="MxN,...")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--candidates", default=DEFAULT_CANDIDATES, help="S:STAGES:LAG:WARPS[:P[:R[:PAIRED]]],..")
    ap.add_argument("--once", help="a candidate or 'table': run that backward 3 times, for ncu")
    from crossfuse.harness import toolchain

    toolchain.add_argument(ap)
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_ln_bwd_groups.py")
    toolchain.pin_for(ap, args.ptxas)
    import torch
    from crossfuse.harness import timing
    from crossfuse.ops import layer_norm as ln

    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    if args.once:
        m, n = shapes[0]
        x, w, _, dy, mean, rstd = inputs(ln, m, n, dtypes[0])
        cand = None if args.once == "table" else parse_candidate(args.once)
        call = functools.partial(ln.layer_norm_bwd, dy, x, w, mean, rstd, True, True)
        call = with_attr(ln._ln_bwd_rows, "GROUPS_MAXNREG", cand[5] or None, call) if cand else call
        for _ in range(3):
            call(config=grouped_config(ln, n, cand) if cand else None)
        torch.cuda.synchronize()
        return 0

    print(f"ptxas: {toolchain.ptxas_in_use()}", flush=True)
    cfg_t = timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=30.0, cuda_min_reps=10, cuda_max_reps=100)
    copy_gbps = copy_ceiling(torch, timing, cfg_t)
    print(f"copy ceiling {copy_gbps:.0f} GB/s", flush=True)
    cands = [parse_candidate(c) for c in args.candidates.split(",")]
    print("shape dtype candidate GB/s %copy vs_table (max|diff| of dx, dw, db to the table)", flush=True)
    for m, n in shapes:
        for dtype in dtypes:
            compare(torch, timing, ln, m, n, dtype, cands, args.rounds, cfg_t, copy_gbps)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
