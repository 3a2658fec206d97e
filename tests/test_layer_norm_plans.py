"""The layer norm's eager path: a call of a known key is a dictionary look-up and the cached launches (no
plan built, no table read, no torch.library dispatch, no ``kernel[grid]``); the same results as the
dispatched path; empty inputs; one feature; the interpreter's launch shapes."""

from __future__ import annotations

import ctypes
import math

import crossfuse
import pytest
import torch
from _layer_norm_checks import randn
from crossfuse.ops import _library
from crossfuse.ops import layer_norm as ln_mod
from crossfuse.ops._runtime import direct as _direct
from crossfuse.ops.layer_norm import api, config, launch, launch_bwd, plan

pytestmark = pytest.mark.usefixtures("fresh_layer_norm_plans")


class CompiledStandIn:
    """``_direct`` for the CPU: a launch through Triton's dispatch is remembered under a slot, as a GPU's
    compiled kernel would be, and a later launch of that slot runs the kernel through the interpreter
    by a path that no spy counts (``launched`` counts them)."""

    def __init__(self, run):
        self.run = run  # the interpreter's own kernel.run, captured before the spies
        self.table = {}
        self.launched = 0
        self.addresses = 0  # pointer arguments given as addresses

    def key(self, kernel, args, options):
        return (kernel, tuple(sorted(options.items())))

    def remember(self, slot, kernel, args, options, compiled):
        # each tensor argument's dtype and size: a later launch may pass its address instead (a plan's
        # scratch parts and statistics), which the interpreter reads as a tensor over that memory
        places = [(a.dtype, a.numel()) if isinstance(a, torch.Tensor) else None for a in args]
        self.table[slot] = (kernel, options, places)

    def kept(self, slot):
        return (slot, ()) if slot in self.table else None

    def launcher(self, slot, grid, tail, device, descs=None):
        kernel, options, places = self.table[slot]

        def go(*args):
            if descs:  # the descriptors' bases given: made here, as the GPU's launcher makes them
                args = _direct.with_descriptors(args, descs)
            addressed = [type(a) is int and p is not None for a, p in zip(args, places, strict=True)]
            self.addresses += sum(addressed)
            args = [_at_address(a, p) if at else a for a, p, at in zip(args, places, addressed, strict=True)]
            self.run(kernel, *args, grid=grid, warmup=False, **options)
            self.launched += 1

        return go

    def launch(self, slot, grid, args):
        kernel, options, _ = self.table[slot]
        self.run(kernel, *args, grid=grid, warmup=False, **options)
        self.launched += 1
        return True


def _at_address(address: int, place: tuple) -> torch.Tensor:
    """A CPU tensor over ``numel`` elements of ``dtype`` at ``address`` (what a pointer argument given as an
    address points to)."""
    dtype, numel = place
    nbytes = numel * dtype.itemsize
    return torch.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype=dtype, count=numel)


class Counts:
    """Counts the calls of each spied function."""

    def __init__(self):
        self.calls = {}

    def spy(self, monkeypatch, owner, name):
        fn = getattr(owner, name)

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return fn(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)

    def total(self) -> int:
        return sum(self.calls.values())


@pytest.mark.parametrize("shape, n", [((64, 256), 256), ((3, 5, 40), 40)], ids=["2-D", "3-D"])
def test_a_second_call_builds_nothing_and_launches_the_cached_kernels(shape, n, device, gen, monkeypatch):
    if device != "cpu":
        pytest.skip("the CPU stands in for compiled kernels here; the GPU test below compares results")
    kernel_type = type(launch._ln_fwd_kernel)  # InterpretedFunction under the interpreter
    stand_in = CompiledStandIn(kernel_type.run)
    monkeypatch.setattr(plan, "_direct", stand_in)
    counts = Counts()
    for owner, name in [(api, "Call"), (api, "_check_layer_norm_args"), (launch, "FwdPlan"),
                        (launch_bwd, "BwdPlan"), (launch, "launch_config"), (launch, "interpreter_config"),
                        (launch_bwd, "reduce_tile"), (config, "launch_config"), (config, "tables_for"),
                        (plan.Launch, "dispatch"), (kernel_type, "__getitem__"), (kernel_type, "run"),
                        (_library, "LAYER_NORM_FWD_SHAPED"), (_library, "LAYER_NORM_BWD")]:  # fmt: skip
        counts.spy(monkeypatch, owner, name)
    x = randn(shape, torch.float32, device, gen).requires_grad_(True)
    w = randn((n,), torch.float32, device, gen).requires_grad_(True)
    b = randn((n,), torch.float32, device, gen).requires_grad_(True)
    dy = randn(shape, torch.float32, device, gen)

    def step():
        y = crossfuse.layer_norm(x, (n,), w, b)
        return (y, *torch.autograd.grad(y, (x, w, b), dy))

    first = step()
    assert counts.calls.get("dispatch", 0) >= 2 and counts.calls.get("Call") == 1, counts.calls
    counts.calls.clear()
    launched = stand_in.launched
    second = step()
    assert counts.total() == 0, counts.calls  # no plan, no table, no dispatcher, no kernel[grid]
    assert stand_in.launched - launched >= 2  # forward and backward: the cached launches
    # the statistics and the backward's scratch as addresses, not views
    assert stand_in.addresses >= 4, stand_in.addresses
    for a, c in zip(first, second, strict=True):
        assert torch.equal(a, c)
    # the module takes the same path
    module = crossfuse.nn.LayerNorm(n)
    module(x).sum().backward()
    counts.calls.clear()
    module(x).sum().backward()
    assert counts.total() == 0, counts.calls


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bfloat16", "float32"])
@pytest.mark.parametrize("m, n", [(4096, 1024), (64, 8192), (5000, 16387), (4101, 16384)], ids=str)
def test_cached_launches_give_the_dispatched_results_bit_for_bit(m, n, dtype, gen):
    # the first call of a key goes through Triton's dispatch, later ones launch the compiled kernels
    # directly: the same kernels on the same arguments, so the same outputs and gradients, bit for bit
    api.clear_plans()
    x = randn((m, n), dtype, "cuda", gen).requires_grad_(True)
    w = randn((n,), dtype, "cuda", gen).requires_grad_(True)
    b = randn((n,), dtype, "cuda", gen).requires_grad_(True)
    dy = randn((m, n), dtype, "cuda", gen)

    def step():
        y = crossfuse.layer_norm(x, (n,), w, b)
        return (y, *torch.autograd.grad(y, (x, w, b), dy))

    dispatched = step()
    for _ in range(2):
        for a, c in zip(dispatched, step(), strict=True):
            assert torch.equal(a, c)


@pytest.mark.parametrize("shape", [(0, 16), (2, 0, 16), (0, 3, 16)], ids=["(0, N)", "(2, 0, N)", "(0, 3, N)"])
def test_empty_input_gives_empty_results_and_zero_parameter_gradients(shape, device, monkeypatch):
    # as torch's layer norm: M = 0 gives an empty y and dx, and dw, db of zeros in the parameters' shape,
    # without a kernel launch
    launches = []
    monkeypatch.setattr(plan.Launch, "__call__", lambda self, *args: launches.append(self))
    api.clear_plans()
    x = torch.empty(shape, device=device, requires_grad=True)
    w = torch.ones(16, device=device, requires_grad=True)
    b = torch.zeros(16, device=device, requires_grad=True)
    y = crossfuse.layer_norm(x, (16,), w, b)
    assert y.shape == shape
    y.sum().backward()
    assert x.grad.shape == shape
    zeros = torch.zeros(16, device=device)
    assert torch.equal(w.grad, zeros) and torch.equal(b.grad, zeros)
    assert launches == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_one_feature_gives_a_zero_input_gradient(dtype, device, gen):
    # N = 1: y is the bias whatever x is, so dx is exactly 0, as torch gives it (on the GPU the general
    # formula left g's rounding error, magnified by 1/sqrt(eps): about 6e-5)
    x = randn((37, 1), dtype, device, gen).requires_grad_(True)
    w = randn((1,), dtype, device, gen, mean=1.0).requires_grad_(True)
    b = randn((1,), dtype, device, gen).requires_grad_(True)
    y = crossfuse.layer_norm(x, (1,), w, b)
    assert torch.equal(y, b.detach().expand(37, 1))
    dy = randn((37, 1), dtype, device, gen)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
    assert torch.equal(dx, torch.zeros_like(dx))
    assert torch.equal(dw, torch.zeros_like(dw))  # xhat = 0
    torch.testing.assert_close(db.float(), dy.float().sum(0), rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
def test_one_feature_gives_a_zero_input_gradient_on_the_gpu(gen):
    test_one_feature_gives_a_zero_input_gradient(torch.float32, "cuda", gen)


def test_interpreter_launches_few_programs_with_large_tiles(device, gen, monkeypatch):
    # under the interpreter each program runs serially with numpy on its tiles, so GPU launch shapes (many
    # programs, a row or two a tile) cost a minute at 1024x1024: the forward and backward there launch a
    # handful of programs (a guard on the interpreter's speed that times nothing)
    if not launch.INTERPRETED:
        pytest.skip("the GPU launches the measured tables' shapes")
    grids = []
    dispatch = plan.Launch.dispatch

    def spy(self, args):
        grids.append(self.grid)
        return dispatch(self, args)

    monkeypatch.setattr(plan.Launch, "dispatch", spy)
    api.clear_plans()
    m, n = 1024, 1024
    x = randn((m, n), torch.float32, device, gen).requires_grad_(True)
    w = randn((n,), torch.float32, device, gen).requires_grad_(True)
    b = randn((n,), torch.float32, device, gen).requires_grad_(True)
    crossfuse.layer_norm(x, (n,), w, b).backward(randn((m, n), torch.float32, device, gen))
    programs = sum(math.prod(grid) for grid in grids)
    assert programs <= 16, grids
    assert all(config.interpreter_config(n, kind, m).block_m * n >= 1 << 16 for kind in ("fwd", "bwd"))


def test_interpreter_configs_only_under_the_interpreter():
    # the GPU's configurations come from the measured tables whatever the interpreter's are
    for n in (1, 97, 1024, 4096, 16384, 16387):
        for kind in ("fwd", "bwd"):
            got = launch.default_config(n, torch.bfloat16, kind, 4096)
            if launch.INTERPRETED:
                assert got == config.interpreter_config(n, kind, 4096)
            else:
                assert got == config.launch_config(n, torch.bfloat16, kind, 4096)


def test_launch_config_is_a_frozen_dataclass_with_named_fields():
    cfg = ln_mod.LaunchConfig(2, 1024, 4, 1, prefetch=True)
    fields = (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.programs_per_sm, cfg.prefetch)
    assert fields == (2, 1024, 4, 1, True)
    with pytest.raises(TypeError):
        ln_mod.LaunchConfig(2, 1024, 4, 1, 2)  # past the grid, fields by name only
    with pytest.raises(AttributeError):
        cfg.block_m = 4  # frozen: a table entry cannot change under a cached plan
    assert cfg.replace(prefetch=False) == ln_mod.LaunchConfig(2, 1024, 4, 1) and hash(cfg)


@pytest.mark.parametrize(
    "m, config, few, where",
    [
        (64, config.LaunchConfig(4, 64, 4, 2), config.FEW_ROWS, "split"),
        (6, None, config.FEW_ROWS, "few"),
        (6, None, config.FewRowsConfig(max_rows=0), "own"),
        (512, None, config.FEW_ROWS, "dx"),
    ],
    ids=["split-backward", "few-rows", "own-scratch", "scratch-in-dx"],
)
def test_a_ready_backward_passes_its_scratch_as_addresses(m, config, few, where, device, gen, monkeypatch):
    # once every launch of a backward plan goes straight to its kernel, the scratch's parts (in dx's last
    # rows, or a buffer of their own for few rows where the few-rows kernel is not used) and the few-rows
    # kernel's tensors are passed as addresses, not views: the same results
    if device != "cpu":
        pytest.skip("the CPU stands in for compiled kernels here; the GPU test above compares results")
    stand_in = CompiledStandIn(type(launch._ln_fwd_kernel).run)
    monkeypatch.setattr(plan, "_direct", stand_in)
    n = 256
    x, dy = (randn((m, n), torch.float32, device, gen) for _ in range(2))
    w = randn((n,), torch.float32, device, gen)
    _, mean, rstd = launch.layer_norm_fwd(x, w, None, 1e-5)
    first = launch_bwd.layer_norm_bwd(dy, x, w, mean, rstd, True, True, config=config, few=few)
    before = stand_in.addresses
    second = launch_bwd.layer_norm_bwd(dy, x, w, mean, rstd, True, True, config=config, few=few)
    assert stand_in.addresses > before
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    (bwd,) = launch_bwd.BWD_PLANS.plans.values()
    assert bwd.ready
    got = bwd.path if bwd.path in ("split", "few") else "dx" if bwd.R else "own" if bwd.total else "none"
    assert got == where, (bwd.path, bwd.R, bwd.total)
