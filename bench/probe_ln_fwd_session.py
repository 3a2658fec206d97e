"""Probe: the layer-norm forward at the anchor rows where a peer led the sessions, timed the way the
sessions time it (the registry's entries on inputs that require grad, the sessions' timer with its
defaults) and through our launcher alone, alternated ``--rounds`` times in one process.

Runs 116 and 124 had Liger 6% ahead at float32 4096×2048, where an alternated probe (run 59) had found
ours and Liger's equal: if the entries called as the sessions call them differ from the launcher alone,
the difference is in the call (the autograd wrapper's GPU work, the spin that hides the CPU); if not,
it is in the session's order of measurements.

    python bench/probe_ln_fwd_session.py [--rows float32:4096x2048,...] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

ROWS = "float32:4096x2048,float32:4096x4096,bfloat16:4096x1024"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=ROWS)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_ln_fwd_session.py")
    import torch
    from crossfuse import registry
    from crossfuse.harness import timing
    from crossfuse.ops import layer_norm as ln

    op = registry.OPS["layer_norm"]
    print(torch.cuda.get_device_name(), flush=True)
    for row in args.rows.split(","):
        dtype_name, shape = row.split(":")
        m, n = (int(s) for s in shape.split("x"))
        dtype = getattr(torch, dtype_name)
        inputs = op.make_inputs((m, n), dtype, "cuda")
        leaves = {k: inputs[k].detach().clone().requires_grad_(True) for k in op.grad_args if k in inputs}
        ins = {**inputs, **leaves}
        calls = {}
        for name in ("fused", "liger", "torch_compile"):
            try:
                impl = registry.get("layer_norm", name)
                impl.fn(**ins)
                calls[f"{name} (session's call)"] = lambda impl=impl, ins=ins: impl.fn(**ins)
            except Exception as exc:  # a peer not installed here: say so, go on
                print(f"  {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
        x, w, b = inputs["x"], inputs["weight"], inputs["bias"]
        calls["fused (launcher alone)"] = lambda x=x, w=w, b=b, e=inputs["eps"]: ln.layer_norm_fwd(x, w, b, e)
        times = timing.alternate(calls, args.rounds)
        print(f"\n{dtype_name} {m}x{n}: GB/s of each round's median, then their median", flush=True)
        for name, ts in times.items():
            gbs = [2 * m * n * dtype.itemsize / t / 1e6 for t in ts]
            each = " ".join(f"{g:5.0f}" for g in gbs)
            print(f"  {name:26s} {each}  | {statistics.median(gbs):5.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
