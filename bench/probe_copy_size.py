"""Probe: the copy ceiling's dependence on size and on how the timer empties L2, beside the layer norm.

The sessions' copy ceiling is ``y.copy_(x)`` of 2^29 bf16 elements (2 GiB moved, ~0.5 ms); the layer
norm's forward at 4096×16384 bf16 moves 256 MiB in ~70 µs, and run 88 found ~9 µs of every such call
independent of the rows. The sessions' timer (``crossfuse.harness.timing.time_cuda``, like
``triton.testing.do_bench``) empties L2 before each repeat by zeroing a 256 MiB buffer, which leaves L2
full of dirty lines that the timed call then writes back to memory. This probe times, under three ways of
emptying L2 (``zero``: the sessions' zeroing; ``read``: zeroing then reading the buffer, so L2 holds clean
lines; ``none``: no flush), ``y.copy_(x)`` from 16 MiB to 2 GiB moved and the layer-norm forward
(this code's and torch's) at 4096×16384, bf16 and float32; medians of ``--rounds`` alternations.

    python bench/probe_copy_size.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def time_gpu(fn, flush: str, reps: int = 30) -> float:
    """Median ms of ``fn`` between CUDA events, after emptying L2 as ``flush`` says and a GPU spin that
    hides the CPU's enqueue (the sessions' timer, with the flush made a parameter)."""
    import torch
    from crossfuse.harness.timing import l2_flush_buffer

    cache = l2_flush_buffer("cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    enqueue = time.perf_counter() - t
    torch.cuda.synchronize()
    cycles = int(min(enqueue * 1.5 + 20e-6, 0.05) * 2.5e9)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if flush in ("zero", "read"):
            cache.zero_()
        if flush == "read":
            cache.max()
        torch.cuda._sleep(cycles)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_copy_size.py")
    import torch
    import torch.nn.functional as F
    from crossfuse.ops import layer_norm as ln

    flushes = ("zero", "read", "none")
    calls = {}
    for numel in (1 << 23, 1 << 25, 1 << 26, 1 << 27, 1 << 29):
        x = torch.ones(numel, dtype=torch.bfloat16, device="cuda")
        y = torch.empty_like(x)
        calls[f"copy bf16 {numel * 4 >> 20} MiB moved"] = (lambda x=x, y=y: y.copy_(x), 4 * numel)
    for dtype in (torch.bfloat16, torch.float32):
        m, n = 4096, 16384
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
        nbytes = 2 * m * n * dtype.itemsize
        name = str(dtype)[6:]
        ours = lambda x=x, w=w, b=b: ln.layer_norm_fwd(x, w, b, 1e-5)  # noqa: E731
        peer = lambda x=x, w=w, b=b, n=n: F.layer_norm(x, (n,), w, b)  # noqa: E731
        calls[f"layer norm fwd {name} 4096x16384 (ours)"] = (ours, nbytes)
        calls[f"layer norm fwd {name} 4096x16384 (torch)"] = (peer, nbytes)
        xc = x.clone()
        calls[f"copy {name} 4096x16384 (the same bytes)"] = (lambda x=x, xc=xc: xc.copy_(x), nbytes)
    times = {(name, f): [] for name in calls for f in flushes}
    for _ in range(args.rounds):
        for name, (fn, _) in calls.items():
            for f in flushes:
                times[(name, f)].append(time_gpu(fn, f))
    print(f"{torch.cuda.get_device_name()}: GB/s (µs) with L2 emptied by " + ", ".join(flushes), flush=True)
    for name, (_, nbytes) in calls.items():
        cells = []
        for f in flushes:
            t = statistics.median(times[(name, f)])
            cells.append(f"{nbytes / t / 1e6:6.0f} ({t * 1e3:7.1f})")
        print(f"  {name:44s} " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
