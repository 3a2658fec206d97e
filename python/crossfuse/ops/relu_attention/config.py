"""Typed launch configurations of the ReLU attention and the rules that choose them.

Every choice of tiles, warps, stages and kernel variant the launchers make is made here, from the
tensors' shapes and dtypes and the flags: :func:`attention_config` (Triton kernels, tuned tables
``TABLES``: ``TUNED_H100``, ``TUNED_H200``), ``TF32_FWD`` and ``TF32_BWD`` (the float32 Gluon kernels),
and the small rules ``_fold``, ``_peel``, ``_causal_order``, ``_relu_cvt`` and ``_tf32_copies``.
:class:`Choices` lets a caller (tests, probes, ``bench/tune.py``) fix any of them explicitly instead of
the rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from ... import _tuning
from .._runtime.device import Card, first_entry, tables_in_order

HEAD_DIMS = (16, 32, 64, 128, 256)
LAYOUTS = ("bhld", "blhd")

# CUDA's limit on a grid's second axis, where every attention kernel puts the (batch, head) pairs
MAX_GRID_1 = 65535


@dataclass(frozen=True)
class AttnConfig:
    """Tiles of one Triton attention kernel (``tuned.json``'s ``attn/`` entries spell the same fields)."""

    block_m: int  # query rows per tile
    block_n: int  # key rows per tile
    num_warps: int
    num_stages: int
    tma: bool = False  # tensor descriptors (the *_tma_kernel's) where _tma_usable allows, else pointers


# the interpreter runs tiles as numpy arrays: few, large programs are fastest
INTERPRETER_CONFIG = AttnConfig(32, 32, 4, 1)

# Sequences up to SHORT_L use the "short" entries of the tables where there are any: with 16k tokens a
# short sequence has many (batch, head) pairs and few blocks per pair, so its fastest tiles can differ.
SHORT_L = 2048

# Measured on the H200 by bench/tune.py: bf16 at 16k tokens (D=64 and D=128 at L=4096, "long", and
# L=1024, "short"; each backward kernel scored as the whole backward, 2.5x the forward's FLOPs, with the
# other kernel at its default); float32 (tf32 dots, reading the copies of _tf32_copies) at B=4, H=16,
# L=4096 (long) and L=1024 (short), the non-causal ones once _peel had removed their serialized
# products, the short causal dK/dV once _fold gave its programs two blocks each. (kind, D, element bytes,
# causal, long sequence) -> config (float16 shares the 2-byte rows). A missing entry falls back to the
# other length's entry, then to the rule in attention_config.
Key = tuple[str, int, int, bool, bool]
TUNED_H200: dict[Key, AttnConfig] = {
    # bf16 kernels reading through tensor descriptors (tma=True) won these keys (the pointer kernel's best
    # in the same sweep in brackets); the others keep the pointer kernels
    ("dkdv", 64, 2, False, True): AttnConfig(64, 64, 4, 3, tma=True),  # 471 TFLOP/s (451)
    ("dkdv", 64, 2, False, False): AttnConfig(64, 64, 4, 3, tma=True),  # 407 TFLOP/s (388)
    ("dkdv", 64, 2, True, True): AttnConfig(64, 64, 4, 3, tma=True),  # 443 TFLOP/s (387)
    ("dkdv", 64, 2, True, False): AttnConfig(32, 64, 4, 3, tma=True),  # 315 TFLOP/s (296)
    ("dq", 64, 2, False, True): AttnConfig(128, 64, 8, 3, tma=True),  # 484 TFLOP/s (441)
    ("dq", 64, 2, False, False): AttnConfig(128, 64, 8, 3, tma=True),  # 428 TFLOP/s (387)
    ("dq", 64, 2, True, True): AttnConfig(128, 64, 4, 3, tma=True),  # 421 TFLOP/s (416)
    ("dq", 64, 2, True, False): AttnConfig(64, 64, 4, 3, tma=True),  # 309 TFLOP/s (297)
    # the forwards re-swept once the bf16 relu took one instruction a pair (the entry before, in brackets)
    ("fwd", 64, 2, False, True): AttnConfig(128, 64, 8, 4),  # 802 TFLOP/s (705)
    ("fwd", 64, 2, False, False): AttnConfig(128, 64, 4, 3, tma=True),  # 638 TFLOP/s (L=1024)
    ("fwd", 64, 2, True, True): AttnConfig(128, 64, 4, 3, tma=True),  # 699 TFLOP/s (682)
    ("fwd", 64, 2, True, False): AttnConfig(128, 64, 4, 3, tma=True),  # 435 TFLOP/s (423)
    # the descriptor kernel with 4 stages (192 KB of shared memory, still one program per SM): the whole
    # backward 1.014x, 1.016x, 1.036x the pointer kernel at L=1024, 4096, 16384
    ("dkdv", 128, 2, False, True): AttnConfig(64, 128, 8, 4, tma=True),  # 537 TFLOP/s bwd, L=16384
    ("dkdv", 128, 2, True, True): AttnConfig(64, 128, 8, 3, tma=True),  # 476 TFLOP/s (468)
    ("dkdv", 128, 2, True, False): AttnConfig(64, 64, 4, 2, tma=True),  # 340 TFLOP/s (332)
    ("dq", 128, 2, False, True): AttnConfig(128, 64, 8, 3, tma=True),  # 537 TFLOP/s (526)
    ("dq", 128, 2, False, False): AttnConfig(128, 64, 8, 3, tma=True),  # 439 TFLOP/s (429)
    ("dq", 128, 2, True, True): AttnConfig(128, 64, 8, 3, tma=True),  # 477 TFLOP/s (467)
    ("dq", 128, 2, True, False): AttnConfig(128, 32, 8, 3, tma=True),  # 337 TFLOP/s (330)
    # full D=128: the sweep's winner (128x64, 4 warps, 2 stages: 777 and 617 TFLOP/s) spills 324 bytes per
    # thread (sm_90 compile here) for 1-2% over these: kept out
    ("fwd", 128, 2, False, True): AttnConfig(64, 64, 4, 3),  # 765 TFLOP/s
    ("fwd", 128, 2, True, True): AttnConfig(64, 64, 4, 3, tma=True),  # 656 TFLOP/s (642)
    ("fwd", 128, 2, False, False): AttnConfig(64, 64, 4, 3),  # 610 TFLOP/s
    ("fwd", 128, 2, True, False): AttnConfig(64, 64, 4, 3, tma=True),  # 449 TFLOP/s (the same)
    ("dkdv", 64, 4, False, True): AttnConfig(32, 128, 8, 3),  # 173 TFLOP/s (with PEEL; 16x128: 162)
    ("dkdv", 64, 4, False, False): AttnConfig(32, 128, 8, 3),  # 113 TFLOP/s (with PEEL; 16x128: 110)
    ("dkdv", 64, 4, True, True): AttnConfig(64, 128, 8, 2),  # 149 TFLOP/s
    ("dkdv", 64, 4, True, False): AttnConfig(32, 128, 8, 3),  # 99 TFLOP/s (with FOLD; 32x64: 94)
    ("dq", 64, 4, False, True): AttnConfig(128, 64, 8, 3),  # 147 TFLOP/s
    ("dq", 64, 4, False, False): AttnConfig(128, 64, 8, 3),  # 104 TFLOP/s
    ("dq", 64, 4, True, True): AttnConfig(128, 64, 8, 3),  # 149 TFLOP/s
    ("dq", 64, 4, True, False): AttnConfig(128, 64, 8, 3),  # 69 TFLOP/s
    ("fwd", 64, 4, False, True): AttnConfig(64, 64, 4, 3),  # 270 TFLOP/s (with PEEL; 128x32: 255)
    ("fwd", 64, 4, False, False): AttnConfig(128, 32, 8, 4),  # 153 TFLOP/s
    ("fwd", 64, 4, True, True): AttnConfig(64, 64, 4, 3),  # 214 TFLOP/s
    ("fwd", 64, 4, True, False): AttnConfig(64, 64, 4, 3),  # 97 TFLOP/s
}

# The other head dims, bf16 (bench/tune.py --only attn-dims, on the H100: 16k tokens, 16 heads, L=4096
# and L=1024; each backward kernel scored as the whole backward with the other at the rule's tiles). The
# rule had taken 55 and 54 TFLOP/s for the D=256 backward (16x64 dK/dV tiles), 509 and 428 for its forward.
TUNED_H100: dict[Key, AttnConfig] = {
    ("dkdv", 16, 2, False, True): AttnConfig(64, 128, 4, 3),  # 276 TFLOP/s
    ("dkdv", 16, 2, False, False): AttnConfig(64, 64, 4, 3),  # 245 TFLOP/s
    ("dkdv", 16, 2, True, True): AttnConfig(64, 64, 4, 3),  # 230 TFLOP/s
    ("dkdv", 16, 2, True, False): AttnConfig(64, 64, 4, 3),  # 163 TFLOP/s
    ("dkdv", 32, 2, False, True): AttnConfig(64, 128, 4, 3),  # 442 TFLOP/s
    ("dkdv", 32, 2, False, False): AttnConfig(64, 128, 4, 3),  # 382 TFLOP/s
    ("dkdv", 32, 2, True, True): AttnConfig(64, 64, 4, 3),  # 356 TFLOP/s
    ("dkdv", 32, 2, True, False): AttnConfig(32, 64, 4, 3),  # 246 TFLOP/s
    ("dkdv", 256, 2, False, True): AttnConfig(64, 64, 8, 2),  # 280 TFLOP/s
    ("dkdv", 256, 2, False, False): AttnConfig(64, 64, 8, 3),  # 251 TFLOP/s
    ("dkdv", 256, 2, True, True): AttnConfig(64, 64, 8, 2),  # 246 TFLOP/s
    ("dkdv", 256, 2, True, False): AttnConfig(64, 64, 8, 2),  # 199 TFLOP/s
    ("dq", 16, 2, False, True): AttnConfig(128, 32, 4, 3),  # 270 TFLOP/s
    ("dq", 16, 2, False, False): AttnConfig(128, 32, 4, 3),  # 241 TFLOP/s
    ("dq", 16, 2, True, True): AttnConfig(128, 32, 4, 3),  # 220 TFLOP/s
    ("dq", 16, 2, True, False): AttnConfig(64, 32, 4, 3),  # 156 TFLOP/s
    ("dq", 32, 2, False, True): AttnConfig(128, 32, 4, 3),  # 413 TFLOP/s
    ("dq", 32, 2, False, False): AttnConfig(128, 32, 4, 3),  # 353 TFLOP/s
    ("dq", 32, 2, True, True): AttnConfig(64, 32, 4, 3),  # 349 TFLOP/s
    ("dq", 32, 2, True, False): AttnConfig(64, 32, 4, 3),  # 244 TFLOP/s
    ("dq", 256, 2, False, True): AttnConfig(128, 32, 8, 3),  # 58 TFLOP/s
    ("dq", 256, 2, False, False): AttnConfig(128, 32, 8, 3),  # 57 TFLOP/s
    ("dq", 256, 2, True, True): AttnConfig(128, 32, 8, 3),  # 52 TFLOP/s
    ("dq", 256, 2, True, False): AttnConfig(128, 32, 8, 3),  # 46 TFLOP/s
    ("fwd", 16, 2, False, True): AttnConfig(128, 64, 4, 4),  # 515 TFLOP/s
    ("fwd", 16, 2, False, False): AttnConfig(128, 64, 4, 4),  # 382 TFLOP/s
    ("fwd", 16, 2, True, True): AttnConfig(128, 64, 4, 4),  # 382 TFLOP/s
    ("fwd", 16, 2, True, False): AttnConfig(64, 64, 4, 4),  # 212 TFLOP/s
    ("fwd", 32, 2, False, True): AttnConfig(128, 128, 4, 3),  # 683 TFLOP/s
    ("fwd", 32, 2, False, False): AttnConfig(64, 64, 4, 4),  # 513 TFLOP/s
    ("fwd", 32, 2, True, True): AttnConfig(128, 64, 4, 3),  # 535 TFLOP/s
    ("fwd", 32, 2, True, False): AttnConfig(128, 64, 4, 4),  # 318 TFLOP/s
    ("fwd", 256, 2, False, True): AttnConfig(128, 32, 8, 3),  # 687 TFLOP/s
    ("fwd", 256, 2, False, False): AttnConfig(128, 32, 8, 3),  # 554 TFLOP/s
    ("fwd", 256, 2, True, True): AttnConfig(128, 32, 8, 3),  # 594 TFLOP/s
    ("fwd", 256, 2, True, False): AttnConfig(128, 32, 8, 3),  # 400 TFLOP/s
    # float32 at D=128 and 256 (Triton's kernels; the Gluon ones take D <= 64), bench/tune.py --only
    # attn-fp32-dims: long at B=2 H=8 L=4096, short at L=1000 with B=4 H=16 and with B=1 H=4 (the short
    # entry is the best geometric mean over both). Each backward kernel timed as the whole backward with
    # the other at the rule's tiles; the comments give that time over the rule's, long | short (4x16 · 1x4).
    # The causal D=128 dQ's short entry is the rule's (no candidate was faster).
    ("fwd", 128, 4, False, True): AttnConfig(64, 32, 4, 2),  # the rule: no candidate 1% faster
    ("fwd", 128, 4, True, True): AttnConfig(64, 32, 4, 2),  # the rule: no candidate 1% faster
    ("fwd", 128, 4, False, False): AttnConfig(128, 32, 8, 3),  # 0.865 · 0.923
    ("fwd", 128, 4, True, False): AttnConfig(128, 32, 8, 3),  # 0.734 · 0.827
    ("dkdv", 128, 4, False, True): AttnConfig(16, 128, 8, 3),  # 0.641
    ("dkdv", 128, 4, False, False): AttnConfig(16, 128, 8, 3),  # 0.428 · 0.734
    ("dkdv", 128, 4, True, True): AttnConfig(16, 128, 8, 3),  # 0.706
    ("dkdv", 128, 4, True, False): AttnConfig(16, 128, 8, 3),  # 0.596 · 0.812
    ("dq", 128, 4, False, True): AttnConfig(128, 32, 8, 2),  # 0.898
    ("dq", 128, 4, False, False): AttnConfig(128, 32, 8, 3),  # 0.971 · 0.964
    ("dq", 128, 4, True, True): AttnConfig(64, 32, 4, 3),  # 0.895
    ("fwd", 256, 4, False, True): AttnConfig(64, 16, 4, 3),  # 0.801
    ("fwd", 256, 4, True, True): AttnConfig(64, 16, 4, 3),  # 0.922
    ("fwd", 256, 4, False, False): AttnConfig(64, 32, 8, 2),  # 0.547 · 0.666
    ("fwd", 256, 4, True, False): AttnConfig(64, 32, 8, 2),  # 0.533 · 0.560
    ("dkdv", 256, 4, False, True): AttnConfig(16, 32, 4, 3),  # 0.853
    ("dkdv", 256, 4, True, True): AttnConfig(16, 32, 4, 3),  # 0.869
    ("dkdv", 256, 4, False, False): AttnConfig(16, 32, 8, 3),  # 0.763 · 0.769
    ("dkdv", 256, 4, True, False): AttnConfig(32, 32, 8, 2),  # 0.419 · 0.297
    ("dq", 256, 4, False, True): AttnConfig(64, 16, 4, 2),  # 0.766
    ("dq", 256, 4, True, True): AttnConfig(64, 16, 4, 2),  # 0.770
    ("dq", 256, 4, False, False): AttnConfig(32, 32, 8, 2),  # 0.981 · 0.962
    ("dq", 256, 4, True, False): AttnConfig(64, 16, 8, 3),  # 0.919 · 0.993
}

# by the model named in the driver's device name (crossfuse.ops._runtime.device.Card.model)
TABLES: dict[str, dict[Key, AttnConfig]] = {"H200": TUNED_H200, "H100": TUNED_H100}
# entries of CROSSFUSE_TUNED_CONFIGS (measured on the user's own card): first on every card
OVERRIDES: dict[Key, AttnConfig] = _tuning.attention_overrides(AttnConfig)


def tables_for(card: Card | None) -> tuple[dict[Key, AttnConfig], ...]:
    """The tables ``card`` reads, first to last (:func:`.._runtime.device.tables_in_order`): the user's
    overrides, its model's, the other models'; on a card of another architecture the overrides and then
    the rule fitted to its shared memory."""
    return tables_in_order(card, OVERRIDES, TABLES)


def shared_bytes(kind: str, d: int, esize: int, cfg: AttnConfig) -> int:
    """An estimate of the shared memory a kernel's tiles take: the operands its loop streams, one buffer
    per stage (the forward's and dQ's keys and values, dK/dV's queries and output gradients), and the
    tiles it keeps (the forward's queries; dQ's queries and output gradients; dK/dV's keys and values)."""
    if kind == "fwd":
        kept, streamed = cfg.block_m, 2 * cfg.block_n
    elif kind == "dq":
        kept, streamed = 2 * cfg.block_m, 2 * cfg.block_n
    else:
        kept, streamed = 2 * cfg.block_n, 2 * cfg.block_m
    return (kept + cfg.num_stages * streamed) * d * esize


def fit_shared(kind: str, d: int, esize: int, cfg: AttnConfig, max_shared: int) -> AttnConfig:
    """``cfg`` with fewer stages, then smaller streamed tiles, until :func:`shared_bytes` is within
    ``max_shared`` (keeping the tiles dividing each other, as the causal loops need)."""
    while shared_bytes(kind, d, esize, cfg) > max_shared:
        if cfg.num_stages > 1:
            cfg = dataclasses.replace(cfg, num_stages=cfg.num_stages - 1)
        elif kind == "dkdv" and cfg.block_m > 16:
            cfg = dataclasses.replace(cfg, block_m=cfg.block_m // 2)
        elif kind != "dkdv" and cfg.block_n > 16:
            cfg = dataclasses.replace(cfg, block_n=cfg.block_n // 2)
        else:
            break
    return cfg


def attention_config(
    kind: str, d: int, dtype: torch.dtype, causal: bool, interpreted: bool = False, length: int | None = None,
    card: Card | None = None,
) -> AttnConfig:
    """Tiles for ``kind`` in ``("fwd", "dkdv", "dq")`` on ``card`` (see :func:`tables_for`); ``length`` is
    max(Lq, Lk) when known. The first table with an entry for the length, or else for the other length,
    gives them; where none has, the rule, fitted to the shared memory of a card the tables do not serve.
    Causal kernels need BLOCK_M and BLOCK_N to divide each other (fwd/dq: BLOCK_N | BLOCK_M; dkdv:
    BLOCK_M | BLOCK_N)."""
    if interpreted:  # the interpreter runs tiles as numpy arrays: few, large programs are fastest
        return INTERPRETER_CONFIG
    esize = dtype.itemsize
    long = length is None or length > SHORT_L
    tuned = first_entry(tables_for(card), (kind, d, esize, causal), long)
    if tuned is not None:
        return tuned
    cfg = rule_config(kind, d, esize)
    if card is not None and not card.tabled:
        cfg = fit_shared(kind, d, esize, cfg, card.max_shared_mem)
    return cfg


def rule_config(kind: str, d: int, esize: int) -> AttnConfig:
    """The tiles where no table has an entry: smaller tiles and fewer stages as a row of q grows."""
    big = d * esize >= 256  # D=128 in 16 bits, D=64 in fp32, or larger
    if kind == "fwd":
        if d * esize >= 512:
            return AttnConfig(64, 32, 4, 2)
        return AttnConfig(128, 64, 8 if big else 4, 3)
    if kind == "dkdv":
        if d * esize >= 1024:  # D=256 in float32: its copies of q and dout (see _tf32_copies) need room
            return AttnConfig(16, 32, 4, 2)
        if d * esize >= 512:
            return AttnConfig(16, 64, 4, 2)
        return AttnConfig(32, 128 if not big else 64, 8 if big else 4, 3)
    if kind == "dq":
        if d * esize >= 1024:
            return AttnConfig(32, 16, 4, 2)
        if d * esize >= 512:
            return AttnConfig(64, 16, 4, 2)
        return AttnConfig(128 if not big else 64, 32, 8 if big else 4, 3)
    raise ValueError(f"kind must be 'fwd', 'dkdv' or 'dq', got {kind!r}")


@dataclass(frozen=True)
class Tf32Tiles:
    """Tiles of one float32 Gluon kernel (:mod:`.gluon_launch`)."""

    block_m: int  # query rows per tile (the forward's and the dQ kernel's warps: block_m // 16)
    block_n: int  # key rows per tile (the dK/dV kernel's warps: block_n // 16)
    stages: int  # shared-memory buffers of the ring the copy engine fills
    is_async: bool  # each product issued asynchronously, overlapping the elementwise work before the next
    trans: bool = False  # the kernel transposes its tiles of the operands summed over L itself: no copies


@dataclass(frozen=True)
class Tf32BwdTiles:
    """Tiles of the float32 Gluon backward's two kernels."""

    dkdv: Tf32Tiles
    dq: Tf32Tiles


# The float32 forward in Gluon: (causal, long sequence) -> tiles; where they do not divide the lengths (or
# the table has no entry), Triton's kernel runs. Measured on the H200 against Triton's float32 forward at
# B=4, H=16 (each with v's copy): 128x64 tiles on 8 warps with 2
# buffers, with v's tiles transposed in the kernel (trans), 1.447x at L=1024 full, 1.455x causal, 1.386x at
# L=2048 causal, 1.325x at L=4096 causal; at L=4096 full v's copy ran faster (1.359 against 1.269x), so
# the long full entry reads it. 64x64 tiles transposing on 4 warps ran 0.82-0.97x of the 128x64 ones; the
# asynchronous products 0.96-1.02x at 64x64 with 3 buffers and 0.75-0.81x at 128x64 with 2 (one program an
# SM at 180 registers).
TF32_FWD: Mapping[tuple[bool, bool], Tf32Tiles] = MappingProxyType({
    (False, False): Tf32Tiles(128, 64, 2, False, True),
    (False, True): Tf32Tiles(128, 64, 2, False, False),
    (True, False): Tf32Tiles(128, 64, 2, False, True),
    (True, True): Tf32Tiles(128, 64, 2, False, True),
})  # fmt: skip


# The float32 backward in Gluon: (causal, long sequence) -> the dK/dV kernel's and the dQ kernel's tiles;
# where they do not divide the lengths (or the table has no entry), Triton's kernels run. Measured on the
# H200 against Triton's float32 backward at B=4, H=16: the full rows' 32x64 dK/dV and 64x64 dQ tiles,
# asynchronous, reading copies in sigma's order, 1.368, 1.413, 1.403x (L = 1024, 2048, 4096); the
# causal rows with 128-key dK/dV tiles on 8 warps and both kernels transposing their tiles themselves
# 1.439, 1.366, 1.274x (the dK/dV kernel transposes two tiles a step: at the full rows, on 4 warps, it ran
# below the copies' 1.20-1.25x).
TF32_BWD: Mapping[tuple[bool, bool], Tf32BwdTiles] = MappingProxyType({
    (False, False): Tf32BwdTiles(Tf32Tiles(32, 64, 2, True), Tf32Tiles(64, 64, 2, True)),
    (False, True): Tf32BwdTiles(Tf32Tiles(32, 64, 2, True), Tf32Tiles(64, 64, 2, True)),
    (True, False): Tf32BwdTiles(Tf32Tiles(64, 128, 2, True, True), Tf32Tiles(64, 64, 2, True, True)),
    (True, True): Tf32BwdTiles(Tf32Tiles(64, 128, 2, True, True), Tf32Tiles(64, 64, 2, True, True)),
})  # fmt: skip

# Past LONGEST_L, the float32 backward's tiles on a card whose model has them here: causal -> tiles, tried
# before TF32_BWD's long entry (which runs where they do not divide the lengths). Measured on the H100 at
# B=4, H=16, D=64, the backward alone against TF32_BWD's long entry (GPU time, each candidate beside it in
# one process): the full rows' 64x128 dK/dV tiles with 3 buffers and 128x128 dQ tiles take 0.824x its time
# at L=8192, where it ran 1.23x slower than the quadratic rate of L=4096 (13.0 ms against 2.66), but 1.084x
# at L=4096, where the long entry stays. The causal rows' best, 128x128 dQ tiles, took 0.970x at L=8192,
# within a run's spread: not taken.
LONGEST_L = 4096
TF32_BWD_LONGEST: Mapping[str, Mapping[bool, Tf32BwdTiles]] = MappingProxyType({
    "H100": MappingProxyType({
        False: Tf32BwdTiles(Tf32Tiles(64, 128, 3, True), Tf32Tiles(128, 128, 2, True)),
    }),
})  # fmt: skip

# The fewest programs one group of heads of the Gluon kernels' causal launch order should have
# (gluon_launch.head_group): about a wave of them on an H200 (132 SMs, two programs each), so that the
# last group's blocks, heaviest first, keep every SM busy to the end.
GROUP_PROGRAMS = 256

L_MAJOR_TILE = (64, 64, 4)  # BLOCK_L, BLOCK_D, warps of the copy kernel with unit stride on L

# A 16-bit forward whose tiles of query rows leave SMs idle (few (batch, head) pairs and short sequences)
# takes these tiles where its own have more rows and D >= FEW_PROGRAMS_MIN_D: twice the programs, each half
# the rows. On the H100 at B1 H4 (bf16, GPU time against the table's tiles, one process): D=256 0.61-0.69x
# at L 1000 and 2048, 0.92-0.93x at L=77; D=64 0.84-0.89x; D=128 (whose tiles have 64 rows already)
# 1.00x. Below D=64 they lost where they changed anything (D=16 non-causal 1.13-1.21x, D=32 causal at
# L=2048 1.10x), so the rule leaves those. At B16 H16 L512-1024 (1024 programs, where the rule keeps the
# entry) the same tiles took 1.06-1.11x at D=256.
FEW_PROGRAMS_TILE = AttnConfig(64, 64, 4, 3)
FEW_PROGRAMS_MIN_D = 64


def few_programs(cfg: AttnConfig, programs: int, sms: int, tile: AttnConfig | None, d: int, esize: int,
                 card: Card | None) -> AttnConfig:  # fmt: skip
    """The forward's tiles ``cfg`` or, where its ``programs`` (query tiles times (batch, head) pairs) are
    fewer than the card's ``sms``, the head dim ``d`` at least FEW_PROGRAMS_MIN_D and ``tile`` has fewer
    rows, ``tile`` fitted to the card's shared memory (None: always ``cfg``)."""
    if tile is None or programs >= sms or d < FEW_PROGRAMS_MIN_D or cfg.block_m <= tile.block_m:
        return cfg
    return tile if card is None else fit_shared("fwd", d, esize, tile, card.max_shared_mem)


@dataclass(frozen=True, eq=False)
class Choices:
    """What the launchers would otherwise decide by rule, fixed by the caller (tests, probes, tuning).

    The defaults are the rules (``None``) and the module's tables. An instance is part of the launch
    plans' keys by identity (``eq=False``): calls with another instance never replay the default's plans.
    """

    # (causal, long sequence) -> the Gluon forward's tiles, and the same for the Gluon backward
    tf32_fwd: Mapping[tuple[bool, bool], Tf32Tiles] = field(default_factory=lambda: TF32_FWD)
    tf32_bwd: Mapping[tuple[bool, bool], Tf32BwdTiles] = field(default_factory=lambda: TF32_BWD)
    # causal -> the Gluon backward's tiles past LONGEST_L, tried first (None: the card's TF32_BWD_LONGEST)
    tf32_bwd_longest: Mapping[bool, Tf32BwdTiles] | None = None
    peel: bool | None = None  # the pointer kernels' PEEL (None: _peel)
    fold: bool | None = None  # the causal pointer kernels' FOLD (None: _fold)
    causal_order: tuple[int, int] | None = None  # the descriptor forward's (GROUP, FIRST) (_causal_order)
    gdc: bool | None = None  # chain the kernels by dependent launches (None: where the GPU allows)
    head_group: int | None = None  # the Gluon kernels' heads per group (None: gluon_launch.head_group)
    group_programs: int = GROUP_PROGRAMS  # the rule's programs per group of heads
    max_grid_1: int = MAX_GRID_1  # (batch, head) pairs per launch; more run as batch slices
    copy_tile: tuple[int, int, int] = L_MAJOR_TILE  # the copy kernel's BLOCK_L, BLOCK_D, warps
    # the 16-bit forward's tiles where its grid leaves SMs idle (few_programs; None: the table's tiles)
    few_programs_tile: AttnConfig | None = FEW_PROGRAMS_TILE
    planning: bool = True  # replay the launches of an earlier call with the same key (launch plans)


DEFAULT = Choices()


def tf32_bwd_tiles(choices: Choices, causal: bool, length: int, card: Card | None) -> list[Tf32BwdTiles]:
    """The float32 Gluon backward's tiles for sequences of ``length`` (max(Lq, Lk)) on ``card``, in the
    order to try them: the first whose tiles divide the lengths runs; none, Triton's kernels."""
    out = []
    if length > LONGEST_L:
        longest = choices.tf32_bwd_longest
        if longest is None:
            longest = TF32_BWD_LONGEST.get(card.model if card is not None else None, {})
        if causal in longest:
            out.append(longest[causal])
    tiles = choices.tf32_bwd.get((causal, length > SHORT_L))
    return [*out, tiles] if tiles is not None else out


def _relu_cvt(interp: bool, squared: bool, dtype: torch.dtype) -> bool:
    """Whether the kernels take relu's bf16 operands from ``_relu_to_bf16`` and apply ``scale`` to their
    outputs: compiled bfloat16 relu (not squared: relu(s)^2 has no one-instruction form)."""
    return not interp and not squared and dtype == torch.bfloat16


# The causal forward's last (batch, head) pairs, as many as hold this many bytes of keys and values, are
# ordered as one group (_block_order): the heaviest query blocks of all of them first, so that the kernel
# ends on light blocks instead of on the last pair's heavy ones. 16-bit D=64 sequences longer than
# SHORT_L only (on the H200 the D=64 forward 1.00-1.06x; D=128 0.95-1.01x, not used).
CAUSAL_TAIL_BYTES = 16 << 20


def _causal_order(k: torch.Tensor, causal: bool) -> tuple[int, int]:
    """``(GROUP, FIRST)`` of the descriptor forward's program order (see CAUSAL_TAIL_BYTES): the first
    FIRST pairs one after another, the last GROUP pairs as one group; ``(1, 0)`` is one pair after
    another."""
    B, H, Lk, D = k.shape
    if not causal or D != 64 or k.element_size() != 2 or Lk <= SHORT_L:
        return 1, 0
    group = max(1, min(B * H, CAUSAL_TAIL_BYTES // (2 * Lk * D * k.element_size())))
    return group, B * H - group


def _fold(dtype: torch.dtype, causal: bool) -> bool:
    """Whether the causal pointer kernels' programs each take two blocks (``FOLD``): the forward's and the
    dQ kernel's query blocks ``n-1-x`` and ``x``, the dK/dV kernel's key blocks ``x`` and ``n-1-x``, so
    that every program does the same work (n + 1 blocks' steps; the middle block of an odd n alone) where
    one block per program does 1 to n and the kernel ends on the heavy blocks that started last. float32
    only: on the H200 the float32 forward took 1.02-1.11x; the bf16 forward moved 0.95-1.02x, within its
    spread."""
    return causal and dtype == torch.float32


def _peel(dtype: torch.dtype, causal: bool) -> bool:
    """Whether a kernel's non-causal loop takes its first block in a loop of its own (``PEEL``): float32
    only. Compiled for sm_90 (Triton 3.6), the float32 kernels' non-causal loops, whose accumulators start
    at zero before the loop, make ptxas serialize their tf32 ``wgmma`` instructions (warning C7515:
    "non wgmma instructions defining accumulator registers of a wgmma between start and end of the
    pipeline stage"); with the first block in a loop of its own, the main loop starts from that loop's
    result and every float32 kernel compiles without it, as the causal ones (two loops) already did.
    The 16-bit kernels compile without the warning either way. Correct for any length (either loop may
    run no step)."""
    return dtype == torch.float32 and not causal


def _tf32_copies(dtype: torch.dtype, interp: bool) -> bool:
    """float32 dots run on tf32 tensor cores, which read both operands of a product K-major (summed
    dimension contiguous in memory). Products summed over L (``p @ v``; ``p^T @ dout``, ``ds^T @ q``,
    ``ds @ k`` in the backward) then need copies with unit stride on L: without them Triton transposes
    every tile with 4-byte copies into shared memory, at about half the speed. 16-bit types have
    transposing tensor-core loads and need none."""
    return dtype == torch.float32 and not interp
