"""Probe: the host's time for the attention's forward+backward through autograd against the raw launchers,
at the causal 16×32×1024×64 anchor shape (where ``bench/extras.py``'s ``do_bench`` put the autograd
path's forward+backward at 1.458× the raw launchers in run 225, with equal GPU times) and at 1×8×1024×64.

    python bench/probe_attn_bwd_cpu.py [--calls 100] [--repeats 3]

For each callable, two figures in µs per call (medians of ``--repeats``):

* ``enqueue``: ``--calls`` calls issued behind a GPU sleep long enough to outlast them, so that the host
  never waits for the GPU: the host's own cost per call. A call that synchronises with the GPU somewhere
  shows here as the sleep's length.
* ``latency``: each call followed by ``torch.cuda.synchronize()``: the host's cost and the GPU's, in series.

The callables: the raw forward then backward (what ``extras.py`` times), the autograd forward then
``torch.autograd.grad`` (the same), the same through ``out.backward``, the forward and the backward alone
(raw; the backward through autograd on a kept graph), the kept graph's backward and the whole autograd path
under ``torch.autograd.set_multithreading_enabled(False)`` (the backward on the calling thread instead of
the engine's worker thread), the raw backward on a new Python thread, a trivial ``autograd.Function`` with
the wrapper's arguments run forward then backward (the engine's own cost, no kernels but one allocation),
one tensor descriptor; then ``do_bench`` of the fwd+bwd paths as ``extras.py`` runs it, and
``torch.profiler``'s CPU table of 20 calls of each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def desc_fields_only(t, rows):
    """A descriptor as ``_desc`` builds it, without the dataclass's checks (what they cost)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    d = object.__new__(TensorDescriptor)
    d.base, d.shape, d.strides, d.block_shape, d.padding = (
        t,
        list(t.shape),
        list(t.stride()),
        [1, 1, rows, t.shape[3]],
        "zero",
    )
    return d


def threaded(fn, calls, sleep_ms, torch) -> str:
    """``fn`` enqueued ``calls`` times on a new Python thread (behind a GPU sleep): µs per call."""
    import threading

    res = []

    def body():
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        for _ in range(3):
            sleep_ms(calls * 3.0)
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            res.append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()

    th = threading.Thread(target=body)
    th.start()
    th.join()
    return f"raw_bwd on a new Python thread: enqueue {', '.join(f'{x:.0f}' for x in res)} µs per call"


def timed_inside(ra, kept, inputs, do, calls, sleep_ms, torch) -> str:
    """The kept graph's backward through ``torch.autograd.grad`` with ``ra._attention_bwd`` timed inside
    (the launch path on the engine's thread) against the whole call."""
    inner = []
    orig = ra._attention_bwd

    def wrapped(*a):
        t0 = time.perf_counter()
        r = orig(*a)
        inner.append(time.perf_counter() - t0)
        return r

    ra._attention_bwd = wrapped
    try:
        for _ in range(5):
            torch.autograd.grad(kept, inputs, do, retain_graph=True)
        torch.cuda.synchronize()
        inner.clear()
        sleep_ms(calls * 3.0)
        t0 = time.perf_counter()
        for _ in range(calls):
            torch.autograd.grad(kept, inputs, do, retain_graph=True)
        whole = (time.perf_counter() - t0) / calls * 1e6
        torch.cuda.synchronize()
    finally:
        ra._attention_bwd = orig
    return (
        f"kept graph's backward: {whole:.0f} µs per call, of which _attention_bwd (on the engine's thread) "
        f"{statistics.median(inner) * 1e6:.0f} µs (median)"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_attn_bwd_cpu.py")
    import torch

    class Trivial(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, squared, scale, relu_scale, layout):
            return torch.empty_like(q)

        @staticmethod
        def backward(ctx, g):
            return g, g, g, None, None, None, None, None

    def sleep_ms(ms: float) -> None:
        torch.cuda._sleep(int(ms * 1e-3 * 1.98e9))  # ~cycles at the H200's clock: long enough, not exact

    for shape in ((16, 32, 1024, 64, True), (1, 8, 1024, 64, False)):
        shape_case(*shape, args, Trivial, sleep_ms)
    return 0


def shape_case(B, H, L, D, causal, args, Trivial, sleep_ms) -> None:
    import crossfuse
    import torch
    import triton
    from crossfuse.ops import relu_attention as ra

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for _ in range(4))  # fmt: skip
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    scale, rs = D**-0.5, 1 / L
    kept = crossfuse.relu_attention(qg, kg, vg, causal=causal)

    def raw_fwd_bwd():
        ra.relu_attention_fwd(q, k, v, causal, False, scale, rs)
        return ra.relu_attention_bwd(q, k, v, do, causal, False, scale, rs)

    def autograd_fwd_bwd():
        out = crossfuse.relu_attention(qg, kg, vg, causal=causal)
        return torch.autograd.grad(out, (qg, kg, vg), do)

    def out_backward():
        out = crossfuse.relu_attention(qg, kg, vg, causal=causal)
        out.backward(do)
        qg.grad = kg.grad = vg.grad = None

    def trivial_fwd_bwd():
        out = Trivial.apply(qg, kg, vg, causal, False, scale, rs, "bhld")
        return torch.autograd.grad(out, (qg, kg, vg), do)

    calls = {
        "raw_fwd_bwd": raw_fwd_bwd,
        "autograd_fwd_bwd": autograd_fwd_bwd,
        "autograd_fwd_backward()": out_backward,
        "raw_fwd": lambda: ra.relu_attention_fwd(q, k, v, causal, False, scale, rs),
        "autograd_fwd": lambda: crossfuse.relu_attention(qg, kg, vg, causal=causal),
        "raw_bwd": lambda: ra.relu_attention_bwd(q, k, v, do, causal, False, scale, rs),
        "autograd_bwd_kept_graph": lambda: torch.autograd.grad(kept, (qg, kg, vg), do, retain_graph=True),
        "trivial_fwd_bwd": trivial_fwd_bwd,
    }
    kept_trivial = Trivial.apply(qg, kg, vg, causal, False, scale, rs, "bhld")
    calls["trivial_bwd_kept_graph"] = lambda: torch.autograd.grad(kept_trivial, (qg, kg, vg), do,
                                                                  retain_graph=True)  # fmt: skip

    def single_threaded():
        with torch.autograd.set_multithreading_enabled(False):
            return torch.autograd.grad(kept, (qg, kg, vg), do, retain_graph=True)

    def fwd_bwd_single_threaded():
        with torch.autograd.set_multithreading_enabled(False):
            return autograd_fwd_bwd()

    calls["autograd_bwd_kept_graph_no_worker_thread"] = single_threaded
    calls["autograd_fwd_bwd_no_worker_thread"] = fwd_bwd_single_threaded
    calls["_attention_bwd_main_thread"] = lambda: ra._attention_bwd(q, k, v, do, causal, False, scale, rs,
                                                                    "bhld")  # fmt: skip
    cfg = ra.attention_config("fwd", D, q.dtype, causal, False, L)
    calls["desc"] = lambda: ra._desc(q, cfg.block_m)
    calls["desc_fields_only"] = lambda: desc_fields_only(q, cfg.block_m)
    print(f"== B={B} H={H} L={L} D={D} causal={causal}", flush=True)
    print(threaded(lambda: calls["raw_bwd"](), args.calls, sleep_ms, torch), flush=True)
    print(timed_inside(ra, kept, (qg, kg, vg), do, args.calls, sleep_ms, torch), flush=True)
    for name, fn in calls.items():
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        enq, lat = [], []
        for _ in range(args.repeats):
            sleep_ms(args.calls * 3.0)  # 3 ms per call: the host never catches up with the GPU
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            enq.append((time.perf_counter() - t0) / args.calls * 1e6)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
                torch.cuda.synchronize()
            lat.append((time.perf_counter() - t0) / args.calls * 1e6)
        print(f"{name:26s} enqueue {statistics.median(enq):8.1f} µs  latency {statistics.median(lat):8.1f} µs"
              f"  (enqueue repeats {', '.join(f'{x:.0f}' for x in enq)})", flush=True)  # fmt: skip
    for name in ("autograd_fwd_bwd", "autograd_fwd_bwd_no_worker_thread", "raw_fwd_bwd"):
        ms = [triton.testing.do_bench(calls[name], warmup=10, rep=40, return_mode="median")
              for _ in range(args.repeats)]  # fmt: skip
        print(f"do_bench {name:33s} {', '.join(f'{x:.4f}' for x in ms)} ms", flush=True)
    from torch.profiler import ProfilerActivity, profile

    for name in ("autograd_fwd_bwd", "raw_fwd_bwd"):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(20):
                calls[name]()
            torch.cuda.synchronize()
        print(f"torch.profiler, {name}, 20 calls:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15), flush=True)


if __name__ == "__main__":
    sys.exit(main())
