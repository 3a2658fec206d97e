"""``crossfuse profile attention``: which kernels each attention implementation launches, and where the
time goes, from the PyTorch profiler.

Subjects: a naive softmax attention written here (matmul, scale, mask, softmax, matmul: the textbook
form that the ReLU variants are compared with; it is not a registry entry because it computes another
op), and the registry's ``relu_attention`` entries ``sdpa_softmax`` (torch SDPA), ``naive`` (torch ReLU
attention) and ``triton`` (crossfuse's kernel). Each runs forward + backward twice to warm up, then
once under ``torch.profiler`` with the ranges ``<impl>: fwd`` and ``<impl>: bwd``.

Output: per subject the profiler's own table (``key_averages().table``) and a kernel table (name,
phase, calls, total time, share); one Chrome trace with one process group per subject
(``profile_trace.json``: open in https://ui.perfetto.dev or chrome://tracing); and a timeline PNG, one row
per subject, kernels as bars. On a GPU "kernels" are the device kernels (CUPTI); on the CPU they are
aten ops, each with its self time (without the ops it calls). A Triton kernel on the CPU runs only
under the interpreter (NumPy emulating the program grid), which says nothing about the kernel: it is
skipped there, with that reason.
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import registry
from .memory import quiet_native_stderr
from .report import markdown_table
from .schema import dtype_str, shape_str

DEFAULT_SHAPE = {"cuda": (4, 16, 4096, 128), "cpu": (1, 4, 256, 64)}
DEFAULT_DTYPE = {"cuda": torch.bfloat16, "cpu": torch.float32}
REGISTRY_SUBJECTS = ("sdpa_softmax", "naive", "triton")  # relu_attention entries, in this order


def naive_softmax_attention(q, k, v, causal: bool = False, squared: bool = False):
    """Textbook softmax attention in torch: ``softmax(mask(q k^T * scale)) @ v``, scale ``1/sqrt(D)``."""
    s = torch.matmul(q, k.transpose(-2, -1))
    s = s * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.matmul(p, v)


@dataclass
class Kernel:
    name: str
    start_us: float  # from the subject's first kernel
    dur_us: float
    phase: str  # "fwd" | "bwd"


@dataclass
class Subject:
    label: str
    description: str
    fn: Callable | None
    reason: str | None = None  # why it was not profiled
    kernels: list[Kernel] = field(default_factory=list)
    torch_table: str = ""


def subjects(device: str, dtype: torch.dtype | None = None) -> list[Subject]:
    out = [
        Subject(
            "softmax_naive",
            "naive softmax attention in torch (matmul, scale, mask, softmax, matmul)",
            naive_softmax_attention,
        )
    ]
    for name in REGISTRY_SUBJECTS:
        try:
            impl = registry.get("relu_attention", name)
        except KeyError:
            out.append(Subject(name, "", None, "not in the registry"))
            continue
        reason = impl.unavailable_reason(device, dtype)
        if reason is None and impl.interpreted(device):
            reason = (
                "a Triton kernel on the CPU runs only under the interpreter (NumPy emulating the "
                "grid): its profile would show the interpreter, not the kernel"
            )
        out.append(Subject(name, impl.description, impl.fn, reason))
    return out


def _is_cuda(device) -> bool:
    return torch.device(device).type == "cuda"


def _sync(device) -> None:
    if _is_cuda(device):
        torch.cuda.synchronize(device)


def _kernels(prof, device, label: str) -> list[Kernel]:
    """Kernels (GPU), or aten ops with their self time (CPU), of one profiled step, with their phase."""
    events = list(prof.events())
    fwd_name, bwd_name = f"{label}: fwd", f"{label}: bwd"
    ranges = {
        e.name: e.time_range
        for e in events
        if e.name in (fwd_name, bwd_name) and e.device_type == torch.autograd.DeviceType.CPU
    }
    fwd_end = ranges[fwd_name].end if fwd_name in ranges else math.inf
    picked = []
    if _is_cuda(device):
        for e in events:
            if e.device_type == torch.autograd.DeviceType.CUDA and e.name not in (fwd_name, bwd_name):
                picked.append((e.name, e.time_range.start, e.time_range.elapsed_us()))
    else:
        for e in events:
            if e.device_type != torch.autograd.DeviceType.CPU or not e.name.startswith("aten::"):
                continue
            if not any(r.start <= e.time_range.start <= r.end for r in ranges.values()):
                continue
            if e.self_cpu_time_total > 0:  # an aten op's own work, without the ops it calls
                picked.append((e.name, e.time_range.start, e.self_cpu_time_total))
    if not picked:
        return []
    t0 = min(p[1] for p in picked)
    return [
        Kernel(n, s - t0, d, "fwd" if s <= fwd_end else "bwd")
        for n, s, d in sorted(picked, key=lambda p: p[1])
    ]


def _torch_table(prof, device) -> str:
    sort = "self_cuda_time_total" if _is_cuda(device) else "self_cpu_time_total"
    try:
        return prof.key_averages().table(sort_by=sort, row_limit=12, max_name_column_width=60)
    except Exception as exc:  # the table's options changed over torch versions; say so, keep going
        return f"(profiler table unavailable: {type(exc).__name__}: {exc})"


def profile_one(subj: Subject, q, k, v, dy, causal: bool, device, trace_path: Path) -> None:
    """Warm up, then profile one forward + backward of ``subj``; fills its kernels and table."""
    from torch.profiler import ProfilerActivity, profile, record_function

    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]

    def step():
        with record_function(f"{subj.label}: fwd"):
            out = subj.fn(*leaves, causal, False)
            _sync(device)
        with record_function(f"{subj.label}: bwd"):
            torch.autograd.grad(out, leaves, dy)
            _sync(device)

    for _ in range(2):
        step()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if _is_cuda(device) else [])
    prof = profile(activities=acts)
    with quiet_native_stderr():
        prof.__enter__()
    try:
        step()
    finally:
        with quiet_native_stderr():
            prof.__exit__(None, None, None)
    subj.kernels = _kernels(prof, device, subj.label)
    subj.torch_table = _torch_table(prof, device)
    prof.export_chrome_trace(str(trace_path))


def merge_traces(parts: list[tuple[str, Path]], out: Path) -> Path:
    """One Chrome trace from several: each part's processes renamed ``<label>: <process>`` and renumbered."""
    merged: dict = {"traceEvents": [], "displayTimeUnit": "ms"}
    for k, (label, path) in enumerate(parts):
        with open(path) as f:
            data = json.load(f)
        pids: dict[str, int] = {}
        named = set()
        for ev in data.get("traceEvents", []):
            if "pid" in ev:
                ev["pid"] = pids.setdefault(str(ev["pid"]), (k + 1) * 1000 + len(pids))
            if ev.get("ph") in ("s", "f", "t") and isinstance(ev.get("id"), int):
                ev["id"] = ev["id"] + (k + 1) * 10**9  # keep flow arrows within their part
            if ev.get("ph") == "M" and ev.get("name") == "process_name":
                ev.setdefault("args", {})["name"] = f"{label}: {ev.get('args', {}).get('name', '')}"
                named.add(ev["pid"])
            merged["traceEvents"].append(ev)
        for orig, pid in pids.items():
            if pid not in named:
                merged["traceEvents"].append(
                    {
                        "ph": "M",
                        "name": "process_name",
                        "pid": pid,
                        "tid": 0,
                        "args": {"name": f"{label}: {orig}"},
                    }
                )
            merged["traceEvents"].append(
                {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        json.dump(merged, f)
    return out


def category(name: str) -> str:
    """A coarse kind of kernel, from its name (for the timeline's colours)."""
    n = name.lower()
    if n.startswith("triton_") or (n.startswith("_") and "::" not in n):  # Inductor's, or a @triton.jit's
        return "Triton kernel"
    if any(s in n for s in ("memset", "memcpy")):
        return "memset/memcpy"
    if any(s in n for s in ("flash", "fmha", "efficient_attention", "attention")):
        return "fused attention"
    if any(s in n for s in ("gemm", "xmma", "cutlass", "cublas", "matmul", "aten::mm", "aten::bmm", "nvjet")):
        return "matmul"
    if "softmax" in n:
        return "softmax"
    if "reduce" in n or "aten::sum" in n:
        return "reduction"
    if any(
        s in n
        for s in (
            "elementwise",
            "vectorized",
            "where",
            "relu",
            "threshold",
            "mul",
            "fill",
            "copy",
            "masked",
            "aten::",
        )
    ):
        return "elementwise"
    return "other"


_COLORS = {
    "matmul": "tab:blue",
    "softmax": "tab:red",
    "fused attention": "tab:purple",
    "elementwise": "tab:orange",
    "reduction": "tab:green",
    "memset/memcpy": "tab:gray",
    "Triton kernel": "tab:brown",
    "other": "tab:olive",
}


def plot_timeline(subjs: list[Subject], path: Path, title: str) -> Path:
    """One row per subject, its kernels as bars (time from its first kernel); skipped subjects say why."""
    from .plots import _plt, _save

    plt = _plt()
    fig, ax = plt.subplots(figsize=(12, 0.9 * len(subjs) + 1.4))
    seen = set()
    for row, s in enumerate(subjs):
        y = len(subjs) - 1 - row
        if not s.kernels:
            ax.text(
                0,
                y,
                f"  not profiled: {s.reason or 'no kernels recorded'}",
                va="center",
                fontsize=7,
                color="dimgray",
            )
            continue
        for kk in s.kernels:
            cat = category(kk.name)
            ax.broken_barh(
                [(kk.start_us / 1e3, max(kk.dur_us, 0.5) / 1e3)],
                (y - 0.35, 0.7),
                facecolors=_COLORS[cat],
                label=None if cat in seen else cat,
            )
            seen.add(cat)
        bwd = [kk.start_us for kk in s.kernels if kk.phase == "bwd"]
        if bwd:
            ax.plot([min(bwd) / 1e3] * 2, [y - 0.45, y + 0.45], color="black", linewidth=0.8)
    ax.set_ylim(-0.6, len(subjs) - 0.4)
    ax.set_yticks(range(len(subjs)))
    ax.set_yticklabels([s.label for s in reversed(subjs)])
    ax.set_xlabel("ms from the implementation's first kernel (black tick: backward starts)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    if seen:
        ax.legend(fontsize=7, loc="lower right")
    return _save(fig, plt, path)


_NOISE = ("void ", "at::native::", "(anonymous namespace)::", "c10::", "std::", "at::")


def short_name(name: str, width: int = 90) -> str:
    """A kernel name without the namespace noise, cut to ``width`` characters."""
    for junk in _NOISE:
        name = name.replace(junk, "")
    return name if len(name) <= width else name[: width - 3] + "..."


def kernel_table(s: Subject, top: int = 12) -> str:
    agg: dict = defaultdict(lambda: [0, 0.0, set()])
    for kk in s.kernels:
        a = agg[kk.name]
        a[0] += 1
        a[1] += kk.dur_us
        a[2].add(kk.phase)
    total = sum(a[1] for a in agg.values()) or 1.0
    rows = []
    for name, (calls, us, phases) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
        short = short_name(name)
        rows.append(
            [
                short,
                "+".join(p for p in ("fwd", "bwd") if p in phases),
                str(calls),
                f"{us:.1f}",
                f"{100 * us / total:.0f}%",
            ]
        )
    return markdown_table(["kernel", "phase", "calls", "total µs", "share"], rows, left=2)


@dataclass
class ProfileResult:
    markdown: str
    trace: Path | None
    timeline: Path | None
    subjects: list[Subject]


def profile_attention(
    device: str = "cpu",
    shape=None,
    dtype: torch.dtype | None = None,
    causal: bool = False,
    out_dir: str | Path = ".",
    trace_name: str = "profile_trace.json",
    timeline_name: str = "profile_timeline.png",
) -> ProfileResult:
    """Profile the attention subjects on ``device``; writes the trace and the timeline into ``out_dir``."""
    devtype = torch.device(device).type
    if devtype == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch sees no CUDA device")
    shape = tuple(shape or DEFAULT_SHAPE[devtype])
    if len(shape) != 4:
        raise ValueError(f"shape must be B x H x L x D (4 dims), got {shape_str(shape)}")
    dtype = dtype or DEFAULT_DTYPE[devtype]
    out_dir = Path(out_dir)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
        for _ in range(3)
    )
    dy = torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    subjs = subjects(device, dtype)
    parts = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, s in enumerate(subjs):
            if s.reason is not None:
                continue
            path = Path(tmp) / f"{i}.json"
            try:
                profile_one(s, q, k, v, dy, causal, device, path)
                parts.append((s.label, path))
            except Exception as exc:  # e.g. out of memory, or a kernel module not there yet
                s.reason = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
                s.kernels = []
                with contextlib.suppress(Exception):
                    if devtype == "cuda":
                        torch.cuda.empty_cache()
        trace = merge_traces(parts, out_dir / trace_name) if parts else None
    title = (
        f"attention fwd+bwd on {devtype} ({_device_name(device)}), {shape_str(shape)} "
        f"{dtype_str(dtype)}{' causal' if causal else ''}"
    )
    timeline = plot_timeline(subjs, out_dir / timeline_name, title)
    md = [
        f"## profile: {title}",
        "",
        "Kernels launched by one forward + backward of each implementation (after two warm-up steps). "
        + ("GPU kernels from CUPTI." if devtype == "cuda" else "On the CPU: aten ops with their self time."),
        "",
    ]
    summary = []
    for s in subjs:
        if s.kernels:
            f_us = sum(kk.dur_us for kk in s.kernels if kk.phase == "fwd")
            b_us = sum(kk.dur_us for kk in s.kernels if kk.phase == "bwd")
            summary.append([s.label, str(len(s.kernels)), f"{f_us / 1e3:.3f}", f"{b_us / 1e3:.3f}", ""])
        else:
            summary.append([s.label, "", "", "", s.reason or "no kernels recorded"])
    md.append(
        markdown_table(["impl", "kernels", "fwd ms (sum)", "bwd ms (sum)", "not profiled because"], summary)
    )
    for s in subjs:
        if not s.kernels:
            continue
        md += [
            "",
            f"### {s.label}: {s.description}",
            "",
            kernel_table(s),
            "",
            "<details><summary>torch.profiler table</summary>",
            "",
            "```",
            s.torch_table.rstrip(),
            "```",
            "",
            "</details>",
        ]
    if trace:
        md += ["", f"Chrome trace: `{trace.name}` (https://ui.perfetto.dev); timeline: `{timeline.name}`."]
    return ProfileResult("\n".join(md) + "\n", trace, timeline, subjs)


def _device_name(device) -> str:
    from .schema import device_name

    return device_name(device)
