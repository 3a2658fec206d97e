"""The eager fast path of ``crossfuse.relu_attention``: after the first call of a key, a call makes one
dictionary look-up, allocates its outputs and replays cached launches, forward and backward.

On the CPU the kernels run under Triton's interpreter, which compiles nothing; as in
tests/test_launch_plans.py a stand-in for ``_runtime.direct`` keeps each launch's kernel and options (the
"compiled kernel") and runs it through the interpreter, and the launchers decide as on a GPU."""

from __future__ import annotations

import crossfuse
import pytest
import torch
from _attention import CompiledStandIn, randn
from crossfuse.ops import _library
from crossfuse.ops import relu_attention as ra
from crossfuse.ops.relu_attention import api as api_module
from crossfuse.ops.relu_attention import launch as launch_module
from crossfuse.reference import relu_attention_ref
from crossfuse.tolerances import relerr, tolerance

# what a repeated call must not do: (module, function) spied on
_WATCHED = {
    "checks": (api_module, "_check_attention_args"),
    "plans built": (launch_module, "_fwd_launches"),
    "backward plans built": (launch_module, "_bwd_launches"),
    "tuning table read": (launch_module, "attention_config"),
    "launches through kernel[grid]": (launch_module, "_launch"),
    "library dispatch (forward)": (_library, "RELU_ATTENTION_FWD"),
    "library dispatch (backward)": (_library, "RELU_ATTENTION_BWD"),
}


class Counts:
    """Spies on everything a repeated call must not do, and a stand-in for the compiled kernels."""

    def __init__(self, monkeypatch):
        self.calls = dict.fromkeys(_WATCHED, 0)
        for name, (module, attr) in _WATCHED.items():
            monkeypatch.setattr(module, attr, self._spy(name, getattr(module, attr)))
        self.compiled = CompiledStandIn()
        self.compiled.install(monkeypatch)
        monkeypatch.setattr(launch_module, "is_interpreted", lambda kernel: False)  # the GPU's decisions

    def _spy(self, name, fn):
        def spy(*args, **kwargs):
            self.calls[name] += 1
            return fn(*args, **kwargs)

        return spy

    def reset(self):
        self.calls = dict.fromkeys(self.calls, 0)
        self.compiled.launches = 0


@pytest.mark.parametrize("layout", ra.LAYOUTS)
def test_a_repeated_call_decides_nothing(layout, gen, monkeypatch):
    # after the first call of a key, neither the forward nor the backward checks its arguments, builds a
    # launch plan, reads the tuning table, goes through torch.library or launches through kernel[grid]:
    # one look-up, allocations, the cached launches; and its results are those of the first call
    counts = Counts(monkeypatch)
    shape = (1, 2, 40, 16) if layout == "bhld" else (1, 40, 2, 16)
    base = [randn(shape, torch.float16, "cpu", gen) for _ in range(4)]

    def call():
        q, k, v = (t.clone().requires_grad_(True) for t in base[:3])
        out = crossfuse.relu_attention(q, k, v, causal=True, layout=layout)
        out.backward(base[3])
        return out.detach(), q.grad, k.grad, v.grad

    first = call()
    assert counts.calls["checks"] == 1 and counts.calls["plans built"] == 1
    counts.reset()
    second = call()
    assert all(n == 0 for n in counts.calls.values()), counts.calls
    assert counts.compiled.launches >= 3  # the forward's kernel and the backward's two, replayed
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    qb, kb, vb = (ra._to_bhld(t.double(), layout) for t in base[:3])
    want = relu_attention_ref(qb, kb, vb, causal=True)
    assert relerr(ra._to_bhld(second[0], layout), want) <= tolerance("relu_attention", torch.float16, "fwd")
    # without gradients (inference) the same: no autograd Function, nothing decided
    counts.reset()
    with torch.no_grad():
        out = crossfuse.relu_attention(*base[:3], causal=True, layout=layout)
    assert all(n == 0 for n in counts.calls.values()) and counts.compiled.launches == 1, counts.calls
    assert torch.equal(out, first[0])


def test_the_key_tells_apart_what_the_checks_tell_apart(gen):
    # 1 == True == 1.0 in a dict: a flag or a scale of another type is checked afresh, never taken from
    # an earlier call's entry; so are other shapes, strides, dtypes and layouts
    q, k, v = (randn((1, 2, 8, 16), torch.float32, "cpu", gen) for _ in range(3))
    crossfuse.relu_attention(q, k, v, causal=True, scale=1.0)
    with pytest.raises(TypeError, match="causal must be a bool"):
        crossfuse.relu_attention(q, k, v, causal=1, scale=1.0)
    with pytest.raises(TypeError, match="scale"):
        crossfuse.relu_attention(q, k, v, causal=True, scale=True)
    with pytest.raises(ValueError, match="layout must be"):
        crossfuse.relu_attention(q, k, v, causal=True, scale=1.0, layout="bshd")
    with pytest.raises(ValueError, match="causal=True needs equal"):
        crossfuse.relu_attention(q, k[:, :, :4], v[:, :, :4], causal=True, scale=1.0)
    key = api_module._eager_key(q, k, v, True, False, 1.0, None, "bhld")
    assert key in ra._EAGER and len(ra._EAGER) == 1


def test_tensor_subclasses_take_the_full_path(gen):
    # a subclass may override torch functions: never served from the fast path's entries

    class Traced(torch.Tensor):
        pass

    q, k, v = (randn((1, 2, 8, 16), torch.float32, "cpu", gen) for _ in range(3))
    sub = [t.as_subclass(Traced) for t in (q, k, v)]
    for _ in range(2):
        out = crossfuse.relu_attention(*sub)
    assert not ra._EAGER
    assert relerr(out, relu_attention_ref(q, k, v)) <= tolerance("relu_attention", torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=lambda d: str(d).removeprefix("torch."))  # fmt: skip
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", ra.LAYOUTS)
def test_fast_path_is_bit_identical_to_the_dispatched_path(layout, causal, dtype, gen):
    # the fast path's replayed launches against the custom operators torch.compile calls (the launchers
    # through torch.library), first call and repeated calls, forward and backward
    shape = (2, 8, 384, 64) if layout == "bhld" else (2, 384, 8, 64)
    q, k, v, do = (randn(shape, dtype, "cuda", gen) for _ in range(4))
    flags = (causal, False, 0.125, None, layout)
    qb, kb, vb, dob = (ra._to_bhld(t, layout) for t in (q, k, v, do))
    want = _library.RELU_ATTENTION_FWD(qb, kb, vb, *flags)
    want_grads = _library.RELU_ATTENTION_BWD(qb, kb, vb, dob, *flags)
    for _ in range(3):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = crossfuse.relu_attention(*leaves, causal=causal, scale=0.125, layout=layout)
        out.backward(do)
        assert torch.equal(out, want)
        for leaf, g in zip(leaves, want_grads, strict=True):
            assert torch.equal(leaf.grad, g)
    assert len(ra._EAGER) == 1


def test_the_compiled_nodes_python_backward_records_only_what_it_may(monkeypatch):
    # the C++ node's fallback records a program only where the node says the saved tensors and the
    # gradient are as the entry's programs expect them (a saved-tensor hook may give back others), once
    # per gradient key, and its gradients stand whatever recording does
    from types import SimpleNamespace

    from crossfuse.ops._runtime import native

    added = []
    monkeypatch.setattr(native, "module", lambda: SimpleNamespace(add_relu_attention_backward=lambda *a:
                                                                  added.append(a)))  # fmt: skip
    monkeypatch.setattr(native, "program", lambda calls, slots: ["program"])
    monkeypatch.setattr(api_module, "steps", lambda plan, tensors: (["step"], ()))
    q = k = v = dout = torch.zeros(1, 1, 4, 16)
    grads = (torch.ones(1), torch.ones(2), torch.ones(3))
    key = (dout.shape, dout.stride(), dout.dtype, dout.data_ptr() % 16)
    entry = SimpleNamespace(bwd_plans={key: "plan"}, backward=lambda *a: grads)
    backward = api_module._native_backward(entry)
    assert backward(7, q, k, v, dout, False) is grads and added == []  # saved tensors not as recorded
    assert backward(7, q, k, v, dout, True) is grads and added == [(7, dout, ["program"], *grads, [])]
    assert backward(7, q, k, v, dout, True) is grads and len(added) == 1  # offered once
    monkeypatch.setattr(native, "program", lambda calls, slots: 1 / 0)
    other = torch.zeros(1, 1, 4, 16)[..., :8]
    entry.bwd_plans[(other.shape, other.stride(), other.dtype, other.data_ptr() % 16)] = "plan"
    assert backward(7, q, k, v, other, True) is grads and len(added) == 1  # a failing recording: no harm
