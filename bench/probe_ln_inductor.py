"""Probe: what inductor generates for the layer-norm forward (torch.compile of ``F.layer_norm``), in its
inference form (inputs that do not require grad: y alone) and its training form (inputs that require grad:
y, the mean and rstd, as the sessions call it), the launch its autotuner kept, and the GB/s of both against
ours and the sessions' own torch.compile entry, alternated in one process.

    python bench/probe_ln_inductor.py [--shape 65536x1024] [--dtypes bfloat16,float32] [--rounds 3]

Runs 190 (its first draft, the same calls) and 194 found inductor's kernel for 65536×1024 to be one row per
program on one warp, and its training forward 2.3–2.4% (bf16) and 1.3–1.5% (float32) slower than its
inference forward, the only difference between the two kernels being the mean and rstd stores.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from ab_ln import probe_timing  # bench/ is this script's folder (sys.path[0]); it sets the path


def _launchers():
    """``(kernel name, config, registers, spills)`` of every inductor kernel loaded in this process that
    has launchers (after autotuning, the one it kept)."""
    from torch._inductor.codecache import PyCodeCache

    # the loaded modules of inductor's output code (a list in torch 2.11 and 2.13)
    for mod in list(getattr(PyCodeCache, "modules", ())):
        for name, obj in vars(mod).items():
            for launcher in getattr(obj, "launchers", None) or ():
                yield (
                    name,
                    getattr(launcher, "config", None),
                    getattr(launcher, "n_regs", None),
                    getattr(launcher, "n_spills", None),
                )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="65536x1024", help="MxN")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_ln_inductor.py")
    import torch
    import torch.nn.functional as F
    from crossfuse import registry
    from crossfuse.harness import timing
    from crossfuse.ops import layer_norm as ln
    from torch._inductor.utils import run_and_get_code

    m, n = (int(v) for v in args.shape.lower().split("x"))
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
        xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
        torch._dynamo.reset()
        f_inf = torch.compile(lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5), dynamic=False)
        _, code_inf = run_and_get_code(f_inf, x, w, b)
        f_tr = torch.compile(lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5), dynamic=False)
        _, code_tr = run_and_get_code(f_tr, xg, wg, bg)
        for label, codes in (("inference", code_inf), ("training", code_tr)):
            print(f"===== {dtype_name} {label}: {len(codes)} code blocks")
            for code in codes:
                print(code)
        for name, config, regs, spills in _launchers():
            print(f"LAUNCHER {dtype_name} {name} {config} regs {regs} spills {spills}")
        fns = {
            "torch_compile inference": lambda f=f_inf, x=x, w=w, b=b: f(x, w, b),
            "torch_compile training": lambda f=f_tr, x=xg, w=wg, b=bg: f(x, w, b),
            "the sessions' torch_compile": lambda x=xg, w=wg, b=bg: registry._torch_compile_layer_norm(
                x, w, b, 1e-5
            ),
            "ours": lambda x=x, w=w, b=b: ln.layer_norm_fwd(x, w, b, 1e-5),
        }
        times = timing.alternate(fns, args.rounds, config=probe_timing())
        nbytes = 2 * m * n * x.element_size()
        for name, ts in times.items():
            print(f"{dtype_name} {m}x{n} {name}: {nbytes / statistics.median(ts) / 1e6:.0f} GB/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
