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
    if not path:
        return {}
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"CROSSFUSE_TUNED_CONFIGS={path!r} could not be read: {exc}") from exc
    if not isinstance(data, dict):
        raise RuntimeError(
            f"CROSSFUSE_TUNED_CONFIGS={path!r}: expected a JSON object as bench/tune.py writes"
        )
    return data


def layer_norm_overrides(config_type) -> dict:
    """``{(kind, element bytes, BLOCK_N of the row): LaunchConfig}`` from the override file."""
    out = {}
    for key, c in _entries().items():
        if key.startswith("ln/"):
            out[(c["kind"], _ESIZE[c["dtype"]], c["n"])] = config_type(
                c["block_m"], c.get("block_n", c["n"]), c["num_warps"], c["pps"]
            )
    return out


def attention_overrides(config_type) -> dict:
    """``{(kind, D, element bytes, causal): AttnConfig}`` (bf16 measurements serve both 2-byte types)."""
    out = {}
    for key, c in _entries().items():
        if key.startswith("attn/"):
            out[(c["kind"], c["d"], 2, c["causal"])] = config_type(
                c["block_m"], c["block_n"], c["num_warps"], c["num_stages"]
            )
    return out
