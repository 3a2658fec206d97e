"""The layer norm's compiled eager path (crossfuse.ops._runtime.native and its C++ module): the programs
recorded from a plan's launches, the module's build, and on the GPU the same results as the Python path,
bit for bit, with no Python plan code on the way."""

from __future__ import annotations

import ctypes
import types
from types import SimpleNamespace

import crossfuse
import pytest
import torch
from _layer_norm_checks import ln_tol, randn
from crossfuse.ops._runtime import native
from crossfuse.ops.layer_norm import api, launch_bwd, plan
from crossfuse.tolerances import relerr

pytestmark = pytest.mark.usefixtures("fresh_layer_norm_plans")


class FakeRun:
    """What :func:`native.program` reads of Triton's launcher: its scratch sizes and launch flags."""

    def __init__(self, **kw):
        self.global_scratch_size = kw.get("global_scratch_size", 0)
        self.profile_scratch_size = kw.get("profile_scratch_size", 0)
        self.launch_pdl = kw.get("launch_pdl", False)
        self.launch_cooperative_grid = False


def fake_launch(signature: dict, tail=(), descs=None, grid=(7,), shared=1024, num_ctas=1, **run):
    compiled = SimpleNamespace(
        function=1234, run=FakeRun(**run), src=SimpleNamespace(signature=signature),
        metadata=SimpleNamespace(num_warps=4, shared=shared, num_ctas=num_ctas),
    )  # fmt: skip
    return SimpleNamespace(compiled=compiled, tail=tail, descs=descs, grid=grid)


SIG = {"X": "*bf16", "Y": "*bf16", "M": "i32", "eps": "fp32", "big": "i64", "BLOCK": "constexpr"}


def test_program_maps_addresses_to_slots_and_skips_constexprs():
    x, y = torch.empty(100, dtype=torch.bfloat16), torch.empty(10, dtype=torch.float32)
    launch = fake_launch(SIG, tail=(64,), launch_pdl=True)
    args = (x.data_ptr() + 20, y, 100, 1e-5, 2**40)  # an address inside x, a tensor, then scalars
    (got,) = native.program([(launch, args)], [None, x, y])
    function, gx, gy, gz, block, shared, pdl, coop, packed = got
    assert (function, gx, gy, gz, block, shared, pdl, coop) == (1234, 7, 1, 1, 128, 1024, True, False)
    assert packed[:5] == [(native.PTR, 1, 20, 0.0), (native.PTR, 2, 0, 0.0), (native.I32, -1, 100, 0.0),
                          (native.F32, -1, 0, 1e-5), (native.I64, -1, 2**40, 0.0)]  # fmt: skip
    assert packed[5:] == [(native.PTR, -1, 0, 0.0)] * 2  # the launcher's global and profile scratch


@pytest.mark.parametrize(
    "change, why",
    [
        (dict(descs={1: ()}), "a descriptor where the launcher's handling of them is not the one read"),
        (dict(global_scratch_size=64), "scratch memory"),
        (dict(num_ctas=2), "clusters"),
        (dict(shared=300 * 1024), "oversized shared memory"),
        (dict(signature={**SIG, "M": "bf16"}), "an argument type it does not pack"),
        (dict(address=1 << 20), "an address outside the slots"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_program_refuses_what_the_module_cannot_launch(change, why):
    x = torch.empty(100, dtype=torch.bfloat16)
    address = change.pop("address", x.data_ptr())
    launch = fake_launch(change.pop("signature", SIG), tail=(64,), **change)
    assert native.program([(launch, (address, x, 1, 1.0, 1))], [x]) is None, why


def test_program_zeroes_contiguous_bytes_within_one_slot_in_order():
    scratch, other = torch.empty(64, dtype=torch.float32), torch.empty(8, dtype=torch.float32)
    launch = fake_launch(SIG, tail=(64,))
    args = (scratch.data_ptr(), scratch, 1, 1e-5, 2)
    zero = plan.Zeroing()
    got = native.program([(zero, (scratch[8:24],)), (launch, args)], [None, scratch])
    assert got[0] == (1, 32, 64) and got[1][0] == 1234  # slot 1, 32 bytes in, 16 float32s; then the launch
    # outside the slots, strided, or past its slot's end (a view of other memory): no program
    assert native.program([(zero, (other[:4],))], [None, scratch]) is None
    assert native.program([(zero, (scratch[::2],))], [None, scratch]) is None
    past = torch.empty(0).set_(scratch.untyped_storage(), 60, (8,))
    assert native.program([(zero, (past,))], [None, scratch[:62]]) is None


def test_fewer_programs_only_where_the_partials_then_fit_into_dx():
    # float32 1000x5000 on 132 SMs: 132 programs' partials take 264 rows, more than a quarter; 124 take 248
    assert launch_bwd.fitting_programs(132, 1000, 1, 20000, 5000, 4, 2) == 124
    assert launch_bwd.scratch_rows(1000, 20000, 2 * 124 * 5000 * 4) == (248, 15040000)
    assert launch_bwd.fitting_programs(132, 1000, 1, 20000, 5000, 4, 1) == 132  # dw alone fits as it is
    # 100 rows: no program count within one more row each fits; the plan keeps its own buffer
    assert launch_bwd.fitting_programs(100, 100, 1, 20000, 5000, 4, 2) == 100


def test_program_refuses_an_address_that_two_slots_hold():
    # one tensor given as weight and bias: a later call of the key may give two, and a program that
    # named one slot for both would read the weight as the bias
    x, p = torch.empty(100, dtype=torch.bfloat16), torch.empty(10, dtype=torch.bfloat16)
    launch = fake_launch(SIG, tail=(64,))
    assert native.program([(launch, (x, p, 1, 1.0, 1))], [x, p, p]) is None
    assert native.program([(launch, (x, p, 1, 1.0, 1))], [x, p, None]) is not None


def test_program_maps_overlapping_views_to_the_one_that_starts_at_the_address():
    # q, k and v as views of one fused projection (B, L, 3, H, D): q's bytes hold k's and v's starts too,
    # and each kernel argument is a view's own start, so it belongs to the slot that starts there
    qkv = torch.empty(2, 16, 3, 4, 8, dtype=torch.bfloat16)
    q, k, v = qkv.unbind(2)
    launch = fake_launch({"Q": "*bf16", "K": "*bf16", "V": "*bf16", "BLOCK": "constexpr"}, tail=(64,))
    (got,) = native.program([(launch, (q, k, v))], [q, k, v])
    assert got[-1][:3] == [(native.PTR, 0, 0, 0.0), (native.PTR, 1, 0, 0.0), (native.PTR, 2, 0, 0.0)]
    # an address inside several slots that none of them starts at: no program
    inside = k.data_ptr() + 2
    assert native.program([(launch, (q, inside, v))], [q, k, v]) is None


class FakeMap:
    """A tensor map as Triton's ``make_tensordesc_arg`` returns it: its bytes behind ``tma_desc_cpu_ptr``
    (here the base address repeated, or, with ``blind``, bytes that ignore it)."""

    def __init__(self, address: int, blind: bool = False):
        self.bytes = ctypes.create_string_buffer((7 if blind else address).to_bytes(8, "little") * 16, 128)

    def tma_desc_cpu_ptr(self) -> int:
        return ctypes.addressof(self.bytes)


def _tensordesc_launch(blind: bool = False, expand_kept: bool = True):
    """A launch whose kernel takes a tensor descriptor at position 1 (given by its base), its compiled
    launcher wrapped as Triton's ``wrap_handle_tensordesc`` leaves it: a closure over the C launcher, the
    descriptors' positions and metadata, in a module whose globals hold ``make_tensordesc_arg`` and
    ``expand_signature`` (what ``direct.tensordesc_handling`` reads; some versions keep the latter inside
    their launcher's builder, where ``native.expanded`` stands in: ``expand_kept=False``)."""

    def make(desc, meta):
        return [FakeMap(desc.base.data_ptr(), blind), *desc.shape, *desc.strides]

    def expand(signature, metas):
        ndim = 2
        return ["nvTmaDesc"] + ["i32"] * ndim + ["i64"] * ndim

    launcher, tensordesc_indices, tensordesc_meta = object(), {1}, [{"swizzle": 3}]

    def wrapped(*args):
        return launcher, tensordesc_indices, tensordesc_meta

    found = {"make_tensordesc_arg": make, **({"expand_signature": expand} if expand_kept else {})}
    raw = types.FunctionType(wrapped.__code__, found, closure=wrapped.__closure__)
    signature = {"X": "*bf16", "D": "tensordesc<bf16[16, 64]>", "M": "i32", "BLOCK": "constexpr"}
    launch = fake_launch(signature, tail=(64,), descs={1: ([64, 64], [64, 1], [16, 64])})
    launch.compiled.run.launch = raw
    return launch


@pytest.mark.parametrize("expand_kept", [True, False], ids=["expand_signature kept", "its rule"])
def test_program_keeps_a_descriptors_tensor_map_per_address(expand_kept):
    # a descriptor's base becomes a tensor-map argument over its slot (the C++ module keeps the map per
    # address and calls the encoder on a miss), then its shape and strides as Triton's launcher expands
    # them; where the bytes read do not follow the address, no program
    x = torch.empty(64 * 64 + 64, dtype=torch.bfloat16)
    row = x[64:]  # a descriptor over a view: the map's address is 128 bytes into the slot
    (got,) = native.program([(_tensordesc_launch(expand_kept=expand_kept), (x, row, 5))], [x])
    packed = got[-1]
    assert packed[0] == (native.PTR, 0, 0, 0.0)
    kind, slot, offset, real, encode = packed[1]
    assert (kind, slot, offset, real) == (native.MAP, 0, 128, 0.0)
    assert encode(x, 128) == (row.data_ptr()).to_bytes(8, "little") * 16  # the map of that address
    assert packed[2:7] == [(native.I32, -1, 64, 0.0), (native.I32, -1, 64, 0.0), (native.I64, -1, 64, 0.0),
                           (native.I64, -1, 1, 0.0), (native.I32, -1, 5, 0.0)]  # fmt: skip
    assert native.program([(_tensordesc_launch(blind=True), (x, row, 5))], [x]) is None
    assert native.program([(_tensordesc_launch(), (x, torch.empty(64, 64), 5))], [x]) is None  # no slot


def test_expanded_follows_tritons_rule_for_descriptors_lowered_to_tensor_maps():
    # per descriptor: the map, then its shape as i32 and its strides as i64; Gluon's types carry a layout
    sig = ["*bf16", "tensordesc<bf16[64, 64]>", "i32", "tensordesc<fp16[1, 1, 128, 64],NVMMASharedLayout(x)>"]
    two, four = ["i32"] * 2 + ["i64"] * 2, ["i32"] * 4 + ["i64"] * 4
    assert native.expanded(sig, [{}, {}]) == ["*bf16", "nvTmaDesc", *two, "i32", "nvTmaDesc", *four]


def test_recorded_keeps_only_this_threads_launches():
    import threading

    seen = []
    launch = SimpleNamespace(go=lambda *a: seen.append(a))

    def run():
        other = threading.Thread(target=lambda: launch.go("other"))
        other.start()
        other.join()
        launch.go("mine")

    _, calls = native.recorded([launch], run)
    assert calls == [(launch, ("mine",))] and seen == [("other",), ("mine",)]


def test_recorded_restores_the_launches_after_an_error():
    seen = []
    launch = SimpleNamespace(go=lambda *a: seen.append(a))
    go = launch.go

    def run():
        launch.go(1, 2)
        raise KeyError("boom")

    with pytest.raises(KeyError):
        native.recorded([launch], run)
    assert launch.go is go and seen == [(1, 2)]
    out, calls = native.recorded([launch], lambda: launch.go(3) or "done")
    assert out == "done" and calls == [(launch, (3,))] and launch.go is go


def test_the_module_builds_loads_and_takes_no_cpu_call(tmp_path, monkeypatch):
    monkeypatch.setenv("CROSSFUSE_CACHE_DIR", str(tmp_path))
    if native.missing() is not None:
        pytest.skip(f"the compiled path cannot be built here: {native.missing()}")
    path = native.build(verbose=False)  # where it can, it must
    assert path.is_relative_to(tmp_path) and native.build(verbose=False) == path  # built once
    fast = native._load(path)
    assert fast.count() == (0, 0)
    x = torch.randn(4, 8)
    assert fast.layer_norm(x, (8,), None, None, 1e-5) is None  # CPU tensors: the Python path
    assert fast.add_layer_norm(x, (8,), None, None, 1e-5, [], torch.empty(2), lambda *a: None) is False
    with pytest.raises(ValueError, match="entry"):
        fast.add_layer_norm_backward(12345, True, True, True, [], None, None)
    # the attention's functions too: CPU tensors, flags that are not bools, take no program
    q = torch.randn(1, 2, 8, 16)
    assert fast.count_attention() == (0, 0)
    assert fast.relu_attention(q, q, q, False, False, None, None, "bhld") is None
    assert fast.relu_attention(q, q, q, 0, False, None, None, "bhld") is None
    added = fast.add_relu_attention(q, q, q, False, False, None, None, "bhld", [], q, lambda *a: None, [])
    assert added is False
    with pytest.raises(ValueError, match="entry"):
        fast.add_relu_attention_backward(12345, q, [], q, q, q, [])


# ----------------------------------------------------------------------------------------------------
# on the GPU
# ----------------------------------------------------------------------------------------------------

CASES = [
    ((4096, 1024), True, True),  # whole rows
    ((64, 8192), True, True),  # few rows
    ((3, 700, 5000), True, True),  # 3-D; on the H100 whole rows
    ((1000, 5000), True, True),  # float32 on the H100: fewer programs, so that the partials fit into dx
    ((2048, 768), False, True),  # bias only
    ((1000, 1000), True, False),  # weight only
    ((512, 256), False, False),
    ((4101, 16384), True, True),  # the grouped Gluon kernel: its counters zeroed by the program
]


def _module():
    fast = native.module()
    if fast is None:
        pytest.fail(f"the compiled path is not available on this GPU machine: {native.problem()}")
    return fast


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape, has_w, has_b", CASES, ids=str)
def test_compiled_path_gives_the_python_paths_results_bit_for_bit(shape, has_w, has_b, dtype, gen,
                                                                   monkeypatch):  # fmt: skip
    fast = _module()
    n = shape[-1]
    x = randn(shape, dtype, "cuda", gen).requires_grad_(True)
    w = randn((n,), dtype, "cuda", gen).requires_grad_(True) if has_w else None
    b = randn((n,), dtype, "cuda", gen).requires_grad_(True) if has_b else None
    dy = randn(shape, dtype, "cuda", gen)
    wrt = [t for t in (x, w, b) if t is not None]

    def step():
        y = crossfuse.layer_norm(x, (n,), w, b)
        return (y, *torch.autograd.grad(y, wrt, dy))

    python = step()  # the first call: Triton's dispatch; the second registers the forward's program
    for a, c in zip(python, step(), strict=True):
        assert torch.equal(a, c)
    third = step()  # the compiled forward; its backward records the backward's program
    forwards, backwards = fast.count()
    ((_, plan),) = next(iter(api.CALLS.plans.values())).bwd.values()
    own_scratch = plan.path != "few" and plan.total and not plan.R  # not in dx's last rows: not a slot
    plain = not own_scratch
    # the backward has its program, its descriptors' tensor maps kept per address, its zeroings of scratch
    # in stream order; one with scratch memory outside dx keeps the Python path (native.program)
    assert forwards == 1 and backwards == int(plain), (plan.path, backwards)
    calls = []
    for name in ("forward", "backward", "backward_plan"):
        fn = getattr(api.Call, name)
        monkeypatch.setattr(api.Call, name, lambda *a, fn=fn, name=name: calls.append(name) or fn(*a))
    for got in (third, step(), step()):
        for a, c in zip(python, got, strict=True):
            assert torch.equal(a, c)
    # no Python plan code: the C++ module's programs (a backward without one calls back into its plan)
    assert calls == [] if plain else set(calls) == {"backward", "backward_plan"}
    calls.clear()
    with torch.no_grad():  # and without an autograd node
        assert torch.equal(crossfuse.layer_norm(x, (n,), w, b), python[0])
    assert calls == []


@pytest.mark.gpu
def test_compiled_path_on_a_side_stream_and_in_a_module(gen):
    _module()
    m = crossfuse.nn.LayerNorm(1024, native_below=0).cuda().to(torch.bfloat16)
    x = randn((4096, 1024), torch.bfloat16, "cuda", gen).requires_grad_(True)
    want = torch.nn.functional.layer_norm(x.float(), (1024,), m.weight.float(), m.bias.float())
    for _ in range(3):
        m(x).sum().backward()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = m(x)
        (gx,) = torch.autograd.grad(y.float().sum(), x)
    torch.cuda.current_stream().wait_stream(side)
    assert (y.float() - want).abs().max().item() < 0.05
    assert torch.isfinite(gx).all()


@pytest.mark.gpu
def test_a_strided_gradient_first_leaves_later_contiguous_ones_right(gen):
    # a gradient with another row stride (a slice of a wider one) takes the Python path and records no
    # program, so the contiguous gradients after it get their own
    _module()
    n = 1024
    x = randn((512, n), torch.bfloat16, "cuda", gen).requires_grad_(True)
    w = randn((n,), torch.bfloat16, "cuda", gen).requires_grad_(True)
    wide = randn((512, 2 * n), torch.bfloat16, "cuda", gen)
    want = torch.autograd.grad(torch.nn.functional.layer_norm(x.double(), (n,), w.double()), x,
                               wide[:, :n].double())[0]  # fmt: skip
    for dy in [wide[:, :n]] * 3 + [wide[:, :n].contiguous()] * 3:
        (gx,) = torch.autograd.grad(crossfuse.layer_norm(x, (n,), w), x, dy)
        assert (gx.double() - want).abs().max().item() < 0.1


@pytest.mark.gpu
def test_one_tensor_as_weight_and_bias_then_two(gen):
    _module()
    n = 768
    x = randn((256, n), torch.float32, "cuda", gen)
    p, q = (randn((n,), torch.float32, "cuda", gen) for _ in range(2))
    for w, b in [(p, p)] * 3 + [(p, q)] * 3:
        want = torch.nn.functional.layer_norm(x, (n,), w, b)
        assert torch.allclose(crossfuse.layer_norm(x, (n,), w, b), want, atol=1e-4)


@pytest.mark.gpu
def test_compiled_backward_refuses_a_double_backward_only_under_create_graph(gen):
    _module()
    x = randn((256, 512), torch.float32, "cuda", gen).requires_grad_(True)
    for _ in range(3):  # the compiled path from the third call
        y = crossfuse.layer_norm(x, (512,))
        torch.autograd.grad(y.pow(3).sum(), x)
    for loss in (lambda t: t.pow(3).sum(), lambda t: (t * t.detach()).sum()):  # the second: dy is constant
        y = crossfuse.layer_norm(x, (512,))
        (gx,) = torch.autograd.grad(loss(y), x, create_graph=True)
        with pytest.raises(RuntimeError, match="differentiate twice"):
            gx.square().sum().backward()


def _compiled_output(x, n, w=None, b=None):
    """``crossfuse.layer_norm(x, (n,), w, b)`` once its call runs from the C++ module (after three calls:
    Triton's dispatch, the forward's program, the backward's)."""
    for _ in range(3):
        y = crossfuse.layer_norm(x, (n,), w, b)
        wrt = [t for t in (x, w, b) if t is not None and t.requires_grad]
        torch.autograd.grad(y, wrt, torch.ones_like(y))
    y = crossfuse.layer_norm(x, (n,), w, b)
    assert y.grad_fn.name() == "CrossfuseLayerNormBackward"
    return y


@pytest.mark.gpu
def test_compiled_node_keeps_autograds_rules_for_saved_tensors(gen):
    # freed after a backward that does not retain the graph; an input changed in place since the forward
    # is an error, not a silent wrong gradient; saved-tensor hooks see what the node saves
    _module()
    n = 768
    x = randn((512, n), torch.bfloat16, "cuda", gen).requires_grad_(True)
    w, b = (randn((n,), torch.bfloat16, "cuda", gen).requires_grad_(True) for _ in range(2))
    dy = randn((512, n), torch.bfloat16, "cuda", gen)
    y = _compiled_output(x, n, w, b)
    torch.autograd.grad(y, (x, w, b), dy)
    with pytest.raises(RuntimeError, match="second time"):
        torch.autograd.grad(y, (x, w, b), dy)
    leaf = randn((512, n), torch.bfloat16, "cuda", gen)
    z = leaf.clone().requires_grad_(True)
    h = z * 1  # a non-leaf input, changed in place below
    y = _compiled_output(h, n, w, b)
    with torch.no_grad():
        h.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(y, (z, w, b), dy)
    packed = []

    def pack(t):
        packed.append(t.data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = crossfuse.layer_norm(x, (n,), w, b)
    assert y.grad_fn.name() == "CrossfuseLayerNormBackward"
    assert {x.data_ptr(), w.data_ptr()} <= set(packed)  # x and the weight themselves
    want = torch.autograd.grad(torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double()),
                               (x, w, b), dy.double())  # fmt: skip
    for got, ref in zip(torch.autograd.grad(y, (x, w, b), dy), want, strict=True):
        assert (got.double() - ref).abs().max().item() < 0.1 * max(1.0, ref.abs().max().item())
    # copies saved (other addresses, as saved-tensor offloading gives back): the backward reads those
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
        y = crossfuse.layer_norm(x, (n,), w, b)
    for got, ref in zip(torch.autograd.grad(y, (x, w, b), dy), want, strict=True):
        assert (got.double() - ref).abs().max().item() < 0.1 * max(1.0, ref.abs().max().item())

    class Refused(Exception):
        pass

    def refuse(t):
        raise Refused("nothing saved here")

    with torch.autograd.graph.saved_tensors_hooks(refuse, lambda t: t):
        with pytest.raises(Refused, match="nothing"):  # the hook's own exception, not the module's
            crossfuse.layer_norm(x, (n,), w, b)


@pytest.mark.gpu
@pytest.mark.parametrize("has_w", [True, False], ids=["weight and bias", "bias only"])
def test_compiled_node_computes_only_the_gradients_asked(has_w, gen, monkeypatch):
    # the flags the node passes on (to its Python backward, where it has no program yet) and the
    # gradients it gives: the bias's edge is the third whether or not there is a weight. bf16 300x768:
    # the few-rows backward with and without weight, one pointer kernel whose program is recorded (in
    # float32 the bias-only backward reads through descriptors: no program, the Python plan each time)
    _module()
    n, dt = 768, torch.bfloat16
    x = randn((300, n), dt, "cuda", gen)  # needs no gradient: its edge is empty
    w = randn((n,), dt, "cuda", gen).requires_grad_(True) if has_w else None
    b = randn((n,), dt, "cuda", gen).requires_grad_(True)
    dy = randn((300, n), dt, "cuda", gen)
    asked = []
    plan_of = api.Call.backward_plan

    def backward_plan(self, dy, x, w, x_shape, need_dw, need_db):
        asked.append((need_dw, need_db))
        return plan_of(self, dy, x, w, x_shape, need_dw, need_db)

    monkeypatch.setattr(api.Call, "backward_plan", backward_plan)
    y = _compiled_output(x, n, w, b)
    assert set(asked) == {(has_w, True)}
    wd = w.double().requires_grad_(True) if has_w else None
    bd = b.double().requires_grad_(True)
    ref = torch.nn.functional.layer_norm(x.double(), (n,), wd, bd)
    one = w if has_w else b  # the weight alone where there is one (a new layout of flags), else the bias
    asked.clear()
    (got,) = torch.autograd.grad(y, (one,), dy, retain_graph=True)
    (want,) = torch.autograd.grad(ref, (wd if has_w else bd,), dy.double(), retain_graph=True)
    assert relerr(got, want) <= ln_tol(dt, "reduced", 300)
    assert asked == ([(True, False)] * 2 if has_w else [])  # dw alone: the Python plan once, then recorded
    y.backward(dy)
    assert x.grad is None and b.grad is not None and (w.grad is not None if has_w else True)
    (rb,) = torch.autograd.grad(ref, (bd,), dy.double())
    assert relerr(b.grad, rb) <= ln_tol(dt, "reduced", 300)


@pytest.mark.gpu
def test_compiled_autograd_takes_the_python_path(gen):
    # compiled autograd cannot trace the C++ node (it has no compiled_args): while it is on, calls take
    # the Python path, whose autograd.Function it can
    from torch._dynamo import compiled_autograd

    _module()
    n = 1024
    x = randn((256, n), torch.float32, "cuda", gen).requires_grad_(True)
    w = randn((n,), torch.float32, "cuda", gen).requires_grad_(True)
    _compiled_output(x, n, w)
    with compiled_autograd._enable(lambda gm: gm):
        y = crossfuse.layer_norm(x, (n,), w)
        assert y.grad_fn.name() != "CrossfuseLayerNormBackward"
        y.pow(2).sum().backward()
    xd, wd = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    torch.nn.functional.layer_norm(xd, (n,), wd).pow(2).sum().backward()
    assert torch.allclose(x.grad.double(), xd.grad, atol=1e-3, rtol=1e-3)
    assert torch.allclose(w.grad.double(), wd.grad, atol=1e-3, rtol=1e-3)
