"""crossfuse under torch.compile: the launchers as custom operators (crossfuse.ops._library).

While torch.compile traces, the autograd.Functions call the launchers through ``torch.ops.crossfuse.*``
(opaque to the tracer, with fake implementations); the compiled graph then runs the same kernels on the
same tensors, so its outputs and gradients equal eager's bit for bit. On the CPU the graphs run with
``aot_eager`` (AOTAutograd without code generation: what the operators must satisfy); on the GPU with
inductor, torch.compile's default.
"""

from __future__ import annotations

import subprocess
import sys

import crossfuse
import pytest
import torch
from crossfuse.ops import layer_norm as ln_mod
from crossfuse.ops import relu_attention as ra
from crossfuse.tolerances import relerr
from torch._dynamo.testing import CompileCounterWithBackend


@pytest.fixture
def backend(device) -> str:
    return "inductor" if device == "cuda" else "aot_eager"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def randn(shape, device, gen, dtype=torch.float32):
    return torch.randn(shape, dtype=torch.float64, generator=gen).to(device=device, dtype=dtype)


def leaves(*tensors):
    return [t.detach().clone().requires_grad_(True) for t in tensors]


def assert_same_run(fn, compiled, inputs, gen, exact=True):
    """``compiled(*inputs)`` against ``fn(*inputs)``: the output and the gradients of every input, equal
    bit for bit (the same kernels on the same tensors), or with ``exact=False`` within float32 rounding
    (where the compiled graph adds the gradients of a repeated input in another order)."""
    eager_in, compiled_in = leaves(*inputs), leaves(*inputs)
    want = fn(*eager_in)
    got = compiled(*compiled_in)
    assert got.shape == want.shape and got.stride() == want.stride() and got.dtype == want.dtype
    dout = randn(want.shape, want.device, gen, want.dtype)
    pairs = zip([got, *torch.autograd.grad(got, compiled_in, dout)],
                [want, *torch.autograd.grad(want, eager_in, dout)], strict=True)  # fmt: skip
    for a, b in pairs:
        if exact:
            assert torch.equal(a, b)
        else:  # norm-wise, as in test_compiled_modules_match_eager (element-wise 1e-5 flaked on the H200)
            assert relerr(a, b) <= 1e-5, relerr(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_compiled_layer_norm_equals_eager(dtype, device, backend, gen):
    def fn(x, w, b):
        return crossfuse.layer_norm(x, (48,), w, b)

    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend=counter)
    w, b = randn((48,), device, gen), randn((48,), device, gen)
    graphs = []
    for rows in (3, 10):
        assert_same_run(fn, compiled, (randn((2, rows, 48), device, gen, dtype), w, b), gen)
        graphs.append(counter.frame_count)
    assert graphs[1] == graphs[0] > 0  # no recompilation for another row count: the fake takes any M
    # no weight, no bias: the operators' optional arguments and results
    assert_same_run(lambda x: crossfuse.layer_norm(x, (48,)),
                    torch.compile(lambda x: crossfuse.layer_norm(x, (48,)), fullgraph=True, backend=backend),
                    (randn((5, 48), device, gen, dtype),), gen)  # fmt: skip


@pytest.mark.parametrize("layout", ["bhld", "blhd"])
@pytest.mark.parametrize("causal,squared", [(False, False), (True, True)], ids=["plain", "causal squared"])
def test_compiled_relu_attention_equals_eager(layout, causal, squared, device, backend, gen):
    def fn(q, k, v):
        return crossfuse.relu_attention(q, k, v, causal=causal, squared=squared, layout=layout)

    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend=counter)
    graphs = []
    for length in (40, 24):
        shape = (1, 2, length, 16) if layout == "bhld" else (1, length, 2, 16)
        assert_same_run(fn, compiled, [randn(shape, device, gen) for _ in range(3)], gen)
        graphs.append(counter.frame_count)
    # no recompilation for another length: relu_scale's default 1/Lk is taken inside the operator
    assert graphs[1] == graphs[0] > 0


def test_compiled_modules_match_eager(device, backend, gen):
    """A pre-norm attention block of crossfuse.nn modules compiles as one graph; its surrounding
    operations may be fused by the backend, so it is held to float32 rounding, not to bits."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = crossfuse.nn.LayerNorm(64, device=device, native_below=0)
            self.attn = crossfuse.nn.ReLUAttention(64, num_heads=4, causal=True, device=device)

        def forward(self, x):
            return x + self.attn(self.norm(x))

    torch.manual_seed(1234)
    block = Block()
    (x,) = leaves(randn((2, 24, 64), device, gen))
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    results = []
    for run in (block, compiled):
        x.grad = None
        block.zero_grad()
        out = run(x)
        out.square().sum().backward()
        results.append([out, x.grad, *(p.grad for p in block.parameters())])
    for got, want in zip(*results, strict=True):
        # norm-wise: a gradient summed over rows in another order moves its small elements the most
        # (on the H200 one of 64 elements by 3.8e-4 of itself, 1.1e-5 absolute)
        assert relerr(got, want) <= 1e-5, relerr(got, want)


@pytest.mark.parametrize(
    "x_dtype,w_dtype,with_bias,grads",
    [
        (torch.float32, torch.float32, False, (True, False)),
        (torch.bfloat16, torch.float32, True, (True, True)),  # dw, db in the weight's dtype
        (torch.float64, torch.float64, True, (False, True)),  # float64 statistics
    ],
    ids=["float32", "bf16 x, float32 weight", "float64"],
)
def test_layer_norm_operators_pass_opcheck(x_dtype, w_dtype, with_bias, grads, device, gen):
    """torch.library.opcheck: the operators' schemas, fake implementations (shapes, strides, dtypes) and
    dispatch (eager, fake tensors, AOTAutograd) agree with the real launchers."""
    x, w = randn((5, 48), device, gen, x_dtype), randn((48,), device, gen, w_dtype)
    b = randn((48,), device, gen, w_dtype) if with_bias else None
    _, mean, rstd = ln_mod.layer_norm_fwd(x, w, b, 1e-5)
    ops = torch.ops.crossfuse
    torch.library.opcheck(ops.layer_norm_fwd.default, (x, w, b, 1e-5))  # kept for saved programs
    for shape in ([5, 48], [5, 1, 48]):  # y allocated in the input's shape, rows in
        torch.library.opcheck(ops.layer_norm_fwd_shaped.default, (x, shape, w, b, 1e-5))
    dy = randn((5, 48), device, gen, x_dtype)
    torch.library.opcheck(ops.layer_norm_bwd.default, (dy, x, w, mean, rstd, *grads))


@pytest.mark.parametrize("layout", ["bhld", "blhd"])
@pytest.mark.parametrize(
    "dtype,relu_scale", [(torch.float32, None), (torch.bfloat16, 1 / 24), (torch.float64, None)],
    ids=["float32, relu_scale 1/Lk", "bfloat16", "float64"],
)  # fmt: skip
def test_attention_operators_pass_opcheck(dtype, relu_scale, layout, device, gen):
    if dtype == torch.float64 and device == "cuda":
        pytest.skip("Triton's dot has no float64 on GPUs: float64 attention runs under the interpreter")
    q, k, v, do = (ra._to_bhld(randn((1, 24, 2, 16), device, gen, dtype), "blhd") for _ in range(4))
    if layout == "bhld":
        q, k, v, do = (t.contiguous() for t in (q, k, v, do))
    flags = (True, False, 0.25, relu_scale, layout)
    torch.library.opcheck(torch.ops.crossfuse.relu_attention_fwd.default, (q, k, v, *flags))
    torch.library.opcheck(torch.ops.crossfuse.relu_attention_bwd.default, (q, k, v, do, *flags))


def test_exported_program_calls_the_operators(device, gen, tmp_path):
    """torch.export (non-strict, its default) records the ops as the crossfuse operators; the exported
    program, and the same program saved and loaded in a fresh process, give eager's output."""

    class NormAttention(torch.nn.Module):
        def forward(self, x, w):
            q = crossfuse.layer_norm(x, (16,), w).unflatten(-1, (1, 16))  # [B, L, H=1, D=16]
            return crossfuse.relu_attention(q, q, q, causal=True, layout="blhd")

    x, w = randn((2, 20, 16), device, gen), randn((16,), device, gen)
    program = torch.export.export(NormAttention(), (x, w), strict=False)
    called = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    want_ops = {"crossfuse.layer_norm_fwd_shaped.default", "crossfuse.relu_attention_fwd.default"}
    assert want_ops <= called, called
    want = NormAttention()(x, w)
    assert torch.equal(program.module()(x, w), want)
    # saved, then loaded and run by a fresh process after a plain `import crossfuse` (which defines the
    # operators without importing the op modules)
    torch.export.save(program, tmp_path / "program.pt2")
    torch.save((x.cpu(), w.cpu(), want.cpu()), tmp_path / "io.pt")
    code = (
        "import sys, torch, crossfuse\n"  # TRITON_INTERPRET (set off the GPU by conftest) inherited
        "x, w, want = torch.load(sys.argv[1])\n"
        f"got = torch.export.load(sys.argv[2]).module()(x.to({device!r}), w.to({device!r}))\n"
        "assert torch.equal(got.cpu(), want), 'the loaded program differs'\n"
        "print('ok')"
    )
    args = [sys.executable, "-c", code, str(tmp_path / "io.pt"), str(tmp_path / "program.pt2")]
    res = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]


def test_one_tensor_in_two_places(device, backend, gen):
    """Self-attention on one tensor (q, k and v the same) and one tensor as weight and bias: compiled in
    one graph, with the gradients of every place added up as in eager mode (torch 2.11 dropped all but
    one of them for an autograd.Function given a tensor twice, pytorch/pytorch#181146; the ops pass it
    views instead, see crossfuse.ops._library.distinct)."""

    def fn(x, p):
        h = crossfuse.layer_norm(x, (64,), p, p).unflatten(-1, (4, 16))  # [B, L, H, D]
        return crossfuse.relu_attention(h, h, h, causal=True, layout="blhd")

    inputs = (randn((2, 40, 64), device, gen), randn((64,), device, gen))
    assert_same_run(fn, torch.compile(fn, fullgraph=True, backend=backend), inputs, gen, exact=False)


@pytest.mark.gpu
def test_compiled_into_cuda_graphs(gen):
    """``mode="reduce-overhead"``: inductor captures the forward and backward graphs, the crossfuse
    operators in them (float32: the copies and dependent launches too), into CUDA graphs and replays
    them; no graph is skipped, and each replay on new values matches eager."""
    from torch._dynamo.utils import counters

    def fn(x, w, b):
        h = crossfuse.layer_norm(x, (64,), w, b).unflatten(-1, (4, 16))  # [B, L, H, D]
        return crossfuse.relu_attention(h, h * 0.5, h, causal=True, layout="blhd")

    compiled = torch.compile(fn, mode="reduce-overhead", fullgraph=True)
    counters.clear()
    w, b = randn((64,), "cuda", gen), randn((64,), "cuda", gen)
    for _ in range(3):  # warm-up, recording, then a replay
        assert_same_run(fn, compiled, (randn((2, 96, 64), "cuda", gen), w, b), gen, exact=False)
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


def test_autocast_leaves_the_ops_in_their_inputs_dtypes(device, gen):
    """The ops are not autocast ops (as the README says): under ``torch.autocast`` they run in their
    inputs' dtypes and give what they give outside it."""
    x, w = randn((4, 64), device, gen), randn((64,), device, gen)
    q = randn((1, 2, 24, 16), device, gen)
    outside = crossfuse.layer_norm(x, (64,), w), crossfuse.relu_attention(q, q, q)
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        inside = crossfuse.layer_norm(x, (64,), w), crossfuse.relu_attention(q, q, q)
    for a, b in zip(inside, outside, strict=True):
        assert a.dtype == torch.float32 and torch.equal(a, b)
