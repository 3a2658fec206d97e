"""Helpers shared by the harness's tests (tests/test_harness*.py): fake registry entries, a tiny suite,
a row with defaults."""

from __future__ import annotations

import contextlib

import torch
from crossfuse import registry
from crossfuse.harness import schema, suite

DESIGN = (
    "op, impl, side, peer, device, device_name, dtype, shape, causal, mode, ms_p20, ms_p50, ms_p80, gbps, "
    "tflops, alloc_bytes, peak_bytes, relerr, versions, timestamp"
)


@contextlib.contextmanager
def registered(*impls):
    """Register fake implementations for one test and remove them afterwards."""
    for impl in impls:
        registry.register(impl)
    try:
        yield impls
    finally:
        for impl in impls:
            registry._REGISTRY.pop(impl.key, None)


def _raise_runtime(**_):
    raise RuntimeError("deliberately broken implementation")


def _layer_norm(x, weight, bias, eps):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps)


def tiny_suite(name="t", ops=("layer_norm",), shape=(8, 32), modes=("fwd", "bwd"), **extra) -> suite.Suite:
    group = {
        "ops": list(ops),
        "shapes": [shape],
        "quick_shapes": [shape],
        "dtypes": ["float32"],
        "modes": modes,
    }
    return suite.parse_suite(name, {"groups": [group], **extra})


def row(**kw) -> schema.Row:
    base = dict(op="layer_norm", impl="torch", side="python", peer=True, device="cpu", device_name="cpu",
                dtype="float32", shape="4096x1024", causal=False, mode="fwd")  # fmt: skip
    return schema.Row(**{**base, **kw})
