"""``crossfuse bench models``: real models from the libraries users have, every ``nn.LayerNorm`` swapped for
``crossfuse.nn.LayerNorm`` (:func:`crossfuse.nn.swap_layer_norms`), against the same model unswapped.

Two tables, in ``OUT/models[-quick]-<device>.csv`` and ``.md`` as each case ends (a run stopped by Ctrl-C
keeps the cases it measured, and its report says it is partial):

* **models**: a GPT-style decoder (transformers ``GPT2LMHeadModel``), a BERT-style encoder (transformers
  ``BertForMaskedLM``) and a vision transformer (timm ``vit_base_patch16_224`` where timm imports, else
  transformers ``ViTForImageClassification``), each built from its configuration with random weights (no
  download), at a small batch with a short sequence and at a large one (:data:`MODEL_CASES`).
* **blocks**: a stack of pre-norm transformer blocks (:mod:`.model_blocks`), ``crossfuse.nn.LayerNorm`` +
  ``crossfuse.nn.ReLUAttention`` against the same math in plain torch (relu attention with its scores
  materialised) and against torch's LayerNorm + SDPA (softmax attention: a speed peer, another function),
  at a short and a long sequence.

Each row is one implementation at one case:

* ``train_ms``: one training step, ``zero_grad(set_to_none=True)``, forward, loss, ``loss.backward()``
  (no optimizer step: the same for both); ``infer_ms``: the forward under ``torch.no_grad()``. Both eager
  (host time included), in ``rounds`` rounds that each take every implementation at once, their batches
  interleaved (:func:`.timing.time_cuda_eager_interleaved`): a row's time is the median over the rounds,
  ``*_speedup`` the median over the rounds of torch's time over this one's in the same round (> 1: faster;
  :func:`speedup`), and the blocks' ``*_vs_peer`` the same against the speed peer. Models run in eval mode
  (dropout off), so that swapped and unswapped compute the same function.
* ``peak_mib``: the allocator's peak above what was live before one training step (CUDA only).
* ``loss_err_*`` / ``grad_err_*``: against the unswapped model in the same dtype and against a float32
  copy of it, for torch's rows too (crossfuse's error read next to torch's own): ``|l - l_ref| / |l_ref|``,
  and ``‖g - g_ref‖ / ‖g_ref‖`` over all parameters' gradients as one vector (:func:`errors`). Under
  Triton's interpreter (the CPU) a float32 value stored as bfloat16 is truncated, not rounded to nearest:
  crossfuse's bfloat16 errors on the CPU are larger than on a GPU for that reason alone.

On CUDA the models table also times the unswapped model a second time (``torch_again``, "torch again (A/A
control)"): its speed is the run's noise, against which crossfuse's is read. On the CPU crossfuse runs
under Triton's interpreter: its rows are checked (errors, swaps), not timed. A family whose library is
missing gets ``skip`` rows saying so.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import memory, timing
from .model_blocks import BLOCK_CASES, BlockCase, block_impls
from .rounds import round_orders
from .schema import device_name, dtype_str, now, versions


@dataclass(frozen=True)
class ModelCase:
    """One batch shape of a model family: ``seq`` is tokens (text) or the image side in pixels (vision)."""

    family: str
    label: str
    batch: int
    seq: int


#: (full, quick) cases of each family: a small batch with a short sequence, and a large one.
MODEL_CASES: dict[str, tuple[tuple[ModelCase, ...], tuple[ModelCase, ...]]] = {
    "gpt2": (
        (ModelCase("gpt2", "small", 1, 128), ModelCase("gpt2", "large", 16, 1024)),
        (ModelCase("gpt2", "small", 1, 4), ModelCase("gpt2", "large", 2, 8)),
    ),
    "bert": (
        (ModelCase("bert", "small", 1, 128), ModelCase("bert", "large", 32, 512)),
        (ModelCase("bert", "small", 1, 4), ModelCase("bert", "large", 2, 8)),
    ),
    "vit": (
        (ModelCase("vit", "small", 1, 224), ModelCase("vit", "large", 64, 224)),
        (ModelCase("vit", "small", 1, 16), ModelCase("vit", "large", 2, 16)),
    ),
}

COLUMNS = ("table", "model", "case", "batch", "seq", "impl", "peer", "device", "device_name", "dtype",
           "train_ms", "infer_ms", "train_speedup", "infer_speedup", "train_vs_peer", "infer_vs_peer",
           "peak_mib", "loss_err_vs_torch", "grad_err_vs_torch", "loss_err_vs_fp32", "grad_err_vs_fp32",
           "swapped", "rounds", "status", "note", "versions", "timestamp")  # fmt: skip


@dataclass
class Row:
    """One implementation at one case (``None``: not measured, an empty cell)."""

    table: str
    model: str
    case: str
    batch: int
    seq: int
    impl: str
    peer: bool
    device: str
    device_name: str
    dtype: str
    train_ms: float | None = None
    infer_ms: float | None = None
    train_speedup: float | None = None
    infer_speedup: float | None = None
    train_vs_peer: float | None = None  # the blocks' crossfuse against their speed peer, paired
    infer_vs_peer: float | None = None
    peak_mib: float | None = None
    loss_err_vs_torch: float | None = None
    grad_err_vs_torch: float | None = None
    loss_err_vs_fp32: float | None = None
    grad_err_vs_fp32: float | None = None
    swapped: int | None = None
    rounds: int | None = None
    status: str = "ok"
    note: str = ""
    versions: str = dataclasses.field(default_factory=versions)
    timestamp: str = dataclasses.field(default_factory=now)


@dataclass(frozen=True)
class ModelsConfig:
    """What ``crossfuse bench models`` runs: where, in which dtype, how small, how many rounds."""

    device: str = "cuda"
    dtype: torch.dtype = torch.bfloat16
    quick: bool = False
    rounds: int = 5
    families: tuple[str, ...] = ("gpt2", "bert", "vit")
    blocks: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        unknown = set(self.families) - set(MODEL_CASES)
        if unknown:
            raise ValueError(f"unknown families {sorted(unknown)}; known: {', '.join(MODEL_CASES)}")


@dataclass
class Built:
    """A model in float32 with how to make its inputs and its loss."""

    name: str
    model: torch.nn.Module
    inputs: Callable[[ModelCase, str, torch.dtype, torch.Generator], dict]
    loss: Callable[[torch.nn.Module, dict], torch.Tensor]


# ----------------------------------------------------------------------------------------------------
# the families, from configurations (random weights, nothing downloaded)
# ----------------------------------------------------------------------------------------------------


def _token_inputs(vocab: int):
    def make(case: ModelCase, device, dtype, gen) -> dict:
        ids = torch.randint(0, vocab, (case.batch, case.seq), generator=gen).to(device)
        return {"input_ids": ids, "labels": ids}

    return make


def _hf_loss(model, inputs) -> torch.Tensor:
    return model(**inputs).loss


def _gpt2(quick: bool) -> Built:
    import transformers

    size = dict(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32) if quick else {}
    cfg = transformers.GPT2Config(**size, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg)
    return Built("gpt2 (transformers GPT2LMHeadModel)", model, _token_inputs(cfg.vocab_size), _hf_loss)


def _bert(quick: bool) -> Built:
    import transformers

    size = dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                vocab_size=64, max_position_embeddings=32) if quick else {}  # fmt: skip
    cfg = transformers.BertConfig(**size, pad_token_id=0)
    model = transformers.BertForMaskedLM(cfg)
    return Built("bert (transformers BertForMaskedLM)", model, _token_inputs(cfg.vocab_size), _hf_loss)


def _image_inputs(classes: int, key: str, label_key: str | None):
    def make(case: ModelCase, device, dtype, gen) -> dict:
        x = torch.randn(case.batch, 3, case.seq, case.seq, generator=gen).to(device, dtype)
        y = torch.randint(0, classes, (case.batch,), generator=gen).to(device)
        return {key: x, label_key or "_labels": y}

    return make


def _timm_loss(model, inputs) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(inputs["x"]).float(), inputs["_labels"])


def _vit(quick: bool) -> Built:
    try:
        import timm
    except Exception:  # not installed, or a torchvision that does not load with this torch: transformers
        timm = None
    if timm is not None:
        tiny = dict(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=10)
        size = tiny if quick else {}
        model = timm.create_model("vit_base_patch16_224", pretrained=False, **size)
        return Built("vit (timm vit_base_patch16_224)", model, _image_inputs(model.num_classes, "x", None),
                     _timm_loss)  # fmt: skip
    import transformers

    size = dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                image_size=16, patch_size=8, num_labels=10) if quick else dict(num_labels=1000)  # fmt: skip
    model = transformers.ViTForImageClassification(transformers.ViTConfig(**size))
    inputs = _image_inputs(model.config.num_labels, "pixel_values", "labels")
    return Built("vit (transformers ViTForImageClassification; timm not importable)", model, inputs, _hf_loss)


FAMILIES: dict[str, tuple[str, Callable[[bool], Built]]] = {
    "gpt2": ("transformers", _gpt2),
    "bert": ("transformers", _bert),
    "vit": ("transformers", _vit),  # timm where it imports
}


def missing_library(family: str) -> str | None:
    """Why ``family`` cannot be built here, or None."""
    lib = FAMILIES[family][0]
    try:
        __import__(lib)
    except Exception as exc:
        return f"{lib} cannot be imported ({type(exc).__name__}: {exc}); pip install crossfuse[models]"
    return None


# ----------------------------------------------------------------------------------------------------
# measuring
# ----------------------------------------------------------------------------------------------------


def loss_and_grads(model, inputs, loss_fn) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss and every parameter's gradient, by name (None-gradients left out)."""
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model, inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach().float(), grads


def errors(got, ref) -> tuple[float, float]:
    """(the loss's relative error, the gradients' relative error) of ``got`` against ``ref``, both
    (loss, grads) pairs. The gradients are taken together, as one vector: per parameter, a gradient that
    is zero in exact arithmetic (the key projection's bias under softmax, which shifts every score of a
    query alike) is rounding noise in both, and its ratio would say nothing."""
    loss_err = abs(got[0].item() - ref[0].item()) / max(abs(ref[0].item()), 1e-30)
    names = [n for n in got[1] if n in ref[1]]
    if not names:
        return loss_err, float("nan")
    num = math.sqrt(sum((got[1][n].double() - ref[1][n].double()).square().sum().item() for n in names))
    den = math.sqrt(sum(ref[1][n].double().square().sum().item() for n in names))
    return loss_err, num / den if den > 0 else float("nan")


def train_step(model, inputs, loss_fn) -> Callable[[], object]:
    def step():
        model.zero_grad(set_to_none=True)
        loss_fn(model, inputs).backward()

    return step


def inference(model, inputs, loss_fn) -> Callable[[], object]:
    def forward():
        with torch.no_grad():
            return loss_fn(model, inputs)

    return forward


def alternate(calls: dict[str, Callable[[], object]], rounds: int, device, config: timing.TimingConfig,
              say: Callable[[str], None],
              time_round=timing.time_cuda_eager_interleaved) -> dict[str, list[float]]:  # fmt: skip
    """Each call's eager median in each of ``rounds`` rounds. A round times every call at once,
    their batches interleaved (:func:`.timing.time_cuda_eager_interleaved`: the host's pace, which sets a
    small model's step, drifts within a second, and this way falls on all of them alike), starting from the
    orders of :func:`.rounds.round_orders` (so that no call keeps one predecessor). ``time_round(calls,
    device, config)`` times one round: ``{name: timing}`` (its ``p50``) of the calls in the order given."""
    names = list(calls)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r, order in enumerate(round_orders(len(names), rounds)):
        timed = time_round({names[i]: calls[names[i]] for i in order}, device, config)
        for n in names:
            times[n].append(timed[n].p50)
        say(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {times[n][-1]:.3f} ms" for n in names))
    return times


def speedup(ref: list[float], times: list[float]) -> float:
    """The median over the rounds of ``ref``'s time over this one's in the same round: each round's ratio
    compares two medians taken in one interleaved pass, under the same pace of the host, which moves
    between rounds by far more than the difference measured (a small model's step by a factor of 2)."""
    return statistics.median(r / t for r, t in zip(ref, times, strict=True))


def free(device) -> None:
    """The last case's memory back to the GPU (on the CPU, the tiny models go with their references)."""
    if torch.device(device).type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def message(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text[:297] + "..." if len(text) > 300 else text


def compare(impls: dict[str, torch.nn.Module], ref: str, fp32: torch.nn.Module | None, inputs, inputs32,
            loss_fn) -> dict[str, dict]:  # fmt: skip
    """Per implementation: its errors against implementation ``ref`` and against ``fp32`` (None: not run)."""
    results = {n: loss_and_grads(m, inputs, loss_fn) for n, m in impls.items()}
    r32 = loss_and_grads(fp32, inputs32, loss_fn) if fp32 is not None else None
    out = {}
    for n, res in results.items():
        fields = {}
        if n != ref:
            fields["loss_err_vs_torch"], fields["grad_err_vs_torch"] = errors(res, results[ref])
        if r32 is not None:
            fields["loss_err_vs_fp32"], fields["grad_err_vs_fp32"] = errors(res, r32)
        out[n] = fields
    return out


def measure(impls: dict[str, torch.nn.Module], timed: list[str], ref: str, inputs, loss_fn,
            cfg: ModelsConfig, say, peer: str | None = None) -> dict[str, dict]:  # fmt: skip
    """Per implementation: train and inference times (the ``timed`` ones, alternately), the speedups against
    ``ref`` (and ``peer``'s, ``*_vs_peer``, but for those two) and the peak memory of a training step."""
    out: dict[str, dict] = {n: {} for n in impls}
    cuda = torch.device(cfg.device).type == "cuda"
    tcfg = timing.QUICK if cfg.quick else timing.DEFAULT
    if cfg.quick and not cuda:  # a smoke test of the mechanism: one timed call
        tcfg = dataclasses.replace(tcfg, cpu_warmup_s=0.0, cpu_rep_s=0.0, cpu_min_reps=1, cpu_max_reps=1)
    for what, make in (("train", train_step), ("infer", inference)):
        calls = {n: make(impls[n], inputs, loss_fn) for n in timed}
        for c in calls.values():
            c()  # the first call (compilation, autotuning) is not timed
        if cuda:
            per_round = alternate(calls, cfg.rounds, cfg.device, tcfg, lambda s, w=what: say(f"{w} {s}"))
        else:
            per_round = {n: [t.p50] for n, t in timing.time_cpu_interleaved(calls, tcfg).items()}
        for n, times in per_round.items():
            out[n][f"{what}_ms"] = statistics.median(times)
            if n != ref and ref in per_round:
                out[n][f"{what}_speedup"] = speedup(per_round[ref], times)
            if n not in (ref, peer) and peer in per_round:
                out[n][f"{what}_vs_peer"] = speedup(per_round[peer], times)
    if cuda:
        for n, m in impls.items():
            peak = memory.measure_cuda(train_step(m, inputs, loss_fn), cfg.device).peak_bytes
            out[n]["peak_mib"] = peak / 2**20
    return out


def _models_case(built: Built, case: ModelCase, cfg: ModelsConfig, say) -> list[Row]:
    from ..nn import swap_layer_norms

    device, dtype = cfg.device, cfg.dtype
    torch_m, built.model = built.model.to(device, dtype).eval(), None
    cf_m = copy.deepcopy(torch_m)
    swapped = len(swap_layer_norms(cf_m))
    fp32 = copy.deepcopy(torch_m).float()
    gen = torch.Generator().manual_seed(cfg.seed)
    inputs = built.inputs(case, device, dtype, gen)
    inputs32 = {k: v.float() if v.is_floating_point() else v for k, v in inputs.items()}
    impls = {"torch": torch_m, "crossfuse": cf_m}
    errs = compare(impls, "torch", fp32, inputs, inputs32, built.loss)
    fp32 = None
    cuda = torch.device(device).type == "cuda"
    if cuda:  # the A/A control: the unswapped model again, timed alongside (see AGAIN)
        impls[AGAIN] = copy.deepcopy(torch_m)
    timed = list(impls) if cuda else ["torch"]
    times = measure(impls, timed, "torch", inputs, built.loss, cfg, say)
    rows = []
    for n in impls:
        note = "" if n in timed else "not timed: runs under the Triton interpreter on the CPU"
        rows.append(_row("models", built.name, case, n, n != "crossfuse", cfg, **errs.get(n, {}), **times[n],
                         swapped=swapped if n == "crossfuse" else None, note=note))  # fmt: skip
    return rows


# The A/A control of the models table: the unswapped model a second time, timed in the same alternation as
# the others. Its speed against "torch" is what the run's noise alone makes of two identical models: a
# crossfuse ratio inside that spread is not a measured difference. On a host-bound step (small batches)
# that spread is wide, as the host's time per step varies from round to round.
AGAIN = "torch_again"


def _row(table, model, case, impl, peer, cfg: ModelsConfig, **fields) -> Row:
    timed = fields.get("train_ms") is not None
    return Row(table, model, case.label, case.batch, case.seq, impl, peer, torch.device(cfg.device).type,
               device_name(cfg.device), dtype_str(cfg.dtype), rounds=cfg.rounds if timed else None,
               status=fields.pop("status", "ok" if timed else "not timed"), **fields)  # fmt: skip


def run_models(cfg: ModelsConfig, say: Callable[[str], None],
               done: Callable[[list[Row]], None] | None = None) -> list[Row]:  # fmt: skip
    """Every family's cases and every block case: rows in the order measured; ``say`` gets progress lines,
    ``done`` (where given) each case's rows as soon as they are measured."""
    rows: list[Row] = []
    done = done or (lambda new: None)
    for family in cfg.families:
        cases = MODEL_CASES[family][1 if cfg.quick else 0]
        why = missing_library(family)
        for case in cases:
            label = f"{family} {case.label} (batch {case.batch}, seq {case.seq})"
            if why is not None:
                say(f"{label}: skip: {why}")
                new = [_row("models", family, case, n, n == "torch", cfg, status="skip", note=why)
                       for n in ("torch", "crossfuse")]  # fmt: skip
                rows += new
                done(new)
                continue
            say(f"{label}: building from its configuration")
            t0 = time.monotonic()
            try:
                torch.manual_seed(cfg.seed)
                built = FAMILIES[family][1](cfg.quick)
                new = _models_case(built, case, cfg, lambda s, lb=label: say(f"{lb}: {s}"))
            except Exception as exc:  # out of memory included: an error row, and the run goes on
                msg = message(exc)
                new = [_row("models", family, case, n, n == "torch", cfg, status="error", note=msg)
                       for n in ("torch", "crossfuse")]  # fmt: skip
                say(f"{label}: error: {msg}")
            rows += new
            done(new)
            built = None
            free(cfg.device)
            say(f"{label}: done in {time.monotonic() - t0:.1f} s")
    if cfg.blocks:
        for case in BLOCK_CASES[1 if cfg.quick else 0]:
            new = _blocks_case(case, cfg, say)
            rows += new
            done(new)
    return rows


def _blocks_case(case: BlockCase, cfg: ModelsConfig, say) -> list[Row]:
    label = f"blocks {case.label} (batch {case.batch}, seq {case.seq})"
    mc = ModelCase("blocks", case.label, case.batch, case.seq)
    name = f"{case.blocks} pre-norm blocks, d={case.dim}, {case.heads} heads"
    names = ("crossfuse", "torch_relu", "torch_sdpa")
    say(f"{label}: building")
    try:
        torch.manual_seed(cfg.seed)
        impls, fp32, loss_fn, inputs = block_impls(case, cfg.device, cfg.dtype, cfg.seed)
        inputs32 = {k: v.float() for k, v in inputs.items()}
        no32 = fp32 is None
        errs = compare({n: impls[n] for n in names[:2]}, "torch_relu", fp32, inputs, inputs32, loss_fn)
        errs["torch_sdpa"] = {}
        fp32 = None
        cuda = torch.device(cfg.device).type == "cuda"
        timed = list(names) if cuda else list(names[1:])
        times = measure(impls, timed, "torch_relu", inputs, loss_fn, cfg, lambda s: say(f"{label}: {s}"),
                        peer="torch_sdpa")
    except Exception as exc:
        msg = message(exc)
        say(f"{label}: error: {msg}")
        free(cfg.device)
        return [_row("blocks", name, mc, n, n != "crossfuse", cfg, status="error", note=msg) for n in names]
    impls = None
    free(cfg.device)
    notes = {"torch_sdpa": "speed peer: softmax attention (SDPA), another function: no errors"}
    if not cuda:
        notes["crossfuse"] = "not timed: runs under the Triton interpreter on the CPU"
    if no32:
        why = "no float32 copy: its materialised scores would pass FP32_SCORES_MAX_BYTES"
        notes = {n: "; ".join(s for s in (notes.get(n, ""), why) if s) for n in names[:2]} | notes
    return [_row("blocks", name, mc, n, n != "crossfuse", cfg, **errs[n], **times[n], note=notes.get(n, ""))
            for n in names]  # fmt: skip
