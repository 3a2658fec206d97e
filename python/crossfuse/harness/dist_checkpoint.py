"""Checkpoints of crossfuse models with ``torch.distributed.checkpoint`` (DCP), across world sizes and
into plain torch models.

``crossfuse.nn.LayerNorm`` subclasses ``torch.nn.LayerNorm`` and adds no state, so a swapped model has the
state dict keys and tensors of the unswapped one. A DCP checkpoint is a set of tensors by key, each
written in the pieces the saving ranks held (FSDP2's shards, or one rank's copy of a DDP replica) and
read back in whatever pieces the loading ranks hold: so it loads at any world size, under any wrapper,
into either model. :func:`save` and :func:`load` take the wrapped model and go through
``torch.distributed.checkpoint.state_dict`` (which removes DDP's ``module.`` prefix and keeps FSDP2's
DTensors sharded).

A check users can run (and the tests do), e.g. saved at two ranks under FSDP2 and loaded at one::

    torchrun --standalone --nproc-per-node 2 -m crossfuse.harness.dist_checkpoint save CKPT --wrapper fsdp
    python -m crossfuse.harness.dist_checkpoint load CKPT --wrapper none,fsdp   # a world of one

``save`` trains the crossfuse model ``--steps`` steps (so that its weights are no longer those of its
seed), writes the checkpoint into ``CKPT/dcp`` and the full state dict with ``torch.save`` into
``CKPT/full.pt`` (the reference) and which model it was into ``CKPT/meta.json``; ``load`` builds that
model, torch's and crossfuse's, from another seed, wraps each, loads the checkpoint into it and compares
its full state dict with the reference, key for key and bit for bit; it exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from . import distributed as D

WRAPS = ("ddp", "fsdp", "none")


def save(model: torch.nn.Module, path: str | Path) -> None:
    """Write ``model``'s state (wrapped or not; every rank calls this) as a DCP checkpoint in ``path``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    dcp.save(get_model_state_dict(model), checkpoint_id=str(path))


def load(model: torch.nn.Module, path: str | Path) -> None:
    """Read the DCP checkpoint in ``path`` into ``model`` (wrapped or not; every rank calls this)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    if not Path(path).is_dir():
        raise FileNotFoundError(f"no DCP checkpoint at {path} (a folder written by dcp.save)")
    state = get_model_state_dict(model)
    dcp.load(state, checkpoint_id=str(path))
    set_model_state_dict(model, state)


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole state dict on the CPU on rank 0 (gathered from the shards), ``{}`` on other ranks."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {k: v.detach().clone() for k, v in get_model_state_dict(model, options=opts).items()}


def differences(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> list[str]:
    """What differs between two full state dicts: missing or extra keys, shapes, dtypes, values."""
    out = [f"missing {k}" for k in ref if k not in got] + [f"extra {k}" for k in got if k not in ref]
    for k in ref.keys() & got.keys():
        a, b = got[k], ref[k]
        if a.shape != b.shape or a.dtype != b.dtype:
            out.append(f"{k}: {tuple(a.shape)} {a.dtype} against {tuple(b.shape)} {b.dtype}")
        elif not torch.equal(a, b):
            out.append(f"{k}: values differ by up to {(a.double() - b.double()).abs().max().item():.3g}")
    return sorted(out)


def _model(cfg: D.DistConfig, ctx: D.Context, impl: str, wrapper: str, seed: int) -> torch.nn.Module:
    from ..nn import swap_layer_norms

    model, _ = D.build_model(cfg.model, cfg.size, seed)
    if impl == "crossfuse":
        swap_layer_norms(model)
    return model.to(ctx.device) if wrapper == "none" else D.wrap(model, wrapper, cfg, ctx)


def run_save(path: Path, cfg: D.DistConfig, wrapper: str, say) -> None:
    """Train crossfuse's model ``cfg.steps`` steps under ``wrapper`` and checkpoint it into ``path``."""
    with D.process_group(cfg) as ctx:
        model = _model(cfg, ctx, "crossfuse", wrapper, cfg.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        vocab = model_vocab(model)
        for step in range(cfg.steps):
            loss = D.train_step(model, opt, D.batch(cfg, ctx, vocab, step), cfg, ctx, wrapper == "ddp")
            opt.step()
            say(ctx, f"save: step {step + 1}/{cfg.steps} loss {loss.item():.5f}")
        save(model, path / "dcp")
        ref = full_state(model)
        if ctx.rank == 0:
            torch.save(ref, path / "full.pt")
            meta = dict(model=cfg.model, size=cfg.size, world=ctx.world, wrapper=wrapper, keys=len(ref))
            (path / "meta.json").write_text(json.dumps(meta, indent=1))
        dist.barrier()
        say(ctx, f"save: {len(ref)} tensors from {wrapper} at world {ctx.world} into {path}")


def model_vocab(model: torch.nn.Module) -> int:
    """The vocabulary size of a transformers model, under DDP (``.module``) or not."""
    inner = getattr(model, "module", model)
    return inner.config.vocab_size


def run_load(path: Path, cfg: D.DistConfig, wrappers: tuple[str, ...], say) -> list[str]:
    """Load ``path`` into torch's model and crossfuse's under each of ``wrappers``; the differences from
    the saved full state dict (on rank 0; empty elsewhere)."""
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path} not found: write the checkpoint with `save` first")
    meta = json.loads(meta_path.read_text())
    cfg = dataclasses.replace(cfg, model=meta["model"], size=meta["size"])
    problems: list[str] = []
    with D.process_group(cfg) as ctx:
        ref = torch.load(path / "full.pt") if ctx.rank == 0 else {}
        for wrapper in wrappers:
            for impl in D.IMPLS:
                model = _model(cfg, ctx, impl, wrapper, cfg.seed + 1)
                load(model, path / "dcp")
                got = full_state(model)
                if ctx.rank == 0:
                    diff = differences(got, ref)
                    problems += [f"{impl} ({wrapper}): {d}" for d in diff]
                    say(ctx, f"load into {impl} ({wrapper}, world {ctx.world}) from {meta['wrapper']} at "
                             f"world {meta['world']}: {len(got)} tensors, "
                             f"{'all equal' if not diff else f'{len(diff)} differ'}")  # fmt: skip
        dist.barrier()
    return problems


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m crossfuse.harness.dist_checkpoint",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    p.add_argument("action", choices=("save", "load"))
    p.add_argument("path", type=Path, help="the checkpoint's folder")
    p.add_argument("--wrapper", default="fsdp",
                   help="save: one of ddp, fsdp, none; load: comma-separated, each loaded in turn")
    p.add_argument("--model", default="gpt2", choices=D.MODELS, help="save (load reads meta.json)")
    p.add_argument("--size", choices=("tiny", "small", "base"),
                   help="save (load reads meta.json); default: tiny on the CPU, base on CUDA")
    p.add_argument("--steps", type=int, default=1, help="training steps before saving")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    wrappers = tuple(w.strip() for w in args.wrapper.split(",") if w.strip())
    if not wrappers or set(wrappers) - set(WRAPS) or (args.action == "save" and len(wrappers) != 1):
        p.error(f"--wrapper must be {'one' if args.action == 'save' else 'a comma-separated list'} of "
                f"{', '.join(WRAPS)}, got {args.wrapper!r}")
    try:
        cfg = D.DistConfig(model=args.model, size=args.size, steps=args.steps, warmup=0,
                           device=args.device, seed=args.seed).resolved()  # fmt: skip
    except ValueError as exc:
        p.error(str(exc))
    D.use_interpreter_for(cfg.device)

    def say(ctx: D.Context, text: str) -> None:
        if ctx.rank == 0:
            print(f"[dcp] {text}", file=sys.stderr, flush=True)

    if args.action == "save":
        args.path.mkdir(parents=True, exist_ok=True)
        run_save(args.path, cfg, wrappers[0], say)
        return 0
    problems = run_load(args.path, cfg, wrappers, say)
    for line in problems[:20]:
        print(f"DIFFERS {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
