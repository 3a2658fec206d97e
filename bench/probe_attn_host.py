"""Probe: where the host's time goes in one attention forward+backward, piece by piece, at the causal
16×32×1024×64 bf16 anchor shape (``bench/extras.py``'s one row over the 5% wrapper bound in ``do_bench``
time) and at 1×8×1024×64.

    python bench/probe_attn_host.py [--calls 200] [--repeats 5] [--compare-only | --fresh-phases]

Every figure is µs of host time per call, the median of ``--repeats`` batches of ``--calls`` calls
enqueued behind a GPU sleep that outlasts them (so the host never waits for the GPU). The launches of one
raw forward+backward are captured from ``_launch`` and replayed: through Triton's ``kernel[grid](...)``
with the captured (prebuilt) descriptors, and straight into the compiled kernel's launcher (what Triton's
``JITFunction.run`` does after it has found the kernel), so that the three costs separate: our Python
around the launches, Triton's dispatch, and the launcher (which encodes each descriptor's tensor map).

``--fresh-phases``: where a fresh forward+backward through autograd (the graph built and freed each call,
as ``bench/extras.py`` times it) spends the host's time, with the engine's worker thread and without, and
the raw launchers, with the attention's launch plans on and off (alternated twice, where the checkout has
them), each with ``do_bench`` of both paths.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compare-only", action="store_true",
                    help="only the dispatched launch path against crossfuse.ops._direct")  # fmt: skip
    ap.add_argument("--fresh-phases", action="store_true",
                    help="only where a fresh autograd forward+backward spends the host's time")  # fmt: skip
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_attn_host.py")
    for shape in ((16, 32, 1024, 64, True), (1, 8, 1024, 64, False)):
        shape_case(*shape, args)
    return 0


def timer(args):
    import torch

    def sleep_ms(ms: float) -> None:
        torch.cuda._sleep(int(ms * 1e-3 * 1.98e9))

    def enqueue(fn, calls=None) -> tuple[float, list[float]]:
        calls = calls or args.calls
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        res = []
        for _ in range(args.repeats):
            sleep_ms(calls * 2.0)
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            res.append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
        return statistics.median(res), res

    return enqueue


def shape_case(B, H, L, D, causal, args) -> None:
    import crossfuse
    import torch
    import triton
    from crossfuse.ops import relu_attention as ra
    from triton.tools.tensor_descriptor import TensorDescriptor

    enqueue = timer(args)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for _ in range(4))  # fmt: skip
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    scale, rs = D**-0.5, 1 / L

    def raw_fwd():
        return ra.relu_attention_fwd(q, k, v, causal, False, scale, rs)

    def raw_bwd():
        return ra.relu_attention_bwd(q, k, v, do, causal, False, scale, rs)

    def raw_fwd_bwd():
        raw_fwd()
        return raw_bwd()

    def autograd_fwd_bwd():
        out = crossfuse.relu_attention(qg, kg, vg, causal=causal)
        return torch.autograd.grad(out, (qg, kg, vg), do)

    class Trivial(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            return torch.empty_like(q)

        @staticmethod
        def backward(ctx, g):
            return g, g, g

    def trivial_fwd_bwd():
        return torch.autograd.grad(Trivial.apply(qg, kg, vg), (qg, kg, vg), do)

    # the launches of one raw forward+backward
    launches = []
    orig = ra._launch

    def capture(kernel, grid, key, *a, **o):
        launches.append((kernel, grid, a, dict(o)))
        return orig(kernel, grid, key, *a, **o)

    ra._launch = capture
    try:
        raw_fwd_bwd()
    finally:
        ra._launch = orig
    torch.cuda.synchronize()

    rows = []

    def row(name, fn, calls=None):
        med, res = enqueue(fn, calls)
        rows.append((name, med, res))
        print(f"{name:44s} {med:8.1f} µs   ({', '.join(f'{x:.0f}' for x in res)})", flush=True)

    print(f"== B={B} H={H} L={L} D={D} causal={causal}: {len(launches)} launches "
          f"({', '.join(getattr(kn, '__name__', str(kn)) for kn, *_ in launches)})", flush=True)  # fmt: skip
    if args.fresh_phases:
        planning = getattr(ra, "PLANNING", None)
        try:
            for _ in range(2):  # alternated: launch plans on, then off (where this checkout has them)
                for plans in (True, False) if planning is not None else (None,):
                    if plans is not None:
                        ra.PLANNING = plans
                        print(f"-- launch plans {'on' if plans else 'off'}", flush=True)
                    for threads in (True, False):
                        with torch.autograd.set_multithreading_enabled(threads):
                            fresh_phases(ra, (qg, kg, vg), do, causal, args, threads)
                    row("raw_fwd", raw_fwd)
                    row("raw_bwd", raw_bwd)
                    row("raw_fwd_bwd", raw_fwd_bwd)
                    for name, fn in (("autograd_fwd_bwd", autograd_fwd_bwd), ("raw_fwd_bwd", raw_fwd_bwd)):
                        ms = [triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
                              for _ in range(2)]  # fmt: skip
                        print(f"do_bench {name:20s} {', '.join(f'{x:.4f}' for x in ms)} ms", flush=True)
        finally:
            if planning is not None:
                ra.PLANNING = planning
        row("trivial_fwd_bwd (engine floor)", trivial_fwd_bwd)
        row("_check_attention_args",
            lambda: ra._check_attention_args(qg, kg, vg, causal, False, None, None, "bhld"))  # fmt: skip
        return
    compare(raw_fwd_bwd, autograd_fwd_bwd, row)
    phases(ra, (qg, kg, vg), do, causal, args)
    if args.compare_only:
        return
    row("raw_fwd_bwd", raw_fwd_bwd)
    row("autograd_fwd_bwd", autograd_fwd_bwd)
    row("trivial_fwd_bwd (engine floor)", trivial_fwd_bwd)
    row("raw_fwd", raw_fwd)
    row("raw_bwd", raw_bwd)
    gc.disable()
    try:
        row("raw_fwd_bwd, gc disabled", raw_fwd_bwd)
        row("autograd_fwd_bwd, gc disabled", autograd_fwd_bwd)
    finally:
        gc.enable()
    with torch.autograd.set_multithreading_enabled(False):
        row("autograd_fwd_bwd, no worker thread", autograd_fwd_bwd)

    dev = torch.cuda.current_device()
    stream = torch.cuda.current_stream().cuda_stream
    total_jit = total_direct = 0.0
    for kernel, grid, a, o in launches:
        name = kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel)
        descs = sum(isinstance(x, TensorDescriptor) for x in a)
        jit = lambda kernel=kernel, grid=grid, a=a, o=o: kernel[grid](*a, **o)  # noqa: E731
        ck = jit()
        o2 = dict(o, debug=o.get("debug", kernel.debug) or triton.knobs.runtime.debug,
                  instrumentation_mode=triton.knobs.compilation.instrumentation_mode)  # fmt: skip
        bound, _, _ = kernel.device_caches[dev][4](*a, **o2)
        vals = tuple(bound.values())
        g3 = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)

        def direct(ck=ck, g3=g3, vals=vals):
            ck.run(*g3, stream, ck.function, ck.packed_metadata, None, None, None, *vals)

        row(f"  {name} via kernel[grid] ({descs} descriptors)", jit)
        total_jit += rows[-1][1]
        row(f"  {name} via the compiled launcher", direct)
        total_direct += rows[-1][1]
        meta = getattr(ck.metadata, "tensordesc_meta", None)
        if descs and meta:
            m = meta[0]
            d0 = next(x for x in a if isinstance(x, TensorDescriptor))
            from triton.backends.nvidia.driver import make_tensordesc_arg

            row(f"  {name}: one make_tensordesc_arg", lambda d0=d0, m=m: make_tensordesc_arg(d0, m))
    print(f"sum of launches: kernel[grid] {total_jit:.1f} µs, compiled launcher {total_direct:.1f} µs",
          flush=True)  # fmt: skip

    cfg = ra.attention_config("fwd", D, q.dtype, causal, False, L)
    out = torch.empty_like(q)
    row("_desc(q)", lambda: ra._desc(q, cfg.block_m))

    def fields_only():
        d = object.__new__(TensorDescriptor)
        d.base, d.shape, d.strides, d.block_shape, d.padding = q, list(q.shape), list(q.stride()), \
            [1, 1, cfg.block_m, D], "zero"  # fmt: skip
        return d

    row("descriptor without the dataclass checks", fields_only)
    row("_tma_usable(q, k, v, do, dq, dk, dv)", lambda: ra._tma_usable(False, q, k, v, do, out, out, out))
    row("attention_config x3", lambda: (ra.attention_config("fwd", D, q.dtype, causal, False, L),
                                        ra.attention_config("dkdv", D, q.dtype, causal, False, L),
                                        ra.attention_config("dq", D, q.dtype, causal, False, L)))  # fmt: skip
    row("torch.empty x4", lambda: [torch.empty((B, H, L, D), dtype=q.dtype, device=q.device) for _ in "abcd"])
    row("_gdc.usable", lambda: ra._gdc.usable(q, False))
    row("_check_attention_args",
        lambda: ra._check_attention_args(qg, kg, vg, causal, False, None, None, "bhld"))  # fmt: skip
    kept = crossfuse.relu_attention(qg, kg, vg, causal=causal)
    row("kept graph's backward (torch.autograd.grad)",
        lambda: torch.autograd.grad(kept, (qg, kg, vg), do, retain_graph=True))  # fmt: skip
    tk = Trivial.apply(qg, kg, vg)
    row("trivial kept graph's backward", lambda: torch.autograd.grad(tk, (qg, kg, vg), do, retain_graph=True))
    for name in ("autograd_fwd_bwd", "raw_fwd_bwd"):
        fn = autograd_fwd_bwd if name.startswith("autograd") else raw_fwd_bwd
        ms = [triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") for _ in range(3)]
        print(f"do_bench {name:20s} {', '.join(f'{x:.4f}' for x in ms)} ms", flush=True)


def phases(ra, inputs, do, causal, args) -> None:
    """Where the kept graph's backward (``torch.autograd.grad``) spends the host's time, per call behind a
    GPU sleep: from the call to the entry of ``ReLUAttentionFunction.backward`` (on the engine's worker
    thread), inside it, and from its return to the call's end."""
    import crossfuse
    import torch

    kept = crossfuse.relu_attention(*inputs, causal=causal)
    fn = ra.ReLUAttentionFunction
    orig = fn.backward
    marks: list[tuple[float, float]] = []

    def timed(ctx, dout):
        t1 = time.perf_counter()
        res = orig(ctx, dout)
        marks.append((t1, time.perf_counter()))
        return res

    fn.backward = staticmethod(timed)
    try:
        for _ in range(5):
            torch.autograd.grad(kept, inputs, do, retain_graph=True)
        torch.cuda.synchronize()
        spans = {"to the backward's entry": [], "inside the backward": [], "from its return": []}
        for _ in range(args.repeats):
            marks.clear()
            calls = []
            torch.cuda._sleep(int(args.calls * 2.0e-3 * 1.98e9))
            for _ in range(args.calls):
                t0 = time.perf_counter()
                torch.autograd.grad(kept, inputs, do, retain_graph=True)
                calls.append((t0, time.perf_counter()))
            torch.cuda.synchronize()
            for (t0, t3), (t1, t2) in zip(calls, marks, strict=True):
                for name, dt in zip(spans, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                    spans[name].append(dt * 1e6)
    finally:
        fn.backward = orig
    parts = ", ".join(f"{name} {statistics.median(v):.1f}" for name, v in spans.items())
    print(f"kept graph's backward, µs per call (median of every call): {parts}", flush=True)


def fresh_phases(ra, inputs, do, causal, args, threads: bool) -> None:
    """Where a fresh ``relu_attention`` then ``torch.autograd.grad`` (the graph built and freed each call,
    as ``bench/extras.py`` times it) spends the host's time, per call behind a GPU sleep: from the call to
    ``ReLUAttentionFunction.forward``'s entry, inside it, from its return to the call's end, from
    ``torch.autograd.grad`` to the backward's entry (the engine's worker thread with ``threads``), inside
    it, and from its return to the end of ``grad``."""
    import crossfuse
    import torch

    fn = ra.ReLUAttentionFunction
    fwd, bwd = fn.forward, fn.backward
    marks: list[float] = []

    def timed_fwd(ctx, *a):
        marks.append(time.perf_counter())
        res = fwd(ctx, *a)
        marks.append(time.perf_counter())
        return res

    def timed_bwd(ctx, dout):
        marks.append(time.perf_counter())
        res = bwd(ctx, dout)
        marks.append(time.perf_counter())
        return res

    def call():
        t0 = time.perf_counter()
        out = crossfuse.relu_attention(*inputs, causal=causal)
        t1 = time.perf_counter()
        torch.autograd.grad(out, inputs, do)
        return t0, t1, time.perf_counter()

    names = ("to forward", "inside forward", "forward's return", "grad to backward", "inside backward",
             "backward's return", "whole call")  # fmt: skip
    spans: dict[str, list[float]] = {n: [] for n in names}
    fn.forward, fn.backward = staticmethod(timed_fwd), staticmethod(timed_bwd)
    try:
        for _ in range(5):
            call()
        torch.cuda.synchronize()
        for _ in range(args.repeats):
            marks.clear()
            calls = []
            torch.cuda._sleep(int(args.calls * 2.0e-3 * 1.98e9))
            for _ in range(args.calls):
                calls.append(call())
            torch.cuda.synchronize()
            for i, (t0, t1, t2) in enumerate(calls):
                f0, f1, b0, b1 = marks[4 * i : 4 * i + 4]
                for n, dt in zip(names, (f0 - t0, f1 - f0, t1 - f1, b0 - t1, b1 - b0, t2 - b1, t2 - t0),
                                 strict=True):  # fmt: skip
                    spans[n].append(dt * 1e6)
    finally:
        fn.forward, fn.backward = fwd, bwd
    parts = ", ".join(f"{n} {statistics.median(v):.1f}" for n, v in spans.items())
    state = "on" if threads else "off"
    print(f"fresh graph, worker thread {state}, µs per call (medians): {parts}", flush=True)


def compare(raw_fwd_bwd, autograd_fwd_bwd, row, rounds: int = 3) -> None:
    """The launch path of crossfuse.ops._direct (compiled kernels launched again without Triton's
    dispatch, descriptors without the dataclass's checks) against Triton's dispatch and the dataclass,
    alternated ``rounds`` times: host µs per call (enqueued) and ``do_bench`` ms."""
    import triton
    from crossfuse.ops import _direct

    saved = _direct._ENABLED, _direct._DESCRIPTOR
    modes = {"dispatch": (False, None), "direct": saved}
    bench = {m: {"raw": [], "autograd": []} for m in modes}
    try:
        for _ in range(rounds):
            for mode, (enabled, maker) in modes.items():
                _direct._ENABLED, _direct._DESCRIPTOR = enabled, maker
                for name, fn in (("raw", raw_fwd_bwd), ("autograd", autograd_fwd_bwd)):
                    row(f"[{mode}] {name}_fwd_bwd enqueue", fn)
                    ms = triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
                    bench[mode][name].append(ms)
    finally:
        _direct._ENABLED, _direct._DESCRIPTOR = saved
    for mode, by in bench.items():
        for name, ms in by.items():
            print(f"do_bench [{mode}] {name}_fwd_bwd {', '.join(f'{x:.4f}' for x in ms)} ms", flush=True)
        ratio = statistics.median(by["autograd"]) / statistics.median(by["raw"])
        print(f"do_bench [{mode}] autograd/raw (medians) {ratio:.3f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
