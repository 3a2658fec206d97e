"""Probe: the grouped layer-norm backward ending itself (v40: dw/db reduced and the scratch rows' dx
written inside the grouped kernel) against v38 (a reduction kernel and a finish kernel after it), taken
apart: the v38 module, this code with the tail off (the main loop's changes alone), with the tail, without
the cooperative launch, with relaxed polling; with and without dw/db. Alternated rounds, the sessions'
GPU timer.

    python bench/probe_ln_bwd_tail.py OLD_LAYER_NORM_PY [--rounds 5] [--shapes 4096x16384]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys

from ab_ln import inputs, load_ops_module, probe_timing


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", default="4096x16384")
    args = ap.parse_args(argv)
    import torch
    from crossfuse.harness import timing
    from crossfuse.ops import _ln_bwd_rows as rows
    from crossfuse.ops import layer_norm as new

    old = load_ops_module(args.old, "_probe_old_layer_norm")
    hold = rows.tail_hold

    def variant(tail=True, poll=0, coop=True):
        def setup():
            rows.tail_hold = hold if tail else (lambda *a: 0)
            rows.TAIL_POLL, rows.TAIL_COOPERATIVE = poll, coop
        return setup

    variants = {"v38": (old, variant()), "tail off": (new, variant(False)), "tail": (new, variant()),
                "tail, not coop": (new, variant(coop=False)), "tail, relaxed poll": (new, variant(poll=1))}
    cfg = probe_timing()
    for m, n in (tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")):
        x, w, _, dy, mean, rstd = inputs(new, m, n, torch.bfloat16)
        for grads in ((True, True), (False, False)):
            times = {k: [] for k in variants}
            ref = None
            for _ in range(args.rounds):
                for name, (mod, setup) in variants.items():
                    setup()
                    fn = functools.partial(mod.layer_norm_bwd, dy, x, w, mean, rstd, *grads)
                    out = fn()
                    if ref is None:
                        ref = out
                    err = (out[0].float() - ref[0].float()).abs().max().item()
                    times[name].append(timing.time_cuda(fn, config=cfg).p50)
            rows.tail_hold = hold
            base = statistics.median(times["v38"])
            nbytes = 3 * m * n * 2
            for name, t in times.items():
                med = statistics.median(t)
                rate = nbytes / med / 1e6
                print(f"{m}x{n} bf16 dw/db={grads[0]} {name:20s} {med * 1e3:8.1f} us {rate:6.0f} GB/s "
                      f"{base / med:.3f}x v38 (dx max diff {err:.1e})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
