"""What float32 attention's transposed copies cost (see ``_tf32_copies`` in crossfuse/ops/relu_attention.py):
at the seed's layout and shapes (float32 [B, L, H, D] as [B, H, L, D] views, B=4, H=16, D=64), the copy
with unit stride on L of one input (``_l_contiguous``, at its tile and at others; torch's transposed
copy) against a plain copy of as many bytes (``torch.clone`` of a contiguous tensor), and the forward and
backward through their launchers against the same kernels given copies made beforehand, alternated in
one process (``crossfuse.harness.timing.alternate``).

    python bench/probe_attn_copies.py [--rounds 3] [--lengths 1024,4096]

Prints, per length, the median ms of each call and the copies' GB/s (bytes read + written).
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys

from ab_attn import SEED_BHD, seed_inputs, timing_config  # bench/ is sys.path[0]; ab_ln sets the path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lengths", default="1024,4096")
    args = ap.parse_args(argv)
    from crossfuse._backend import require_cuda

    require_cuda("bench/probe_attn_copies.py")
    import torch
    from crossfuse.harness import timing
    from crossfuse.ops import relu_attention as ra

    cfg = timing_config()
    b, h, d = SEED_BHD
    for length in (int(n) for n in args.lengths.split(",")):
        q, k, v, do = seed_inputs(length, 4)
        flat = torch.randn(b * h * length * d, device="cuda")
        kw = dict(squared=False, scale=1 / math.sqrt(d), relu_scale=1 / length)
        (vt,) = ra._l_contiguous(v)
        qc, doc, kc = ra._l_contiguous(q, do, k)
        calls = {
            "l_contiguous(v)": functools.partial(ra._l_contiguous, v),
            "l_contiguous(q, do, k)": functools.partial(ra._l_contiguous, q, do, k),
            "torch's transposed copy": functools.partial(_torch_copy, v),
            "clone (same bytes)": flat.clone,
        }
        for tile in TILES:
            calls[f"l_contiguous(v) tile {tile}"] = functools.partial(_with_tile, ra, tile, v)
        for causal in (False, True):
            cfg_f = ra.attention_config("fwd", d, q.dtype, causal, length=length)
            calls[f"fwd causal={causal} launcher"] = functools.partial(
                ra.relu_attention_fwd, q, k, v, causal, **kw
            )
            calls[f"fwd causal={causal} kernel only"] = functools.partial(
                _fwd_kernel_only, ra, q, k, vt, causal, kw, cfg_f
            )
            calls[f"bwd causal={causal} launcher"] = functools.partial(
                ra.relu_attention_bwd, q, k, v, do, causal, **kw
            )
        times = timing.alternate(calls, args.rounds, config=cfg)
        nbytes = 2 * flat.numel() * flat.element_size()
        print(f"L={length}", flush=True)
        for name, ts in times.items():
            ms = statistics.median(ts)
            moved = nbytes * (3 if "(q, do, k)" in name else 1)
            extra = f" {moved / ms / 1e6:.0f} GB/s" if "fwd" not in name and "bwd" not in name else ""
            print(f"  {name}: {ms:.4f} ms{extra}", flush=True)
        del qc, doc, kc
    return 0


TILES = ((32, 64, 4), (64, 64, 4), (64, 64, 8), (128, 64, 8), (128, 32, 4), (32, 32, 4))


def _torch_copy(t):
    return t.transpose(2, 3).contiguous().transpose(2, 3)


def _with_tile(ra, tile, t):
    """``ra._l_contiguous(t)`` with the copy kernel's tile ``(BLOCK_L, BLOCK_D, warps)``."""
    kept = ra.L_MAJOR_TILE
    ra.L_MAJOR_TILE = tile
    try:
        return ra._l_contiguous(t)
    finally:
        ra.L_MAJOR_TILE = kept


def _fwd_kernel_only(ra, q, k, vt, causal, kw, cfg):
    """The pointer forward kernel on a copy of v made beforehand (what the launcher runs after its copy)."""
    import torch
    import triton

    B, H, L, D = q.shape
    out = torch.empty((B, H, L, D), dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(L, cfg.block_m), B * H)
    ra._relu_attn_fwd_kernel[grid](
        q, k, vt, out, *ra._bhld_strides(q), *ra._bhld_strides(k), *ra._bhld_strides(vt), vt.stride(3),
        *ra._bhld_strides(out), H, L, L, kw["scale"], kw["relu_scale"],
        HEAD_D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal, SQUARED=False,
        EVEN_M=L % cfg.block_m == 0, EVEN_N=L % cfg.block_n == 0, IS_FP64=False, UPCAST=False,
        PEEL=ra._peel(q.dtype, causal), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out


if __name__ == "__main__":
    sys.exit(main())
