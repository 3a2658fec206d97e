"""crossfuse's ops under torch.compile against the same ops in eager mode, on the GPU.

    python bench/probe_compile.py [--rounds 3] [--out DIR]

A forward and backward (``y = f(*inputs); torch.autograd.grad(y, inputs, dy)``) of each case, eager and
through ``torch.compile(f, fullgraph=True)`` (inductor), the two calls alternated ``--rounds`` times,
medians of ``crossfuse.harness.timing.time_cuda`` (the sessions' GPU timer: GPU time only, the CPU's
enqueue hidden). The cases: ``crossfuse.layer_norm`` and ``crossfuse.relu_attention`` alone (the compiled
graph calls the same kernels through the ``torch.ops.crossfuse`` operators, so equal outputs and a
ratio near 1 are expected), and a pre-norm attention block of ``crossfuse.nn`` modules with its
projections and residual (where inductor may fuse what lies between the kernels). Prints one line per
case and writes ``DIR/compile.csv`` with ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

from ab_attn import timing_config


def cases():
    """``(name, make)``: ``make()`` returns ``(fn, inputs, params)``: the gradients are taken for the
    inputs (requiring grad) and the parameters."""
    import crossfuse
    import torch

    def tensor(shape, dtype):
        return torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)

    def layer_norm(m, n, dtype):
        def make():
            return (
                (lambda x, w, b: crossfuse.layer_norm(x, (n,), w, b)),
                [tensor((m, n), dtype), tensor((n,), dtype), tensor((n,), dtype)],
                [],
            )

        return f"layer_norm {str(dtype)[6:]} {m}x{n}", make

    def attention(b, h, length, d, causal):
        def make():
            return (
                (lambda q, k, v: crossfuse.relu_attention(q, k, v, causal=causal)),
                [tensor((b, h, length, d), torch.bfloat16) for _ in range(3)],
                [],
            )

        return f"relu_attention bf16 B={b} H={h} L={length} D={d} causal={causal}", make

    def block(b, length, embed, heads):
        def make():
            norm = crossfuse.nn.LayerNorm(embed, device="cuda", dtype=torch.bfloat16)
            attn = crossfuse.nn.ReLUAttention(embed, heads, causal=True, device="cuda", dtype=torch.bfloat16)
            params = [*norm.parameters(), *attn.parameters()]
            return (lambda x: x + attn(norm(x))), [tensor((b, length, embed), torch.bfloat16)], params

        return f"block (LayerNorm, ReLUAttention, residual) bf16 B={b} L={length} E={embed} H={heads}", make

    return [
        layer_norm(4096, 4096, torch.bfloat16),
        layer_norm(32768, 4096, torch.bfloat16),
        layer_norm(4096, 16384, torch.float32),
        attention(16, 32, 1024, 64, False),
        attention(4, 16, 4096, 128, True),
        block(8, 2048, 2048, 16),
    ]


def measure(name: str, make, rounds: int, cfg) -> dict:
    """One case: eager against compiled, alternated; the largest difference of output and gradients."""
    import torch
    from crossfuse.harness import timing

    fn, inputs, params = make()
    compiled = torch.compile(fn, fullgraph=True)
    dy = torch.randn_like(fn(*inputs))

    def step(f):
        out = f(*inputs)
        return out, *torch.autograd.grad(out, [*inputs, *params], dy)

    results = [step(f) for f in (fn, compiled)]
    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(*results, strict=True))

    def train(f):
        return lambda: torch.autograd.grad(f(*inputs), [*inputs, *params], dy)

    times = timing.alternate({"eager": train(fn), "compiled": train(compiled)}, rounds, config=cfg)
    eager, comp = statistics.median(times["eager"]), statistics.median(times["compiled"])
    print(f"{name}: {eager:.4f} {comp:.4f} {eager / comp:.3f} {diff:.3g}", flush=True)
    torch._dynamo.reset()
    return dict(case=name, eager_ms=f"{eager:.4f}", compiled_ms=f"{comp:.4f}",
                eager_over_compiled=f"{eager / comp:.3f}", max_abs_diff=f"{diff:.3g}")  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, help="a folder for compile.csv")
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_compile.py")
    cfg = timing_config()
    print("case eager_ms compiled_ms eager/compiled max|compiled-eager| (output, gradients)", flush=True)
    rows = [measure(name, make, args.rounds, cfg) for name, make in cases()]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "compile.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
