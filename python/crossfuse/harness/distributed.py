"""crossfuse under ``torch.distributed``: a real model trained a few steps under DDP and FSDP2, every
``nn.LayerNorm`` swapped for ``crossfuse.nn.LayerNorm`` (:func:`crossfuse.nn.swap_layer_norms`), against
the same run with torch's LayerNorm. Run it with ``torchrun``::

    torchrun --standalone --nproc-per-node 2 -m crossfuse.harness.distributed --out results/distributed
    TRITON_INTERPRET=1 torchrun --standalone --nproc-per-node 2 -m crossfuse.harness.distributed --device cpu

(without ``torchrun`` it runs as a world of one). What one run does, per wrapper (``ddp``, ``fsdp``):

* builds the model (transformers ``GPT2LMHeadModel`` or ``BertForMaskedLM`` from a configuration, random
  weights, nothing downloaded; eval mode, so dropout is off and both runs compute one function), copies it,
  swaps the copy's LayerNorms, and wraps both the same way: DDP over float32 parameters with the forward
  under ``torch.autocast`` in the compute dtype; or FSDP2 (``fully_shard`` on each transformer block,
  then on the root) with ``MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=float32)``;
* trains both with AdamW on the same batches (each rank its own), alternating which one steps first;
  a step is zero_grad, forward, loss, backward, optimizer step;
* compares crossfuse's run with torch's: the loss averaged over ranks at every step (largest relative
  error), all gradients of the first step as one vector (relative L2 error; FSDP's shards are summed over
  ranks) and all parameters after the last step; a run whose errors pass the tolerances of
  :data:`TOLERANCES` (bfloat16 on a GPU, float32 on the CPU) exits 0, else 1;
* times each step on each rank (host clock around the step, the device synchronised on both sides) and,
  on CUDA, the allocator's peak above what was allocated before the step; medians over the steps after
  ``warmup``.

Rank 0 gathers every rank's numbers and writes ``OUT/distributed-<model>-<device>-world<W>.csv`` and
``.md``. On the CPU (gloo) the crossfuse kernels run under Triton's interpreter: its times say nothing
about speed there. Checkpoints with ``torch.distributed.checkpoint``: :mod:`.dist_checkpoint`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import dataclasses
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

IMPLS = ("torch", "crossfuse")
WRAPPERS = ("ddp", "fsdp")
MODELS = ("gpt2", "bert")

#: model sizes: ``tiny`` for the CPU (Triton's interpreter), ``small`` for a quick GPU run, ``base`` is
#: the libraries' default configuration (GPT-2 124M, BERT-base).
SIZES: dict[str, dict[str, dict]] = {
    "gpt2": {
        "tiny": dict(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32),
        "small": dict(n_layer=4, n_embd=256, n_head=4, vocab_size=8192, n_positions=1024),
        "base": {},
    },
    "bert": {
        "tiny": dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                     vocab_size=64, max_position_embeddings=32),
        "small": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024,
                      vocab_size=8192, max_position_embeddings=512),
        "base": {},
    },
}  # fmt: skip


@dataclass(frozen=True)
class Tolerance:
    """Largest accepted relative errors of crossfuse's run against torch's: the loss (at any step), the
    first step's gradients, the parameters after the last step."""

    loss: float
    grad: float
    param: float


#: per compute dtype. bfloat16: both runs round activations to 8 bits, each its own way (crossfuse's
#: layer norm returns bfloat16 under autocast where torch's returns float32), so they differ by about
#: what each differs from float32; float32: the kernels' own error, summed over the model's rows.
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(loss=1e-5, grad=1e-4, param=1e-4),
    torch.bfloat16: Tolerance(loss=2e-2, grad=5e-2, param=2e-2),
    torch.float16: Tolerance(loss=1e-2, grad=2e-2, param=1e-2),
}


@dataclass(frozen=True)
class DistConfig:
    """One run. ``None`` fields are chosen by device: ``size`` tiny on the CPU, base on CUDA; ``batch``
    (per rank) 2 / 8; ``seq`` 8 / 512; ``dtype`` float32 / bfloat16; ``backend`` gloo / nccl."""

    model: str = "gpt2"
    size: str | None = None
    wrappers: tuple[str, ...] = WRAPPERS
    steps: int = 6
    warmup: int = 2
    batch: int | None = None
    seq: int | None = None
    dtype: torch.dtype | None = None
    device: str = "auto"
    backend: str | None = None
    lr: float = 1e-4
    seed: int = 0
    out: Path | None = None

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.size is not None and self.size not in SIZES[self.model]:
            raise ValueError(f"size must be one of {', '.join(SIZES[self.model])}, got {self.size!r}")
        if not self.wrappers or set(self.wrappers) - set(WRAPPERS):
            raise ValueError(f"wrappers must be a non-empty subset of {WRAPPERS}, got {self.wrappers!r}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if not 0 <= self.warmup < self.steps:
            raise ValueError(f"warmup must be in [0, steps), got {self.warmup} with steps={self.steps}")
        for name in ("batch", "seq"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.dtype is not None and self.dtype not in TOLERANCES:
            raise ValueError(f"dtype must be one of {[str(d) for d in TOLERANCES]}, got {self.dtype}")
        if self.backend is not None and self.backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be gloo or nccl, got {self.backend!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")

    def resolved(self) -> DistConfig:
        """The same run with every ``None`` field chosen (see the class docstring)."""
        dev = self.device if self.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        cuda = dev == "cuda"
        if cuda and not torch.cuda.is_available():
            raise ValueError("device='cuda' but torch sees no CUDA device")
        backend = self.backend or ("nccl" if cuda else "gloo")
        if backend == "nccl" and not cuda:
            raise ValueError("backend='nccl' needs device='cuda'; on the CPU use gloo")
        return dataclasses.replace(
            self, device=dev, backend=backend, size=self.size or ("base" if cuda else "tiny"),
            batch=self.batch or (8 if cuda else 2), seq=self.seq or (512 if cuda else 8),
            dtype=self.dtype or (torch.bfloat16 if cuda else torch.float32),
        )  # fmt: skip


@dataclass(frozen=True)
class Context:
    """This process's place in the run."""

    rank: int
    world: int
    device: torch.device


# ----------------------------------------------------------------------------------------------------
# process group
# ----------------------------------------------------------------------------------------------------


def use_interpreter_for(device: str) -> None:
    """On the CPU the kernels need Triton's interpreter, chosen before Triton is imported."""
    if device != "cpu":
        return
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("device='cpu' needs Triton's interpreter, but Triton was imported without it: "
                           "set TRITON_INTERPRET=1 before starting the process")  # fmt: skip
    os.environ["TRITON_INTERPRET"] = "1"


@contextlib.contextmanager
def process_group(cfg: DistConfig):
    """The default process group (from torchrun's environment; without it a world of one), destroyed on
    exit if this call made it. Yields the :class:`Context`."""
    made = False
    if not dist.is_initialized():
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(cfg.backend)
        else:
            dist.init_process_group(cfg.backend, store=dist.HashStore(), rank=0, world_size=1)
        made = True
    rank, world = dist.get_rank(), dist.get_world_size()
    if cfg.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        if local >= torch.cuda.device_count():
            raise RuntimeError(f"rank {rank} has LOCAL_RANK {local} but torch sees "
                               f"{torch.cuda.device_count()} CUDA devices: start at most that many "
                               "processes per node (torchrun --nproc-per-node)")  # fmt: skip
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    try:
        yield Context(rank, world, device)
    finally:
        if made:
            dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------------
# models and wrappers
# ----------------------------------------------------------------------------------------------------


def build_model(model: str, size: str, seed: int) -> tuple[torch.nn.Module, int]:
    """``(model in float32 on the CPU, eval mode; its vocabulary size)``, random weights from ``seed``."""
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(f"the distributed run builds its model with transformers ({exc}); "
                          "pip install crossfuse[models]") from exc  # fmt: skip
    torch.manual_seed(seed)
    if model == "gpt2":
        cfg = transformers.GPT2Config(**SIZES[model][size], bos_token_id=0, eos_token_id=0)
        m = transformers.GPT2LMHeadModel(cfg)
    else:
        m = transformers.BertForMaskedLM(transformers.BertConfig(**SIZES[model][size], pad_token_id=0))
    return m.eval(), m.config.vocab_size


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks: FSDP2's units below the root."""
    if hasattr(model, "transformer"):
        return list(model.transformer.h)
    return list(model.bert.encoder.layer)


def wrap(model: torch.nn.Module, wrapper: str, cfg: DistConfig, ctx: Context) -> torch.nn.Module:
    """``model`` (float32) on this rank's device, under DDP or FSDP2."""
    model = model.to(ctx.device)
    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(ctx.device.type, (ctx.world,))
    low = cfg.dtype != torch.float32
    mp = MixedPrecisionPolicy(param_dtype=cfg.dtype if low else None, reduce_dtype=torch.float32)
    for block in blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def batch(cfg: DistConfig, ctx: Context, vocab: int, step: int) -> dict[str, torch.Tensor]:
    """Rank ``ctx.rank``'s tokens at ``step``: the same for both implementations, another on each rank."""
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step * 1009 + ctx.rank)
    ids = torch.randint(0, vocab, (cfg.batch, cfg.seq), generator=gen).to(ctx.device)
    return {"input_ids": ids, "labels": ids}


# ----------------------------------------------------------------------------------------------------
# comparing sharded or replicated tensors
# ----------------------------------------------------------------------------------------------------


def _local(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(this rank's part of ``t`` in float64, whether the parts are shards to be summed over ranks)."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return t.to_local().detach().double(), True
    return t.detach().double(), False


def relative_l2(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], ctx: Context) -> float:
    """``‖got − ref‖ / ‖ref‖`` over all the tensors as one vector, whether each is replicated on every
    rank (DDP) or sharded across them (FSDP2's DTensors)."""
    sums = torch.zeros(4, dtype=torch.float64)  # sharded num, sharded den, replicated num, replicated den
    for name, r in ref.items():
        (g, sharded), (rl, _) = _local(got[name]), _local(r)
        i = 0 if sharded else 2
        sums[i] += (g - rl).square().sum().cpu()
        sums[i + 1] += rl.square().sum().cpu()
    shards = sums[:2].to(ctx.device)
    dist.all_reduce(shards)
    num, den = shards[0].item() + sums[2].item(), shards[1].item() + sums[3].item()
    return math.sqrt(num / den) if den > 0 else float("nan")


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# ----------------------------------------------------------------------------------------------------
# training
# ----------------------------------------------------------------------------------------------------


@dataclass
class Trace:
    """One implementation's run on this rank."""

    losses: list[torch.Tensor] = dataclasses.field(default_factory=list)
    times_ms: list[float] = dataclasses.field(default_factory=list)
    peaks: list[float] = dataclasses.field(default_factory=list)
    first_grads: dict[str, torch.Tensor] | None = None
    swapped: int | None = None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(model, opt, inputs, cfg: DistConfig, ctx: Context, ddp: bool) -> torch.Tensor:
    """zero_grad, forward (under autocast for DDP in a low dtype), loss, backward; the optimizer step is
    the caller's, after it has read the gradients."""
    opt.zero_grad(set_to_none=True)
    low = cfg.dtype != torch.float32
    ac = torch.autocast(ctx.device.type, dtype=cfg.dtype) if ddp and low else contextlib.nullcontext()
    with ac:
        loss = model(**inputs).loss
    loss.backward()
    return loss.detach().float()


def run_wrapper(wrapper: str, cfg: DistConfig, ctx: Context, say: Callable[[str], None]) -> dict:
    """Train torch's and crossfuse's models under ``wrapper``; this rank's numbers per implementation."""
    from ..nn import swap_layer_norms

    base, vocab = build_model(cfg.model, cfg.size, cfg.seed)
    models, opts, traces = {}, {}, {n: Trace() for n in IMPLS}
    for impl in IMPLS:
        m = copy.deepcopy(base)
        if impl == "crossfuse":
            # the fused kernels at every size: what runs under DDP and FSDP2 is the point here
            traces[impl].swapped = len(swap_layer_norms(m, native_below=0))
        models[impl] = wrap(m, wrapper, cfg, ctx)
        opts[impl] = torch.optim.AdamW(models[impl].parameters(), lr=cfg.lr)
    base = None
    cuda = ctx.device.type == "cuda"
    for step in range(cfg.steps):
        inputs = batch(cfg, ctx, vocab, step)
        for impl in IMPLS if step % 2 == 0 else IMPLS[::-1]:
            tr, model, opt = traces[impl], models[impl], opts[impl]
            _sync(ctx.device)
            if cuda:
                torch.cuda.reset_peak_memory_stats(ctx.device)
                before = torch.cuda.memory_allocated(ctx.device)
            t0 = time.perf_counter()
            loss = train_step(model, opt, inputs, cfg, ctx, wrapper == "ddp")
            if step == 0:
                tr.first_grads = grads(model)
            opt.step()
            _sync(ctx.device)
            tr.times_ms.append((time.perf_counter() - t0) * 1e3)
            if cuda:
                tr.peaks.append((torch.cuda.max_memory_allocated(ctx.device) - before) / 2**20)
            tr.losses.append(loss)
        done = (f"{n} {traces[n].times_ms[-1]:.1f} ms loss {traces[n].losses[-1].item():.5f}" for n in IMPLS)
        say(f"{wrapper} step {step + 1}/{cfg.steps}: " + ", ".join(done))
    t, c = traces["torch"], traces["crossfuse"]
    losses = {n: torch.stack(traces[n].losses).to(ctx.device) for n in IMPLS}
    for v in losses.values():
        dist.all_reduce(v)
    lt, lc = (losses[n].double().cpu() / ctx.world for n in IMPLS)
    loss_err = ((lc - lt).abs() / lt.abs().clamp_min(1e-30)).max().item()
    grad_err = relative_l2(c.first_grads, t.first_grads, ctx)
    param_err = relative_l2(params(models["crossfuse"]), params(models["torch"]), ctx)
    out = {}
    for n in IMPLS:
        tr = traces[n]
        timed = tr.times_ms[cfg.warmup :]
        out[n] = dict(step_ms=statistics.median(timed), step_ms_min=min(timed),
                      peak_mib=max(tr.peaks[cfg.warmup :]) if tr.peaks else None, swapped=tr.swapped,
                      loss_first=lt[0].item() if n == "torch" else lc[0].item(),
                      loss_last=lt[-1].item() if n == "torch" else lc[-1].item())  # fmt: skip
        if n == "crossfuse":
            out[n].update(loss_err=loss_err, grad_err=grad_err, param_err=param_err)
    return out


# ----------------------------------------------------------------------------------------------------
# rows, files
# ----------------------------------------------------------------------------------------------------

COLUMNS = ("wrapper", "model", "size", "impl", "rank", "world", "device", "device_name", "backend", "dtype",
           "batch_per_rank", "seq", "steps", "warmup", "step_ms", "step_ms_min", "speedup", "peak_mib",
           "loss_first", "loss_last", "loss_err", "grad_err", "param_err", "swapped", "status", "versions",
           "timestamp", "command")  # fmt: skip


def rows_of(results: list[dict], cfg: DistConfig, world: int, command: str) -> list[dict]:
    """CSV rows from every rank's results (``results[rank][wrapper][impl]``)."""
    from .schema import device_name, dtype_str, now, versions

    tol = TOLERANCES[cfg.dtype]
    info = dict(model=cfg.model, size=cfg.size, world=world, device=cfg.device,
                device_name=device_name(cfg.device), backend=cfg.backend, dtype=dtype_str(cfg.dtype),
                batch_per_rank=cfg.batch, seq=cfg.seq, steps=cfg.steps, warmup=cfg.warmup,
                versions=versions(), timestamp=now(), command=command)  # fmt: skip
    rows = []
    for wrapper in cfg.wrappers:
        for rank, res in enumerate(results):
            for impl in IMPLS:
                r = res[wrapper][impl]
                row = dict(info, wrapper=wrapper, impl=impl, rank=rank, **r)
                row["speedup"] = res[wrapper]["torch"]["step_ms"] / r["step_ms"]
                if impl == "crossfuse":
                    errs = (r["loss_err"], r["grad_err"], r["param_err"])
                    ok = all(e <= t for e, t in zip(errs, (tol.loss, tol.grad, tol.param), strict=True))
                    row["status"] = "ok" if ok else "fail"
                else:
                    row["status"] = "ref"
                rows.append(row)
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if r.get(k) is None else (repr(r[k]) if isinstance(r[k], float) else r[k])
                        for k in COLUMNS})  # fmt: skip


def _f(v, digits: int = 3) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}g}"


def render(rows: list[dict], cfg: DistConfig) -> str:
    """The markdown report: the run, then one line per wrapper, implementation and rank."""
    from .report import markdown_table

    r0, tol = rows[0], TOLERANCES[cfg.dtype]
    cpu = cfg.device == "cpu"
    head = [f"## distributed: {cfg.model} ({cfg.size}), world {r0['world']}, {cfg.backend}",
            f"- {r0['device']}: {r0['device_name']}; {r0['dtype']}; batch {cfg.batch} per rank, "
            f"seq {cfg.seq}; {cfg.steps} steps, the first {cfg.warmup} not timed; versions: {r0['versions']}",
            f"- command: `{r0['command']}`",
            "- step: zero_grad + forward + loss + backward + AdamW step, host clock with the device "
            "synchronised; ms and peak MiB (allocator peak above the step's start): medians / maxima over "
            "the timed steps; speed = torch's ms / this one's",
            f"- errors against torch's run, relative: loss (largest over steps, tolerance {tol.loss:g}), "
            f"first step's gradients ({tol.grad:g}), parameters after the last step "
            f"({tol.param:g})"]  # fmt: skip
    if cpu:
        head.append("- on the CPU crossfuse's kernels run under Triton's interpreter: its times are not "
                    "a measure of speed")  # fmt: skip
    header = ["wrapper", "impl", "rank", "step ms", "speed", "peak MiB", "loss err", "grad err", "param err",
              "status"]  # fmt: skip
    body = []
    for r in rows:
        impl = r["impl"] + (f" ({r['swapped']} LN swapped)" if r.get("swapped") is not None else "")
        body.append([r["wrapper"], impl, str(r["rank"]), _f(r["step_ms"], 4), _f(r["speedup"]) + "×",
                     _f(r.get("peak_mib"), 4), _f(r.get("loss_err"), 2), _f(r.get("grad_err"), 2),
                     _f(r.get("param_err"), 2), r["status"]])  # fmt: skip
    return "\n".join(head) + "\n\n" + markdown_table(header, body, left=3) + "\n"


def run(cfg: DistConfig, command: str = "", stream=None) -> list[dict]:
    """Every wrapper of ``cfg`` on this rank; rank 0 writes the files (where ``cfg.out`` is set). Returns
    the rows of every rank (on every rank)."""
    cfg = cfg.resolved()
    use_interpreter_for(cfg.device)
    stream = stream or sys.stderr
    t0 = time.monotonic()
    with process_group(cfg) as ctx:

        def say(text: str) -> None:
            if ctx.rank == 0:
                print(f"[dist {time.monotonic() - t0:7.1f} s] {text}", file=stream, flush=True)

        dtype = str(cfg.dtype).removeprefix("torch.")
        say(f"{cfg.model} ({cfg.size}) on {ctx.world} {cfg.device} rank(s), {cfg.backend}, {dtype}, "
            f"batch {cfg.batch} per rank, seq {cfg.seq}")  # fmt: skip
        mine = {}
        for wrapper in cfg.wrappers:
            mine[wrapper] = run_wrapper(wrapper, cfg, ctx, say)
            c = mine[wrapper]["crossfuse"]
            say(f"{wrapper}: loss err {c['loss_err']:.2e}, grad err {c['grad_err']:.2e}, "
                f"param err {c['param_err']:.2e}")  # fmt: skip
        results: list = [None] * ctx.world
        dist.all_gather_object(results, mine)
        rows = rows_of(results, cfg, ctx.world, command)
        if ctx.rank == 0 and cfg.out is not None:
            out = Path(cfg.out)
            out.mkdir(parents=True, exist_ok=True)
            stem = out / f"distributed-{cfg.model}-{cfg.device}-world{ctx.world}"
            write_csv(rows, stem.with_suffix(".csv"))
            stem.with_suffix(".md").write_text(render(rows, cfg))
            say(f"wrote {stem}.csv and {stem}.md")
    return rows


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m crossfuse.harness.distributed",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    p.add_argument("--model", default="gpt2", choices=MODELS)
    p.add_argument("--size", choices=("tiny", "small", "base"), help="default: tiny on the CPU, base on CUDA")
    p.add_argument("--wrappers", default=",".join(WRAPPERS), help="comma-separated: ddp, fsdp")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2, help="first steps not timed")
    p.add_argument("--batch", type=int, help="per rank (default 2 on the CPU, 8 on CUDA)")
    p.add_argument("--seq", type=int, help="tokens (default 8 on the CPU, 512 on CUDA)")
    p.add_argument("--dtype", help="compute dtype (default float32 on the CPU, bfloat16 on CUDA)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl on CUDA, gloo on the CPU")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="folder for the CSV and markdown (rank 0); none: not written")
    p.add_argument("--no-check", action="store_true", help="exit 0 even where errors exceed the tolerances")
    return p


def config_from(args: argparse.Namespace) -> DistConfig:
    from .schema import parse_dtype

    wrappers = tuple(w.strip() for w in args.wrappers.split(",") if w.strip())
    return DistConfig(model=args.model, size=args.size, wrappers=wrappers, steps=args.steps,
                      warmup=args.warmup, batch=args.batch, seq=args.seq,
                      dtype=parse_dtype(args.dtype) if args.dtype else None, device=args.device,
                      backend=args.backend, lr=args.lr, seed=args.seed, out=args.out)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        cfg = config_from(args)
    except ValueError as exc:
        p.error(str(exc))
    given = " ".join(sys.argv[1:] if argv is None else argv)
    launcher = (f"torchrun --nproc-per-node {os.environ['LOCAL_WORLD_SIZE']}"
                if "LOCAL_WORLD_SIZE" in os.environ else "python")  # fmt: skip
    command = f"{launcher} -m crossfuse.harness.distributed {given}".rstrip()
    rows = run(cfg, command)
    failed = [r for r in rows if r["status"] == "fail" and r["rank"] == 0]
    for r in failed:
        print(f"FAIL {r['wrapper']}: crossfuse against torch: loss err {r['loss_err']:.2e}, grad err "
              f"{r['grad_err']:.2e}, param err {r['param_err']:.2e} (tolerances: "
              f"{TOLERANCES[cfg.resolved().dtype]})", file=sys.stderr)  # fmt: skip
    return 1 if failed and not args.no_check else 0


if __name__ == "__main__":
    sys.exit(main())
