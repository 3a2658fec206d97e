"""Bit for bit: every kernel path's outputs and gradients here against another checkout's.

    python bench/compare_commits.py OTHER_PYTHON_DIR [--out DIR] [--quick]

``OTHER_PYTHON_DIR`` is the ``python/`` folder of another checkout (e.g. ``git worktree add /tmp/base
<commit>`` then ``/tmp/base/python``). Each tree runs in a subprocess of its own, calls the public ops
(``crossfuse.layer_norm``, ``crossfuse.relu_attention``) forward and backward on the same seeded inputs
over cases chosen to reach every launch path (row lengths for the fused, chunked and Gluon layer-norm
kernels, few and many rows, each dtype, with and without affine parameters; attention at each head dim,
lengths that are and are not multiples of the tiles, causal and not, squared, both layouts, float32's
Gluon kernels), and saves every output. A refactoring that moves code must leave them equal bit for bit;
the script prints one line per case and exits non-zero on any difference. Each case also runs twice in
the new tree, so a path that is not deterministic is named as such rather than blamed on the change.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "python"

# (M, N): one row, a prime row length, the fused kernel's sizes, not powers of two, the Gluon backward's
# long rows, the chunked kernels past the fused limit, many short rows.
LN_SHAPES = ((1, 64), (7, 1), (33, 997), (4096, 768), (4096, 1024), (1000, 5000), (4096, 4096),
             (2048, 12288), (1024, 16384), (64, 65536), (131072, 512), (16384, 2560))  # fmt: skip
LN_QUICK = ((1, 64), (7, 1), (33, 997))
# (B, H, L, D): each head dim, lengths that are and are not multiples of the tiles, many heads
ATTN_SHAPES = ((2, 4, 128, 16), (1, 8, 1000, 32), (2, 4, 1024, 64), (1, 4, 2048, 128), (1, 2, 512, 256),
               (4, 16, 1024, 64), (1, 3, 77, 64))  # fmt: skip
# (B, H, L, D, causal, squared, layout)
ATTN_CASES = tuple(
    (b, h, length, d, causal, squared, layout)
    for (b, h, length, d) in ATTN_SHAPES
    for causal in (False, True)
    for squared, layout in ((False, "bhld"), (True, "blhd"))
)
ATTN_QUICK = tuple(c for c in ATTN_CASES if c[2] <= 128)
DTYPES = ("bfloat16", "float16", "float32")


def _inputs(shape, dtype, seed, device):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(device=device, dtype=getattr(torch, dtype))


def _ln_case(m, n, dtype, affine, seed, device):
    import crossfuse
    import torch

    x = _inputs((m, n), dtype, seed, device).requires_grad_()
    w = b = None
    if affine:
        w = (1 + 0.1 * _inputs((n,), dtype, seed + 1, device)).requires_grad_()
        b = (0.1 * _inputs((n,), dtype, seed + 2, device)).requires_grad_()
    y = crossfuse.layer_norm(x, (n,), w, b, 1e-5)
    dy = _inputs((m, n), dtype, seed + 3, device)
    y.backward(dy)
    outs = {"y": y.detach(), "dx": x.grad}
    if affine:
        outs |= {"dw": w.grad, "db": b.grad}
    return {k: v.cpu() for k, v in outs.items()} | {"_": torch.tensor(0)}


def _attn_case(b, h, length, d, causal, squared, layout, dtype, seed, device):
    import crossfuse

    shape = (b, h, length, d) if layout == "bhld" else (b, length, h, d)
    q, k, v = (_inputs(shape, dtype, seed + i, device).requires_grad_() for i in range(3))
    out = crossfuse.relu_attention(q, k, v, causal=causal, squared=squared, layout=layout)
    out.backward(_inputs(shape, dtype, seed + 3, device))
    return {"out": out.detach().cpu(), "dq": q.grad.cpu(), "dk": k.grad.cpu(), "dv": v.grad.cpu()}


def cases(quick: bool):
    for dtype in DTYPES:
        for m, n in LN_QUICK if quick else LN_SHAPES:
            for affine in (True, False):
                yield f"layer_norm {dtype} {m}x{n} affine={affine}", _ln_case, (m, n, dtype, affine)
        for c in ATTN_QUICK if quick else ATTN_CASES:
            yield f"relu_attention {dtype} {'x'.join(map(str, c[:4]))} causal={c[4]} squared={c[5]} {c[6]}", \
                _attn_case, (*c, dtype)


def dump(folder: Path, quick: bool, repeat: int) -> None:
    """Run every case (``repeat`` times) in this process and save its outputs under ``folder``."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    folder.mkdir(parents=True, exist_ok=True)
    for i, (name, fn, args) in enumerate(cases(quick)):
        for r in range(repeat):
            try:
                outs = fn(*args, 1000 + i, device)
            except Exception as e:  # a case one tree cannot run is reported, not fatal
                outs = {"error": f"{type(e).__name__}: {e}"}
            torch.save({"name": name, "outs": outs}, folder / f"{i:04d}_{r}.pt")
        torch.cuda.empty_cache() if device == "cuda" else None


def _run_tree(python_dir: Path, folder: Path, quick: bool, repeat: int) -> None:
    env = dict(os.environ, PYTHONPATH=str(python_dir))
    cmd = [sys.executable, __file__, "--dump", str(folder), "--repeat", str(repeat)]
    cmd += ["--quick"] if quick else []
    subprocess.run(cmd, env=env, check=True)


def _bits(t):
    """The tensor's bytes, so that NaNs compare by their bits (torch.equal says NaN != NaN)."""
    import torch

    return t.contiguous().view(torch.uint8) if t.numel() and t.dim() else t


def _differs(a: dict, b: dict) -> str | None:
    import torch

    if "error" in a or "error" in b:
        return f"error: {a.get('error')} | {b.get('error')}" if a.get("error") != b.get("error") else None
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            return f"{key} missing"
        x, y = a[key], b[key]
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"{key}: {tuple(x.shape)} {x.dtype} vs {tuple(y.shape)} {y.dtype}"
        if not torch.equal(_bits(x), _bits(y)):
            diff = (x.double() - y.double()).abs().nan_to_num(posinf=float("inf"))
            return f"{key}: {int((x != y).sum())} elements differ, max |diff| {float(diff.max()):.3g}"
    return None


def compare(other: Path, out: Path, quick: bool) -> int:
    import torch

    new, old = out / "new", out / "old"
    _run_tree(HERE, new, quick, repeat=2)
    _run_tree(other, old, quick, repeat=1)
    bad = 0
    for f in sorted(old.glob("*_0.pt")):
        a, b = torch.load(f), torch.load(new / f.name)
        again = torch.load(new / f.name.replace("_0.pt", "_1.pt"))
        changed, unstable = _differs(a["outs"], b["outs"]), _differs(b["outs"], again["outs"])
        verdict = "same" if changed is None else ("not deterministic: " + unstable if unstable else changed)
        bad += changed is not None and unstable is None
        tag = "ok  " if changed is None else "DIFF" if unstable is None else "NDET"
        print(f"{tag} {a['name']}: {verdict}")
    print(f"{bad} case(s) differ bit for bit")
    return 1 if bad else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("other", nargs="?", type=Path, help="the python/ folder of the checkout to compare with")
    p.add_argument("--out", type=Path, help="where to keep the saved outputs (default: a temporary folder)")
    p.add_argument("--quick", action="store_true", help="a few small cases (a check of this script on a CPU)")
    p.add_argument("--dump", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--repeat", type=int, default=1, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.dump:
        from crossfuse import _backend

        _backend.enable_interpreter_if_no_gpu()
        dump(a.dump, a.quick, a.repeat)
        return 0
    if a.other is None or not (a.other / "crossfuse").is_dir():
        p.error("OTHER_PYTHON_DIR must be a python/ folder holding crossfuse/")
    if a.out:
        return compare(a.other, a.out, a.quick)
    with tempfile.TemporaryDirectory() as tmp:
        return compare(a.other, Path(tmp), a.quick)


if __name__ == "__main__":
    sys.exit(main())
