"""The candidates of the tuning sweep (``bench/tune.py``) and how its winners become ``tuned.json`` entries.

A candidate is a dict in the spelling of a ``tuned.json`` entry (``crossfuse._tuning`` reads them):
``kind``, ``n`` and ``dtype`` with the launch fields for the layer norm; ``kind``, ``d``, ``causal`` with
the tiles for attention. Three keys steer the sweep only: ``many_only`` (time a layer-norm candidate at
the many-rows shape alone), ``long_rows`` (at 1000 and 4096 rows of N, and 16384 of 32768) and ``short``
(time an attention candidate at a short sequence too, so that it can win the short-sequence entry).
Nothing here needs a GPU; :func:`code_tables` and :func:`regime` import the ops (and so Triton).
"""

from __future__ import annotations

import csv
import itertools
import json
import math

LN_NS = (1024, 2048, 4096, 8192, 16384)
LN_NARROW_NS = (64, 128, 256, 512)  # rows a warp or a few cover: many rows a tile
# rows past FUSED_MAX_N: chunked forwards, split or grouped backwards; the longest first (as float32 first
# in ln_long_candidates), where a budget's cut leaves the others out
LN_LONG_NS = (65536, 32768)
LN_DTYPES = ("bfloat16", "float32")
# a candidate's keys that steer the sweep (see the module's docstring), never a tuned.json entry's
STEERING = ("many_only", "long_rows", "short")
ATTN_DS = (64, 128)
# the groups of candidates ``bench/tune.py --only`` picks from
GROUPS = (
    "ln",
    "ln-split",
    "ln-chunked",
    "ln-unroll",
    "ln-shifted",
    "ln-tma",
    "ln-coop",
    "ln-fwd",
    "ln-prefetch",
    "ln-fwd-params",
    "ln-prefetch-wide",
    "ln-narrow",
    "ln-long",
    "attn",
    "attn128",
    "attn-fp32",
    "attn-pairs",
    "attn-fp32-fwd",
    "attn-tma",
    "attn-dims",
    "attn-fp32-dims",
)
ATTN_OTHER_DS = (16, 32, 256)  # the head dims the ``attn`` group leaves to the rule
# float32's head dims past the Gluon kernels' (D <= 64): Triton's kernels, on tiles of the rule unless tuned
ATTN_FP32_DS = (128, 256)
# shared memory a block may take on the H100 and the H200 (227 KB): the float32 candidates past it are
# not compiled
MAX_SHARED = 232448


def _row_tiles(n: int, block_ms, epts, warp_options, max_tile: int, min_tile: int = 1024):
    """(block_m, elements per thread per tensor, warps) of whole-row tiles of ``block_m`` rows of ``n``
    between ``min_tile`` and ``max_tile`` elements, whose warp count is one of ``warp_options``."""
    for bm in block_ms:
        tile = bm * n
        if not min_tile <= tile <= max_tile:
            continue
        for ept in epts:
            warps = tile // (32 * ept)
            if warps in warp_options:
                yield bm, ept, warps


def ln_candidates(quick: bool) -> list[dict]:
    out = []
    for n in LN_NS[:2] if quick else LN_NS:
        for dtype in LN_DTYPES:
            for bm in (1, 2, 4, 8, 16):
                for _, ept, warps in _row_tiles(n, (bm,), (8, 16, 32), (1, 2, 4, 8, 16, 32), 32768):
                    out.append(dict(kind="fwd", n=n, dtype=dtype, block_m=bm, num_warps=warps, pps=0))
                    if ept == 16 and not quick:  # the persistent forward
                        for pps in (4, 8):
                            out.append(dict(kind="fwd", n=n, dtype=dtype, block_m=bm, num_warps=warps,
                                            pps=pps))  # fmt: skip
                for _, _, warps in _row_tiles(n, (bm,), (4, 8, 16), (2, 4, 8, 16, 32), 16384):
                    for pps in (1, 2, 4, 8):
                        out.append(dict(kind="bwd", n=n, dtype=dtype, block_m=bm, num_warps=warps, pps=pps))
            for bn in (1024, 2048, 4096, 8192):  # the chunked forward: three passes over chunks of the row
                if bn < n and n >= 4096:
                    for warps in (4, 8, 16, 32):
                        if bn // (32 * warps) < 2:  # at least two elements per thread
                            continue
                        for unroll in (1, 2):
                            out.append(dict(kind="fwd", n=n, dtype=dtype, block_m=1, block_n=bn,
                                            num_warps=warps, pps=0, unroll=unroll))  # fmt: skip
            if n >= 8192:  # the split backward: row sums first, then column chunks of several rows
                for bn in (1024, 2048):
                    for bm in (2, 4, 8):
                        for warps in (4, 8):
                            for pps in (1, 4):
                                out.append(dict(kind="bwd", n=n, dtype=dtype, block_m=bm, block_n=bn,
                                                num_warps=warps, pps=pps))  # fmt: skip
    return out


def ln_unroll_candidates() -> list[dict]:
    """Persistent loops unrolled (two row tiles per iteration: the second tile's loads issue before the
    first tile's reductions) against the same loops not unrolled, N <= 4096, timed at many rows only."""
    out = []
    for n in (1024, 2048, 4096):
        for dtype in LN_DTYPES:
            for bm, _, warps in _row_tiles(n, (1, 2, 4), (4, 8, 16), (1, 2, 4, 8, 16), 1 << 30, min_tile=0):
                base = dict(n=n, dtype=dtype, block_m=bm, num_warps=warps, many_only=True)
                for unroll in (1, 2):
                    for pps in (1, 2, 4, 8):
                        out.append(dict(base, kind="bwd", pps=pps, unroll=unroll))
                    for pps in (2, 4, 8):
                        out.append(dict(base, kind="fwd", pps=pps, unroll=unroll))
                out.append(dict(base, kind="fwd", pps=0))
    return out


def ln_prefetch_candidates(pps_options=(1, 2, 4)) -> list[dict]:
    """Persistent loops that load the next row tile before reducing their own (``prefetch``): the
    forward and the fused backward with the whole row in one tile, and the split backward of long rows."""
    out = []
    for n in LN_NS:
        for dtype in LN_DTYPES:
            for bm in (1, 2, 4, 8):
                for kind, epts in (("fwd", (8, 16, 32)), ("bwd", (4, 8, 16))):
                    if kind == "bwd" and n > 8192:
                        continue
                    for _, _, warps in _row_tiles(n, (bm,), epts, (2, 4, 8, 16, 32), 16384):
                        for pps in pps_options:
                            base = dict(n=n, dtype=dtype, block_m=bm, num_warps=warps, pps=pps)
                            out.append(dict(base, kind=kind, prefetch=True))
            if n >= 8192:
                for bn in (1024, 2048):
                    for bm in (2, 4, 8):
                        for warps in (4, 8):
                            for pps in pps_options:
                                out.append(dict(kind="bwd", n=n, dtype=dtype, block_m=bm, block_n=bn,
                                                num_warps=warps, pps=pps, prefetch=True))  # fmt: skip
    return out


def ln_narrow_candidates() -> list[dict]:
    """Rows of 64 to 512 elements, whose tiles hold many rows: one program per tile and persistent
    forwards, persistent backwards through pointers and through tensor descriptors."""
    out = []
    for n in LN_NARROW_NS:
        for dtype in LN_DTYPES:
            bms = tuple(1 << k for k in range(10))
            for bm, ept, warps in _row_tiles(n, bms, (8, 16), (1, 2, 4, 8, 16), 32768, min_tile=512):
                base = dict(kind="fwd", n=n, dtype=dtype, block_m=bm, num_warps=warps)
                out.append(dict(base, pps=0))
                if ept == 16:
                    out += [dict(base, pps=pps, prefetch=True) for pps in (4, 8)]
            for bm, _, warps in _row_tiles(n, bms, (4, 8, 16), (2, 4, 8, 16), 16384, min_tile=512):
                base = dict(kind="bwd", n=n, dtype=dtype, block_m=bm, num_warps=warps)
                out += [dict(base, pps=pps) for pps in (1, 2, 4)]
                out += [dict(base, pps=pps, tma_stages=3) for pps in (1, 2)]
    return out


def ln_tma_candidates() -> list[dict]:
    """Whole-row persistent kernels reading through tensor descriptors (``tma_stages``: the copy engine
    fills 2 or 3 shared-memory buffers), forward and backward, every N of the tables."""
    out = []
    for n in LN_NS:
        for dtype in LN_DTYPES:
            for bm, _, warps in _row_tiles(n, (1, 2, 4, 8), (8, 16), (2, 4, 8, 16, 32), 16384):
                for stages in (2, 3):
                    base = dict(n=n, dtype=dtype, block_m=bm, num_warps=warps, tma_stages=stages)
                    for pps in (1, 2, 4):
                        out.append(dict(base, kind="bwd", pps=pps))
                    for pps in (1, 2, 4, 8):
                        out.append(dict(base, kind="fwd", pps=pps))
    return out


def ln_long_candidates() -> list[dict]:
    """Rows past FUSED_MAX_N (N = 32768 and 65536, which the tables key as such): the chunked forward,
    plain or in two passes (``shifted``); the split, cooperative and grouped Gluon backwards; the rule's
    configurations among them. Timed at 1000 and 4096 rows, and 16384 for N = 32768 (``long_rows``)."""
    out = []
    for n in LN_LONG_NS:
        for dtype in reversed(LN_DTYPES):
            base = dict(n=n, dtype=dtype, long_rows=True)
            flags = ({}, {"unroll": 2}, {"shifted": True}, {"unroll": 2, "shifted": True})
            for bn, warps, extra in itertools.product((4096, 8192, 16384), (8, 16, 32), flags):
                if bn // (32 * warps) >= 4:  # defaults left out: one spelling of each configuration
                    out.append(dict(base, kind="fwd", block_m=1, block_n=bn, num_warps=warps, pps=0, **extra))
            for bm, bn, warps, pps in itertools.product((2, 4), (2048, 4096), (4, 8), (1, 2)):
                split = dict(base, kind="bwd", block_m=bm, block_n=bn, num_warps=warps, pps=pps)
                out += [split, dict(split, prefetch=True)]
            for bm, bn, warps in itertools.product((1, 2), (4096, 8192), (8, 16)):
                out.append(dict(base, kind="bwd", block_m=bm, block_n=bn, num_warps=warps, pps=1,
                                prefetch=True, coop=True))  # fmt: skip
            for slices, warps, pps, (stages, lag) in itertools.product((8, 16, 32), (2, 4), (2, 4),
                                                                       ((3, 1), (4, 2))):  # fmt: skip
                out.append(dict(base, kind="bwd", block_m=1, num_warps=warps, pps=pps, tma_stages=stages,
                                smem_rows=True, slices=slices, lag=lag, paired=True))  # fmt: skip
    return out


def ln_coop_candidates() -> list[dict]:
    """The cooperative backward of long rows (``coop``: column slabs of one row group exchange their row
    sums and wait for each other, x and dy read once), N = 8192 and 16384, against the code's entries."""
    out = []
    for n in (8192, 16384):
        for dtype in LN_DTYPES:
            for bn in (1024, 2048, 4096):
                for bm, _, warps in _row_tiles(bn, (1, 2, 4), (8, 16), (2, 4, 8, 16), 16384):
                    for pps in (1, 2, 4):
                        for prefetch in (False, True):
                            c = dict(kind="bwd", n=n, dtype=dtype, block_m=bm, block_n=bn, num_warps=warps,
                                     pps=pps, coop=True)  # fmt: skip
                            out.append(dict(c, prefetch=True) if prefetch else c)
    return out


def merged(tables) -> dict:
    """One table of ``tables`` read first to last: each key's entry from the first table that has it."""
    out = {}
    for table in reversed(tables):
        out.update(table)
    return out


def code_tables(card=None) -> dict:
    """The configurations in the code (the tables of both ops ``card`` reads, see their ``tables_for``;
    the first table with a key gives its entry) as ``tuned.json`` entries, for ``--base code``: this run's
    candidates must beat them in the same run."""
    from crossfuse.ops import layer_norm as ln
    from crossfuse.ops import relu_attention as ra

    names = {2: "bfloat16", 4: "float32"}
    out = {}
    for (kind, esize, n, many), c in merged(ln.tables_for(card)).items():
        rows = "many" if many else "few"
        entry = dict(kind=kind, n=n, dtype=names[esize], block_m=c.block_m, num_warps=c.num_warps,
                     pps=c.programs_per_sm, rows=rows)  # fmt: skip
        if c.block_n != n:
            entry["block_n"] = c.block_n
        if c.unroll != 1:
            entry["unroll"] = c.unroll
        if c.prefetch:
            entry["prefetch"] = True
        if c.keep_params:
            entry["keep_params"] = True
        if c.shifted:
            entry["shifted"] = True
        if c.tma_stages:
            entry["tma_stages"] = c.tma_stages
        if c.coop:
            entry["coop"] = True
        if c.smem_rows:
            entry["smem_rows"] = True
        if c.slices > 1:
            entry["slices"] = c.slices
            entry["lag"] = c.lag
        if c.paired:
            entry["paired"] = True
        out[f"ln/{kind}/{names[esize]}/{n}/{rows}"] = entry
    for (kind, d, esize, causal, long), c in merged(ra.tables_for(card)).items():
        length = "long" if long else "short"
        out[f"attn/{kind}/{names[esize]}/{d}/{causal}/{length}"] = dict(
            kind=kind, d=d, causal=causal, dtype=names[esize], block_m=c.block_m, block_n=c.block_n,
            num_warps=c.num_warps, num_stages=c.num_stages, length=length,
        )  # fmt: skip
        if c.tma:
            out[f"attn/{kind}/{names[esize]}/{d}/{causal}/{length}"]["tma"] = True
    return out


def _attn(kind, d, causal, bm, bn, warps, stages) -> dict:
    return dict(kind=kind, d=d, causal=causal, block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)


def attn_candidates(quick: bool, ds=ATTN_DS, dtype="bfloat16") -> list[dict]:
    out = []
    for d in ds:
        for causal in (False, True):
            for bm, bn in ((64, 32), (64, 64), (128, 32), (128, 64), (128, 128)):
                for warps in (4, 8):
                    for stages in (2, 3, 4) if dtype != "float32" else (1, 2, 3):
                        out.append(_attn("fwd", d, causal, bm, bn, warps, stages))
            for bm, bn in ((16, 64), (32, 64), (64, 64), (16, 128), (32, 128), (64, 128)):
                for warps in (4, 8):
                    for stages in (2, 3):
                        out.append(_attn("dkdv", d, causal, bm, bn, warps, stages))
            for bm, bn in ((64, 16), (64, 32), (64, 64), (128, 16), (128, 32), (128, 64)):
                for warps in (4, 8):
                    for stages in (2, 3):
                        out.append(_attn("dq", d, causal, bm, bn, warps, stages))
    if dtype != "bfloat16":
        out = [dict(c, dtype=dtype) for c in out]
    if quick:
        out = out[::9]
    return out


def attn_fp32_dims_candidates(ds=ATTN_FP32_DS, max_shared: int = MAX_SHARED) -> list[dict]:
    """float32 (tf32 dots) at D = 128 and 256: rows of 512 bytes and more, so smaller tiles than the
    16-bit sweep's, those whose shared memory (:func:`..ops.relu_attention.config.shared_bytes`) fits
    ``max_shared``; each timed at a long and two short shapes (:func:`bench.tune.attn_shapes`)."""
    from ..ops.relu_attention.config import AttnConfig, shared_bytes

    tiles = {
        "fwd": ((32, 32), (64, 16), (64, 32), (64, 64), (128, 32), (128, 64)),
        "dkdv": ((16, 32), (32, 32), (16, 64), (32, 64), (64, 64), (16, 128), (32, 128)),
        "dq": ((32, 16), (32, 32), (64, 16), (64, 32), (64, 64), (128, 16), (128, 32)),
    }
    return [dict(_attn(kind, d, causal, bm, bn, warps, stages), dtype="float32", short=True)
            for d, causal, kind, bm, bn, warps, stages in _attn_grid(ds, tiles, lambda kind: (2, 3))
            if shared_bytes(kind, d, 4, AttnConfig(bm, bn, warps, stages)) <= max_shared]


def _attn_grid(ds, tiles: dict, stages_of):
    """``(d, causal, kind, block_m, block_n, warps, stages)`` of every head dim of ``ds``, causal or not,
    every kind's tiles of ``tiles`` (kind: its (block_m, block_n) pairs), 4 and 8 warps, and the stages
    ``stages_of(kind)`` gives."""
    for d in ds:
        for causal in (False, True):
            for kind, kind_tiles in tiles.items():
                for bm, bn in kind_tiles:
                    for warps in (4, 8):
                        for stages in stages_of(kind):
                            yield d, causal, kind, bm, bn, warps, stages


def attn_tma_candidates() -> list[dict]:
    """bf16 kernels reading through tensor descriptors (TMA), D=64 and 128 at both lengths (16k tokens).
    Triton's warp specialization of their loops is not offered: it gave wrong results on the H200."""
    tiles = {
        "fwd": ((64, 64), (128, 32), (128, 64), (128, 128)),
        "dkdv": ((32, 64), (64, 64), (32, 128), (64, 128)),
        "dq": ((64, 32), (64, 64), (128, 32), (128, 64)),
    }
    stages_of = lambda kind: (3,) if kind == "fwd" else (2, 3, 4)  # noqa: E731
    return [dict(_attn(kind, d, causal, bm, bn, warps, stages), tma=True, short=True)
            for d, causal, kind, bm, bn, warps, stages in _attn_grid(ATTN_DS, tiles, stages_of)]


def of_kind(cands: list[dict], kind: str) -> list[dict]:
    """The candidates of ``--kind``: ``bwd`` is every backward candidate, the layer norm's and the
    attention's (its paired backward, and its dK/dV and dQ kernels, each timed in the whole backward)."""
    kinds = {"bwd", "dkdv", "dq"} if kind == "bwd" else {kind}
    return [c for c in cands if c.get("kind") in kinds]


def pair_candidates(paths: str, top: int = 5) -> list[dict]:
    """The backward as a pair: the ``top`` dK/dV and dQ configurations of earlier sweeps (``paths``, their
    tuning.csv files, comma-separated; each was timed with the other kernel at its default) combined, to
    be timed together."""
    rows = []
    for path in paths.split(","):
        with open(path, newline="") as f:
            rows += [r for r in csv.DictReader(f) if r.get("d") and r["status"] == "ok" and r["rate"]]
    out = []
    for d, dtype, causal in sorted({(int(r["d"]), r.get("dtype") or "bfloat16", r["causal"]) for r in rows}):
        tops = {}
        for kind in ("dkdv", "dq"):
            mine = [
                r
                for r in rows
                if r["kind"] == kind
                and int(r["d"]) == d
                and r["causal"] == causal
                and (r.get("dtype") or "bfloat16") == dtype
                and int(r["shape"].split("x")[2]) > 2048
            ]
            mine.sort(key=lambda r: -float(r["rate"]))
            tops[kind] = [
                [int(r[k]) for k in ("block_m", "block_n", "num_warps", "num_stages")] for r in mine[:top]
            ]
        for a in tops["dkdv"]:
            for b in tops["dq"]:
                c = dict(kind="bwd", d=d, causal=causal == "True", dkdv=a, dq=b, short=True)
                out.append(c if dtype == "bfloat16" else dict(c, dtype=dtype))
    return out


def base_candidates(base: dict, cands: list[dict]) -> list[dict]:
    """The entries of an earlier tuned.json whose (kind, dtype, N or D, causal) this run tunes, as
    candidates timed at the same shapes as this run's own candidates for that key."""

    def meta(c) -> tuple:  # an attention pair's flag, not the layer norm's paired groups
        return ("score", "rows", "length") + (() if "n" in c else ("paired",))

    def ident(c):
        return (c["kind"], c.get("dtype", "bfloat16"), c.get("n"), c.get("d"), c.get("causal"))

    flags = {}
    for c in cands:
        if c["kind"] != "bwd" or "n" in c:  # attention pairs are split into dkdv/dq entries below
            flags.setdefault(ident(c), {k: c[k] for k in STEERING if k in c})
        else:
            for kind in ("dkdv", "dq"):
                flags.setdefault(ident(dict(c, kind=kind)), {"short": True} if c.get("short") else {})
    out = []
    for entry in base.values():
        c = {k: v for k, v in entry.items() if k not in meta(entry)}
        if ident(c) in flags:
            out.append(dict(c, **flags[ident(c)]))
    return out


def candidates(groups: set[str], quick: bool = False, pairs_from: str | None = None) -> list[dict]:
    """The candidates of the chosen ``groups`` (of :data:`GROUPS`), in order, duplicates included (groups
    may overlap); ``pairs_from``: the ``tuning.csv`` files the ``attn-pairs`` group pairs from."""
    unknown = set(groups) - set(GROUPS)
    if unknown:
        raise ValueError(f"unknown groups {sorted(unknown)}; known: {', '.join(GROUPS)}")
    cands = []
    ln_all = ln_candidates(quick)
    if "ln" in groups:
        cands += ln_all
    if "ln-split" in groups:  # the backward of long rows: fused and split candidates side by side
        cands += [c for c in ln_all if c["kind"] == "bwd" and c["n"] >= 8192]
    if "ln-fwd" in groups:
        cands += [c for c in ln_all if c["kind"] == "fwd"]
    if "ln-chunked" in groups:  # the forward of long rows: one-tile and chunked candidates side by side
        cands += [c for c in ln_all if c["kind"] == "fwd" and c["n"] >= 4096]
    if "ln-shifted" in groups:  # the chunked forward in two passes (sums about a shift)
        chunked = [c for c in ln_all if c["kind"] == "fwd" and c["n"] >= 4096 and "block_n" in c]
        cands += [dict(c, shifted=True) for c in chunked]
    if "ln-tma" in groups:
        cands += ln_tma_candidates()
    if "ln-coop" in groups:
        cands += ln_coop_candidates()
    if "ln-unroll" in groups:
        cands += ln_unroll_candidates()
    if "ln-prefetch" in groups:
        cands += ln_prefetch_candidates()
    if "ln-narrow" in groups:
        cands += ln_narrow_candidates()
    if "ln-long" in groups:
        cands += ln_long_candidates()
    if "ln-prefetch-wide" in groups:  # more programs per SM than ln-prefetch
        cands += ln_prefetch_candidates(pps_options=(8, 16))
    if "ln-fwd-params" in groups:  # one-tile and prefetching forwards with weight and bias loaded first
        one_tile = [c for c in ln_all if c["kind"] == "fwd" and c["pps"] == 0 and "block_n" not in c]
        prefetching = [c for c in ln_prefetch_candidates() if c["kind"] == "fwd"]
        cands += [dict(c, keep_params=True) for c in one_tile + prefetching]
    if "attn" in groups:
        cands += attn_candidates(quick)
    if "attn-dims" in groups:  # the other head dims, each length its own winner
        cands += [dict(c, short=True) for c in attn_candidates(quick, ds=ATTN_OTHER_DS)]
    if "attn128" in groups:  # D=128 at two lengths, each its own winner
        cands += [dict(c, short=True) for c in attn_candidates(quick, ds=(128,))]
    if "attn-fp32" in groups:  # float32 (tf32 dots) at the seed's shapes, D=64, two lengths
        cands += [dict(c, short=True) for c in attn_candidates(quick, ds=(64,), dtype="float32")]
    if "attn-fp32-fwd" in groups:  # the float32 forward alone (its value tiles stream from a transposed copy)
        fp32 = attn_candidates(quick, ds=(64,), dtype="float32")
        fp32 += [dict(c, num_stages=4) for c in fp32 if c["num_stages"] == 3]
        cands += [dict(c, short=True) for c in fp32 if c["kind"] == "fwd"]
    if "attn-tma" in groups:
        cands += attn_tma_candidates()
    if "attn-fp32-dims" in groups:  # float32 at D = 128 and 256, each length its own winner
        cands += attn_fp32_dims_candidates()
    if "attn-pairs" in groups:
        if not pairs_from:
            raise ValueError("the group attn-pairs needs pairs_from (tune.py --pairs-from TUNING_CSV)")
        cands += pair_candidates(pairs_from)
    return cands


def regime(c: dict, shape) -> str:
    """The table regime a timed shape stands for: few/many rows (ln), short/long sequences (attention),
    by the thresholds the ops use to pick a table entry."""
    from crossfuse.ops import layer_norm as ln
    from crossfuse.ops import relu_attention as ra

    if "n" in c:
        return "many" if shape[0] > ln.MANY_ROWS else "few"
    return "short" if shape[2] <= ra.SHORT_L else "long"


def winners(rows: list[dict]) -> dict[str, tuple[float, dict]]:
    """``{tuned.json key: (rate, entry)}``: the fastest candidate per key and regime of the timed ``rows``
    (each timed shape stands for one regime of the tables); where a regime has several shapes (1000 and
    4096 rows of a long row, two short sequences), the best geometric mean of a candidate's rates over
    them, among the candidates timed at as many of them as any (a budget may cut a candidate's shapes);
    an attention pair becomes one entry per kernel, unless a single-kernel candidate (from the base)
    timed as fast."""
    rates: dict[str, dict[str, tuple[dict, list[float]]]] = {}  # key -> candidate -> (entry, rates)
    for r in rows:
        if r["status"] != "ok" or not r["rate"]:
            continue
        c = {k: r[k] for k in r if k not in ("shape", "ms", "rate", "status", *STEERING)}
        shape = tuple(int(x) for x in r["shape"].split("x"))
        reg = regime(c, shape)
        if "n" in c:
            key = f"ln/{c['kind']}/{c['dtype']}/{c['n']}/{reg}"
            c["rows"] = reg
        else:
            key = f"attn/{c['kind']}/{c.get('dtype', 'bfloat16')}/{c['d']}/{c['causal']}/{reg}"
            c["length"] = reg
        rates.setdefault(key, {}).setdefault(json.dumps(c, sort_keys=True), (c, []))[1].append(r["rate"])
    best: dict[str, tuple[float, dict]] = {}
    for key, per in rates.items():
        most = max(len(v) for _, v in per.values())
        for c, v in per.values():
            if len(v) == most:
                rate = math.prod(v) ** (1 / len(v))
                if key not in best or rate > best[key][0]:
                    best[key] = (rate, c)
    for key in [k for k in best if k.startswith("attn/bwd/")]:  # a pair: one entry per kernel
        rate, c = best.pop(key)
        if any(best.get(key.replace("/bwd/", f"/{kind}/"), (0.0,))[0] >= rate for kind in ("dkdv", "dq")):
            continue  # a single-kernel candidate (from --base) timed as fast as the best pair
        for kind in ("dkdv", "dq"):
            bm, bn, warps, stages = json.loads(c[kind]) if isinstance(c[kind], str) else c[kind]
            entry = {k: v for k, v in c.items() if k not in ("dkdv", "dq")}
            entry.update(kind=kind, block_m=bm, block_n=bn, num_warps=warps, num_stages=stages, paired=True)
            best[key.replace("/bwd/", f"/{kind}/")] = (rate, entry)
    return best
