"""Plots of result rows (PNG, matplotlib's Agg backend; matplotlib is imported here only).

Throughput is read from the eager median time (``ms_p50``: the call as a user makes it, host time
included); the GPU-only time (``gpu_ms_p50``) and host time (``host_us``) are in the CSV and the report.

* :func:`plot_gbps`: layer-norm GB/s against N, one line per implementation, one panel per dtype × mode,
  for the rows sharing the most common M (the suite's M=4096 sweep); the copy ceiling as a dashed line.
* :func:`plot_tflops`: attention TFLOP/s against L, one line per implementation, panels per
  D × causal × mode.
* :func:`plot_memory`: bars of bytes allocated (and the peak, hatched) per implementation and mode, in
  multiples of the input's size, one panel per device × op × shape (the ``memory`` suite).

Each function returns the path written, or None when the rows hold nothing to plot.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pandas as pd

from .report import copy_ceiling, with_labels
from .schema import MODES, parse_shape, rows_frame

NORM_OPS = ("layer_norm", "normalise", "layer_norm_maxstd")


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _grid(plt, n_rows: int, n_cols: int, w: float = 4.2, h: float = 3.2):
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(w * n_cols, h * n_rows), squeeze=False)
    return fig, axes


def _style(peer: bool) -> dict:
    return {"linestyle": "--" if peer else "-", "marker": "o" if not peer else "s", "markersize": 4}


def _lines(ax, g: pd.DataFrame, x: str, y: str, title: str, ylabel: str, ceiling: float | None = None):
    """One panel: a line per implementation label of ``g`` (peers dashed), ``x`` on a log2 axis."""
    for label, gi in g.groupby("label", sort=False):
        peer = bool(gi["peer"].iloc[0])
        line = gi.groupby(x, sort=True)[y].median()  # one point per x (repeated runs: their median)
        ax.plot(line.index, line.values, label=label, **_style(peer))
    if ceiling:
        ax.axhline(ceiling, color="grey", linestyle=":", linewidth=1, label="copy ceiling")
    ax.set_xscale("log", base=2)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


def preferred_device(df: pd.DataFrame) -> str | None:
    devs = list(dict.fromkeys(df["device"]))
    return "cuda" if "cuda" in devs else (devs[0] if devs else None)


def plot_gbps(df, path, device: str | None = None, op: str = "layer_norm") -> Path | None:
    df = rows_frame(df)
    device = device or preferred_device(df)
    d = with_labels(df)
    d = d[(d["op"] == op) & (d["device"] == device) & (d["status"] == "ok") & (d["suite"] != "memory")]
    if d.empty:
        return None
    dims = d["shape"].map(parse_shape)
    m_common = Counter(s[0] for s in dims).most_common(1)[0][0]
    d = d.assign(M=dims.map(lambda s: s[0]), N=dims.map(lambda s: s[-1]))
    d = d[d["M"] == m_common]
    dtypes = list(dict.fromkeys(d["dtype"]))
    modes = [m for m in MODES if m in set(d["mode"])]
    plt = _plt()
    fig, axes = _grid(plt, len(dtypes), len(modes))
    ceiling = copy_ceiling(df, device)
    for i, dt in enumerate(dtypes):
        for j, mode in enumerate(modes):
            g = d[(d["dtype"] == dt) & (d["mode"] == mode)]
            _lines(axes[i][j], g, "N", "gbps", f"{op} {dt} {mode} (M={m_common})", "GB/s (eager)", ceiling)
    fig.suptitle(f"{op}: GB/s (eager median time) against N on {device} ({d['device_name'].iloc[0]})",
                 fontsize=10)  # fmt: skip
    return _save(fig, plt, path)


def plot_tflops(df, path, device: str | None = None, op: str = "relu_attention") -> Path | None:
    df = rows_frame(df)
    device = device or preferred_device(df)
    d = with_labels(df)
    d = d[(d["op"] == op) & (d["device"] == device) & (d["status"] == "ok")]
    if d.empty:
        return None
    dims = d["shape"].map(parse_shape)
    d = d.assign(L=dims.map(lambda s: s[2]), D=dims.map(lambda s: s[3]))
    panels = d[["D", "causal", "mode"]].drop_duplicates()
    panels = panels.assign(_m=panels["mode"].map({m: i for i, m in enumerate(MODES)}))
    panels = panels.sort_values(["D", "causal", "_m"])
    cols = len(panels[["causal", "mode"]].drop_duplicates())
    ds = list(dict.fromkeys(panels["D"]))
    plt = _plt()
    fig, axes = _grid(plt, len(ds), cols)
    for i, dd in enumerate(ds):
        for j, (_, p) in enumerate(panels[panels["D"] == dd].iterrows()):
            g = d[(d["D"] == dd) & (d["causal"] == p["causal"]) & (d["mode"] == p["mode"])]
            causal = "causal" if p["causal"] else "not causal"
            title = f"D={dd} {g['dtype'].iloc[0] if len(g) else ''} {causal} {p['mode']}"
            _lines(axes[i][j], g, "L", "tflops", title, "TFLOP/s (eager)")
    fig.suptitle(f"{op}: TFLOP/s (eager median time) against L on {device} ({d['device_name'].iloc[0]})",
                 fontsize=10)  # fmt: skip
    return _save(fig, plt, path)


def plot_memory(df, path) -> Path | None:
    df = rows_frame(df)
    d = with_labels(df)
    d = d[(d["op"].isin(NORM_OPS)) & d["alloc_bytes"].notna()]
    if (d["suite"] == "memory").any():
        d = d[d["suite"] == "memory"]
    if d.empty:
        return None
    import torch

    panels = list(d[["device", "op", "shape", "dtype"]].drop_duplicates().itertuples(index=False))
    n_cols = min(3, len(panels))
    n_rows = math.ceil(len(panels) / n_cols)
    plt = _plt()
    fig, axes = _grid(plt, n_rows, n_cols, w=5.0, h=3.4)
    colors = {"fwd": "tab:blue", "bwd": "tab:orange", "fwd+bwd": "tab:green"}
    for k, (device, op, shape, dtype) in enumerate(panels):
        ax = axes[k // n_cols][k % n_cols]
        g = d[(d["device"] == device) & (d["op"] == op) & (d["shape"] == shape) & (d["dtype"] == dtype)]
        ref = math.prod(parse_shape(shape)) * torch.empty((), dtype=getattr(torch, dtype)).element_size()
        impls = list(dict.fromkeys(g["label"]))
        modes = [m for m in MODES if m in set(g["mode"])]
        width = 0.8 / max(1, len(modes))
        for j, mode in enumerate(modes):
            # repeated runs (crossfuse bench --append): their median, as the report's tables
            gm = g[g["mode"] == mode].groupby("label", sort=False)[["alloc_bytes", "peak_bytes"]].median()
            gm = gm.reindex(impls)
            xs = [i + (j - (len(modes) - 1) / 2) * width for i in range(len(impls))]
            ax.bar(xs, gm["alloc_bytes"] / ref, width, color=colors[mode], label=f"{mode} allocated")
            ax.bar(
                xs,
                gm["peak_bytes"] / ref,
                width * 0.5,
                color="none",
                edgecolor="black",
                hatch="//",
                linewidth=0.6,
                label=f"{mode} peak" if j == 0 else None,
            )
        ax.set_xticks(range(len(impls)))
        ax.set_xticklabels(impls, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("× input bytes")
        ax.set_title(f"{op} {shape} {dtype} on {device}", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        if k == 0:
            ax.legend(fontsize=6)
    for k in range(len(panels), n_rows * n_cols):
        axes[k // n_cols][k % n_cols].axis("off")
    fig.suptitle(
        "bytes allocated during the call (bars) and peak above baseline (hatched), × input size", fontsize=10
    )
    return _save(fig, plt, path)


def _save(fig, plt, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# the files write_plots may write
PLOT_NAMES = ("layer_norm_gbps.png", "attention_tflops.png", "memory.png")


def write_plots(df, out_dir) -> list[Path]:
    """All plots the rows allow, into ``out_dir`` (:data:`PLOT_NAMES`)."""
    out_dir = Path(out_dir)
    gbps, tflops, mem = (out_dir / n for n in PLOT_NAMES)
    written = [plot_gbps(df, gbps), plot_tflops(df, tflops), plot_memory(df, mem)]
    return [p for p in written if p is not None]
