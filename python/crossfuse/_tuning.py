"""Launch-configuration overrides from a tuning run (``bench/tune.py`` writes ``tuned.json``).

Set ``CROSSFUSE_TUNED_CONFIGS=/path/to/tuned.json`` to use configurations measured on your own GPU
instead of the built-in tables (measured on an H100 and an H200). Read once, when the op modules are imported.
"""

from __future__ import annotations

import functools
import json
import os

_ESIZE = {"bfloat16": 2, "float16": 2, "float32": 4}
_HEAD_DIMS = (16, 32, 64, 128, 256)  # crossfuse.ops.relu_attention.HEAD_DIMS (not imported: no Triton here)
_WARPS = (1, 2, 4, 8, 16, 32)


def _int_at_least(low: int):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _pow2(v) -> bool:
    return _int_at_least(1)(v) and v & (v - 1) == 0


def _where(key: str, origin: str) -> str:
    return f"{origin or 'tuned configs'}: entry {key!r}"


def _checked(key: str, c, origin: str, fields: dict) -> dict:
    """``c`` when it is an object whose ``fields`` (name: (test, what it must be); a name ending in ``?``
    is optional) pass; otherwise an error naming where the file came from, the entry and the field: an
    entry the launchers cannot use must not reach them (a causal attention entry whose tiles do not
    divide gives wrong results, not an error)."""
    where = _where(key, origin)
    if not isinstance(c, dict):
        raise RuntimeError(f"{where} must be an object, got {type(c).__name__}")
    for name, (test, what) in fields.items():
        optional = name.endswith("?")
        name = name.rstrip("?")
        if name not in c:
            if optional:
                continue
            raise RuntimeError(f"{where} has no {name!r} (as bench/tune.py writes)")
        if not test(c[name]):
            raise RuntimeError(f"{where}: {name} must be {what}, got {c[name]!r}")
    return c


_LN_FIELDS = {
    "kind": (lambda v: v in ("fwd", "bwd"), "'fwd' or 'bwd'"),
    "dtype": (lambda v: v in _ESIZE, f"one of {', '.join(_ESIZE)}"),
    "n": (_pow2, "a power of 2 (the row length's tile, as bench/tune.py keys them)"),
    "block_m": (_pow2, "a power of 2"),
    "block_n?": (_pow2, "a power of 2"),
    "num_warps": (lambda v: v in _WARPS, f"one of {_WARPS}"),
    "pps": (_int_at_least(0), "an int >= 0"),
    "rows?": (lambda v: v in ("few", "many"), "'few' or 'many'"),
}
_ATTN_FIELDS = {
    "kind": (lambda v: v in ("fwd", "dkdv", "dq"), "'fwd', 'dkdv' or 'dq'"),
    "d": (lambda v: v in _HEAD_DIMS, f"one of {_HEAD_DIMS}"),
    "dtype?": (lambda v: v in _ESIZE, f"one of {', '.join(_ESIZE)}"),
    "causal": (lambda v: isinstance(v, bool), "true or false"),
    "block_m": (lambda v: _pow2(v) and v >= 16, "a power of 2 >= 16"),
    "block_n": (lambda v: _pow2(v) and v >= 16, "a power of 2 >= 16"),
    "num_warps": (lambda v: v in _WARPS[:4], f"one of {_WARPS[:4]}"),
    "num_stages": (_int_at_least(1), "an int >= 1"),
    "length?": (lambda v: v in ("short", "long"), "'short' or 'long'"),
}


def _check_attention_tiles(key: str, c: dict, origin: str) -> None:
    """The causal loops need the tiles to divide each other (fwd and dq: block_n | block_m; dkdv:
    block_m | block_n); the built-in tables keep that for every entry, causal or not, and so must these."""
    m, n = c["block_m"], c["block_n"]
    ok = n % m == 0 if c["kind"] == "dkdv" else m % n == 0
    if not ok:
        rule = "block_m must divide block_n" if c["kind"] == "dkdv" else "block_n must divide block_m"
        raise RuntimeError(f"{_where(key, origin)}: {rule} (got {m} and {n})")


@functools.cache
def _entries() -> dict:
    path = os.environ.get("CROSSFUSE_TUNED_CONFIGS")
    return read_tuned(path, "CROSSFUSE_TUNED_CONFIGS=") if path else {}


def _origin() -> str:
    path = os.environ.get("CROSSFUSE_TUNED_CONFIGS")
    return f"CROSSFUSE_TUNED_CONFIGS={path!r}" if path else ""


def read_tuned(path: str, origin: str = "") -> dict:
    """The entries of a ``tuned.json`` (what ``bench/tune.py`` writes); an unreadable file is an error
    naming ``origin`` (where the path came from) and the path."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"{origin}{path!r} could not be read: {exc}") from exc
    if not isinstance(data, dict):
        raise RuntimeError(f"{origin}{path!r}: expected a JSON object as bench/tune.py writes")
    return data


def layer_norm_config(config_type, c: dict, programs_per_sm: int | None = None):
    """The launch configuration a ``tuned.json`` layer-norm entry (or a ``bench/tune.py`` candidate)
    spells; ``programs_per_sm`` replaces the entry's ``pps`` when given."""
    return config_type(
        c["block_m"], c.get("block_n", c["n"]), c["num_warps"],
        c["pps"] if programs_per_sm is None else programs_per_sm, unroll=c.get("unroll", 1),
        prefetch=bool(c.get("prefetch", False)), keep_params=bool(c.get("keep_params", False)),
        shifted=bool(c.get("shifted", False)), tma_stages=int(c.get("tma_stages", 0)),
        coop=bool(c.get("coop", False)), smem_rows=bool(c.get("smem_rows", False)),
        slices=int(c.get("slices", 1)), lag=int(c.get("lag", 1)), paired=bool(c.get("paired", False)),
    )  # fmt: skip


def layer_norm_overrides(config_type) -> dict:
    """``{(kind, element bytes, BLOCK_N of the row, many rows): LaunchConfig}`` from the override file.

    Entries without ``rows`` serve both row regimes; their forward runs one program per tile
    (``programs_per_sm = 0``)."""
    out = {}
    for key, c in _entries().items():
        if key.startswith("ln/"):
            _checked(key, c, _origin(), _LN_FIELDS)
            cfg = layer_norm_config(config_type, c, None if c["kind"] == "bwd" or "rows" in c else 0)
            regimes = (c["rows"] == "many",) if "rows" in c else (False, True)
            for many in regimes:
                out[(c["kind"], _ESIZE[c["dtype"]], c["n"], many)] = cfg
    return out


def attention_overrides(config_type, entries: dict | None = None) -> dict:
    """``{(kind, D, element bytes, causal, long sequence): AttnConfig}`` from the override file, or from
    ``entries`` (a ``tuned.json`` read by :func:`read_tuned`) when given (bf16 measurements serve both
    2-byte types; entries without ``dtype`` are bf16; entries without ``length``
    serve both lengths)."""
    out = {}
    origin = _origin() if entries is None else ""
    for key, c in (_entries() if entries is None else entries).items():
        if key.startswith("attn/"):
            if isinstance(c, dict) and c.get("ws"):  # warp-specialized loops gave wrong results: ignored
                continue
            _checked(key, c, origin, _ATTN_FIELDS)
            _check_attention_tiles(key, c, origin)
            tma = bool(c.get("tma", False))
            cfg = config_type(block_m=c["block_m"], block_n=c["block_n"], num_warps=c["num_warps"],
                              num_stages=c["num_stages"], tma=tma)  # fmt: skip
            esize = _ESIZE[c.get("dtype", "bfloat16")]
            for long in (c["length"] == "long",) if "length" in c else (False, True):
                out[(c["kind"], c["d"], esize, c["causal"], long)] = cfg
    return out
