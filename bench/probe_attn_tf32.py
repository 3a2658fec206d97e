"""Probe: the float32 forward and backward in Gluon (``crossfuse.ops._attn_tf32``, attention v26-v37)
against Triton's float32 kernels, at the seed's shapes (``bench/extras.py``'s float32 section: [B, L, H, D]
as [B, H, L, D] views, B=4, H=16, D=64, L = 1024, 2048, 4096, causal and not), each with its copies,
alternated ``--rounds`` times, medians of ``crossfuse.harness.timing.time_cuda``.

    python bench/probe_attn_tf32.py [--rounds 3] [--tiles 64:64:2:0,64:64:3:1,128:64:2:0:1,...]
    python bench/probe_attn_tf32.py --kind bwd [--tiles 32:64:3:1/64:64:2:1,...]
    python bench/probe_attn_tf32.py --kind copies

``--groups 1,16,64`` runs each tile with each number of heads per group of the causal launch order
(``crossfuse.ops._attn_tf32.head_group``; ``auto``: the launcher's choice). ``--fold-bwd 0,1`` runs each
backward tile without and with the backward's fold of the scale (``_attn_tf32.FOLD_BWD``, attention v36;
named ``+fold``), ``--split 0,1`` without and with a barrier array per tensor of the kernels' rings
(``_attn_tf32.SPLIT_BARS``, attention v37; ``+split``; not for forward tiles with ASYNC, whose rings are
their own). A dQ tile's sixth field, WRITE (attention v36), runs the dQ kernel first, writing the copies
of q and dout that the dK/dV kernel reads (``32:64:2:1/64:64:2:1:1:1``).

Prints per shape: TFLOP/s of Triton's kernels and of each Gluon tile (BLOCK_M:BLOCK_N:STAGES:ASYNC, and
for the forward :TRANS, v transposed in the kernel instead of copied, attention v31; ASYNC and TRANS 0
where not given; for the backward that of the dK/dV kernel, then after ``/`` the dQ kernel's), their ratio,
and the relative difference of the Gluon result from Triton's (the largest over dq, dk, dv).
``--kind copies`` times the backward's copies of q, dout and k with unit stride on L (one launch).
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kind", choices=("fwd", "bwd", "copies"), default="fwd")
    ap.add_argument("--tiles", default=None, help="default: 128:64:2:0,64:64:3:0,64:64:2:1,64:64:3:1,"
                    "128:64:2:1 (fwd), 32:64:3:1/64:64:2:1,32:64:2:1/64:32:3:1,32:64:3:0/64:64:2:0 "
                    "(bwd)")  # fmt: skip
    ap.add_argument("--groups", default="auto", help="heads per group of the causal launch order, each "
                    "tile with each: 'auto' (the launcher's head_group) or numbers, as 1,16,64")  # fmt: skip
    ap.add_argument("--causal", action="store_true", help="the causal shapes only")
    ap.add_argument("--fold-bwd", default="", help="the backward's fold of the scale, each tile with each: "
                    "0,1 (default: the code's FOLD_BWD)")  # fmt: skip
    ap.add_argument("--split", default="", help="a barrier array per tensor of the rings, each tile with "
                    "each: 0,1 (default: the code's SPLIT_BARS)")  # fmt: skip
    args = ap.parse_args(argv)
    bwd = args.kind == "bwd"
    if args.tiles is None:
        bwd_tiles = "32:64:3:1/64:64:2:1,32:64:2:1/64:32:3:1,32:64:3:0/64:64:2:0"
        args.tiles = bwd_tiles if bwd else "128:64:2:0,64:64:3:0,64:64:2:1,64:64:3:1,128:64:2:1"
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_attn_tf32.py")
    import torch
    from crossfuse.harness.timing import time_cuda
    from crossfuse.ops import _attn_tf32
    from crossfuse.ops import relu_attention as ra
    from crossfuse.tolerances import relerr

    def parse(spec):
        parts = [tuple(int(x) for x in p.split(":")) for p in spec.split("/")]
        return tuple(parts) if bwd else (parts[0] + (0, 0))[:5]  # ASYNC, TRANS 0 where not given

    if args.kind == "copies":
        for L in (1024, 2048, 4096):
            q, k, do = (torch.randn(4, L, 16, 64, device="cuda").transpose(1, 2) for _ in range(3))
            t = time_cuda(lambda q=q, k=k, do=do: ra._l_contiguous(q, do, k)).p50  # ms
            moved = 3 * 2 * q.numel() * q.element_size()  # read and written
            print(f"L={L}: copies of q, dout, k {t * 1e3:.1f} us, {moved / t / 1e6:.0f} GB/s", flush=True)
        return 0
    groups = [None if g == "auto" else int(g) for g in args.groups.split(",")]
    knobs = {  # module flags of _attn_tf32 each tile runs with, each value given: (name, values)
        "FOLD_BWD": ("fold", [bool(int(f)) for f in args.fold_bwd.split(",")] if args.fold_bwd else None),
        "SPLIT_BARS": ("split", [bool(int(f)) for f in args.split.split(",")] if args.split else None),
    }
    saved_knobs = {flag: getattr(_attn_tf32, flag) for flag in knobs}
    choices = [[(flag, v) for v in values or [saved_knobs[flag]]] for flag, (_, values) in knobs.items()]
    tiles = {}
    for spec in args.tiles.split(","):
        for g in groups:
            for chosen in itertools.product(*choices):
                if not bwd and parse(spec)[3] and dict(chosen)["SPLIT_BARS"]:
                    continue  # the forward with ASYNC has rings of its own: SPLIT does not apply
                name = f"{spec}@{g or 'auto'}" if len(groups) > 1 or g else spec
                varied = [knobs[flag][0] for flag, v in chosen if v and len(knobs[flag][1] or []) > 1]
                name += "".join(f"+{word}" for word in varied)
                tiles[name] = (parse(spec), g, dict(chosen))
    table = "TF32_BWD" if bwd else "TF32_FWD"
    B, H, D = 4, 16, 64
    saved, launch = getattr(ra, table), ra._launch
    op = ra.relu_attention_bwd if bwd else ra.relu_attention_fwd
    launched: set[str] = set()

    def spy(kernel, *args, **options):  # which kernels ran (a tile the launcher refuses: Triton's)
        launched.add(getattr(kernel, "__name__", str(kernel)))
        return launch(kernel, *args, **options)

    ra._launch = spy
    try:
        for L in (1024, 2048, 4096):
            for causal in (True,) if args.causal else (False, True):
                gen = torch.Generator(device="cuda").manual_seed(L + causal)
                q, k, v, do = (torch.randn(B, L, H, D, device="cuda", generator=gen).transpose(1, 2)
                               for _ in range(4))  # fmt: skip
                scale, relu_scale = 1 / math.sqrt(D), 1 / L
                flops = 4 * B * H * L * L * D * (0.5 if causal else 1.0) * (2.5 if bwd else 1.0)
                call = (q, k, v, do) if bwd else (q, k, v)
                call += (causal, False, scale, relu_scale)
                setattr(ra, table, {})
                ref = op(*call)
                variants = {"triton": (None, None, saved_knobs), **tiles}
                times: dict[str, list[float]] = {name: [] for name in variants}
                diffs, gluon = {}, {}
                for _ in range(args.rounds):
                    for name, (cfg, group, flags) in variants.items():
                        setattr(ra, table, {} if cfg is None else {(causal, L > ra.SHORT_L): cfg})
                        _attn_tf32.FORCE_GROUP = group
                        for flag, value in flags.items():
                            setattr(_attn_tf32, flag, value)
                        try:
                            fn = lambda call=call: op(*call)  # noqa: E731
                            launched.clear()
                            out = fn()
                            gluon[name] = any("tf32" in n for n in launched)
                            pairs = zip(out, ref, strict=True) if bwd else [(out, ref)]
                            diffs[name] = max(relerr(a, b) for a, b in pairs)
                            times[name].append(time_cuda(fn).p50)
                        except Exception as exc:  # a tile that does not fit: reported, not fatal
                            times[name].append(float("nan"))
                            diffs[name] = f"{type(exc).__name__}: {str(exc)[:80]}"
                base = statistics.median(times["triton"])
                line = [f"L={L} causal={causal}: triton {flops / base / 1e9:.1f} TFLOP/s"]
                for name in variants:
                    if name == "triton":
                        continue
                    t = statistics.median(times[name])
                    d = diffs[name]
                    dtxt = f"{d:.1e}" if isinstance(d, float) else d
                    ran = "" if gluon.get(name) else ", Triton's kernels ran"
                    line.append(f"{name} {flops / t / 1e9:.1f} ({base / t:.3f}x, diff {dtxt}{ran})")
                print("; ".join(line), flush=True)
    finally:
        setattr(ra, table, saved)
        ra._launch = launch
        _attn_tf32.FORCE_GROUP = None
        for flag, value in saved_knobs.items():
            setattr(_attn_tf32, flag, value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
