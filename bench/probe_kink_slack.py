"""relu attention's gradient errors at long rows on the GPU: every row, with each row's kink slack, and
without the rows at relu's kink (the rule the tests followed before run 173).

    python bench/probe_kink_slack.py [--lengths 1024,2048,4096] [--heads 4] [--seed 173]

For bf16, float16 and float32 (tf32 products, the reference given the same truncated inputs, as the
tests do), D in {64, 128}, causal and not: the kernel's dq and dk against float64 as ``relerr`` over
every row, ``relerr_with_slack`` (``crossfuse.reference.kink_slack``), ``relerr`` without the rows the
slack touches; the share of rows given slack, the slack's norm relative to the gradient's, and the
tolerance the tests hold them to. One line per gradient.
"""

from __future__ import annotations

import argparse


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="1024,2048,4096", help="sequence lengths, comma-separated")
    ap.add_argument("--heads", type=int, default=4, help="heads (batch 1)")
    ap.add_argument("--seed", type=int, default=173)
    args = ap.parse_args(argv)
    try:
        lengths = [int(s) for s in args.lengths.split(",")]
    except ValueError:
        ap.error(f"--lengths: comma-separated integers expected, got {args.lengths!r}")
    if args.heads < 1 or min(lengths) < 1:
        ap.error("--heads and --lengths must be positive")

    import crossfuse
    import torch
    from crossfuse._backend import require_cuda
    from crossfuse.reference import kink_slack, relu_attention_ref, tf32_truncate
    from crossfuse.tolerances import relerr, relerr_with_slack, tolerance

    require_cuda("bench/probe_kink_slack.py")
    gen = torch.Generator().manual_seed(args.seed)
    print(
        "dtype L D causal | grad | relerr, every row | with slack | kink rows left out | rows given slack"
        " | ||slack|| / ||ref|| | tolerance"
    )
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        tf32 = dtype == torch.float32
        tol = tolerance("relu_attention", dtype, "bwd", tf32=tf32)
        for length in lengths:
            for d in (64, 128):
                for causal in (False, True):
                    shape = (1, args.heads, length, d)
                    q, k, v, do = (torch.randn(shape, dtype=torch.float64, generator=gen).to("cuda", dtype)
                                   for _ in range(4))  # fmt: skip
                    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
                    crossfuse.relu_attention(*leaves, causal=causal).backward(do)
                    ops = [tf32_truncate(t) if tf32 else t for t in (q, k, v)]  # what the kernel multiplies
                    refs = [t.double().requires_grad_(True) for t in ops]
                    relu_attention_ref(*refs, causal=causal).backward(do.double())
                    slack = kink_slack(*refs, do, causal)
                    for name, i in (("q", 0), ("k", 1)):
                        g, r, s = leaves[i].grad, refs[i].grad, slack[name]
                        keep = s == 0
                        print(f"{str(dtype).removeprefix('torch.')} {length} {d} {int(causal)} | d{name} | "
                              f"{relerr(g, r):.2e} | {relerr_with_slack(g, r, s):.2e} | "
                              f"{relerr(g[keep], r[keep]):.2e} | {(~keep).float().mean().item():.3f} | "
                              f"{(s.norm() / r.norm()).item():.2e} | {tol:.1e}", flush=True)  # fmt: skip
                    del leaves, refs, slack
                    torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
