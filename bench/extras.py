"""Three measurements the issues ask for, every figure from one run (about a minute on an H200).

    PYTHONUNBUFFERED=1 python bench/extras.py OUT [--quick] [--seed PATH] [--budget-s 120]

1. ``overhead``: the autograd wrapper against the raw launchers ("the autograd wrapper costs <= 5% over
   calling the kernels directly"). ``crossfuse.relu_attention`` on inputs that require grad against
   ``relu_attention_fwd`` / ``relu_attention_bwd`` on the same tensors, forward and forward+backward,
   bf16, [B, H, L, D]; each call timed twice: ``triton.testing.do_bench`` (median; includes the CPU's
   launch cost when the CPU is the bottleneck, like the seed's ``%timeit``) and the harness's
   ``time_cuda`` (p50; GPU time only, the enqueue hidden behind a GPU spin).
2. ``heads``: TFLOP/s of ``crossfuse.relu_attention`` (forward, and forward+backward through autograd)
   at H=16 against H=64, B=4, L=4096, D in {64, 128}, bf16, and float32 at D=64 (the seed's "slow with
   many heads" was float32). FLOPs: 4*B*H*L^2*D forward, halved when causal; forward+backward 3.5x.
3. ``seed``: float32 against the seed notebook's Triton kernels, in the seed's layout [B, L, H, D]
   (our ``layout="blhd"``), B=4, H=16, D=64, L in {1024, 2048, 4096}, causal or not: forward TFLOP/s of
   the seed's ``relu_attn`` against ``crossfuse.relu_attention``, backward TFLOP/s (2.5x the forward's
   FLOPs) of the seed's ``relu_attn_bwd`` against our raw ``relu_attention_bwd``, and the relative
   errors of both (output and each gradient) against a float64 torch reference and against each other.
   The seed is not part of the project: its four definitions are read from the notebook file at run
   time (``--seed``; default ``.cache/seeds/relu_attention_notebook.py`` in the repository root, then
   ``../shared/seeds/relu_attention_notebook.py``) and nothing else of it is executed. No file: the seed's
   figures are recorded as skipped, with the reason.

Each section has a deadline (its share of ``--budget-s``, time left over goes to the next): a case not
started by then becomes a ``skipped: budget`` row. Writes OUT/extras.csv (one row per figure, appended
as measured, so a killed run keeps what it measured) and OUT/extras.md (the tables). Needs no
installation: it imports crossfuse from this checkout's ``python/``. Without a CUDA device (or with
``--quick``) it runs tiny shapes (on the CPU under Triton's interpreter when there is no GPU): a check
of this script, not a measurement.
"""

from __future__ import annotations

import argparse
import ast
import csv
import datetime
import gc
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
os.environ.setdefault("PYTHONUNBUFFERED", "1")

from crossfuse import _backend  # noqa: E402

_backend.enable_interpreter_if_no_gpu()  # before anything imports triton

import crossfuse  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.testing  # noqa: E402
from crossfuse import registry  # noqa: E402
from crossfuse._validate import dtype_name  # noqa: E402
from crossfuse.harness import timing  # noqa: E402
from crossfuse.harness.report import markdown_table  # noqa: E402
from crossfuse.harness.schema import versions  # noqa: E402
from crossfuse.ops import relu_attention as attn  # noqa: E402
from crossfuse.reference import relu_attention_ref  # noqa: E402
from crossfuse.tolerances import relerr, tolerance  # noqa: E402

T0 = time.monotonic()
BF16, F32 = torch.bfloat16, torch.float32

SEED_FILE = "relu_attention_notebook.py"
SEED_SEARCH = (ROOT / ".cache" / "seeds" / SEED_FILE, ROOT.parent / "shared" / "seeds" / SEED_FILE)
SEED_DEFS = ("relu_attn_", "relu_attn", "relu_attn_bwd_", "relu_attn_bwd")

# (section, share of the budget): a section's deadline is the start plus the budget times the shares up
# to and including it. The seed section compiles the most kernels (the seed's take every shape as a
# constexpr), hence its larger share.
SECTIONS = (("overhead", 0.30), ("heads", 0.30), ("seed", 0.40))
REPORT_S = 3.0  # kept back for the report
DO_BENCH = dict(warmup=10, rep=40)  # ms
GPU_TIMING = timing.TimingConfig(cuda_warmup_ms=5.0, cuda_rep_ms=25.0, cuda_min_reps=10, cuda_max_reps=100)
REF_CHUNK_BYTES = 1 << 30  # the float64 reference's L x L scores, per chunk of (batch, head) pairs
ROUNDS = 3  # overhead: alternations of autograd and raw per timer
OVERHEAD_LIMIT = 1.05  # the criterion: autograd / raw <= 1.05

CSV_FIELDS = ("section", "case", "dtype", "causal", "mode", "impl", "method", "metric", "value", "unit",
              "limit", "status", "note")  # fmt: skip


@dataclass(frozen=True)
class Shapes:
    """What each section runs: the full set on a GPU, tiny ones for ``--quick`` or the interpreter."""

    overhead: tuple[tuple[int, int, int, int, tuple[bool, ...]], ...]  # (B, H, L, D, causal values)
    heads_bl: tuple[int, int]  # (B, L)
    heads_h: tuple[int, int]  # (few heads, many heads)
    heads_d: dict  # dtype -> head dims
    seed_bhd: tuple[int, int, int]
    seed_l: tuple[int, ...]


FULL = Shapes(
    overhead=(
        (16, 32, 1024, 64, (False, True)),
        (4, 16, 4096, 128, (False, True)),
        (1, 8, 1024, 64, (False,)),
    ),
    heads_bl=(4, 4096),
    heads_h=(16, 64),
    heads_d={BF16: (64, 128), F32: (64,)},
    seed_bhd=(4, 16, 64),
    seed_l=(1024, 2048, 4096),
)
QUICK = Shapes(
    overhead=((1, 2, 64, 16, (False, True)), (1, 1, 32, 16, (False,))),
    heads_bl=(1, 64),
    heads_h=(2, 4),
    heads_d={BF16: (16,), F32: (16,)},
    seed_bhd=(1, 2, 16),
    seed_l=(64, 128),
)


def log(msg: str) -> None:
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    print(f"[{time.monotonic() - T0:6.1f} s {stamp}] {msg}", flush=True)


def attention_flops(b: int, h: int, length: int, d: int, causal: bool) -> float:
    """Forward FLOPs as the harness counts them (``crossfuse.registry.flops``)."""
    return registry.flops("relu_attention", (b, h, length, d), "fwd", causal)


# ----------------------------------------------------------------------------------------------------
# Bookkeeping: rows, timers, deadlines
# ----------------------------------------------------------------------------------------------------


class Recorder:
    """Rows of the long-format CSV, written (and flushed) as they come and kept for the report."""

    def __init__(self, path: Path):
        self.rows: list[dict] = []
        self._file = path.open("w", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=CSV_FIELDS)
        self._writer.writeheader()
        self._file.flush()

    def add(self, section: str, case: str, **fields) -> dict:
        row = {k: "" for k in CSV_FIELDS} | dict(section=section, case=case, status="ok") | fields
        self.rows.append(row)
        self._writer.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()})
        self._file.flush()
        return row

    def close(self) -> None:
        self._file.close()

    def find(self, **match) -> dict | None:
        """The last row whose fields equal ``match``."""
        for row in reversed(self.rows):
            if all(row.get(k) == v for k, v in match.items()):
                return row
        return None


class Context:
    """The device, the shapes, the timers and the section deadline shared by the sections."""

    def __init__(self, rec: Recorder, device: str, shapes: Shapes):
        self.rec, self.device, self.shapes = rec, device, shapes
        self.deadline = math.inf
        self.cuda = device == "cuda"
        # method name -> timer (a callable returning milliseconds); the first is the "wall" method
        if self.cuda:
            self.timers: dict[str, Callable[[Callable], float]] = {
                "do_bench": lambda fn: triton.testing.do_bench(fn, **DO_BENCH, return_mode="median"),
                "time_cuda": lambda fn: timing.time_cuda(fn, device, GPU_TIMING).p50,
            }
        else:
            self.timers = {"perf_counter": lambda fn: timing.time_cpu(fn, timing.QUICK).p50}
        self.gpu_method = "time_cuda" if self.cuda else "perf_counter"
        self.seed_path: Path | None = None  # set by the seed section, for the report
        self.profile = ""  # the overhead section's CPU profile of the smallest shape, for the report

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, fn: Callable[[], object], method: str) -> float:
        """Milliseconds of ``fn()`` by ``method``, after one untimed call (compilation)."""
        fn()
        self.sync()
        return float(self.timers[method](fn))

    def randn(self, shape, dtype, gen: torch.Generator) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=self.device, dtype=torch.float32).to(dtype)

    def generator(self, seed: int = 0) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(seed)

    def run_case(self, section: str, case: str, body: Callable[[], None], **fields) -> None:
        """Run one case: a ``skipped: budget`` row after the deadline, an ``error`` row if it raises."""
        if time.monotonic() > self.deadline:
            self.rec.add(section, case, status="skipped: budget", note="section deadline passed", **fields)
            log(f"[{section}] {case}: skipped (budget)")
            return
        try:
            body()
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # one broken case must not cost the others their time
            msg = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
            self.rec.add(section, case, status="error", note=msg, **fields)
            log(f"[{section}] {case}: ERROR {msg}\n{traceback.format_exc()}")
        finally:
            gc.collect()
            if self.cuda:
                torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------------
# 1. Autograd wrapper overhead
# ----------------------------------------------------------------------------------------------------


def overhead_section(ctx: Context) -> None:
    for B, H, L, D, causals in ctx.shapes.overhead:
        for causal in causals:
            case = f"B={B} H={H} L={L} D={D}"
            ctx.run_case("overhead", case, lambda a=(B, H, L, D, causal): overhead_case(ctx, *a),
                         dtype="bfloat16", causal=causal)  # fmt: skip


def overhead_case(ctx: Context, B: int, H: int, L: int, D: int, causal: bool) -> None:
    case = f"B={B} H={H} L={L} D={D}"
    gen = ctx.generator()
    q, k, v, do = (ctx.randn((B, H, L, D), BF16, gen) for _ in range(4))
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))  # same storage as q, k, v
    scale, relu_scale = 1.0 / math.sqrt(D), 1.0 / L

    def autograd_fwd():
        return crossfuse.relu_attention(qg, kg, vg, causal=causal)

    def raw_fwd():
        return attn.relu_attention_fwd(q, k, v, causal, False, scale, relu_scale)

    def autograd_fwd_bwd():
        out = crossfuse.relu_attention(qg, kg, vg, causal=causal)
        return torch.autograd.grad(out, (qg, kg, vg), do)

    def raw_fwd_bwd():
        raw_fwd()
        return attn.relu_attention_bwd(q, k, v, do, causal, False, scale, relu_scale)

    common = dict(dtype="bfloat16", causal=causal)
    for mode, calls in (("fwd", (autograd_fwd, raw_fwd)), ("fwd+bwd", (autograd_fwd_bwd, raw_fwd_bwd))):
        for method in ctx.timers:
            # the two alternate, ROUNDS times each, and each keeps its median: a drift of the GPU's clock
            # during the section then shifts both alike instead of favouring whichever ran first
            runs: dict[str, list[float]] = {"autograd": [], "raw": []}
            for _ in range(ROUNDS if ctx.cuda else 1):
                for impl, fn in zip(("autograd", "raw"), calls, strict=True):
                    runs[impl].append(ctx.time(fn, method))
            ms = {impl: statistics.median(t) for impl, t in runs.items()}
            for impl in ms:
                ctx.rec.add("overhead", case, mode=mode, impl=impl, method=method, metric="time",
                            value=ms[impl], unit="ms", **common)  # fmt: skip
            ratio = ms["autograd"] / ms["raw"]
            status = "ok" if ratio <= OVERHEAD_LIMIT else "over"
            ctx.rec.add("overhead", case, mode=mode, impl="autograd/raw", method=method, metric="ratio",
                        value=ratio, limit=OVERHEAD_LIMIT, status=status, **common)  # fmt: skip
            log(f"[overhead] {case} causal={causal} {mode} {method}: autograd {ms['autograd']:.4g} ms, "
                f"raw {ms['raw']:.4g} ms, ratio {ratio:.3f}")  # fmt: skip
    if ctx.cuda and B * H * L <= 8192 and not ctx.profile:  # the smallest shape: where the CPU time goes
        ctx.profile = cpu_profile(autograd_fwd_bwd, raw_fwd_bwd, ctx)


def cpu_profile(autograd_fn, raw_fn, ctx: Context, calls: int = 200) -> str:
    """cProfile of ``calls`` synchronised calls of each: the functions with the most own time."""
    import cProfile
    import io
    import pstats

    parts = []
    for name, fn in (("autograd fwd+bwd", autograd_fn), ("raw fwd+bwd", raw_fn)):
        fn()
        ctx.sync()
        prof = cProfile.Profile()
        t = time.perf_counter()
        prof.enable()
        for _ in range(calls):
            fn()
        prof.disable()
        ctx.sync()
        per_call = (time.perf_counter() - t) / calls * 1e6
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
        text = "\n".join(line for line in buf.getvalue().splitlines() if line.strip())
        parts.append(f"{name}: {per_call:.0f} µs per call under cProfile ({calls} calls)\n{text}")
    return "\n\n".join(parts)


# ----------------------------------------------------------------------------------------------------
# 2. Throughput against the number of heads
# ----------------------------------------------------------------------------------------------------


def heads_section(ctx: Context) -> None:
    for dtype, dims in ctx.shapes.heads_d.items():
        for D in dims:
            for causal in (False, True):
                ctx.run_case("heads", f"D={D}", lambda a=(dtype, D, causal): heads_case(ctx, *a),
                             dtype=dtype_name(dtype), causal=causal)  # fmt: skip


def heads_case(ctx: Context, dtype: torch.dtype, D: int, causal: bool) -> None:
    """Both head counts (and their ratio) for one dtype, head dim and mask."""
    B, L = ctx.shapes.heads_bl
    case = f"D={D}"
    common = dict(dtype=dtype_name(dtype), causal=causal, method=ctx.gpu_method)
    tflops: dict[tuple[str, int], float] = {}
    for H in ctx.shapes.heads_h:
        gen = ctx.generator()
        q, k, v, do = (ctx.randn((B, H, L, D), dtype, gen) for _ in range(4))
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))

        def fwd(q=q, k=k, v=v):
            return crossfuse.relu_attention(q, k, v, causal=causal)

        def fwd_bwd(q=q, k=k, v=v, do=do):
            return torch.autograd.grad(crossfuse.relu_attention(q, k, v, causal=causal), (q, k, v), do)

        flops = attention_flops(B, H, L, D, causal)
        for mode, fn, f in (("fwd", fwd, flops), ("fwd+bwd", fwd_bwd, 3.5 * flops)):
            ms = ctx.time(fn, ctx.gpu_method)
            tflops[mode, H] = f / ms / 1e9
            impl = f"H={H}"
            ctx.rec.add("heads", case, mode=mode, impl=impl, metric="time", value=ms, unit="ms", **common)
            ctx.rec.add("heads", case, mode=mode, impl=impl, metric="throughput", value=tflops[mode, H],
                        unit="TFLOP/s", note=f"B={B} L={L}", **common)  # fmt: skip
            log(f"[heads] {common['dtype']} D={D} causal={causal} H={H} {mode}: {ms:.4g} ms, "
                f"{tflops[mode, H]:.4g} TFLOP/s")  # fmt: skip
        del q, k, v, do
    few, many = ctx.shapes.heads_h
    for mode in ("fwd", "fwd+bwd"):
        ratio = tflops[mode, many] / tflops[mode, few]
        ctx.rec.add("heads", case, mode=mode, impl=f"H={many}/H={few}", metric="ratio", value=ratio, **common)
        log(f"[heads] {common['dtype']} D={D} causal={causal} {mode}: H={many}/H={few} = {ratio:.3f}")


# ----------------------------------------------------------------------------------------------------
# 3. float32 against the seed's kernels
# ----------------------------------------------------------------------------------------------------


def find_seed(arg: str | None) -> tuple[Path | None, str]:
    """The notebook's path, or ``None`` and why not."""
    candidates = (Path(arg),) if arg else SEED_SEARCH
    for p in candidates:
        if p.is_file():
            return p, ""
    return None, "seed notebook not found (looked for " + ", ".join(str(p) for p in candidates) + ")"


def load_seed(path: Path) -> dict:
    """The seed notebook's four kernel definitions, executed from the file itself.

    The notebook holds IPython lines (``%timeit``, ``!shell``) and top-level test code that runs on
    cuda: lines starting with ``%`` or ``!`` are blanked (line numbers kept, so that ``triton.jit`` finds
    each kernel's source in the file), the rest is parsed, and only the top-level imports and the
    function definitions named in ``SEED_DEFS`` are executed, in a namespace of their own.
    """
    text = path.read_text()
    lines = ["" if ln.lstrip().startswith(("%", "!")) else ln for ln in text.splitlines()]
    tree = ast.parse("\n".join(lines), filename=str(path))
    keep = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in SEED_DEFS]
    missing = sorted(set(SEED_DEFS) - {n.name for n in defs})
    if missing:
        raise LookupError(f"{path} lacks the definitions {missing}")
    ns = {"__name__": "seed_notebook", "torch": torch, "np": np, "triton": triton, "tl": tl}
    exec(compile(ast.Module(body=keep + defs, type_ignores=[]), str(path), "exec"), ns)
    return ns


def reference(q, k, v, do, causal: bool) -> tuple[torch.Tensor, ...]:
    """float64 ``(out, dq, dk, dv)`` of ``relu_attention_ref`` on [B, H, L, D] views, in chunks of
    (batch, head) pairs so that no chunk's L x L scores exceed ``REF_CHUNK_BYTES``."""
    B, H, L, D = q.shape
    flat = [t.reshape(B * H, L, D) for t in (q, k, v, do)]
    step = max(1, REF_CHUNK_BYTES // (L * L * 8))
    parts: list[list[torch.Tensor]] = [[], [], [], []]
    for i in range(0, B * H, step):
        qc, kc, vc = (t[i : i + step].double().requires_grad_(True) for t in flat[:3])
        with torch.enable_grad():
            out = relu_attention_ref(qc, kc, vc, causal=causal)
            grads = torch.autograd.grad(out, (qc, kc, vc), flat[3][i : i + step].double())
        for acc, t in zip(parts, (out.detach(), *grads), strict=True):
            acc.append(t)
    return tuple(torch.cat(p).view(B, H, L, D) for p in parts)


class Seed:
    """The seed's kernels once loaded, or why they are not available."""

    def __init__(self, arg: str | None):
        self.ns: dict | None = None
        self.status = "skipped"  # of the seed's rows when ns is None
        path, self.reason = find_seed(arg)
        self.path = path
        if path is None:
            log(f"[seed] {self.reason}")
            return
        try:
            self.ns = load_seed(path)
            log(f"[seed] loaded {', '.join(SEED_DEFS)} from {path}")
        except Exception as exc:
            self.reason = f"could not load the seed from {path}: {type(exc).__name__}: {exc}"
            self.status = "error"
            log(f"[seed] {self.reason}")

    def fail(self, ctx: Context, exc: Exception) -> None:
        """The seed's kernel raised: under the interpreter a skip (it was written for the GPU), on the
        GPU an error."""
        where = "under the Triton interpreter" if not ctx.cuda else "on the GPU"
        self.status = "error" if ctx.cuda else "skipped"
        msg = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:250]
        self.reason = f"the seed's kernel fails {where}: {msg}"
        self.ns = None
        log(f"[seed] {self.reason}")


def seed_section(ctx: Context, seed_arg: str | None) -> None:
    seed = Seed(seed_arg)
    ctx.seed_path = seed.path
    B, H, D = ctx.shapes.seed_bhd
    for L in ctx.shapes.seed_l:
        for causal in (True, False):  # the seed's default first
            ctx.run_case("seed", f"B={B} H={H} L={L} D={D}", lambda a=(L, causal): seed_case(ctx, seed, *a),
                         dtype="float32", causal=causal)  # fmt: skip


def seed_case(ctx: Context, seed: Seed, L: int, causal: bool) -> None:
    B, H, D = ctx.shapes.seed_bhd
    case = f"B={B} H={H} L={L} D={D}"
    common = dict(dtype="float32", causal=causal)
    gen = ctx.generator()
    q, k, v, do = (ctx.randn((B, L, H, D), F32, gen) for _ in range(4))  # the seed's [B, L, H, D]
    qb, kb, vb, dob = (t.transpose(1, 2) for t in (q, k, v, do))  # [B, H, L, D] views, no copies
    scale, relu_scale = 1.0 / math.sqrt(D), 1.0 / L  # the seed's sm_scale and relu_scale

    def ours_fwd():
        return crossfuse.relu_attention(q, k, v, causal=causal, layout="blhd")

    def ours_bwd():  # outputs in [B, L, H, D] like the seed's (allocated per call, like the seed's)
        grads = [torch.empty_like(t).transpose(1, 2) for t in (q, k, v)]
        return attn.relu_attention_bwd(qb, kb, vb, dob, causal, False, scale, relu_scale, *grads)

    def seed_fwd():
        return seed.ns["relu_attn"](q, k, v, is_causal=causal, is_squared=False)

    def seed_bwd():
        return seed.ns["relu_attn_bwd"](q, k, v, do, is_causal=causal, is_squared=False)

    results: dict[str, tuple] = {"ours": (ours_fwd(), ours_bwd())}
    if seed.ns is not None:
        try:
            results["seed"] = (seed_fwd(), seed_bwd())
            ctx.sync()
        except Exception as exc:
            seed.fail(ctx, exc)
    flops = attention_flops(B, H, L, D, causal)
    ms: dict[tuple[str, str], float] = {}
    for mode, f in (("fwd", flops), ("bwd", 2.5 * flops)):
        for impl, fn in (("seed", seed_fwd if mode == "fwd" else seed_bwd),
                         ("ours", ours_fwd if mode == "fwd" else ours_bwd)):  # fmt: skip
            if impl not in results:
                ctx.rec.add(
                    "seed", case, mode=mode, impl=impl, status=seed.status, note=seed.reason, **common
                )
                continue
            ms[mode, impl] = t = ctx.time(fn, ctx.gpu_method)
            kw = dict(mode=mode, impl=impl, method=ctx.gpu_method, **common)
            ctx.rec.add("seed", case, metric="time", value=t, unit="ms", **kw)
            ctx.rec.add("seed", case, metric="throughput", value=f / t / 1e9, unit="TFLOP/s", **kw)
            log(f"[seed] {case} causal={causal} {mode} {impl}: {t:.4g} ms, {f / t / 1e9:.4g} TFLOP/s")
        if (mode, "seed") in ms:
            ratio = ms[mode, "seed"] / ms[mode, "ours"]
            ctx.rec.add("seed", case, mode=mode, impl="ours/seed", method=ctx.gpu_method, metric="ratio",
                        value=ratio, note="throughput ratio (seed time / our time)", **common)  # fmt: skip
            log(f"[seed] {case} causal={causal} {mode}: ours/seed = {ratio:.3f}")
    # accuracy: the same inputs through the float64 reference
    ref = reference(qb, kb, vb, dob, causal)
    tf32 = ctx.cuda  # both float32 paths use tf32 tensor cores on GPUs (Triton's default for float32 dots)
    precision = "tf32" if tf32 else "float32"
    # everything as [B, H, L, D] views: ours returns the gradients as such (views of [B, L, H, D] buffers)
    got = {"ours": (results["ours"][0].transpose(1, 2), *results["ours"][1])}
    if "seed" in results:
        got["seed"] = tuple(t.transpose(1, 2) for t in (results["seed"][0], *results["seed"][1]))
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        tol = tolerance("relu_attention", F32, "fwd" if name == "out" else "bwd", tf32=tf32)
        pairs = [(f"{impl} vs float64", got[impl][i], ref[i], tol) for impl in got]
        if "seed" in got:  # each within tol of the reference: within 2 tol of each other
            pairs.append(("ours vs seed", got["ours"][i], got["seed"][i], 2 * tol))
        said = []
        for label, a, b, limit in pairs:
            err = relerr(a, b)
            ok = err <= limit
            ctx.rec.add("seed", case, mode=name, impl=label, metric="relerr", value=err, limit=limit,
                        status="ok" if ok else "FAIL", note=precision, **common)  # fmt: skip
            said.append(f"{label} {err:.3g}{'' if ok else f' FAIL (limit {limit:.3g})'}")
        log(f"[seed] {case} causal={causal} {name} relerr: {', '.join(said)}")


# ----------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------


def fmt(x, digits: int = 4) -> str:
    if x is None or x == "":
        return "—"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"
    return str(x)


def fmt_ratio(x) -> str:
    return "—" if x is None or x == "" else f"{x:.3f}"


def problems(rec: Recorder, section: str) -> str:
    """A section's skipped cases and errors, one line per (status, reason), with the cases it hit."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r in rec.rows:
        if r["section"] == section and r["status"] not in ("ok", "over", "FAIL"):
            parts = (r["dtype"], r["case"], f"causal={r['causal']}", r["mode"], r["impl"])
            what = " ".join(str(x) for x in parts if x)
            groups.setdefault((r["status"], r["note"]), []).append(what)
    out = [f"* **{status}**: {note} ({len(cases)}×: {'; '.join(cases[:4])}{'; …' if len(cases) > 4 else ''})"
           for (status, note), cases in groups.items()]  # fmt: skip
    return ("\n" + "\n".join(out) + "\n") if out else ""


def value(rec: Recorder, **match):
    row = rec.find(**match)
    return None if row is None or row["value"] == "" else row["value"]


def overhead_report(ctx: Context) -> str:
    rec, methods = ctx.rec, list(ctx.timers)
    header = ["shape (bf16, bhld)", "causal", "mode"]
    for m in methods:
        header += [f"{m} autograd ms", f"{m} raw ms", f"{m} autograd/raw"]
    header.append(f"≤ {OVERHEAD_LIMIT} ({' / '.join(methods)})")
    body = []
    for B, H, L, D, causals in ctx.shapes.overhead:
        case = f"B={B} H={H} L={L} D={D}"
        for causal in causals:
            for mode in ("fwd", "fwd+bwd"):
                row = [case, "yes" if causal else "no", mode]
                verdict = []
                for m in methods:
                    key = dict(section="overhead", case=case, causal=causal, mode=mode, method=m)
                    ratio = value(rec, impl="autograd/raw", **key)
                    row += [fmt(value(rec, impl="autograd", **key)), fmt(value(rec, impl="raw", **key)),
                            fmt_ratio(ratio)]  # fmt: skip
                    verdict.append("—" if ratio is None else ("yes" if ratio <= OVERHEAD_LIMIT else "no"))
                body.append([*row, " / ".join(verdict)])
    wall = methods[0]
    return (
        "## 1. Autograd wrapper overhead\n\n"
        "`crossfuse.relu_attention` (the `autograd.Function`; q, k, v require grad, so the forward builds "
        "the graph) against the raw launchers `relu_attention_fwd` / `relu_attention_bwd` on the same "
        "tensors (scale = 1/sqrt(D), relu_scale = 1/L). fwd+bwd: `out = relu_attention(q, k, v); "
        "torch.autograd.grad(out, (q, k, v), do)` against the raw forward then the raw backward. "
        + (f"`{wall}` = `triton.testing.do_bench(fn, warmup={DO_BENCH['warmup']}, rep={DO_BENCH['rep']}, "
           "return_mode='median')`: CUDA events around each call after an L2 flush; the CPU's "
           "enqueue time shows when the CPU is the bottleneck (like the seed's `%timeit`). `time_cuda` = "
           "the harness's timer (p50): the enqueue hidden behind a GPU spin, so GPU time only. "
           if ctx.cuda else "`perf_counter` = the harness's CPU timer (p50): no GPU, not a measurement. ")
        + "The issue's criterion: autograd/raw ≤ 1.05.\n\n" + markdown_table(header, body, left=3) + "\n"
        + problems(rec, "overhead")
    )  # fmt: skip


def heads_report(ctx: Context) -> str:
    rec = ctx.rec
    few, many = ctx.shapes.heads_h
    B, L = ctx.shapes.heads_bl
    header = ["dtype", "D", "causal", "mode", f"H={few} ms", f"H={few} TFLOP/s", f"H={many} ms",
              f"H={many} TFLOP/s", f"H={many}/H={few}"]  # fmt: skip
    body = []
    for dtype, dims in ctx.shapes.heads_d.items():
        for D in dims:
            for causal in (False, True):
                for mode in ("fwd", "fwd+bwd"):
                    key = dict(
                        section="heads", case=f"D={D}", dtype=dtype_name(dtype), causal=causal, mode=mode
                    )
                    row = [dtype_name(dtype), str(D), "yes" if causal else "no", mode]
                    for H in (few, many):
                        row += [fmt(value(rec, impl=f"H={H}", metric="time", **key)),
                                fmt(value(rec, impl=f"H={H}", metric="throughput", **key))]  # fmt: skip
                    row.append(fmt_ratio(value(rec, impl=f"H={many}/H={few}", **key)))
                    body.append(row)
    return (
        f"## 2. Throughput against the number of heads\n\n`crossfuse.relu_attention`, B={B}, L={L} "
        f"(fixed), [B, H, L, D]; fwd+bwd through autograd (`torch.autograd.grad`). FLOPs: 4·B·H·L²·D "
        f"forward, halved when causal; fwd+bwd 3.5× that. Timer: `{ctx.gpu_method}` (p50). float32 runs "
        f"on tf32 tensor cores on GPUs. A ratio near 1 means no per-head slowdown (H={many} does "
        f"{many // few}× the work of H={few}).\n\n" + markdown_table(header, body, left=4) + "\n"
        + problems(rec, "heads")
    )  # fmt: skip


SEED_NOTES = """Reading the seed's kernels (conventions, compared like with like):

* Both compute `out = (1/L) · relu(mask(q kᵀ / sqrt(D))) @ v` with the causal mask keeping keys ≤ the
  query; the seed folds `1/sqrt(D)` into q before the first dot and (backward) `1/L` into v, crossfuse
  scales the float32 accumulators: algebraically the same. Both run float32 dots on tf32 on GPUs.
* The seed's `relu_attn_bwd(q, k, v, do, is_causal=True, is_squared=False)` returns `(dq, dk, dv)` in
  the inputs' layout [B, L, H, D] and dtype, computed by one kernel (a program accumulates dk and dv of
  its key block over the query blocks, then dq of its query block over the key blocks); crossfuse's
  backward is two kernels (dK/dV, dQ). Ours is given [B, L, H, D] outputs too (transposed views).
* relu′(0): the seed's mask is `score >= 0` (derivative 1 at 0), crossfuse's `score > 0` (0, torch's
  convention): they differ only where a score is exactly 0 (none with random inputs; masked scores are
  zeroed by the causal mask in both).
* The seed's squared backward lacks the factor 2 of d(a²)/da: not compared (squared=False here).
* The seed needs contiguous [B, L, H, D], L a multiple of its block (min(L, 64)), and takes B, H, L, D and
  both scales as constexpr (a compilation per shape): the first call of each shape is untimed.
* The seed's kernel reads the scales from L and D; ours is called with scale = 1/sqrt(D), relu_scale =
  1/L explicitly. The causal default is True in the seed, False in crossfuse: both are passed explicitly.
"""


def seed_report(ctx: Context) -> str:
    rec = ctx.rec
    B, H, D = ctx.shapes.seed_bhd
    speed, acc = [], []
    for L in ctx.shapes.seed_l:
        case = f"B={B} H={H} L={L} D={D}"
        for causal in (True, False):
            key = dict(section="seed", case=case, causal=causal)
            for mode in ("fwd", "bwd"):
                row = [str(L), "yes" if causal else "no", mode]
                for impl in ("seed", "ours"):
                    row += [fmt(value(rec, mode=mode, impl=impl, metric="time", **key)),
                            fmt(value(rec, mode=mode, impl=impl, metric="throughput", **key))]  # fmt: skip
                row.append(fmt_ratio(value(rec, mode=mode, impl="ours/seed", **key)))
                speed.append(row)
            for name in ("out", "dq", "dk", "dv"):
                cells, limits, verdict = [], {}, []
                for label in ("ours vs float64", "seed vs float64", "ours vs seed"):
                    r = rec.find(mode=name, impl=label, metric="relerr", **key)
                    cells.append(fmt(None if r is None else r["value"], 3))
                    if r is not None:
                        limits[f"{r['limit']:.2g}"] = None  # distinct, in order
                        verdict.append(r["status"])
                acc.append([str(L), "yes" if causal else "no", name, *cells, " / ".join(limits) or "—",
                            "ok" if verdict and all(s == "ok" for s in verdict) else
                            (" / ".join(verdict) or "—")])  # fmt: skip
    tf32 = "tf32" if ctx.cuda else "float32 (interpreter: no tf32)"
    speed_header = ["L", "causal", "pass", "seed ms", "seed TFLOP/s", "ours ms", "ours TFLOP/s", "ours/seed"]
    acc_header = ["L", "causal", "tensor", "ours vs float64", "seed vs float64", "ours vs seed",
                  "limit (vs float64 / between)", "within"]  # fmt: skip
    return (
        f"## 3. float32 against the seed's kernels\n\nThe seed notebook's `relu_attn` / `relu_attn_bwd`, "
        f"loaded at run time from `{ctx.seed_path or 'n/a'}` (only those definitions; nothing of the "
        f"seed is in the project), against `crossfuse.relu_attention(..., layout='blhd')` and the raw "
        f"`relu_attention_bwd` on `.transpose(1, 2)` views. float32, [B, L, H, D] contiguous, B={B}, "
        f"H={H}, D={D}, scale = 1/sqrt(D), relu_scale = 1/L. FLOPs: 4·B·H·L²·D forward (halved when "
        f"causal), backward 2.5× that. Timer: `{ctx.gpu_method}` (p50). ours/seed = seed time / our "
        "time.\n\n" + markdown_table(speed_header, speed, left=3) + "\n\n"
        f"Relative errors `‖a − b‖ / ‖b‖` (`crossfuse.tolerances.relerr`) against torch's float64 "
        f"`relu_attention_ref` (gradients by autograd in float64) on the same inputs. Limits: "
        f"`tolerance('relu_attention', float32, tf32={ctx.cuda})` ({tf32}) against float64, twice that "
        "between the two kernels (each within the limit of the reference).\n\n"
        + markdown_table(acc_header, acc, left=3) + "\n" + problems(rec, "seed") + "\n" + SEED_NOTES
    )  # fmt: skip


def render(ctx: Context, args, elapsed: dict[str, float]) -> str:
    dev = torch.cuda.get_device_name(0) if ctx.cuda else "cpu (Triton interpreter)"
    times = ", ".join(f"{k} {v:.0f} s" for k, v in elapsed.items())
    head = (
        f"# crossfuse extras: autograd overhead, heads, the seed's kernels\n\n"
        f"Measured on {dev} on {datetime.datetime.now():%Y-%m-%d %H:%M} by `python bench/extras.py"
        f"{' --quick' if args.quick else ''}` ({versions()}); every figure from this one run "
        f"(`extras.csv`). Budget {args.budget_s:.0f} s; sections took {times}.\n"
    )
    if not ctx.cuda or args.quick:
        head += "\n**Quick / CPU run: tiny shapes, a check of the script; the figures mean nothing.**\n"
    prof = ""
    if ctx.profile:
        prof = ("\n### Where the CPU time goes at the smallest shape\n\n"
                "cProfile (own time per function) of the autograd path and of the raw launchers:\n\n"
                f"```\n{ctx.profile}\n```\n")  # fmt: skip
    return "\n".join((head, overhead_report(ctx), prof, heads_report(ctx), seed_report(ctx)))


# ----------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output folder: extras.csv and extras.md are written there")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (to check this script on a CPU)")
    ap.add_argument("--seed", default=None, help=f"the seed notebook (default: the first of "
                    f"{', '.join(str(p) for p in SEED_SEARCH)})")  # fmt: skip
    ap.add_argument("--budget-s", type=float, default=120.0, help="wall-clock budget of the whole run")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = QUICK if args.quick or device == "cpu" else FULL
    log(f"crossfuse extras -> {out}; {versions()}; interpreter={_backend.interpreter_requested()}")
    log(f"device: {torch.cuda.get_device_name(0) if device == 'cuda' else 'cpu'}; "
        f"{'quick' if shapes is QUICK else 'full'} shapes; budget {args.budget_s:.0f} s")  # fmt: skip
    rec = Recorder(out / "extras.csv")
    ctx = Context(rec, device, shapes)
    runs = {
        "overhead": lambda: overhead_section(ctx),
        "heads": lambda: heads_section(ctx),
        "seed": lambda: seed_section(ctx, args.seed),
    }
    elapsed: dict[str, float] = {}
    share = 0.0
    try:
        for name, frac in SECTIONS:
            share += frac
            ctx.deadline = T0 + (args.budget_s - REPORT_S) * share
            t = time.monotonic()
            log(f"== {name}: {ctx.deadline - t:.0f} s until its deadline")
            runs[name]()
            elapsed[name] = time.monotonic() - t
            log(f"== {name} done in {elapsed[name]:.1f} s")
    finally:
        rec.close()
        (out / "extras.md").write_text(render(ctx, args, elapsed))
    bad = [r for r in rec.rows if r["status"] in ("error", "FAIL")]
    log(f"done: {len(rec.rows)} rows, {len(bad)} errors/failures; wrote {out / 'extras.csv'}, "
        f"{out / 'extras.md'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
