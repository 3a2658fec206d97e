"""Copies of [B, H, L, D] views with unit stride on L, for float32's tf32 products summed over L.

See :func:`.config._tf32_copies` for why float32 needs them and :func:`_l_contiguous` for how they are
made.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._runtime import direct as _direct
from .._runtime import pdl as _gdc
from .config import L_MAJOR_TILE
from .plans import record, scratch


@triton.jit
def _l_major_copy_kernel(
    X0, X1, X2,  # (B, H, L, D) each, through strides: the T tensors copied (the unused ones: X0 again)
    Y,  # out: (T, B, H, D, L) contiguous, i.e. each X's elements with unit stride on L
    stride_0b, stride_0h, stride_0l, stride_0d,
    stride_1b, stride_1h, stride_1l, stride_1d,
    stride_2b, stride_2h, stride_2l, stride_2d,
    H, L, D,
    T: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GDC: tl.constexpr = False,  # the kernel after it may be a dependent launch that waits for it (_gdc)
    SIGMA: tl.constexpr = False,  # L's indices in sigma's order within each 8 (L a multiple of 8)
):  # fmt: skip
    _gdc.launch_dependents(GDC)
    # a [BLOCK_L, BLOCK_D] tile read along D and written along L: Triton gives the load and the store
    # each a coalesced layout and moves the tile between them through shared memory. The grid's first
    # axis runs over (tensor, batch, head)
    pid = tl.program_id(0)
    pairs = tl.num_programs(0) // T
    t = pid // pairs
    pid_bh = pid % pairs
    X, sb, sh, sl, sd = X0, stride_0b, stride_0h, stride_0l, stride_0d
    if T > 1:
        if t == 1:
            X, sb, sh, sl, sd = X1, stride_1b, stride_1h, stride_1l, stride_1d
    if T > 2:
        if t == 2:
            X, sb, sh, sl, sd = X2, stride_2b, stride_2h, stride_2l, stride_2d
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_l = (tl.program_id(1) * BLOCK_L + tl.arange(0, BLOCK_L)).to(tl.int64)
    offs_d = (tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)).to(tl.int64)
    ok = (offs_l[:, None] < L) & (offs_d[None, :] < D)
    if SIGMA:  # place l' = 8g + sigma(c) takes row 8g + c: c = (l' % 8 >> 2) | (l' % 4 << 1)
        rows = (offs_l & ~7) | ((offs_l & 7) >> 2) | ((offs_l & 3) << 1)
    else:
        rows = offs_l
    x = tl.load(X + b * sb + h * sh + rows[:, None] * sl + offs_d[None, :] * sd, mask=ok)
    Y += pid.to(tl.int64) * D * L
    tl.store(Y + offs_d[None, :] * L + offs_l[:, None], x, mask=ok)




def _l_contiguous(*tensors: torch.Tensor, signal: bool = False, sigma: bool = False,
                  tile: tuple[int, int, int] = L_MAJOR_TILE) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """[B, H, L, D] views with unit stride on L of ``tensors``: each tensor itself when it has one, else a
    copy ([B, H, D, L] contiguous, seen transposed). Tensors of one shape, dtype and device are copied
    three at a time by one launch into one buffer (which lives as long as any of its copies). The copy is a
    Triton kernel: torch's ``contiguous()`` of the transposed view moved about 1 TB/s on the H200 at the
    float32 shapes B=4, H=16, a third of a plain copy's rate, and the copies were then 30% of the
    float32 forward at L=1024. With ``signal``, the copy kernel lets a dependent launch after it start
    (:mod:`._gdc`); that kernel must wait for it before reading the copies. With ``sigma`` (for the float32
    Gluon kernels; L a multiple of 8) every tensor is copied, the indices along L of each
    group of 8 in the order of ``gluon_common._sigma``: place ``8g + sigma(c)`` holds row
    ``8g + c``."""
    out = list(tensors)
    todo = [i for i, t in enumerate(tensors) if sigma or t.stride(2) != 1]
    while todo:
        kind = _copy_kind(tensors[todo[0]])
        group = [i for i in todo if _copy_kind(tensors[i]) == kind][:3]
        todo = [i for i in todo if i not in group]
        made = _l_major_copies([tensors[i] for i in group], signal, sigma, tile)
        for i, c in zip(group, made, strict=True):
            out[i] = c
    return tuple(out)


def sigma_rows(length: int, device=None) -> torch.Tensor:
    """The rows that places ``0 .. length - 1`` of a copy in sigma's order hold (see :func:`_l_contiguous`):
    ``8g + c`` for place ``8g + sigma(c)``, sigma(b0 + 2 b1 + 4 b2) = b1 + 2 b2 + 4 b0."""
    at = torch.arange(length, device=device)
    return (at & ~7) | ((at & 7) >> 2) | ((at & 3) << 1)


def _copy_kind(t: torch.Tensor) -> tuple:
    return t.shape, t.dtype, t.device


def _l_major_copies(ts: list[torch.Tensor], signal: bool = False, sigma: bool = False,
                    tile: tuple[int, int, int] = L_MAJOR_TILE) -> list[torch.Tensor]:  # fmt: skip
    """One to three tensors of one [B, H, L, D] shape copied with unit stride on L (see _l_contiguous)."""
    B, H, L, D = ts[0].shape
    if sigma and L % 8:
        raise ValueError(f"a copy in sigma's order needs a length that is a multiple of 8, got {L}")
    block_l, block_d, warps = tile
    block_d = min(block_d, triton.next_power_of_2(D))
    grid = (len(ts) * B * H, triton.cdiv(L, block_l), triton.cdiv(D, block_d))
    if grid[1] > 65535:  # a grid's second axis is at most 65535 programs: torch's copy beyond that
        if sigma:
            ts = [t[:, :, sigma_rows(L, t.device)] for t in ts]
        return [t.transpose(2, 3).contiguous().transpose(2, 3) for t in ts]
    out = torch.empty((len(ts), B, H, D, L), dtype=ts[0].dtype, device=ts[0].device)
    if out.numel():
        scratch(out)  # a launch plan allocates its own (written by this launch, which it replays)
        xs = [*ts, ts[0], ts[0]][:3]
        args = (*xs, out, *(s for x in xs for s in x.stride()), H, L, D)
        options = dict(T=len(ts), BLOCK_L=block_l, BLOCK_D=block_d, GDC=signal, SIGMA=sigma, num_warps=warps)
        record(_direct.run(_l_major_copy_kernel, grid, args, options), grid, args)  # its key, for a plan
    return [y.transpose(2, 3) for y in out.unbind(0)]
