"""Reports from result rows: markdown tables, the pivot and the ratio to the best peer.

* Throughput tables, one per (suite, op, device, dtype, mode, causal): shapes down, implementations
  across, GB/s (normalisations) or TFLOP/s (attention) from the median eager time (``ms_p50``: the call
  as a user makes it, host time included); a cell without a number
  says why (``not timed``, ``skip``, ``error``). For each implementation that is not a peer, a column
  ``<impl> ÷ best peer`` divides it by the fastest peer in that row (where a peer was measured; none
  where a peer was left out for the run's time budget, since the best is then unknown). Where
  the run measured the copy ceiling (op ``copy``) on the device, a column gives the best implementation's
  GB/s as a percentage of the copy bandwidth.
* Time per call, one table per (suite, op, device, dtype, mode, causal): the eager median (ms, the time the
  throughput tables use), the GPU-only median (ms) and the host time per call (µs) of each implementation.
* Memory tables for the ``memory`` suite: bytes allocated and peak above baseline per mode, in MiB and
  as a multiple of the input's size.
* Accuracy: the largest relative error against the float64 reference, per op, dtype and implementation.
* What was not measured, and why (grouped notes of ``skip``, ``not timed`` and ``error`` rows).

A CSV holding a run cut short (a ``stopped`` marker row: interrupted, out of time budget, rows that
raised, a crash) gets a "partial run" line under the title that says why; the marker rows are in no
table. A marker followed by rows of its suite (a later run appended with ``--append``) is said apart: the
file no longer ends with that run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from .schema import BUDGET_SPENT, MODES, STOPPED, parse_shape, rows_frame

ATTENTION_OPS = ("relu_attention",)
UNIT = {"gbps": "GB/s", "tflops": "TFLOP/s"}


def metric_for(op: str) -> str:
    """``tflops`` for ops counted in FLOPs (attention), ``gbps`` for ops counted in bytes."""
    return "tflops" if op in ATTENTION_OPS else "gbps"


def _ordered(values) -> list:
    seen = {}
    for v in values:
        seen.setdefault(v, None)
    return list(seen)


def with_labels(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``label``: the implementation's name, with ``[side]`` for sides other than python (a Julia
    twin has the same name as its Python one)."""
    side = df["side"].where(df["side"] != "python", "")
    return df.assign(label=df["impl"] + side.map(lambda v: f" [{v}]" if v else ""))


def pivot(df: pd.DataFrame, metric: str, index: str = "shape", columns: str = "label") -> pd.DataFrame:
    """``metric`` per ``index`` × ``columns``, in order of first appearance (NaN where not measured)."""
    ok = df[df["status"] == "ok"]
    # one row per cell, unless a CSV holds repeated runs (``crossfuse bench --append``): their median
    table = ok.pivot_table(index=index, columns=columns, values=metric, aggfunc="median")
    rows = [r for r in _ordered(df[index]) if r in table.index] or list(table.index)
    cols = _ordered(df[columns])
    return table.reindex(index=rows + [r for r in _ordered(df[index]) if r not in rows], columns=cols)


def peer_ratio(table: pd.DataFrame, peers: Sequence[str]) -> pd.DataFrame:
    """For each non-peer column: its value divided by the best (largest) peer value in the row.

    Columns ``"<impl> ÷ best peer"``; NaN where the row has no peer value. Empty when no peer is present.
    """
    peer_cols = [c for c in table.columns if c in set(peers)]
    if not peer_cols:
        return pd.DataFrame(index=table.index)
    best = table[peer_cols].max(axis=1, skipna=True)
    out = {}
    for c in table.columns:
        if c in peer_cols or table[c].isna().all():
            continue
        out[f"{c} ÷ best peer"] = table[c] / best
    return pd.DataFrame(out, index=table.index)


def peers_of(df: pd.DataFrame) -> set[str]:
    """Labels (see :func:`with_labels`) of the peer implementations in ``df``."""
    return set(with_labels(df).loc[df["peer"], "label"])


# a figure this far above the copy ceiling is flagged as a measurement problem
OVER_CEILING = 1.05
# what identifies one measurement: a row repeating these is a second run of it
MEASUREMENT_KEYS = ["suite", "op", "impl", "side", "device", "dtype", "shape", "causal", "mode"]


def copy_ceiling(df: pd.DataFrame, device: str) -> float | None:
    """The best measured copy bandwidth (GB/s) on ``device`` in these rows, or None."""
    c = df[(df["op"] == "copy") & (df["device"] == device) & (df["status"] == "ok")]["gbps"].dropna()
    return float(c.max()) if len(c) else None


# ----------------------------------------------------------------------------------------------------
# formatting
# ----------------------------------------------------------------------------------------------------


def fmt_num(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    v = float(v)
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def fmt_bytes(v, ref: float | None = None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    text = f"{v / 2**20:.1f} MiB"
    if ref:
        text += f" ({v / ref:.2f}×)"
    return text


def fmt_ratio(v) -> str:
    if v is None or pd.isna(v):
        return ""
    return f"{v:.2f}×" if v >= 0.1 else f"{v:.2g}×"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """A GitHub markdown table; the first ``left`` columns left-aligned, the others right-aligned."""
    esc = [[str(c).replace("|", "\\|") for c in r] for r in [header, *rows]]
    align = [":---" if i < left else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(esc[0]) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in esc[1:]]
    return "\n".join(lines)


def _missing_cell(df: pd.DataFrame, shape: str, label: str) -> str:
    st = df[(df["shape"] == shape) & (df["label"] == label)]["status"]
    if not len(st):
        return ""
    s = st.iloc[0]
    return "" if s == "ok" else s


def _out_of_budget(df: pd.DataFrame, shape: str, label: str) -> bool:
    """Whether ``label`` at ``shape`` was left unmeasured because the run's time budget was spent."""
    rows = df[(df["shape"] == shape) & (df["label"] == label)]
    budget = rows["note"].astype(str).str.contains(BUDGET_SPENT, regex=False)
    return bool(((rows["status"] == "skip") & budget).any())


# ----------------------------------------------------------------------------------------------------
# sections
# ----------------------------------------------------------------------------------------------------


def _group_title(keys: dict) -> str:
    parts = [f"{keys['op']}", f"{keys['device']}", keys["dtype"], keys["mode"]]
    if keys["op"] in ATTENTION_OPS:
        parts.append("causal" if keys["causal"] else "not causal")
    return " · ".join(parts)


def throughput_section(df: pd.DataFrame) -> str:
    """The throughput tables for all non-copy rows of ``df`` (copy rows give the ceiling column)."""
    ceilings = {dev: copy_ceiling(df, dev) for dev in _ordered(df["device"])}
    df = with_labels(df[df["op"] != "copy"])
    if df.empty:
        return ""
    peers = peers_of(df)
    out, any_flagged, cpu_pruned = [], False, False
    keys = ["suite", "op", "device", "dtype", "mode", "causal"]
    # tables in the order the rows were measured, the modes of one table group as fwd, bwd, fwd+bwd
    order = df[keys].drop_duplicates()
    first = {k: i for i, k in enumerate(dict.fromkeys(map(tuple, order[keys[:-2] + keys[-1:]].values)))}
    order = order.assign(
        _g=[first[tuple(v)] for v in order[keys[:-2] + keys[-1:]].values],
        _m=order["mode"].map({m: i for i, m in enumerate(MODES)}),
    )
    for _, k in order.sort_values(["_g", "_m"], kind="stable").iterrows():
        g = df[(df[keys] == k[keys]).all(axis=1)]
        if g["suite"].iloc[0] == "memory":
            continue
        metric = metric_for(k["op"])
        table = pivot(g, metric)
        if k["device"] == "cpu":  # only what was timed: the interpreter's and CUDA-only columns mean nothing
            pruned = table.dropna(axis=1, how="all")
            cpu_pruned = cpu_pruned or pruned.shape[1] < table.shape[1]
            table = pruned
        if table.empty:
            continue
        ratio = peer_ratio(table, peers)
        for shape in table.index:  # a peer left out for the time budget: its row's best peer is unknown
            if any(_out_of_budget(g, shape, c) for c in table.columns if c in peers):
                ratio.loc[shape] = float("nan")
        ceiling = ceilings.get(k["device"]) if metric == "gbps" else None
        header = ["shape", *table.columns, *ratio.columns]
        if ceiling:
            header.append("best % of copy")
        rows, flagged = [], False
        for shape in table.index:
            cells = [shape]
            for impl in table.columns:
                v = table.at[shape, impl]
                cells.append(fmt_num(v) if not pd.isna(v) else _missing_cell(g, shape, impl))
            for c in ratio.columns:
                cells.append(fmt_ratio(ratio.at[shape, c]))
            if ceiling:
                r = table.loc[shape].dropna()
                over = len(r) and r.max() > OVER_CEILING * ceiling
                mark = " ⚠" if over else ""
                cells.append(f"{100 * r.max() / ceiling:.0f}%{mark} ({r.idxmax()})" if len(r) else "")
                flagged = flagged or over
            rows.append(cells)
        title = f"### {_group_title(k)} — {UNIT[metric]} (eager median)"
        if ceiling:
            title += f"; copy ceiling {ceiling:.0f} GB/s"
        any_flagged = any_flagged or flagged
        out.append(title + "\n\n" + markdown_table(header, rows))
    if cpu_pruned:  # said once, after the tables
        out.append(
            "On the CPU the tables hold only what was timed there (torch's implementations and Julia's): the "
            "Triton kernels run under Triton's interpreter and are checked, not timed (see the accuracy "
            "table), and what runs on CUDA only or was excluded is listed under what was not measured."
        )
    if any_flagged:  # said once, after the tables
        out.append(
            "⚠ above the copy ceiling: no kernel moves bytes faster than a copy, so one of the two timings "
            "is off; on a CPU, other load on the machine or torch's thread pool (a descheduled thread) can "
            "stretch single calls by milliseconds"
        )
    return "\n\n".join(out)


# what each clock of a row is, said once above the time tables
CLOCKS = (
    "eager: the call as a user makes it (`ms_p50`: back-to-back calls, host time included); GPU: GPU-only "
    "time, launch overhead hidden (`gpu_ms_p50`: what the kernels cost); host: CPU time per call "
    "(`host_us`: calls back to back without a synchronisation)"
)


def _time_cell(g: pd.DataFrame, shape: str, label: str) -> str:
    r = g[(g["shape"] == shape) & (g["label"] == label) & (g["status"] == "ok")]
    if not len(r):
        return _missing_cell(g, shape, label)
    eager, gpu, host = (r[c].median() for c in ("ms_p50", "gpu_ms_p50", "host_us"))
    parts = [f"{fmt_num(eager)} ms" if not pd.isna(eager) else "–"]
    parts.append(f"GPU {fmt_num(gpu)} ms" if not pd.isna(gpu) else "GPU –")
    parts.append(f"host {fmt_num(host)} µs" if not pd.isna(host) else "host –")
    return " · ".join(parts)


def times_section(df: pd.DataFrame) -> str:
    """Eager, GPU-only and host time per call of every timed row but the copy's and the memory suite's,
    one table per (suite, op, device, dtype, mode, causal)."""
    d = with_labels(df[(df["op"] != "copy") & (df["suite"] != "memory")])
    d = d[(d["status"] == "ok") & d["ms_p50"].notna()]
    if d.empty:
        return ""
    out = [f"### time per call\n\n{CLOCKS}; `–`: not measured on this device."]
    keys = ["suite", "op", "device", "dtype", "mode", "causal"]
    for k, g in d.groupby(keys, sort=False):
        labels = _ordered(g["label"])
        rows = [[shape, *(_time_cell(g, shape, c) for c in labels)] for shape in _ordered(g["shape"])]
        title = f"#### {_group_title(dict(zip(keys, k, strict=True)))} — eager · GPU-only · host"
        out.append(title + "\n\n" + markdown_table(["shape", *labels], rows))
    return "\n\n".join(out)


def memory_section(df: pd.DataFrame) -> str:
    """Memory tables: rows of the ``memory`` suite (alloc and peak per mode, × the input's bytes)."""
    m = df[(df["suite"] == "memory") & (df["op"] != "copy")]
    if m.empty:
        return ""
    out = []
    for (op, device, dtype, shape), g in m.groupby(["op", "device", "dtype", "shape"], sort=False):
        dims = parse_shape(shape)
        ref = math.prod(dims) * _element_size(dtype)
        modes = [x for x in MODES if x in set(g["mode"])]
        header = ["impl", *[f"{x} {w}" for x in modes for w in ("alloc", "peak")]]
        rows = []
        for label, gi in with_labels(g).groupby("label", sort=False):
            cells = [label + (" (peer)" if gi["peer"].iloc[0] else "")]
            for x in modes:
                r = gi[gi["mode"] == x]
                if not len(r) or r["alloc_bytes"].isna().all():
                    miss = r["status"].iloc[0] if len(r) else ""
                    cells += [miss, miss]
                else:  # repeated runs (crossfuse bench --append): their median, as the other tables
                    cells += [
                        fmt_bytes(r["alloc_bytes"].median(), ref),
                        fmt_bytes(r["peak_bytes"].median(), ref),
                    ]
            rows.append(cells)
        title = f"### memory · {op} · {device} · {dtype} · {shape} (input {ref / 2**20:.1f} MiB)"
        out.append(title + "\n\n" + markdown_table(header, rows))
    return "\n\n".join(out)


def peak_section(df: pd.DataFrame) -> str:
    """Peak memory of forward+backward in the speed suites: one table per (op, device, dtype, causal),
    MiB per shape and implementation (the allocator's peak above what was live before the call)."""
    m = df[(df["suite"] != "memory") & (df["op"] != "copy") & (df["mode"] == "fwd+bwd")]
    m = m[m["peak_bytes"].notna()] if "peak_bytes" in m else m.iloc[0:0]
    if m.empty:
        return ""
    out = []
    for (op, device, dtype, causal), g in m.groupby(["op", "device", "dtype", "causal"], sort=False):
        table = pivot(with_labels(g), "peak_bytes")
        rows = [[shape, *(fmt_bytes(table.at[shape, c]) if not pd.isna(table.at[shape, c]) else ""
                          for c in table.columns)] for shape in table.index]  # fmt: skip
        mask = f" · {'causal' if causal else 'not causal'}" if op == "relu_attention" else ""
        title = f"### peak memory of fwd+bwd · {op} · {device} · {dtype}{mask}"
        out.append(title + "\n\n" + markdown_table(["shape", *table.columns], rows))
    return "\n\n".join(out)


def _element_size(dtype: str) -> int:
    import torch

    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


def accuracy_section(df: pd.DataFrame) -> str:
    """Largest relerr per (op, device, dtype, impl): of the forward, and of the gradients."""
    d = df[(df["op"] != "copy")]
    if d["relerr"].notna().sum() == 0:
        return ""
    rows = []
    for (op, device, dtype, impl), g in with_labels(d).groupby(
        ["op", "device", "dtype", "label"], sort=False
    ):
        f = g[g["mode"] == "fwd"]["relerr"].max()
        b = g[g["mode"] != "fwd"]["relerr"].max()
        if pd.isna(f) and pd.isna(b):
            continue
        rows.append(
            [
                op,
                device,
                dtype,
                impl,
                f"{f:.2e}" if not pd.isna(f) else "",
                f"{b:.2e}" if not pd.isna(b) else "",
            ]
        )
    if not rows:
        return ""
    header = ["op", "device", "dtype", "impl", "max relerr fwd", "max relerr with grads"]
    return "### accuracy (relative error against the float64 reference)\n\n" + markdown_table(
        header, rows, left=4
    )


def notes_section(df: pd.DataFrame) -> str:
    """What was not measured and why: one line per distinct (op, impl, device, status, note)."""
    d = with_labels(df[df["status"] != "ok"])
    if d.empty:
        return ""
    g = d.groupby(["op", "label", "device", "status", "note"], sort=False).size().reset_index(name="rows")
    rows = [[r.op, r.label, r.device, r.status, str(r.rows), r.note] for r in g.itertuples()]
    return "### not measured\n\n" + markdown_table(
        ["op", "impl", "device", "status", "rows", "why"], rows, left=6
    )


def _stop_notes(stops) -> str:
    notes = (str(r.note).removeprefix("partial run: ") for r in stops.itertuples())
    return "; ".join(_ordered(f"suite {r.suite}: {n}" if r.suite else n
                              for r, n in zip(stops.itertuples(), notes, strict=True)))  # fmt: skip


def render(df_or_rows, title: str = "crossfuse benchmark results", source: str | None = None) -> str:
    """The full markdown report of some rows (a DataFrame or a list of :class:`Row`)."""
    df = rows_frame(df_or_rows).reset_index(drop=True)  # in the CSV's order
    stopped = df["status"] == STOPPED
    # a stopped run of a suite that a later run appended to (`crossfuse bench --append`) is no longer what
    # the file ends with: said apart, not as a partial file
    later = [bool(((df.index > i) & ~stopped & (df["suite"] == df.at[i, "suite"])).any())
             for i in df.index[stopped]]  # fmt: skip
    stops, redone = df[stopped][[not x for x in later]], df[stopped][later]
    df = df[~stopped]
    partial = ""
    if len(stops):
        partial = (f"**Partial run**: {_stop_notes(stops)}. The tables hold only what was measured before it "
                   "stopped.")  # fmt: skip
    if len(redone):
        earlier = f"**An earlier run was cut short**, then appended to: {_stop_notes(redone)}."
        partial = "\n\n".join(p for p in (partial, earlier) if p)
    if df.empty:
        return f"## {title}\n\n" + (partial + "\n\n" if partial else "") + "no rows\n"
    parts = [f"## {title}"]
    if partial:
        parts.append(partial)
    meta = [f"{len(df)} rows" + (f" from `{source}`" if source else "")]
    for dev, name in df[["device", "device_name"]].drop_duplicates().itertuples(index=False):
        meta.append(f"{dev}: {name}")
    meta.append("versions: " + "; ".join(_ordered(df["versions"])))
    ts = df["timestamp"][df["timestamp"] != ""]
    if len(ts):
        meta.append(f"measured {ts.min()} – {ts.max()}")
    measured = df[(df["status"] == "ok") & (df["op"] != "copy")]
    repeats = int(measured.duplicated(MEASUREMENT_KEYS, keep=False).sum())
    if repeats:
        meta.append(
            f"{repeats} rows repeat a measurement (runs appended to one CSV): the tables show the median "
            "of each measurement's runs"
        )
    twins = ~df["op"].isin([*ATTENTION_OPS, "copy"])  # ops with Julia variants (attention has none)
    if twins.any() and not (df["side"] == "julia").any():
        meta.append("Julia: no rows (the Julia side was not asked, or crossfuse_julia was not registered)")
    parts.append("\n".join(f"- {m}" for m in meta))
    for dev in _ordered(df["device"]):
        c = copy_ceiling(df, dev)
        if c:
            parts.append(f"Copy ceiling on {dev}: {c:.0f} GB/s (y.copy_(x), bytes read + written).")
    sections = (throughput_section(df), times_section(df), peak_section(df), memory_section(df),
                accuracy_section(df), notes_section(df))  # fmt: skip
    for section in sections:
        if section:
            parts.append(section)
    return "\n\n".join(parts) + "\n"
