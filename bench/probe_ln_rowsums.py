"""Probe: the split backward's row-sums kernel alone (``_ln_bwd_rowsums_kernel``, the first of its two
passes over x and dy), at long rows, over its launch shape: chunk width, warps and chunks per loop
iteration (``UNROLL``: their loads issued together), and N at runtime or as a compile-time constant
(``N_C``; then the loop is not unrolled by hand).

    python bench/probe_ln_rowsums.py [--shapes 4096x16384,4096x8192]

Prints GB/s (the bytes of x and dy it reads) per (dtype, BLOCK_N, warps, UNROLL), medians of
``time_cuda`` (the sessions' timer), and the code's launch (``BLOCK_N`` of the table, 8 warps, UNROLL 1)
marked. The sums of every variant are checked against the code's launch.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="4096x16384")
    ap.add_argument(
        "--const-n",
        default="01",
        help="N at runtime (0) and/or as a compile-time constant (1, the kernel's N_C), e.g. 01",
    )
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_ln_rowsums.py")
    args.const_n = [c == "1" for c in args.const_n]
    import torch
    from crossfuse.harness import timing
    from crossfuse.ops import layer_norm as ln

    cfg_t = timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=25.0, cuda_min_reps=10, cuda_max_reps=100)
    for shape in args.shapes.split(","):
        m, n = (int(v) for v in shape.split("x"))
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(m, n, device="cuda", dtype=dtype)
            w = torch.randn(n, device="cuda", dtype=dtype)
            dy = torch.randn_like(x)
            _, mean, rstd = ln.layer_norm_fwd(x, w, None, 1e-5)
            code_bn = ln.launch_config(n, dtype, "bwd", m).block_n

            def run(bn, warps, unroll, const_n, c1, c2, x=x, w=w, dy=dy, mean=mean, rstd=rstd, m=m, n=n):
                ln._ln_bwd_rowsums_kernel[(m,)](
                    dy, x, w, mean, rstd, c1, c2, x, dy.stride(0), x.stride(0), x.stride(0), 0, m, n,
                    BLOCK_N=bn, HAS_WEIGHT=True, IS_FP64=False, WRITE_DX=False, UNROLL=unroll,
                    N_C=n if const_n else 0, num_warps=warps,
                )  # fmt: skip

            ref = [torch.empty(m, device="cuda", dtype=torch.float32) for _ in range(2)]
            run(code_bn, 8, 1, False, *ref)
            nbytes = 2 * m * n * x.element_size()
            rows = []
            for bn, warps, unroll, const_n in itertools.product(
                (1024, 2048, 4096), (4, 8, 16), (1, 2, 4), tuple(args.const_n)
            ):
                if bn // (32 * warps) < 1 or bn > n or (const_n and unroll > 1):
                    continue
                c = [torch.empty(m, device="cuda", dtype=torch.float32) for _ in range(2)]
                run(bn, warps, unroll, const_n, *c)
                err = max((a - b).abs().max().item() for a, b in zip(c, ref, strict=True))
                launch = functools.partial(run, bn, warps, unroll, const_n, *c)
                t = timing.time_cuda(launch, config=cfg_t).p50
                code = " (code)" if (bn, warps, unroll, const_n) == (code_bn, 8, 1, False) else ""
                nk = " constN" if const_n else ""
                rows.append((nbytes / t / 1e6, f"{bn} {warps} {unroll}{nk}{code} |c - code| {err:.1e}"))
            print(f"{shape} {str(dtype)[6:]}: GB/s BLOCK_N warps UNROLL", flush=True)
            for rate, desc in sorted(rows, reverse=True):
                print(f"  {rate:6.0f}  {desc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
