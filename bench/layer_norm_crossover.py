"""Where the fused layer norm starts to pay in eager mode: the size behind ``crossfuse.nn.LayerNorm``'s
``native_below`` default.

    python bench/layer_norm_crossover.py [--out DIR] [--dtype bfloat16] [--rounds 5] [--calls 100]

For each (M, N), a training step's layer norm (forward, then backward of a retained graph) and an
inference forward (no grad) are called ``--calls`` times back to back, synchronised at the end only:
the time a model spends per layer norm when nothing else hides the host's time. crossfuse's module with
the fused kernels at every size (``native_below=0``) and torch's module alternate, ``--rounds`` times,
in the orders of ``crossfuse.harness.rounds.round_orders`` (each first in some rounds); the medians are
compared. The suggested threshold is the smallest element count from which the fused module is at least
as fast as torch's at every larger size of the sweep, training and inference.
Needs a CUDA GPU; writes ``crossover.csv`` and ``crossover.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

ROWS = (64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
COLS = (768, 1024, 2048, 4096)


def _per_call_us(fn, calls: int) -> float:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def measure(dtype, rounds: int, calls: int) -> list[dict]:
    import crossfuse
    import torch
    from crossfuse.harness.rounds import round_orders

    rows = []
    for n in COLS:
        ours = crossfuse.nn.LayerNorm(n, device="cuda", dtype=dtype, native_below=0)
        theirs = torch.nn.LayerNorm(n, device="cuda", dtype=dtype)
        for m in ROWS:
            x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
            dy = torch.randn(m, n, device="cuda", dtype=dtype)
            cases = {}
            for name, mod in (("crossfuse", ours), ("torch", theirs)):
                y = mod(x)

                def train(mod=mod, y=y, x=x, dy=dy):
                    mod(x)
                    torch.autograd.grad(y, (x, mod.weight, mod.bias), dy, retain_graph=True)

                def infer(mod=mod, x=x):
                    with torch.no_grad():
                        mod(x)

                for _ in range(3):  # compiles, plans
                    train()
                    infer()
                cases[name] = (train, infer)
            times = {(name, mode): [] for name in cases for mode in ("train", "infer")}
            names = list(cases)
            for order in round_orders(len(names), rounds):  # each first in some rounds, second in others
                for name in (names[i] for i in order):
                    train, infer = cases[name]
                    times[name, "train"].append(_per_call_us(train, calls))
                    times[name, "infer"].append(_per_call_us(infer, calls))
            for mode in ("train", "infer"):
                cf, tv = (statistics.median(times[name, mode]) for name in ("crossfuse", "torch"))
                rows.append(dict(m=m, n=n, numel=m * n, mode=mode, crossfuse_us=round(cf, 2),
                                 torch_us=round(tv, 2), speed=round(tv / cf, 3)))  # fmt: skip
    return rows


def threshold(rows: list[dict]) -> int:
    """The smallest element count from which crossfuse is at least as fast at every larger size (both
    modes); one above the largest size when it never is."""
    losing = [r["numel"] for r in rows if r["speed"] < 1.0]
    if not losing:
        return 0
    worst = max(losing)
    above = sorted({r["numel"] for r in rows if r["numel"] > worst})
    return above[0] if above else worst + 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("out/crossover"))
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=100)
    a = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench/layer_norm_crossover.py: needs a CUDA GPU")
    rows = measure(getattr(torch, a.dtype), a.rounds, a.calls)
    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "crossover.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"# Layer norm module, eager µs per call, {a.dtype}, {torch.cuda.get_device_name(0)}, "
             f"torch {torch.__version__}", "",
             f"`python bench/layer_norm_crossover.py --dtype {a.dtype}`: {a.calls} calls back to back, "
             f"median of {a.rounds} alternated rounds; train = forward + backward of a retained graph, "
             "infer = forward without grad; crossfuse with the fused kernels at every size "
             "(`native_below=0`). speed = torch / crossfuse.", "",
             "| M | N | elements | mode | crossfuse µs | torch µs | speed |", "|" + " --- |" * 7]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['m']} | {r['n']} | {r['numel']} | {r['mode']} | {r['crossfuse_us']} | "
                     f"{r['torch_us']} | {r['speed']} |")  # fmt: skip
    lines += ["", f"Smallest size from which the fused module is never slower here: {threshold(rows)} "
              "elements."]  # fmt: skip
    (a.out / "crossover.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
