"""A/B of two versions of the ReLU-attention kernels in one process: an earlier ``relu_attention.py``
(``git show REV:python/crossfuse/ops/relu_attention.py > /tmp/old.py``) against this checkout's, each with
its own ``TUNED`` tables, alternated ``--rounds`` times at the session's bf16 shapes (16k tokens; D=64 with
H=32, D=128 with H=16; L = 1024, 4096, 16384; causal and not), medians of
``crossfuse.harness.timing.time_cuda`` (the sessions' GPU timer).

    python bench/ab_attn.py OLD_RELU_ATTENTION_PY [--rounds 3] [--kind bwd|fwd] [--tuned TUNED_JSON]
                            [--seed | --heads]

``--seed`` takes the float32 extras' shapes instead (``bench/extras.py``'s comparison with the seed's
kernels): float32 (tf32 dots), the seed's [B, L, H, D] layout as [B, H, L, D] views, B=4, H=16, D=64,
L = 1024, 2048, 4096. ``--heads`` takes the extras' heads shapes (bf16, B=4, L=4096, D=64 and 128, H=16
and 64; the issue's per-head criterion compares H=64 with H=16).

``--tuned`` applies a sweep's ``tuned.json`` (``bench/tune.py``) to this checkout's tables only, as
``CROSSFUSE_TUNED_CONFIGS`` would: with a copy of this checkout's file as OLD, it alternates the sweep's
winners with the code's entries in one process.

Prints one line per (D, L, causal): TFLOP/s of each (4·B·H·L²·D forward, halved when causal, 2.5× that
backward), their ratio, and the largest difference of their outputs (the raw launchers'
``relu_attention_fwd`` / ``relu_attention_bwd``, scale 1/sqrt(D), relu_scale 1/L).
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys

from ab_ln import load_ops_module  # bench/ is this script's folder (sys.path[0]); it sets the path

TOKENS = 16384
SEED_BHD = (4, 16, 64)  # the seed's float32 shapes (B, H, D; L from 1024 to 4096), its layout [B, L, H, D]


def seed_inputs(length: int, count: int) -> list:
    """``count`` random float32 CUDA tensors at the seed's layout and shapes, as [B, H, L, D] views."""
    import torch

    b, h, d = SEED_BHD
    return [torch.randn((b, length, h, d), device="cuda").transpose(1, 2) for _ in range(count)]


def timing_config():
    """The attention A/B scripts' timer settings (the sessions' GPU timer, 50 ms of calls per figure)."""
    from crossfuse.harness import timing

    return timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=50.0, cuda_min_reps=5, cuda_max_reps=100)


def _call(mod, kind, q, k, v, do, kw):
    """The raw forward or backward launcher of module ``mod`` on these inputs, as a call with no arguments."""
    if kind == "fwd":
        return functools.partial(mod.relu_attention_fwd, q, k, v, **kw)
    return functools.partial(mod.relu_attention_bwd, q, k, v, do, **kw)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", help="an earlier crossfuse/ops/relu_attention.py")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kind", choices=("bwd", "fwd"), default="bwd")
    ap.add_argument("--tuned", help="a tuned.json whose attention entries the new side's tables take")
    shapes = ap.add_mutually_exclusive_group()
    shapes.add_argument("--seed", action="store_true", help="float32 at the seed's layout and shapes")
    shapes.add_argument("--heads", action="store_true", help="bf16 B=4 L=4096, H=16 and 64 (the extras')")
    from crossfuse.harness import toolchain

    toolchain.add_argument(ap)
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/ab_attn.py")
    toolchain.pin_for(ap, args.ptxas)
    print(f"ptxas: {toolchain.ptxas_in_use()}", flush=True)
    import torch
    from crossfuse import _tuning
    from crossfuse.harness import timing
    from crossfuse.ops import relu_attention as new

    versions = {"old": load_ops_module(args.old, "_ab_old_relu_attention"), "new": new}
    if args.tuned:
        changed = _tuning.attention_overrides(new.AttnConfig, _tuning.read_tuned(args.tuned, "--tuned "))
        changed = {k: c for k, c in changed.items() if new.TUNED.get(k) != c}
        new.TUNED.update(changed)
        print(f"new: the code's tables with {len(changed)} entries of {args.tuned}:", flush=True)
        for key, c in sorted(changed.items()):
            print(f"  {key}: {c}", flush=True)
    cfg = timing_config()
    print("D L causal old_TFLOPs new_TFLOPs new/old" + (" (H in brackets)" if args.heads else ""), flush=True)
    if args.seed:  # (B, H, D, L, dtype)
        cases = [(*SEED_BHD, length, torch.float32) for length in (1024, 2048, 4096)]
    elif args.heads:
        cases = [(4, h, d, 4096, torch.bfloat16) for d in (64, 128) for h in (16, 64)]
    else:
        cases = [
            (TOKENS // n, h, d, n, torch.bfloat16)
            for d, h in ((64, 32), (128, 16))
            for n in (1024, 4096, 16384)
        ]
    for b, h, d, length, dtype in cases:
        if args.seed:
            q, k, v, do = seed_inputs(length, 4)
        else:
            q, k, v, do = (torch.randn((b, h, length, d), device="cuda", dtype=dtype) for _ in range(4))
        for causal in (False, True):
            kw = dict(causal=causal, squared=False, scale=1 / math.sqrt(d), relu_scale=1 / length)
            fns = {name: _call(mod, args.kind, q, k, v, do, kw) for name, mod in versions.items()}
            outs = [fn() for fn in fns.values()]
            outs = [o if isinstance(o, tuple) else (o,) for o in outs]
            err = max((a.float() - c.float()).abs().max().item() for a, c in zip(*outs, strict=True))
            times = {name: [] for name in fns}
            for _ in range(args.rounds):
                for name, fn in fns.items():
                    times[name].append(timing.time_cuda(fn, config=cfg).p50)
            flops = 4 * b * h * length * length * d * (0.5 if causal else 1.0)
            flops *= 2.5 if args.kind == "bwd" else 1.0
            o, n = statistics.median(times["old"]), statistics.median(times["new"])
            where = f"{d} {length} (H={h})" if args.heads else f"{d} {length}"
            print(f"{where} {causal} {flops / o / 1e9:.0f} {flops / n / 1e9:.0f} {o / n:.3f} "
                  f"(max |new-old| {err:.2e})", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
