"""Launches that skip Triton's dispatch (ops._runtime.direct): the same kernels, the same results."""

from __future__ import annotations

import crossfuse
import pytest
import torch
from crossfuse._backend import triton_version
from crossfuse.ops import relu_attention as ra
from crossfuse.ops._runtime import direct as _direct
from crossfuse.ops._runtime import native
from crossfuse.ops.relu_attention import launch as launch_module
from crossfuse.reference import relu_attention_ref
from crossfuse.tolerances import relerr, tolerance
from triton.tools.tensor_descriptor import TensorDescriptor


def randn(shape, dtype, device, gen):
    return torch.randn(shape, dtype=torch.float64, generator=gen).to(device=device, dtype=dtype)


def test_descriptor_without_checks_equals_the_dataclass():
    # the unchecked maker is used only where it builds what the dataclass builds, field for field
    if _direct.SUPPORTED[0] <= triton_version() <= _direct.SUPPORTED[1]:
        assert _direct._DESCRIPTOR is not None  # the Triton versions it was written for
    t = torch.zeros(2, 4, 24, 64, dtype=torch.bfloat16)
    for base in (t, t.transpose(1, 2), t[:, 1:3]):
        args = (base, list(base.shape), list(base.stride()), [1, 1, 16, 64])
        want, got = TensorDescriptor(*args), _direct.descriptor(*args)
        assert type(got) is TensorDescriptor and got.base is base
        assert vars(got).keys() == vars(want).keys()
        for name in vars(want):
            if name != "base":
                assert getattr(got, name) == getattr(want, name), name


def test_argument_keys_are_at_least_as_fine_as_tritons():
    t = torch.zeros(64, dtype=torch.bfloat16)
    keys = _direct.arg_keys
    # ints by value (Triton: 1 is a constant, multiples of 16 are marked, 32/64-bit by range)
    assert keys((16,)) != keys((17,)) and keys((1,)) != keys((2,)) and keys((2**40,)) != keys((16,))
    assert keys((True,)) != keys((1,)) and keys((False,)) != keys((0,)) and keys((None,)) != keys((0,))
    # floats by value (Triton takes a constexpr float by value), never equal to an int's
    assert keys((0.5,)) != keys((3.0,)) and keys((0.5,)) == keys((0.5,)) and keys((1.0,)) != keys((1,))
    # tensors by dtype and 16-byte alignment of their data
    assert keys((t[8:],)) == keys((t,)) and keys((t[1:],)) != keys((t,))
    assert keys((t.float(),)) != keys((t,))
    # descriptors by dtype and block shape (base, shape and strides are run-time arguments)
    big = torch.zeros(2, 2, 64, 32, dtype=torch.bfloat16)

    def desc(x, rows):
        return TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, rows, 32])

    assert keys((desc(big, 16),)) == keys((desc(big[:1], 16),))
    assert keys((desc(big, 16),)) != keys((desc(big, 32),))
    assert keys((desc(big, 16),)) != keys((desc(big.half(), 16),))
    assert keys(("text",)) is None and keys(([1, 2],)) is None  # unknown: Triton's dispatch decides
    # keyword values (constexprs, options) by type and value; a tensor given by keyword: no key
    opts = _direct.option_keys
    assert len({opts({"C": 1}), opts({"C": 1.0}), opts({"C": True})}) == 3
    assert opts({"C": 1, "num_warps": 4}) == opts({"C": 1, "num_warps": 4}) != opts({"C": 1, "num_warps": 8})
    assert opts({"X": t}) is None


def test_descriptor_kernels_refuse_empty_tensors(device):
    # Triton's descriptor checks (skipped by _desc) want positive dims: empty tensors take the pointer
    # kernels, which accept them
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    full, empty = (torch.zeros(shape, dtype=dtype, device=device) for shape in ((1, 2, 8, 32), (1, 2, 0, 32)))
    interp = device == "cpu"
    if not ra._tma_usable(interp, full):
        pytest.skip("no tensor-descriptor kernels on this GPU")
    assert not ra._tma_usable(interp, empty) and not ra._tma_usable(interp, full, empty)


@pytest.mark.parametrize("shape", [((1, 2, 0, 64), (1, 2, 40, 64)), ((0, 2, 40, 64), (0, 2, 40, 64))],
                         ids=["no queries", "empty batch"])  # fmt: skip
def test_empty_queries_or_batch(shape, device, gen):
    # no queries: an empty output and zero gradients of k and v; an empty batch: empty everything
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q = randn(shape[0], dtype, device, gen).requires_grad_(True)
    k, v = (randn(shape[1], dtype, device, gen).requires_grad_(True) for _ in range(2))
    out = crossfuse.relu_attention(q, k, v)
    assert out.shape == q.shape
    out.backward(torch.ones_like(out))
    for g, t in ((q.grad, q), (k.grad, k), (v.grad, v)):
        assert g.shape == t.shape and not g.abs().sum().item()


def _fwd_bwd(q, k, v, do, causal, squared):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = crossfuse.relu_attention(*leaves, causal=causal, squared=squared)
    return (out.detach(), *torch.autograd.grad(out, leaves, do))


@pytest.fixture
def direct_hits(monkeypatch):
    """Counts the launches made straight into a compiled kernel (``_direct.launch``, and the launchers that
    plans keep); starts with nothing remembered and no plans."""
    _direct.clear()
    ra.clear_plans()
    ra.clear_eager()
    hits = []
    launch, launcher = _direct.launch, _direct.launcher

    def counted(slot, grid, args):
        done = launch(slot, grid, args)
        hits.append(done)
        return done

    def counted_launcher(*args):
        go = launcher(*args)

        def counted_go(*a):
            go(*a)
            hits.append(True)

        return counted_go

    monkeypatch.setattr(_direct, "launch", counted)
    monkeypatch.setattr(_direct, "launcher", counted_launcher)
    yield hits
    _direct.clear()
    ra.clear_plans()
    ra.clear_eager()


@pytest.mark.gpu
@pytest.mark.parametrize(
    "dtype, d, length, causal, squared",
    [(torch.bfloat16, 64, 1024, True, False), (torch.bfloat16, 128, 200, False, True),
     (torch.float16, 64, 77, False, False), (torch.float32, 64, 300, True, False)],
)  # fmt: skip
def test_direct_launches_equal_dispatched_ones(dtype, d, length, causal, squared, gen, direct_hits,
                                               monkeypatch):  # fmt: skip
    # the descriptor kernels (16-bit), the pointer kernels and float32's copies: bit for bit the results
    # of Triton's dispatch, and the second call is made without it
    q, k, v, do = (randn((2, 3, length, d), dtype, "cuda", gen) for _ in range(4))
    monkeypatch.setattr(_direct, "_ENABLED", False)
    want = _fwd_bwd(q, k, v, do, causal, squared)
    assert not any(direct_hits)
    monkeypatch.setattr(_direct, "_ENABLED", True)
    first = _fwd_bwd(q, k, v, do, causal, squared)  # dispatched, remembered
    assert direct_hits and not any(direct_hits)
    direct_hits.clear()
    second = _fwd_bwd(q, k, v, do, causal, squared)  # straight into the compiled kernels
    assert direct_hits and all(direct_hits), direct_hits
    for name, a, b, c in zip(("out", "dq", "dk", "dv"), want, first, second, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c), name


@pytest.mark.gpu
def test_direct_launches_tell_specializations_apart(gen, direct_hits):
    # Triton compiles a kernel per alignment of its pointers and per ints' divisibility by 16: a base one
    # element off an aligned address (the pointer kernels) and lengths 64, 65, 64 again must each find
    # their own kernel, every result against float64
    dtype, d = torch.bfloat16, 64
    tol = tolerance("relu_attention", dtype, "fwd")
    for length, offset in ((64, 0), (64, 1), (65, 0), (65, 1), (64, 0), (64, 1)):
        q, k, v = (randn((1, 2, length, d), dtype, "cuda", gen) for _ in range(3))
        buf = torch.empty(q.numel() + offset, dtype=dtype, device="cuda")
        q = buf[offset:].view(q.shape).copy_(q)
        assert (q.data_ptr() % 16 == 0) == (offset == 0)
        want = relu_attention_ref(q.double(), k.double(), v.double())
        for _ in range(2):  # remembered, then launched directly
            got = crossfuse.relu_attention(q, k, v)
            assert relerr(got, want) <= tol, (length, offset, relerr(got, want))
    assert any(direct_hits)


@pytest.mark.gpu
def test_direct_launches_use_the_current_stream(gen, direct_hits):
    # a launch made directly goes to the caller's current stream, as Triton's dispatch does: on a side
    # stream busy for ~10 ms that then overwrites q, the attention must see the new q (on any other
    # stream it would run at once, on the old one)
    q, k, v, q_new = (randn((2, 4, 256, 64), torch.bfloat16, "cuda", gen) for _ in range(4))
    want = crossfuse.relu_attention(q_new, k, v)
    crossfuse.relu_attention(q, k, v)  # every kernel remembered
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    direct_hits.clear()
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)
        q.copy_(q_new)
        got = crossfuse.relu_attention(q, k, v)
    # straight into the compiled kernels: from Python, or from the compiled path's C++ (crossfuse.ops.
    # _runtime.native), which launches on the current stream too
    fast = native.module()
    assert all(direct_hits) and (direct_hits or (fast is not None and fast.count_attention()[0] == 1))
    side.synchronize()
    assert torch.equal(got, want)


def test_remember_keeps_the_bound_constexprs_and_a_bounded_table(monkeypatch):
    # what is passed after the positional arguments: the constexprs given, else their defaults, in the
    # kernel's order; a parameter with neither is never cached; the table starts afresh when full
    import inspect

    class Param:
        def __init__(self, name, default=inspect.Parameter.empty):
            self.name, self.default = name, default

    class Kernel:
        params = (Param("x"), Param("n"), Param("BLOCK"), Param("FLAG", False), Param("MODE", 3))

    class CompiledKernel:  # the type name Triton's compiled kernels have
        pass

    _direct.clear()
    compiled = CompiledKernel()
    _direct.remember(("a",), Kernel, ("x", 7), {"BLOCK": 64, "MODE": 1, "num_warps": 4}, compiled)
    assert _direct.kept(("a",)) == (compiled, (64, False, 1))
    _direct.remember(("b",), Kernel, ("x", 7), {"MODE": 1}, compiled)  # BLOCK missing
    _direct.remember(("c",), Kernel, ("x", 7), {"BLOCK": 64}, object())  # not a compiled kernel
    _direct.remember(None, Kernel, ("x", 7), {"BLOCK": 64}, compiled)  # no key: dispatch each time
    assert list(_direct._COMPILED) == [("a",)]
    monkeypatch.setattr(_direct, "MAX_REMEMBERED", 2)
    _direct.remember(("d",), Kernel, ("x", 7), {"BLOCK": 64}, compiled)
    _direct.remember(("e",), Kernel, ("x", 7), {"BLOCK": 64}, compiled)
    assert list(_direct._COMPILED) == [("e",)]
    _direct.clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_attention_launch_has_a_key(dtype, causal, device, gen, monkeypatch):
    # whatever the attention's launchers pass (pointers, strides, descriptors, scales, constexprs, options)
    # is of a type the keys know, so that no launch falls back to Triton's dispatch for want of a key
    seen = []
    launch, run = launch_module._launch, _direct.run

    def spy_launch(kernel, grid, key, *args, **options):
        seen.append((args, dict(options)))
        return launch(kernel, grid, key, *args, **options)

    def spy_run(kernel, grid, args, options):
        seen.append((args, dict(options)))
        return run(kernel, grid, args, options)

    monkeypatch.setattr(launch_module, "_launch", spy_launch)
    monkeypatch.setattr(_direct, "run", spy_run)
    if device == "cpu" and dtype == torch.bfloat16:
        dtype = torch.float64  # the interpreter's bf16 path is the float32 one; float64 for variety
    q, k, v, do = (randn((1, 2, 40, 32), dtype, device, gen) for _ in range(4))
    tma = ra.AttnConfig(32, 16, 4, 1, True)
    # the descriptor kernels (where usable), then the pointer kernels, in 32 and 64 bits reading the
    # copies with unit stride on L (which the copy kernel makes, through _direct.run)
    for cfg in (tma, ra.AttnConfig(32, 16, 4, 1)):
        ra.relu_attention_fwd(q, k, v, causal, False, 0.2, 0.01, config=cfg)
        dkdv = ra.AttnConfig(16, 32, 4, 1, cfg.tma)
        ra.relu_attention_bwd(q, k, v, do, causal, False, 0.2, 0.01, configs=(dkdv, cfg),
                              trans_copies=not cfg.tma and dtype != torch.bfloat16)  # fmt: skip
    if ra._tma_usable(device == "cpu", q, k, v, do):
        assert any(isinstance(a, TensorDescriptor) for args, _ in seen for a in args)
    assert len(seen) >= (6 if dtype == torch.bfloat16 else 7)  # 3 with descriptors, 3 without, the copies
    for args, options in seen:
        assert _direct.arg_keys(args) is not None, [type(a).__name__ for a in args]
        assert _direct.option_keys(options) is not None, options


class _FakeDriver:
    """``triton.runtime.driver.active`` for the CPU: the current stream of a device is 1000 + its index."""

    def get_current_stream(self, device):
        return 1000 + device


def _fake_compiled(scratch: int):
    """A compiled kernel whose launcher records its calls: ``CudaLauncher`` by type name, as Triton's,
    with its C function ``launch`` and its Python ``__call__`` (which adds the scratch memory)."""
    calls = []

    class CudaLauncher:
        global_scratch_size, profile_scratch_size = scratch, 0
        launch_cooperative_grid, launch_pdl = 0, 1

        def launch(self, *args):
            calls.append(("C", args))

        def __call__(self, *args):
            calls.append(("call", args))

    class CompiledKernel:
        run, function, packed_metadata = CudaLauncher(), "function", (4, 1, 0)

        def launch_metadata(self, grid, stream, *args):
            return ("metadata", grid, stream, args)

    return CompiledKernel(), calls


def test_launcher_calls_the_c_launcher_itself_while_the_launch_hooks_call_nothing(monkeypatch):
    import triton
    from triton.knobs import HookChain

    monkeypatch.setattr(_direct, "triton_version", lambda: (3, 6))
    monkeypatch.setattr(triton.runtime.driver, "_active", _FakeDriver())  # (what set_active sets)
    # hooks empty (Triton's default): the C launcher, no metadata, no hooks, the scratch's None
    compiled, calls = _fake_compiled(scratch=0)
    go = _direct.launcher(compiled, (3,), ("TAIL",), 2)
    go(7, 8)
    assert calls == [("C", (3, 1, 1, 1002, "function", 0, 1, None, None, (4, 1, 0), None, None, None, 7, 8,
                            "TAIL"))]  # fmt: skip
    # a kernel that asks for scratch memory: the launcher's __call__, which allocates it
    compiled, calls = _fake_compiled(scratch=64)
    _direct.launcher(compiled, (3, 2), (), 0)(5)
    assert calls == [("call", (3, 2, 1, 1000, "function", (4, 1, 0), None, None, None, 5))]
    # a Triton whose C launcher was not read for this: its __call__, still without the hooks' work
    monkeypatch.setattr(_direct, "triton_version", lambda: (3, 9))
    compiled, calls = _fake_compiled(scratch=0)
    _direct.launcher(compiled, (3,), (), 0)(5)
    assert calls == [("call", (3, 1, 1, 1000, "function", (4, 1, 0), None, None, None, 5))]
    # a launch hook set (a profiler): the metadata and both hooks, as Triton's dispatch passes them
    chain = HookChain()
    chain.add(lambda metadata: None)
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", chain)
    compiled, calls = _fake_compiled(scratch=0)
    _direct.launcher(compiled, (3,), ("TAIL",), 0)(7)
    exit_hook = triton.knobs.runtime.launch_exit_hook
    assert calls == [("call", (3, 1, 1, 1000, "function", (4, 1, 0), ("metadata", (3,), 1000, (7, "TAIL")),
                               chain, exit_hook, 7, "TAIL"))]  # fmt: skip


def _fake_wrapped(indices: set, metas: list | None):
    """A compiled kernel whose C launcher sits beneath a Python wrapper shaped as Triton 3.6's handling of
    tensor descriptors (``wrap_handle_tensordesc``: a closure over the C launcher, the descriptors'
    positions and metadata, with ``make_tensordesc_arg`` among its globals). Returns the kernel, the C
    launcher's calls and the encodings made."""
    calls, encoded = [], []

    def make_tensordesc_arg(arg, metadata):
        encoded.append(arg.base.data_ptr())
        return [("map", arg.base.data_ptr(), tuple(arg.block_shape), metadata), *arg.shape, *arg.strides]

    source = (
        "def wrap(launcher, tensordesc_indices, tensordesc_meta):\n"
        "    def inner(*args):\n"
        "        final = list(args[:13])\n"
        "        k = 0\n"
        "        for i, a in enumerate(args[13:]):\n"
        "            if i in tensordesc_indices:\n"
        "                final.extend(make_tensordesc_arg(a, tensordesc_meta[k]))\n"
        "                k += 1\n"
        "            else:\n"
        "                final.append(a)\n"
        "        return launcher(*final)\n"
        "    return inner\n"
    )  # fmt: skip
    namespace = {"make_tensordesc_arg": make_tensordesc_arg}
    exec(source, namespace)
    wrapped = namespace["wrap"](lambda *args: calls.append(args), indices, metas)

    class CudaLauncher:
        global_scratch_size = profile_scratch_size = 0
        launch_cooperative_grid, launch_pdl = 0, 1
        launch = staticmethod(wrapped)

    class CompiledKernel:
        run, function, packed_metadata = CudaLauncher(), "function", (4, 1, 0)

    return CompiledKernel(), calls, encoded


def test_a_plans_descriptors_are_encoded_once_per_address_beneath_tritons_wrapper(monkeypatch):
    import triton

    monkeypatch.setattr(_direct, "triton_version", lambda: (3, 6))
    monkeypatch.setattr(triton.runtime.driver, "_active", _FakeDriver())
    t, u = torch.zeros(4, 8), torch.zeros(4, 8)
    spec = ([4, 8], [8, 1], [2, 8])
    base = (3, 1, 1, 1002, "function", 0, 1, None, None, (4, 1, 0), None, None, None)

    def expanded(x):
        return (("map", x.data_ptr(), (2, 8), "meta"), 4, 8, 8, 1)

    compiled, calls, encoded = _fake_wrapped({1}, ["meta"])
    go = _direct.launcher(compiled, (3,), ("TAIL",), 2, {1: spec})
    go(7, t, 9)
    go(7, t, 9)  # the same address: its tensor map again, not encoded afresh
    go(7, u, 9)
    assert encoded == [t.data_ptr(), u.data_ptr()]
    assert calls == [(*base, 7, *expanded(t), 9, "TAIL")] * 2 + [(*base, 7, *expanded(u), 9, "TAIL")]
    # a descriptor Triton lowers to pointers (no metadata: its expansion holds the tensor itself), or
    # descriptor positions that are not the plan's: not beneath the wrapper
    for indices, metas in (({1}, [None]), ({0, 1}, ["meta", "meta"]), ({2}, ["meta"])):
        compiled, _, _ = _fake_wrapped(indices, metas)
        assert _direct._beneath_descriptors(compiled.run.launch, {1: spec}) is None
    # there, Triton's wrapper is given a descriptor built per call, and encodes it per call
    compiled, calls, encoded = _fake_wrapped({1}, [None])
    go = _direct.launcher(compiled, (3,), (), 2, {1: spec})
    go(7, t)
    go(7, t)
    assert encoded == [t.data_ptr()] * 2 and len(calls) == 2


def test_a_gluon_descriptors_key_holds_its_layout_and_a_plan_names_its_base(monkeypatch):
    # Triton's key of a Gluon descriptor holds its shared-memory layout: two layouts, two keys. A launch
    # plan takes a Gluon descriptor over a view starting where one of the call's tensors starts (the
    # float32 kernels' row views) as that tensor's place, the launcher told its shape, strides, box and
    # layout; over any other memory (a copy), or where two of the call's tensors start there, no plan
    gluon = pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from triton.experimental.gluon import language as gl

    t = torch.zeros(2, 32, 32, dtype=torch.float32)
    rows = t.view(64, 32)

    def layout(swizzle):
        return gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=32, rank=2)

    def desc(base, swizzle=0):
        return gluon.TensorDescriptor(base, [64, 32], [32, 1], [16, 32], layout(swizzle))

    a, b = _direct.arg_keys((desc(rows),)), _direct.arg_keys((desc(rows, 64),))
    assert a is not None and b is not None and a != b and a == _direct.arg_keys((desc(rows),))
    monkeypatch.setattr(_direct, "kept", lambda slot: ("compiled", ()))
    monkeypatch.setattr(_direct, "launcher", lambda compiled, grid, tail, device, descs: descs)
    u = torch.zeros(2, 32, 32)
    plan = ra._make_plan([(("slot", 0), (1, 1), (u, desc(rows), 5))], (t, u))
    spec = ([64, 32], [32, 1], [16, 32], layout(0))
    ((go, template, places, step),) = plan.launches
    assert (go, template, places) == ({1: spec}, (ra._Tensor(1), ra._Tensor(0), 5), ((0, 1), (1, 0)))
    assert step == ra.Step("compiled", (), (1, 1), {1: spec})  # what the compiled eager path records
    copy = torch.zeros(64, 32)
    assert ra._make_plan([(("slot", 0), (1, 1), (desc(copy),))], (t, u)) is None
    assert ra._make_plan([(("slot", 0), (1, 1), (desc(rows),))], (t, t.view(2, 32, 32))) is None
