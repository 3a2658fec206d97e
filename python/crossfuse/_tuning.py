"""Launch-configuration overrides from a tuning run (``bench/tune.py`` writes ``tuned.json``).

Set ``CROSSFUSE_TUNED_CONFIGS=/path/to/tuned.json`` to use configurations measured on your own GPU
instead of the built-in tables (measured on an H200). Read once, when the op modules are imported.
"""

from __future__ import annotations

import functools
import json
import os

_ESIZE = {"bfloat16": 2, "float16": 2, "float32": 4}


@functools.cache
def _entries() -> dict:
    path = os.environ.get("CROSSFUSE_TUNED_CONFIGS")
    return read_tuned(path, "CROSSFUSE_TUNED_CONFIGS=") if path else {}


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
        c["pps"] if programs_per_sm is None else programs_per_sm, c.get("unroll", 1),
        bool(c.get("prefetch", False)), bool(c.get("keep_params", False)), bool(c.get("shifted", False)),
        int(c.get("tma_stages", 0)), bool(c.get("coop", False)), bool(c.get("smem_rows", False)),
    )  # fmt: skip


def layer_norm_overrides(config_type) -> dict:
    """``{(kind, element bytes, BLOCK_N of the row, many rows): LaunchConfig}`` from the override file.

    Entries without ``rows`` (files of earlier versions) serve both row regimes; their forward ran one
    program per tile, which ``programs_per_sm = 0`` now spells."""
    out = {}
    for key, c in _entries().items():
        if key.startswith("ln/"):
            cfg = layer_norm_config(config_type, c, None if c["kind"] == "bwd" or "rows" in c else 0)
            regimes = (c["rows"] == "many",) if "rows" in c else (False, True)
            for many in regimes:
                out[(c["kind"], _ESIZE[c["dtype"]], c["n"], many)] = cfg
    return out


def attention_overrides(config_type, entries: dict | None = None) -> dict:
    """``{(kind, D, element bytes, causal, long sequence): AttnConfig}`` from the override file, or from
    ``entries`` (a ``tuned.json`` read by :func:`read_tuned`) when given (bf16 measurements serve both
    2-byte types; entries without ``dtype`` are bf16; entries without ``length``, from earlier versions,
    serve both lengths)."""
    out = {}
    for key, c in (_entries() if entries is None else entries).items():
        if key.startswith("attn/"):
            if c.get("ws"):  # run 26: warp-specialized loops gave wrong results; their entries are not used
                continue
            tma = bool(c.get("tma", False))
            cfg = config_type(c["block_m"], c["block_n"], c["num_warps"], c["num_stages"], tma)
            esize = _ESIZE[c.get("dtype", "bfloat16")]
            for long in (c["length"] == "long",) if "length" in c else (False, True):
                out[(c["kind"], c["d"], esize, c["causal"], long)] = cfg
    return out
