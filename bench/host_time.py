"""Host time per call of every public entry point, beside torch's own op, measured in one process.

    python bench/host_time.py [--out DIR] [--against OTHER_PYTHON_DIR] [--calls N]

Host time is what the CPU spends to issue one call: ``N`` calls back to back with no synchronisation,
wall clock divided by ``N``, after a warm-up (so the first call, which compiles and plans, is excluded).
crossfuse's call and its peer's are timed together, in runs of ``N/10`` calls that alternate between them,
so that the host's drift within a second falls on both.
Inputs require grad, as in training. Forward rows time the call; backward rows time
``torch.autograd.grad`` of a retained graph (the backward's own host path, autograd's engine included).
A model whose step issues many small calls is held back by this number, whatever its kernels cost.

Peers: ``F.layer_norm`` and ``torch.nn.LayerNorm`` for the layer norm, ``F.scaled_dot_product_attention``
for the op and ``torch.nn.MultiheadAttention`` for the module. ``--against`` also measures another
checkout's crossfuse (its ``python/`` folder) in a subprocess on the same GPU, for a before/after table;
torch's ops measured there too get a column of their own (the host's drift between the two processes).
Each row also gives the median over the rounds of torch's time over crossfuse's in the same round,
with the rounds' range (:func:`paired`); the table's last line gives the rounds' spread. Needs a CUDA
GPU; writes ``host_time.csv`` and ``host_time.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _host_us_pair(fns, calls: int, chunks: int = 10) -> list[float]:
    """Microseconds of CPU per call of each of ``fns`` (crossfuse's entry and its peer), as
    ``crossfuse.harness.timing.host_time_us`` counts them, after a warm-up long enough for the first calls'
    compiles and plans: ``calls`` calls each, in ``chunks`` runs of back-to-back calls that alternate
    between them (the GPU synchronised between runs, outside the clock), which of them goes first
    alternating too. The host's pace drifts within a second; this way a slow spell falls on both. Written
    here rather than imported: with ``--against`` this runs on another checkout's crossfuse, whose harness
    may not have that function."""
    import torch

    for fn in fns:
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    per_chunk = max(1, calls // chunks)
    spent = [0.0] * len(fns)
    for c in range(chunks):
        for i in range(len(fns)) if c % 2 == 0 else reversed(range(len(fns))):
            fn = fns[i]
            t0 = time.perf_counter()
            for _ in range(per_chunk):
                fn()
            spent[i] += time.perf_counter() - t0
            torch.cuda.synchronize()
    return [dt / (per_chunk * chunks) * 1e6 for dt in spent]


def _fused_module(crossfuse, n: int, dev, dt):
    """crossfuse's LayerNorm module with its fused kernels at every size (this shape is below its
    ``native_below`` default, where it runs torch's own layer norm); an older checkout's has no such
    argument."""
    try:
        return crossfuse.nn.LayerNorm(n, device=dev, dtype=dt, native_below=0)
    except TypeError:
        return crossfuse.nn.LayerNorm(n, device=dev, dtype=dt)


def measure(calls: int, rounds: int) -> list[dict]:
    """``[{entry, mode, shape, impl, host_us}]`` for crossfuse and its peers, bf16 on the current GPU: the
    median of ``rounds`` measurements, every case measured once a round (so that a slow spell of the host
    falls on all of them)."""
    import crossfuse
    import torch
    import torch.nn.functional as F

    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    cases = []

    def add(entry, shape, impl, fwd, out_and_inputs):
        cases.append((dict(entry=entry, mode="fwd", shape=shape, impl=impl), fwd))
        out, inputs = out_and_inputs()
        dout = torch.randn_like(out)
        # the graph of a call after the first ones, as in a training loop: a shape's first calls compile,
        # plan and record the compiled path's programs, and their graphs keep the Python backward
        for _ in range(3):
            torch.autograd.grad(out, inputs, dout)
            out, inputs = out_and_inputs()
        bwd = lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True)  # noqa: E731
        cases.append((dict(entry=entry, mode="bwd", shape=shape, impl=impl), bwd))

    m, n = 4096, 1024
    x = torch.randn(m, n, device=dev, dtype=dt, requires_grad=True)
    w = torch.ones(n, device=dev, dtype=dt, requires_grad=True)
    b = torch.zeros(n, device=dev, dtype=dt, requires_grad=True)
    ln_shape = f"{m}x{n}"
    add("layer_norm", ln_shape, "crossfuse.layer_norm", lambda: crossfuse.layer_norm(x, (n,), w, b),
        lambda: (crossfuse.layer_norm(x, (n,), w, b), (x, w, b)))  # fmt: skip
    add("layer_norm", ln_shape, "F.layer_norm", lambda: F.layer_norm(x, (n,), w, b),
        lambda: (F.layer_norm(x, (n,), w, b), (x, w, b)))  # fmt: skip
    for impl, mod in (("crossfuse.nn.LayerNorm", _fused_module(crossfuse, n, dev, dt)),
                      ("torch.nn.LayerNorm", torch.nn.LayerNorm(n, device=dev, dtype=dt))):  # fmt: skip
        add("nn.LayerNorm", ln_shape, impl, lambda mod=mod: mod(x),
            lambda mod=mod: (mod(x), (x, mod.weight, mod.bias)))  # fmt: skip

    # the module's default below native_below: torch's layer norm behind crossfuse's checks (a small
    # batch of a model: one sequence of 128 tokens, 768 wide)
    small = torch.randn(1, 128, 768, device=dev, dtype=dt, requires_grad=True)
    for impl, mod in (("crossfuse.nn.LayerNorm", crossfuse.nn.LayerNorm(768, device=dev, dtype=dt)),
                      ("torch.nn.LayerNorm", torch.nn.LayerNorm(768, device=dev, dtype=dt))):  # fmt: skip
        add("nn.LayerNorm (default, small)", "1x128x768", impl, lambda mod=mod: mod(small),
            lambda mod=mod: (mod(small), (small, mod.weight, mod.bias)))  # fmt: skip

    # a wide row (a large model's hidden size), whose backward runs the Gluon kernels on Hopper
    wide_n = 8192
    wide = torch.randn(1024, wide_n, device=dev, dtype=dt, requires_grad=True)
    ww = torch.ones(wide_n, device=dev, dtype=dt, requires_grad=True)
    wb = torch.zeros(wide_n, device=dev, dtype=dt, requires_grad=True)
    for impl, op in (("crossfuse.layer_norm", crossfuse.layer_norm), ("F.layer_norm", F.layer_norm)):
        add("layer_norm", f"1024x{wide_n}", impl, lambda op=op: op(wide, (wide_n,), ww, wb),
            lambda op=op: (op(wide, (wide_n,), ww, wb), (wide, ww, wb)))  # fmt: skip

    bb, h, length, d = 1, 8, 128, 64
    q, k, v = (torch.randn(bb, h, length, d, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    a_shape = f"{bb}x{h}x{length}x{d}"
    add("relu_attention", a_shape, "crossfuse.relu_attention", lambda: crossfuse.relu_attention(q, k, v),
        lambda: (crossfuse.relu_attention(q, k, v), (q, k, v)))  # fmt: skip
    add("relu_attention", a_shape, "F.scaled_dot_product_attention",
        lambda: F.scaled_dot_product_attention(q, k, v),
        lambda: (F.scaled_dot_product_attention(q, k, v), (q, k, v)))  # fmt: skip
    e = h * d
    xs = torch.randn(bb, length, e, device=dev, dtype=dt, requires_grad=True)
    ours = crossfuse.nn.ReLUAttention(e, h, device=dev, dtype=dt)
    theirs = torch.nn.MultiheadAttention(e, h, batch_first=True, device=dev, dtype=dt)
    add("nn.ReLUAttention", f"{bb}x{length}x{e}", "crossfuse.nn.ReLUAttention", lambda: ours(xs),
        lambda: (ours(xs), (xs,)))  # fmt: skip
    add("nn.ReLUAttention", f"{bb}x{length}x{e}", "torch.nn.MultiheadAttention",
        lambda: theirs(xs, xs, xs, need_weights=False)[0],
        lambda: (theirs(xs, xs, xs, need_weights=False)[0], (xs,)))  # fmt: skip
    # crossfuse's case and its peer's, of each (entry, mode, shape), measured together (_host_us_pair)
    pairs: dict = {}
    for i, (case, _) in enumerate(cases):
        pairs.setdefault((case["entry"], case["mode"], case["shape"]), []).append(i)
    groups = list(pairs.values())
    times = [[] for _ in cases]
    for r in range(rounds):
        # the listed order, then shuffles: no pair keeps its place or the pair before it (whatever one
        # measurement leaves the next, in the host's caches say, falls on every pair alike); as the
        # harness's rounds.round_orders does, written here for --against's older checkouts
        order = list(range(len(groups)))
        if r:
            random.Random(r).shuffle(order)
        for g in order:
            for i, us in zip(groups[g], _host_us_pair([cases[i][1] for i in groups[g]], calls), strict=True):
                times[i].append(us)
    return [dict(case, host_us=statistics.median(spent), min_us=min(spent), max_us=max(spent),
                 rounds_us=spent) for spent, (case, _) in zip(times, cases, strict=True)]  # fmt: skip


def paired(rows: list[dict]) -> dict:
    """``{(entry, mode, shape): (median, lowest, highest)}`` of the peer's time over crossfuse's in each
    round (> 1: crossfuse's call costs less), for the rows labelled "crossfuse" and "torch": the two were
    measured in the same runs of a round, under the same pace of the host, which moves between rounds by
    more than the differences measured; the range says how far one round's verdict can stray."""
    keyed: dict = {}
    for r in rows:
        if r.get("rounds_us") and r["label"] in ("crossfuse", "torch"):
            keyed.setdefault((r["entry"], r["mode"], r["shape"]), {})[r["label"]] = r["rounds_us"]
    out = {}
    for key, got in keyed.items():
        if len(got) == 2:
            ratios = [t / c for t, c in zip(got["torch"], got["crossfuse"], strict=True)]
            out[key] = (statistics.median(ratios), min(ratios), max(ratios))
    return out


def _table(rows: list[dict], columns: list[str]) -> str:
    """Markdown: one line per (entry, mode), crossfuse against the peer, in µs per call, and the paired
    ratio of each round (:func:`paired`)."""
    head = ["entry", "mode", "shape", *columns, "torch ÷ crossfuse, paired (rounds' range)"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    keyed: dict = {}
    for r in rows:
        keyed.setdefault((r["entry"], r["mode"], r["shape"]), {})[r["label"]] = r["host_us"]
    ratios = paired(rows)
    for key, got in keyed.items():
        cells = [f"{got[c]:.1f}" if c in got else "" for c in columns]
        ratio = ratios.get(key)
        cells.append(f"{ratio[0]:.3f} ({ratio[1]:.2f}–{ratio[2]:.2f})" if ratio else "")
        lines.append("| " + " | ".join([*key, *cells]) + " |")
    return "\n".join(lines)


def _spread(rows: list[dict]) -> str:
    """A line on the rounds' spread (slowest over fastest round, less one) of every row that has one."""
    spreads = [(r["max_us"] / r["min_us"] - 1, r) for r in rows if r.get("min_us")]
    if not spreads:
        return ""
    worst, r = max(spreads, key=lambda item: item[0])
    median = statistics.median(s for s, _ in spreads)
    return (f"Spread of the rounds (slowest over fastest, less one): {median:.0%} at the median row, "
            f"{worst:.0%} at most ({r['label']}, {r['entry']} {r['mode']} {r['shape']}).")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("out/host_time"))
    p.add_argument("--against", type=Path, help="another checkout's python/ folder, measured too")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--rounds", type=int, default=5, help="measurements per case (the median is kept)")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench/host_time.py: needs a CUDA GPU (host time with nothing to launch is moot)")
    rows = measure(a.calls, a.rounds)
    if a.json:
        print(json.dumps(rows))
        return 0
    for r in rows:
        r["label"] = "crossfuse" if r["impl"].startswith("crossfuse") else "torch"
    columns = ["crossfuse", "torch"]
    if a.against is not None:
        env = dict(os.environ, PYTHONPATH=str(a.against))
        cmd = [sys.executable, __file__, "--json", "--calls", str(a.calls), "--rounds", str(a.rounds)]
        other = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
        # its torch rows too: torch's op measured in both processes shows how far the host drifted
        # between them, which a before/after difference of crossfuse's must exceed to mean anything
        for r in other:
            ours = r["impl"].startswith("crossfuse")
            rows.append(dict(r, label="crossfuse before" if ours else "torch, before's run"))
        columns[:0] = ["crossfuse before", "torch, before's run"]
    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "host_time.csv", "w", newline="") as f:
        ratios = paired(rows)
        for r in rows:  # the paired ratio on crossfuse's row (see paired)
            if r["label"] == "crossfuse" and (r["entry"], r["mode"], r["shape"]) in ratios:
                r["torch_over_crossfuse"] = ratios[r["entry"], r["mode"], r["shape"]][0]
        fields = ["entry", "mode", "shape", "impl", "label", "host_us", "min_us", "max_us",
                  "torch_over_crossfuse"]
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    device = torch.cuda.get_device_name(0)
    md = (f"# Host time per call (µs), bf16, {device}, torch {torch.__version__}\n\n"
          f"`python bench/host_time.py{' --against ...' if a.against else ''}`: {a.calls} calls back to "
          f"back, no synchronisation, after a warm-up, in runs of a tenth of them that alternate between "
          f"crossfuse and its peer; median of {a.rounds} rounds (the pairs in another order each round), "
          "and the median over the rounds of each round's ratio (> 1: crossfuse's call costs less); "
          "inputs require grad; backward = autograd.grad of a retained graph.\n\n"
          + _table(rows, columns) + "\n\n" + _spread(rows) + "\n")  # fmt: skip
    (a.out / "host_time.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
