"""Cross-check of two GPU timing methods on the same calls (run on a GPU).

    python bench/timing_check.py

For the fused layer norm (bf16, M=4096), times the raw launchers and the autograd path with
``triton.testing.do_bench`` (median) and with the harness's ``time_cuda`` (p50), and prints GB/s.
If the two methods disagree on one call, the timing is at fault; if the raw and autograd paths
disagree under one method, the autograd path does extra GPU work.
"""

from __future__ import annotations

import torch
import triton
from crossfuse.harness.timing import time_cuda
from crossfuse.ops import layer_norm as ln


def main() -> None:
    from crossfuse._backend import require_cuda

    require_cuda("bench/timing_check.py")
    print(f"{'call':34s} {'do_bench GB/s':>14s} {'time_cuda GB/s':>15s}")
    for n in (4096, 8192, 16384):
        check_row(4096, n)


def check_row(m: int, n: int) -> None:
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    _, mean, rstd = ln.layer_norm_fwd(x, w, b, 1e-5)
    xg, wg, bg = (t.clone().requires_grad_(True) for t in (x, w, b))
    out = ln.layer_norm(xg, (n,), wg, bg)
    calls = {
        f"raw fwd {m}x{n}": (lambda: ln.layer_norm_fwd(x, w, b, 1e-5), 2),
        f"autograd fwd {m}x{n}": (lambda: ln.layer_norm(xg, (n,), wg, bg), 2),
        f"raw bwd {m}x{n}": (lambda: ln.layer_norm_bwd(dy, x, w, mean, rstd, True, True), 3),
        f"autograd bwd {m}x{n}": (
            lambda: torch.autograd.grad(out, (xg, wg, bg), dy, retain_graph=True), 3),
    }  # fmt: skip
    for name, (fn, passes) in calls.items():
        fn()
        nbytes = passes * m * n * 2
        a = triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")
        t = time_cuda(fn).p50
        print(f"{name:34s} {nbytes / a / 1e6:14.0f} {nbytes / t / 1e6:15.0f}")


if __name__ == "__main__":
    main()
