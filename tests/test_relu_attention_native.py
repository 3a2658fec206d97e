"""The ReLU attention's compiled eager path (the C++ module of crossfuse.ops._runtime.native): on the GPU,
the same results as the Python path bit for bit, with no Python on the way once a key's programs are
recorded (their tensor maps kept per address), and autograd's rules kept by its node."""

from __future__ import annotations

import crossfuse
import pytest
import torch
from _attention import randn
from crossfuse.ops._runtime import native
from crossfuse.ops.relu_attention import api
from crossfuse.reference import relu_attention_ref as ref

pytestmark = pytest.mark.gpu


def _module():
    fast = native.module()
    if fast is None:
        pytest.fail(f"the compiled path is not available on this GPU machine: {native.problem()}")
    return fast


CASES = [  # (B, H, L, D), layout, causal, dtype
    ((1, 8, 128, 64), "bhld", False, torch.bfloat16),  # host-bound: what the compiled path is for
    ((2, 4, 200, 64), "bhld", True, torch.bfloat16),  # a length not a multiple of the tiles
    ((1, 8, 128, 128), "blhd", False, torch.float16),
    ((2, 2, 77, 32), "blhd", True, torch.bfloat16),
    ((1, 4, 256, 256), "bhld", False, torch.bfloat16),
    ((1, 4, 128, 64), "bhld", False, torch.float32),  # tf32 copies: scratch the module allocates per call
    ((1, 4, 1000, 64), "blhd", True, torch.float32),  # float32 whose forward copies its operands too
    ((1, 4, 1000, 256), "bhld", False, torch.float32),
]


def _inputs(shape, layout, dtype, gen):
    B, H, L, D = shape
    full = (B, H, L, D) if layout == "bhld" else (B, L, H, D)
    return [randn(full, dtype, "cuda", gen).requires_grad_(True) for _ in range(4)]


@pytest.mark.parametrize("shape, layout, causal, dtype", CASES, ids=str)
def test_compiled_path_gives_the_python_paths_results_bit_for_bit(shape, layout, causal, dtype, gen,
                                                                   monkeypatch):  # fmt: skip
    fast = _module()
    q, k, v, dout = _inputs(shape, layout, dtype, gen)
    dout = dout.detach()

    def step():
        out = crossfuse.relu_attention(q, k, v, causal=causal, layout=layout)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    python = step()  # the first call plans; the second registers the forward's program
    for a, c in zip(python, step(), strict=True):
        assert torch.equal(a, c)
    third = step()  # the compiled forward; its backward records the backward's program
    forwards, backwards = fast.count_attention()
    # both programs (their descriptors' maps kept per address); float32's copies of q and dout (tf32) are
    # scratch buffers the module allocates per call, in the slots after the call's tensors
    assert (forwards, backwards) == (1, 1)
    calls = []
    for name in ("forward", "backward"):
        fn = getattr(api._Entry, name)
        monkeypatch.setattr(api._Entry, name, lambda *a, fn=fn, name=name: calls.append(name) or fn(*a))
    for got in (third, step(), step()):
        for a, c in zip(python, got, strict=True):
            assert torch.equal(a, c)
    assert calls == ([] if backwards else ["backward"] * 2)  # no Python but a backward without a program
    out = crossfuse.relu_attention(q, k, v, causal=causal, layout=layout)
    assert out.grad_fn.name() == "CrossfuseReLUAttentionBackward"
    calls.clear()
    with torch.no_grad():  # and without an autograd node
        assert torch.equal(crossfuse.relu_attention(q, k, v, causal=causal, layout=layout), python[0])
    assert calls == []


def _compiled_output(q, k, v, **kw):
    for _ in range(3):
        out = crossfuse.relu_attention(q, k, v, **kw)
        torch.autograd.grad(out, [t for t in (q, k, v) if t.requires_grad], torch.ones_like(out))
    out = crossfuse.relu_attention(q, k, v, **kw)
    assert out.grad_fn.name() == "CrossfuseReLUAttentionBackward"
    return out


def test_new_addresses_and_a_gradient_of_another_layout(gen):
    # tensors at other addresses (their tensor maps encoded on a miss), the same tensor as q, k and v, and
    # a gradient laid out otherwise (the Python backward, which records no program for it): all right
    _module()
    shape = (2, 8, 128, 64)
    q, k, v, _ = _inputs(shape, "bhld", torch.bfloat16, gen)
    _compiled_output(q, k, v)
    for _ in range(3):
        q2, k2, v2, _ = _inputs(shape, "bhld", torch.bfloat16, gen)
        for qq, kk, vv in ((q2, k2, v2), (q2, q2, q2)):
            out = crossfuse.relu_attention(qq, kk, vv)
            assert out.grad_fn.name() == "CrossfuseReLUAttentionBackward"
            want = ref(qq.double(), kk.double(), vv.double())
            assert (out.double() - want).abs().max().item() < 2e-2
        wide = randn((2, 8, 128, 128), torch.bfloat16, "cuda", gen)[..., :64]
        out = crossfuse.relu_attention(q2, k2, v2)
        got = torch.autograd.grad(out, (q2, k2, v2), wide)
        qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q2, k2, v2))
        want = torch.autograd.grad(ref(qd, kd, vd), (qd, kd, vd), wide.double())
        for g, w in zip(got, want, strict=True):
            assert (g.double() - w).abs().max().item() < 5e-2 * max(1.0, w.abs().max().item())


def test_compiled_node_keeps_autograds_rules(gen):
    # saved tensors freed after a backward that does not retain the graph; an input changed in place is
    # an error; saved-tensor hooks see q, k, v and their exceptions reach the caller as raised; a double
    # backward raises under create_graph; only the gradients asked for are given
    _module()
    shape = (1, 8, 128, 64)
    q, k, v, dout = _inputs(shape, "bhld", torch.bfloat16, gen)
    dout = dout.detach()
    out = _compiled_output(q, k, v)
    torch.autograd.grad(out, (q, k, v), dout)
    with pytest.raises(RuntimeError, match="second time"):
        torch.autograd.grad(out, (q, k, v), dout)
    h = q * 1
    out = _compiled_output(h, k, v)
    with torch.no_grad():
        h.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(out, (q, k, v), dout)
    packed = []
    def pack(t):
        packed.append(t.data_ptr())
        return t.clone()  # copies saved: the backward reads those

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = crossfuse.relu_attention(q, k, v)
    assert out.grad_fn.name() == "CrossfuseReLUAttentionBackward"
    assert {q.data_ptr(), k.data_ptr(), v.data_ptr()} <= set(packed)
    got = torch.autograd.grad(out, (q, k, v), dout)
    want = torch.autograd.grad(crossfuse.relu_attention(q, k, v), (q, k, v), dout)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)  # read from the clones the hook saved: the same values

    class Refused(Exception):
        pass

    def refuse(t):
        raise Refused("nothing saved here")

    with torch.autograd.graph.saved_tensors_hooks(refuse, lambda t: t):
        with pytest.raises(Refused, match="nothing"):
            crossfuse.relu_attention(q, k, v)
    out = crossfuse.relu_attention(q, k, v)  # under create_graph, a gradient that requires grad
    (gq,) = torch.autograd.grad(out.float().pow(2).sum(), (q,), create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gq.sum().backward()
    vk = v.detach().requires_grad_(True)
    out = crossfuse.relu_attention(q.detach(), k.detach(), vk)
    (gv,) = torch.autograd.grad(out, (vk,), dout)
    assert torch.equal(gv, want[2])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_views_of_one_qkv_buffer_take_the_compiled_path(dtype, gen):
    # q, k and v as crossfuse.nn.ReLUAttention gives them: strided [B, L, H, D] views of one fused
    # projection, whose bytes overlap; they take the compiled path (both programs recorded) and give the
    # Python path's results bit for bit, at the first addresses and at new ones
    fast = _module()
    B, L, H, D = 2, 128, 4, 64
    before = fast.count_attention()

    def packed():
        qkv = randn((B, L, 3, H, D), dtype, "cuda", gen).requires_grad_(True)
        return qkv, qkv.unbind(2)

    _, (q, k, v) = packed()
    dout = randn((B, L, H, D), dtype, "cuda", gen)

    def step(q, k, v):
        out = crossfuse.relu_attention(q, k, v, causal=True, layout="blhd")
        return out, *torch.autograd.grad(out, (q, k, v), dout)

    python = step(q, k, v)
    for _ in range(3):
        got = step(q, k, v)
        for a, c in zip(python, got, strict=True):
            assert torch.equal(a, c)
    forwards, backwards = fast.count_attention()
    assert (forwards - before[0], backwards - before[1]) == (1, 1)
    assert crossfuse.relu_attention(q, k, v, causal=True, layout="blhd").grad_fn.name() == (
        "CrossfuseReLUAttentionBackward")  # fmt: skip
    _, (q2, k2, v2) = packed()  # new addresses: the same programs, right results
    out, *grads = step(q2, k2, v2)
    qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q2, k2, v2))
    want_out = ref(qd.transpose(1, 2), kd.transpose(1, 2), vd.transpose(1, 2), causal=True).transpose(1, 2)
    want = torch.autograd.grad(want_out, (qd, kd, vd), dout.double())
    assert (out.double() - want_out).abs().max().item() < 2e-2 * max(1.0, want_out.abs().max().item())
    for g, w in zip(grads, want, strict=True):
        assert (g.double() - w).abs().max().item() < 5e-2 * max(1.0, w.abs().max().item())
    assert fast.count_attention() == (forwards, backwards)
