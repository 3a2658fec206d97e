"""The attention's launch plans (crossfuse.ops.relu_attention.plans._planned): a call with the key of an
earlier one makes that call's launches on its own tensors, and gets what deciding afresh gets, bit for bit.

On a GPU the plans replay compiled kernels (crossfuse.ops._runtime.direct); under the CPU's interpreter,
where nothing is compiled, a stand-in for ``_direct`` runs the kernels through the interpreter and the
launchers decide as they would on a GPU (``is_interpreted`` False: the GPU's tiles, pointer kernels)."""

from __future__ import annotations

import pytest
import torch
from _attention import CompiledStandIn, randn
from crossfuse.ops import relu_attention as ra
from crossfuse.ops._runtime import direct as _direct
from crossfuse.ops.relu_attention import launch as launch_module
from crossfuse.ops.relu_attention import plans as plans_module
from crossfuse.ops.relu_attention.plans import steps
from crossfuse.reference import relu_attention_ref
from crossfuse.tolerances import relerr, tolerance


class Planning:
    """Plans on; counts the calls that decided their launches afresh and the launches made from plans."""

    def __init__(self, monkeypatch, device):
        self.decided = []
        self.compiled = CompiledStandIn()
        self.table = self.compiled.table  # slot -> (kernel, options)
        for name in ("_fwd_launches", "_bwd_launches"):
            monkeypatch.setattr(launch_module, name, self._counted(name, getattr(launch_module, name)))
        self.replays = []
        replay = plans_module._replay

        def counted_replay(plan, tensors):
            replay(plan, tensors)
            self.replays.append(len(plan.launches))  # the launches made from the plan

        monkeypatch.setattr(plans_module, "_replay", counted_replay)
        if device == "cpu":
            monkeypatch.setattr(launch_module, "is_interpreted", lambda kernel: False)
            self.compiled.install(monkeypatch)
        else:
            _direct.clear()

    def _counted(self, name, fn):
        def counted(*args):
            self.decided.append(name)
            return fn(*args)

        return counted


@pytest.fixture
def planning(monkeypatch, device):
    yield Planning(monkeypatch, device)
    _direct.clear()


def _run(q, k, v, do, causal, squared, scale=0.2, relu_scale=0.01, configs=(None, None),
         choices=ra.DEFAULT):  # fmt: skip
    out = ra.relu_attention_fwd(q, k, v, causal, squared, scale, relu_scale, config=configs[0],
                                choices=choices)  # fmt: skip
    grads = ra.relu_attention_bwd(q, k, v, do, causal, squared, scale, relu_scale, configs=configs[1],
                                  choices=choices)  # fmt: skip
    return out, *grads


def _check_against_float64(got, q, k, v, do, causal, squared, scale=0.2, relu_scale=0.01):
    qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    want = relu_attention_ref(qd, kd, vd, causal=causal, squared=squared, scale=scale, relu_scale=relu_scale)
    grads = torch.autograd.grad(want, (qd, kd, vd), do.double())
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, (want, *grads), strict=True):
        kind = "fwd" if name == "out" else "bwd"
        tol = tolerance("relu_attention", q.dtype, kind, tf32=q.is_cuda)  # float32 on GPUs: tf32 products
        assert relerr(g, w) <= tol, (name, relerr(g, w))


CASES = [  # (D, L, causal, squared): the descriptor and pointer kernels of the tables, odd lengths
    (64, 256, True, False),
    (64, 77, False, True),
    (128, 130, False, False),
]


@pytest.mark.parametrize("d, length, causal, squared", CASES)
def test_plans_replay_what_deciding_afresh_launches(d, length, causal, squared, device, gen, planning):
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    shape = (1, 2, length, d)
    q, k, v, do = (randn(shape, dtype, device, gen) for _ in range(4))
    first = _run(q, k, v, do, causal, squared)  # decided, recorded
    assert planning.decided == ["_fwd_launches", "_bwd_launches"] and len(ra._PLANS) == 2
    _check_against_float64(first, q, k, v, do, causal, squared)
    planning.decided.clear()
    # the same key, other tensors: the plans' launches on the new tensors, never on the old ones
    q2, k2, v2, do2 = (randn(shape, dtype, device, gen) for _ in range(4))
    second = _run(q2, k2, v2, do2, causal, squared)
    assert not planning.decided and len(planning.replays) == 2 and all(planning.replays)
    _check_against_float64(second, q2, k2, v2, do2, causal, squared)
    fresh = _run(q2, k2, v2, do2, causal, squared, choices=ra.Choices(planning=False))  # deciding afresh
    for name, a, b in zip(("out", "dq", "dk", "dv"), second, fresh, strict=True):
        assert torch.equal(a, b), name


def test_plans_keep_calls_with_other_keys_apart(device, gen, planning):
    # strides, alignment, flags, scales and tiles are each part of the key: none of these calls may take
    # another's plan; every result against float64
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    shape = (1, 2, 96, 64)
    q, k, v, do = (randn(shape, dtype, device, gen) for _ in range(4))
    blhd = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, do)]  # other strides
    buf = torch.empty(q.numel() + 1, dtype=dtype, device=device)
    q_odd = buf[1:].view(shape).copy_(q)  # 2 bytes off a 16-byte boundary
    calls = [
        ((q, k, v, do), dict(causal=False, squared=False)),
        ((q, k, v, do), dict(causal=True, squared=False)),
        ((q, k, v, do), dict(causal=False, squared=True)),
        (tuple(blhd), dict(causal=False, squared=False)),
        ((q_odd, k, v, do), dict(causal=False, squared=False)),
        ((q, k, v, do), dict(causal=False, squared=False, scale=0.1)),
        ((q, k, v, do), dict(causal=False, squared=False,
                             configs=(ra.AttnConfig(32, 32, 4, 2), (ra.AttnConfig(32, 32, 4, 2),) * 2))),
    ]  # fmt: skip
    for round_ in range(2):  # decided and recorded, then each from its own plan
        for tensors, flags in calls:
            got = _run(*tensors, **flags)
            _check_against_float64(got, *tensors, flags["causal"], flags["squared"], flags.get("scale", 0.2))
        if round_ == 0:
            assert len(planning.decided) == 2 * len(calls) and len(ra._PLANS) == 2 * len(calls)
            planning.decided.clear()
    assert not planning.decided and len(planning.replays) == 2 * len(calls) and all(planning.replays)


def test_plans_follow_the_tensors_given_twice_and_outlive_the_kernel_table(device, gen, planning):
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    q, k, v, do = (randn((1, 2, 64, 64), dtype, device, gen) for _ in range(4))
    # one tensor in two places (self-attention on one input): no plan is made from such a call, since a
    # later call may pass two tensors there ...
    _run(q, q, q, do, False, False)
    assert not ra._PLANS
    # ... and a plan made from distinct tensors serves it
    _run(q, k, v, do, False, False)
    assert len(ra._PLANS) == 2
    planning.decided.clear()
    got = _run(k, k, k, do, False, False)
    assert not planning.decided
    _check_against_float64(got, k, k, k, do, False, False)
    # the compiled-kernel table started afresh: a plan keeps its kernels' launchers, and still replays
    planning.table.clear()
    _direct.clear()
    replays = len(planning.replays)
    got = _run(q, k, v, do, False, False)
    assert not planning.decided and len(planning.replays) == replays + 2
    _check_against_float64(got, q, k, v, do, False, False)


def test_float32_plans_its_copies_each_replay_into_a_buffer_of_its_own(device, gen, planning):
    # float32's products summed over L read copies with unit stride on L (config._tf32_copies), which a
    # kernel makes into a buffer of the call's own: the plan replays that kernel into a buffer it
    # allocates, so later calls decide nothing. On a GPU the Gluon kernels at this shape: the causal ones
    # transpose their tiles themselves, the non-causal backward reads copies (config.TF32_FWD, TF32_BWD);
    # on the CPU the pointer kernels, every product over L from a copy
    shape = (1, 2, 128, 64)
    for causal in (False, True):
        q, k, v, do = (randn(shape, torch.float32, device, gen) for _ in range(4))
        _check_against_float64(_run(q, k, v, do, causal, False), q, k, v, do, causal, False)
    assert len(planning.decided) == 4 and len(ra._PLANS) == 4
    assert any(plan.scratch for plan in ra._PLANS.values())  # the copies planned, not avoided
    planning.decided.clear()
    for causal in (False, True):
        for _ in range(2):  # back to back: the second replay's buffer may reuse the first's memory
            q, k, v, do = (randn(shape, torch.float32, device, gen) for _ in range(4))
            got = _run(q, k, v, do, causal, False)
            _check_against_float64(got, q, k, v, do, causal, False)
            fresh = _run(q, k, v, do, causal, False, choices=ra.Choices(planning=False))
            for name, a, b in zip(("out", "dq", "dk", "dv"), got, fresh, strict=True):
                assert torch.equal(a, b), (causal, name)
    assert planning.decided == ["_fwd_launches", "_bwd_launches"] * 4  # only the unplanned calls decided


def test_a_plan_names_views_of_the_calls_scratch_and_replays_them_over_its_own(monkeypatch):
    # a tensor over a buffer the call allocated (scratch) is a view the replay makes over a buffer of the
    # same shape that it allocates; a tensor over memory that is neither the call's nor its scratch: no plan
    monkeypatch.setattr(_direct, "kept", lambda slot: ("compiled", ()))
    made = []
    monkeypatch.setattr(_direct, "launcher", lambda *slot_grid_tail_device_descs: lambda *a: made.append(a))
    t = torch.zeros(2, 3, 4)
    buf = torch.empty(2, 3, 4, 5)
    view = buf[1].transpose(1, 2)
    plan = ra._make_plan([(("slot", 0), (1, 1), (t, buf, 7)), (("slot", 1), (1, 1), (view, t))], (t,), (buf,))
    assert plan.scratch == (((2, 3, 4, 5), torch.float32, torch.device("cpu")),)
    assert plan.views == ((0, (2, 3, 4, 5), (60, 20, 5, 1), 0), (0, (3, 5, 4), (20, 1, 5), 60))
    assert [p for _, _, p, _ in plan.launches] == [((0, 0), (1, 1)), ((0, 2), (1, 0))]
    other = torch.ones(2, 3, 4)
    ra._replay(plan, (other,))
    (a, b, seven), (c, d) = made
    assert a is other and d is other and seven == 7
    assert b.shape == buf.shape and b.data_ptr() != buf.data_ptr()
    assert c.shape == view.shape and c.stride() == view.stride() and c.data_ptr() == b.data_ptr() + 60 * 4
    assert ra._make_plan([(("slot", 0), (1, 1), (torch.zeros(3),))], (t,), (buf,)) is None


def test_a_plan_keeps_literal_arguments_and_refuses_foreign_tensors(monkeypatch):
    # None, ints and floats are arguments like any other (a kernel's optional descriptor is None); only a
    # tensor that is not one of the call's own makes a launch unplannable
    monkeypatch.setattr(_direct, "kept", lambda slot: ("compiled", ()))
    monkeypatch.setattr(_direct, "launcher", lambda compiled, grid, tail, device, descs: ("launcher", grid,
                                                                                          descs))  # fmt: skip
    t = torch.zeros(2)
    plan = ra._make_plan([(("slot", 0), (1, 1), (t, None, 3, 0.5))], (t,))
    step = ra.Step("compiled", (), (1, 1), None)
    assert plan == ra.Plan(((("launcher", (1, 1), None), (ra._Tensor(0), None, 3, 0.5), ((0, 0),), step),))
    assert ra._make_plan([(("slot",), (1, 1), (torch.zeros(2),))], (t,)) is None
    assert ra._make_plan([(None, (1, 1), (t,))], (t,)) is None  # a launch without a compiled kernel's key


def test_a_plan_passes_a_descriptors_base_and_its_launcher_makes_the_descriptor(monkeypatch):
    # a descriptor over one of the call's tensors: the plan names the tensor's place, and the launcher is
    # told the descriptor's shape, strides and box (it makes the descriptor, or keeps its tensor map)
    from triton.tools.tensor_descriptor import TensorDescriptor

    monkeypatch.setattr(_direct, "kept", lambda slot: ("compiled", ()))
    monkeypatch.setattr(_direct, "launcher", lambda compiled, grid, tail, device, descs: ("launcher", descs))
    q, o = torch.zeros(1, 2, 16, 8), torch.zeros(1, 2, 16, 8)
    desc = TensorDescriptor(o, list(o.shape), list(o.stride()), [1, 1, 16, 8])
    plan = ra._make_plan([(("slot", 0), (1, 1), (q, 7, desc))], (q, o))
    spec = (list(o.shape), list(o.stride()), [1, 1, 16, 8])
    step = ra.Step("compiled", (), (1, 1), {2: spec})
    places = ((0, 0), (2, 1))
    assert plan == ra.Plan(((("launcher", {2: spec}), (ra._Tensor(0), 7, ra._Tensor(1)), places, step),))
    # a descriptor over a tensor that is not the call's: no plan
    other = TensorDescriptor(torch.zeros(1, 2, 16, 8), list(o.shape), list(o.stride()), [1, 1, 16, 8])
    assert ra._make_plan([(("slot", 0), (1, 1), (q, other))], (q, o)) is None


def test_steps_give_a_plans_launches_on_a_calls_tensors(monkeypatch):
    # what the compiled eager path records: each launch's Step and its arguments with the call's tensors
    # at their places, and a plan's scratch buffers allocated for them, its views over them in their places
    monkeypatch.setattr(_direct, "kept", lambda slot: ("compiled", ("tail",)))
    monkeypatch.setattr(_direct, "launcher", lambda *args: "launcher")
    t, u = torch.zeros(2), torch.zeros(3)
    plan = ra._make_plan([(("slot", 0), (4, 1), (t, 7, u)), (("slot", 1), (2,), (u,))], (t, u))
    a, b = torch.ones(2), torch.ones(3)
    ((s1, args1), (s2, args2)), none = steps(plan, (a, b))
    assert none == ()
    assert s1 == ra.Step("compiled", ("tail",), (4, 1), None) and s2.grid == (2,)
    assert args1[0] is a and args1[1] == 7 and args1[2] is b and args2[0] is b
    buf = torch.empty(2, 3)
    scratched = ra._make_plan([(("slot", 0), (1,), (t, buf[0]))], (t,), (buf,))
    ((_, args),), (fresh,) = steps(scratched, (a,))
    assert scratched.scratch and fresh.shape == (2, 3) and fresh.data_ptr() != buf.data_ptr()
    assert args[0] is a and args[1].data_ptr() == fresh.data_ptr() and args[1].shape == (3,)
