"""GPU helper of tests/test_harness.py (imported only where a GPU runs the test, so that the harness tests
need no Triton elsewhere): a layer-norm forward timed after a read of its input with ``evict_last``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from crossfuse.harness import timing


@triton.jit
def _touch_kernel(X, n, OUT, BLOCK: tl.constexpr, POLICY: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(X + offs, mask=offs < n, other=0.0, eviction_policy=POLICY)
    tl.store(OUT + tl.program_id(0), tl.sum(v, axis=0))


def stale_line_ratios(config: timing.TimingConfig, rounds: int = 5) -> list[float]:
    """A layer-norm forward's time (float32 4096×2048, whole rows, its configuration fixed here) measured
    by the timer with ``config`` after a read of x with evict_last, over its time after the persisting
    lines were reset by hand, ``rounds`` times alternated. Below 1 where the timer lets the call read the
    lines that read left in L2."""
    from crossfuse.ops import layer_norm as ln

    x = torch.randn(4096, 2048, device="cuda")
    w, b = torch.randn(2048, device="cuda"), torch.randn(2048, device="cuda")
    cfg = ln.LaunchConfig(2, 2048, 4, 4, prefetch=True, keep_params=True)
    part = torch.empty(x.numel() // 4096, device="cuda")

    def after(stale: bool) -> float:
        torch.cuda.synchronize()
        if stale:
            _touch_kernel[(part.numel(),)](x, x.numel(), part, BLOCK=4096, POLICY="evict_last")
        else:
            assert timing._reset_persisting_l2("cuda"), "the driver refused the reset"
        torch.cuda.synchronize()
        return timing.time_cuda(lambda: ln.layer_norm_fwd(x, w, b, 1e-5, config=cfg), "cuda", config).p50

    after(False)  # compiles
    return [after(True) / after(False) for _ in range(rounds)]
