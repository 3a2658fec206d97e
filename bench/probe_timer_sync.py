"""Probe: what of the mended CUDA timer moved the figures, and which of torch.compile's kernels left
persisting L2 lines in the old sessions (both open after runs 213-222, bench/results/h200/NOTES.md;
answered by run 224, ``bench/results/h200/probe_run224_timer_sync.txt``: the synchronisation moved the
level, and neither of torch.compile's measurements leaves lines that matter).

    python bench/probe_timer_sync.py [--shapes 4096x2048,4096x4096] [--rounds 3] [--no-compile]

Part 1, in a fresh process (nothing loaded with ``evict_last`` yet): our whole-row forward, then our
chunked forward, float32, each timed under three timers in turn, ``--rounds`` times: ``old`` (no
synchronisation, no reset: ``reset_persisting_l2=False, sync_each_repeat=False``; when run 224 ran it, the
first alone meant both), ``sync only`` (the new timer's
synchronisation before each repeat, through a reset that does nothing) and ``new`` (synchronisation and
``cuCtxResetPersistingL2Cache``). If ``sync only`` moves the whole-row kernel as ``new`` does, the
synchronisation made the difference; if only ``new`` does, the reset.

Part 2 (skipped with ``--no-compile``): under the old timer, our whole-row forward measured right after a
measurement of torch.compile's layer norm forward, or of its backward (the gradient call of a retained
graph, as a session times it), against right after a reset by hand: which of the two leaves lines that the
next call reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import sys

from ab_ln import probe_timing  # bench/ is this script's folder (sys.path[0]); it sets the path


def _cell(label: str, gbps: list[float]) -> str:
    return f"{label} {statistics.median(gbps):.0f} ({'/'.join(f'{g:.0f}' for g in gbps)})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="4096x2048,4096x4096", help="MxN,... (float32)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true", help="skip part 2 (torch.compile)")
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_timer_sync.py")
    import torch
    from crossfuse import registry
    from crossfuse.harness import timing
    from crossfuse.ops import layer_norm as ln

    new = probe_timing()
    old = dataclasses.replace(new, reset_persisting_l2=False, sync_each_repeat=False)
    real = timing.persisting_l2_reset()
    if real is None:
        raise SystemExit("the driver's cuCtxResetPersistingL2Cache did not load: nothing to compare")

    def measure(fn, mode: str) -> float:
        if mode == "sync only":
            timing._PERSISTING_RESET[:] = [lambda: 0]
        try:
            return timing.time_cuda(fn, "cuda", old if mode == "old" else new).p50
        finally:
            timing._PERSISTING_RESET[:] = [real]

    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",")]
    print("part 1: GB/s (2·M·N·4 bytes) under each timer, rounds in the order run", flush=True)
    for m, n in shapes:
        x = torch.randn(m, n, device="cuda")
        w, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        whole = ln.LaunchConfig(2, n, 4 if n <= 2048 else 8, 0, keep_params=True)  # whole rows, pointers
        chunked = ln.LaunchConfig(1, n // 2, 8, 0, unroll=2)  # two chunks per row
        for name, cfg in (("whole rows", whole), ("chunked", chunked)):
            fn = functools.partial(ln.layer_norm_fwd, x, w, b, 1e-5, config=cfg)
            fn()
            torch.cuda.synchronize()
            res = {mode: [] for mode in ("old", "sync only", "new")}
            for _ in range(args.rounds):
                for mode in res:
                    res[mode].append(2 * m * n * 4 / measure(fn, mode) / 1e6)
            print(f"  float32 {m}x{n} {name}: " + "   ".join(_cell(k, v) for k, v in res.items()), flush=True)

    if args.no_compile:
        return 0
    print("part 2: our whole-row forward under the old timer right after each P (GB/s, rounds)", flush=True)
    for m, n in shapes:
        x = torch.randn(m, n, device="cuda")
        w, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
        dy = torch.randn_like(x)
        y = registry._torch_compile_layer_norm(xg, wg, bg, 1e-5)  # compiles; the graph kept for its backward
        tc_fwd = functools.partial(registry._torch_compile_layer_norm, xg, wg, bg, 1e-5)
        tc_bwd = functools.partial(torch.autograd.grad, y, (xg, wg, bg), dy, retain_graph=True)
        tc_bwd()  # compiles the backward
        preds = {
            "a reset by hand": functools.partial(timing._reset_persisting_l2, "cuda"),
            "torch.compile fwd": functools.partial(timing.time_cuda, tc_fwd, "cuda", old),
            "torch.compile bwd": functools.partial(timing.time_cuda, tc_bwd, "cuda", old),
        }
        whole = ln.LaunchConfig(2, n, 4 if n <= 2048 else 8, 0, keep_params=True)
        target = functools.partial(ln.layer_norm_fwd, x, w, b, 1e-5, config=whole)
        target()
        res = {p: [] for p in preds}
        for _ in range(args.rounds):
            for p, before in preds.items():
                before()
                torch.cuda.synchronize()
                res[p].append(2 * m * n * 4 / timing.time_cuda(target, "cuda", old).p50 / 1e6)
        print(f"  float32 {m}x{n}: " + "   ".join(_cell("after " + p, v) for p, v in res.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
