"""Helpers shared by the ReLU attention's tests (tests/test_relu_attention*.py)."""

from __future__ import annotations

import crossfuse
import torch
from crossfuse.ops import relu_attention as ra
from crossfuse.ops._runtime import direct as _direct
from crossfuse.reference import kink_slack as reference_kink_slack
from crossfuse.reference import relu_attention_ref, tf32_truncate
from crossfuse.tolerances import relerr, relerr_with_slack, tolerance

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def randn(shape, dtype, device, gen):
    return torch.randn(shape, dtype=torch.float64, generator=gen).to(device=device, dtype=dtype)


def qkv(b, h, lq, lk, d, dtype, device, gen):
    return (
        randn((b, h, lq, d), dtype, device, gen),
        randn((b, h, lk, d), dtype, device, gen),
        randn((b, h, lk, d), dtype, device, gen),
    )


def kink_slack(q, k, v, dout, causal, squared, **scales):
    """Each dq, dk, dv row's slack: how far its scores at relu's kink may move it (see
    crossfuse.reference.kink_slack; none for dv, relu being continuous)."""
    slack = reference_kink_slack(q, k, v, dout, causal, squared, **scales)
    return {"dq": slack["q"], "dk": slack["k"], "dv": torch.zeros(v.shape[:-1], dtype=torch.float64,
                                                                  device=v.device)}  # fmt: skip



def run_and_compare(q, k, v, causal, squared, gen, layout="bhld", choices=None):
    """Kernel forward + backward vs the float64 reference; returns the errors (asserted here). With
    ``choices`` (:class:`crossfuse.ops.relu_attention.Choices`), through the full path that takes them."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    if choices is None:
        out = crossfuse.relu_attention(*leaves, causal=causal, squared=squared, layout=layout)
    else:
        out = ra.relu_attention_with(*leaves, causal=causal, squared=squared, layout=layout, choices=choices)
    dout = randn(out.shape, out.dtype, out.device, gen)
    out.backward(dout)
    dtype, tf32 = q.dtype, q.is_cuda and q.dtype == torch.float32  # float32 dots run on tf32 on GPUs
    # with tf32 the kernel multiplies operands truncated to 10 mantissa bits: the reference gets the same
    # truncated inputs, so that a score within rounding of 0 falls on the same side of relu's kink in
    # both (otherwise one flipped score among a few hundred decides the error of a short sequence)
    refs = [(tf32_truncate(t) if tf32 else t).detach().double().requires_grad_(True) for t in (q, k, v)]
    to_bhld = (lambda t: t) if layout == "bhld" else (lambda t: t.transpose(1, 2))
    out_ref = relu_attention_ref(*(to_bhld(t) for t in refs), causal=causal, squared=squared)
    out_ref = to_bhld(out_ref)
    out_ref.backward(dout.double())
    errs = {"out": (relerr(out, out_ref), tolerance("relu_attention", dtype, "fwd", tf32=tf32))}
    # every gradient row is compared; a row that a score within float32 rounding of 0 reaches may stand
    # as far from float64 as those scores on the other side of relu's kink would move it, and no farther
    # (such scores are rare in short rows, but each row holds L of them: 16% of the rows at bf16 L=2048
    # on the H200 meet one, where leaving those rows out would have hidden a wrong gradient)
    slack = kink_slack(*(to_bhld(t) for t in refs), to_bhld(dout), causal, squared)
    for name, got, ref in zip("qkv", leaves, refs, strict=True):
        err = relerr_with_slack(to_bhld(got.grad), to_bhld(ref.grad), slack["d" + name])
        errs["d" + name] = (err, tolerance("relu_attention", dtype, "bwd", tf32=tf32))
    bad = {k: v for k, v in errs.items() if not v[0] <= v[1]}
    assert not bad, f"relative error over tolerance (error, tolerance): {bad}"
    return errs, out, leaves


class CompiledStandIn:
    """The CPU's stand-in for ``ops._runtime.direct``, where the interpreter compiles nothing: the same
    keys, a slot per launch key whose "compiled kernel" is the interpreter's kernel with its options
    (what ``CompiledKernel.run`` does on a GPU); ``launches`` counts the launches made from slots."""

    def __init__(self):
        self.table = {}
        self.launches = 0

    def install(self, monkeypatch) -> None:
        for name in ("state", "key", "remember", "launch", "kept", "launcher"):
            monkeypatch.setattr(_direct, name, getattr(self, name))

    def state(self):
        return ("cpu",)

    def key(self, kernel, args, options):
        keys, opts = _direct.arg_keys(args), _direct.option_keys(options)
        return None if keys is None or opts is None else (kernel, keys, opts)

    def remember(self, slot, kernel, args, options, compiled):
        if slot is not None:
            self.table[slot] = (kernel, options)

    def launch(self, slot, grid, args):
        if slot not in self.table:
            return False
        self.launcher(slot, grid, (), None)(*args)
        return True

    def kept(self, slot):
        return (slot, ()) if slot in self.table else None

    def launcher(self, slot, grid, tail, device, descs=None):
        kernel, options = self.table[slot]

        def go(*args):
            if descs:  # the descriptors' bases given: made here, as the GPU's launcher makes them
                args = _direct.with_descriptors(args, descs)
            self.launches += 1
            kernel[grid](*args, **options)

        return go
