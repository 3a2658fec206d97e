"""Probe: a first check of a changed layer-norm backward on the GPU before its tests (run 270): dx, dw and
db of a few long-row shapes against torch's float64 autograd (relative error of each), the same call again
bit for bit, and the first call's time (compilation included; a kernel that hangs shows here first).

    python bench/probe_ln_bwd_sanity.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

SHAPES = [(4096, 16384, "bfloat16"), (5, 16384, "bfloat16"), (4101, 16384, "bfloat16"),
          (8192, 16384, "bfloat16"), (4096, 16384, "float32")]  # fmt: skip


def main() -> int:
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_ln_bwd_sanity.py")
    import torch
    from crossfuse.ops import layer_norm as ln
    from crossfuse.tolerances import relerr

    torch.manual_seed(0)
    for m, n, name in SHAPES:
        dt = getattr(torch, name)
        x = (torch.randn(m, n, device="cuda") * 2 + 3).to(dt)
        w = (torch.randn(n, device="cuda") * 0.5 + 1).to(dt)
        dy = torch.randn(m, n, device="cuda").to(dt)
        _, mean, rstd = ln.layer_norm_fwd(x, w, None, 1e-5)
        t = time.time()
        got = ln.layer_norm_bwd(dy, x, w, mean, rstd, True, True)
        torch.cuda.synchronize()
        t = time.time() - t
        xd, wd = x.double().requires_grad_(True), w.double().requires_grad_(True)
        bd = torch.zeros(n, dtype=torch.float64, device="cuda", requires_grad=True)
        y = torch.nn.functional.layer_norm(xd, (n,), wd, bd, 1e-5)
        want = torch.autograd.grad(y, (xd, wd, bd), dy.double())
        errs = [relerr(a, b) for a, b in zip(got, want, strict=True)]
        again = ln.layer_norm_bwd(dy, x, w, mean, rstd, True, True)
        same = all(torch.equal(a, b) for a, b in zip(got, again, strict=True))
        print(f"{m}x{n} {dt}: dx {errs[0]:.2e} dw {errs[1]:.2e} db {errs[2]:.2e} repeat-equal {same} "
              f"first call {t:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
