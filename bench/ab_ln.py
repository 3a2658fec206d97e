"""A/B of two versions of the layer-norm kernels in one process: an earlier ``layer_norm.py`` (for
example ``git show REV:python/crossfuse/ops/layer_norm.py > /tmp/old.py``) against this checkout's, each
with its own ``TUNED`` table, alternated ``--rounds`` times at the session's shapes (medians of
``crossfuse.harness.timing.time_cuda``, the sessions' GPU timer).

    python bench/ab_ln.py OLD_LAYER_NORM_PY [--rounds 3] [--shapes MxN,...] [--kinds fwd,bwd,bwd-dx]

Prints one line per (shape, dtype, fwd/bwd): GB/s of each, their ratio, and the largest difference of
their outputs. ``bwd-dx`` is the backward without dw and db (a layer norm without affine parameters, or
with frozen ones). ``bench/results/h200/ab_run35_ln.txt`` and ``ab_run36_ln.txt`` came from its first form,
which differed only in taking the old module copied into the package by hand; ``ab_run40_ln.txt`` to
``ab_run42_ln.txt`` from this one.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import importlib
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

SHAPES = [(4096, 1024), (4096, 2048), (4096, 4096), (4096, 8192), (4096, 16384), (65536, 1024), (32768, 4096)]


def probe_timing():
    """The layer-norm probes' timer settings (the sessions' GPU timer, 40 ms of calls per figure)."""
    from crossfuse.harness import timing

    return timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=40.0, cuda_min_reps=10, cuda_max_reps=200)


def load_ops_module(path, name: str):
    """An earlier ``crossfuse/ops/<op>.py`` (``layer_norm.py``, ``relu_attention.py``) imported as
    ``crossfuse.ops.<name>``: it imports its siblings relatively, so it sits in the package for the run
    (removed at exit)."""
    twin = ROOT / "python" / "crossfuse" / "ops" / f"{name}.py"
    shutil.copyfile(path, twin)
    atexit.register(twin.unlink, missing_ok=True)
    return importlib.import_module(f"crossfuse.ops.{name}")


def inputs(mod, m: int, n: int, dtype):
    """Random ``(x, w, b, dy, mean, rstd)`` on the GPU, the statistics from ``mod``'s forward."""
    import torch

    x = torch.randn(m, n, device="cuda", dtype=dtype)
    w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    _, mean, rstd = mod.layer_norm_fwd(x, w, b, 1e-5)
    return x, w, b, dy, mean, rstd


def _calls(mod, kind, x, w, b, dy, mean, rstd):
    """The op of module ``mod`` on these inputs, as a call with no arguments."""
    if kind == "fwd":
        return functools.partial(mod.layer_norm_fwd, x, w, b, 1e-5)
    grads = kind == "bwd"  # else "bwd-dx": dx alone
    return functools.partial(mod.layer_norm_bwd, dy, x, w, mean, rstd, grads, grads)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", help="an earlier crossfuse/ops/layer_norm.py")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default=",".join(f"{m}x{n}" for m, n in SHAPES), help="MxN,...")
    ap.add_argument("--kinds", default="fwd,bwd", help="of fwd, bwd, bwd-dx")
    from crossfuse.harness import toolchain

    toolchain.add_argument(ap)
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/ab_ln.py")
    toolchain.pin_for(ap, args.ptxas)
    print(f"ptxas: {toolchain.ptxas_in_use()}", flush=True)
    import torch
    from crossfuse.harness import timing
    from crossfuse.ops import layer_norm as new

    old = load_ops_module(args.old, "_ab_old_layer_norm")
    cfg = timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=25.0, cuda_min_reps=10, cuda_max_reps=100)
    print("shape dtype kind old_GBps new_GBps new/old", flush=True)
    for m, n in (tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",")):
        for dtype in (torch.bfloat16, torch.float32):
            x, w, b, dy, mean, rstd = inputs(new, m, n, dtype)
            for kind in args.kinds.split(","):
                args_ = (kind, x, w, b, dy, mean, rstd)
                fns = {"old": _calls(old, *args_), "new": _calls(new, *args_)}
                outs = zip(fns["old"](), fns["new"](), strict=True)
                err = max((a.float() - c.float()).abs().max().item() for a, c in outs if a is not None)
                times = {"old": [], "new": []}
                for _ in range(args.rounds):
                    for name in ("old", "new"):
                        times[name].append(timing.time_cuda(fns[name], config=cfg).p50)
                nbytes = (2 if kind == "fwd" else 3) * m * n * x.element_size()
                o, nw = statistics.median(times["old"]), statistics.median(times["new"])
                rates = f"{nbytes / o / 1e6:.0f} {nbytes / nw / 1e6:.0f} {o / nw:.3f}"
                print(f"{m}x{n} {str(dtype)[6:]} {kind} {rates} (max |new-old| {err:.2e})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
