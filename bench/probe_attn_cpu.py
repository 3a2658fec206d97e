"""Probe: where the CPU time of the attention forward goes at the causal 16×32×1024×64 anchor shape, where
``bench/extras.py`` found the autograd path 1.37× the raw launcher in ``do_bench`` time (run 75) while
the GPU times were equal.

    python bench/probe_attn_cpu.py [--calls 200]

Each callable is enqueued ``--calls`` times between two synchronisations (µs per call; two repeats): the
raw launcher, the autograd wrapper with inputs requiring grad and with inputs that do not, and their
parts (the launch with prebuilt tensor descriptors, one descriptor, ``_tma_usable``, the config lookup,
the output's allocation, the argument checks, a trivial ``autograd.Function.apply`` with the same
arguments, the wrapper's ``Function.apply`` without its checks); then a cProfile of the autograd and raw
paths. Run 83 ran this script without the two ``apply_*`` calls; runs 81, 82 and 84 ran the same calls
from throwaway scripts (``probe_run8[1-4]_attn_cpu.txt``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_attn_cpu.py")
    import crossfuse
    import torch
    import triton
    from crossfuse.ops import relu_attention as ra

    B, H, L, D = 16, 32, 1024, 64
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = torch.empty_like(q)
    cfg = ra.attention_config("fwd", D, q.dtype, True, False, L)
    descs = [ra._desc(t, cfg.block_m if t is q or t is out else cfg.block_n) for t in (q, k, v, out)]
    grid = (triton.cdiv(L, cfg.block_m), B * H)

    def launch():
        ra._relu_attn_fwd_tma_kernel[grid](
            *descs, H, L, 0.125, 1 / L, HEAD_D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=True,
            SQUARED=False, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip

    class Trivial(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, squared, scale, relu_scale, layout):
            return out

        @staticmethod
        def backward(ctx, g):
            return g, g, g, None, None, None, None, None

    apply = ra.ReLUAttentionFunction.apply
    calls = {
        "raw_fwd": lambda: ra.relu_attention_fwd(q, k, v, True, False, D**-0.5, 1 / L),
        "autograd_fwd": lambda: crossfuse.relu_attention(qg, kg, vg, causal=True),
        "wrapper_no_grad_inputs": lambda: crossfuse.relu_attention(q, k, v, causal=True),
        "apply_grad_inputs": lambda: apply(qg, kg, vg, True, False, 0.125, 1 / L, "bhld"),
        "apply_no_grad_inputs": lambda: apply(q, k, v, True, False, 0.125, 1 / L, "bhld"),
        "launch_prebuilt_descs": launch,
        "desc": lambda: ra._desc(q, cfg.block_m),
        "tma_usable": lambda: ra._tma_usable(False, q, k, v, out),
        "attention_config": lambda: ra.attention_config("fwd", D, q.dtype, True, False, L),
        "empty": lambda: torch.empty((B, H, L, D), dtype=q.dtype, device=q.device),
        "check_args": lambda: ra._check_attention_args(qg, kg, vg, True, False, None, None, "bhld"),
        "trivial_apply": lambda: Trivial.apply(qg, kg, vg, True, False, 0.1, 0.1, "bhld"),
        "get_device_capability": lambda: torch.cuda.get_device_capability(q.device),
    }
    for _ in range(2):
        res = {}
        for name, fn in calls.items():
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            res[name] = round((t1 - t0) / args.calls * 1e6, 1)
        print(res, flush=True)
    for name in ("autograd_fwd", "raw_fwd"):
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        prof.enable()
        for _ in range(args.calls):
            calls[name]()
        prof.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
        print(name, s.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
