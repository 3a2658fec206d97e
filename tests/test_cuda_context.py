"""Where the kernels run: on threads other than the one that first used the GPU, and on the device of
their inputs rather than the current one.

Triton fills a tensor descriptor's map with a driver call that needs a current CUDA context, before its
launcher makes one current; a thread whose first CUDA work is a launch through descriptors has none.
The autograd engine runs every backward on a worker thread of its own, so a backward made only of
crossfuse's kernels can be that first work ("Failed to create tensor map descriptor: invalid device
context"). ``ops._runtime.device.bind_cuda_context`` binds the context first; these tests run each
descriptor path as the first CUDA work of a new thread, and the autograd backwards as the first work of
a fresh process's engine thread. Without the binding, both new-thread cases and the three ``*_thread``
engine cases fail so; the other two pass either way, since a thread that first loads a kernel has its
context bound by Triton's loading.

Triton launches on the current device whatever device the arguments are on; the launchers make the
inputs' device current (``ops._runtime.device.on_input_device``), checked with two GPUs where there are.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def on_new_thread(fn):
    """``fn()`` on a new thread (no CUDA context bound to it yet): its result, or its exception raised."""
    box = {}

    def body():
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised on the caller's thread
            box["error"] = exc

    th = threading.Thread(target=body)
    th.start()
    th.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


class _Stream:
    def __init__(self, log, index):
        self.log, self.index = log, index

    def query(self):
        self.log.append((threading.get_ident(), self.index))
        return True


class _CudaLike(torch.Tensor):
    """A tensor (no storage) that reports the device the test gives it."""

    def __new__(cls, kind, index):
        t = torch.Tensor._make_subclass(cls, torch.empty(0))
        t._said = torch.device(kind, index) if index is not None else torch.device(kind)
        return t

    @property
    def device(self):
        return self._said


def test_bind_cuda_context_queries_once_per_thread_and_device(monkeypatch):
    from crossfuse.ops._runtime import device

    log = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index: _Stream(log, index))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(device, "_THREAD", threading.local())  # no thread has bound anything yet
    me = threading.get_ident()
    for _ in range(3):
        device.bind_cuda_context(_CudaLike("cuda", 0))
    device.bind_cuda_context(_CudaLike("cuda", None))  # the current device, 1
    device.bind_cuda_context(_CudaLike("cuda", 1))
    device.bind_cuda_context(_CudaLike("cpu", None))  # nothing to bind
    assert log == [(me, 0), (me, 1)]

    def bind_on_this_thread():
        device.bind_cuda_context(_CudaLike("cuda", 0))
        return threading.get_ident()

    other = on_new_thread(bind_on_this_thread)
    assert log == [(me, 0), (me, 1), (other, 0)]


class _Guard:
    def __init__(self, log, index):
        self.log, self.index = log, index

    def __enter__(self):
        self.log.append(("enter", self.index))

    def __exit__(self, *exc):
        self.log.append(("exit", self.index))


def test_launchers_run_on_their_first_tensors_device(monkeypatch):
    from crossfuse.ops._runtime import device

    log = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda index: _Guard(log, index))

    @device.on_input_device
    def launcher(t, *args, **kwargs):
        log.append(("launch", args, kwargs))
        return "done"

    assert launcher(_CudaLike("cuda", 1), 2, flag=True) == "done"
    assert log == [("enter", 1), ("launch", (2,), {"flag": True}), ("exit", 1)]
    log.clear()
    for same in (_CudaLike("cuda", 0), _CudaLike("cuda", None), _CudaLike("cpu", None), None):
        assert launcher(same) == "done"
    assert [entry[0] for entry in log] == ["launch"] * 4  # current already, not CUDA, no tensor: no guard
    log.clear()
    assert launcher(None, _CudaLike("cuda", 1)) == "done"  # a None placeholder first (reduce_partials)
    assert [entry[0] for entry in log] == ["enter", "launch", "exit"]


@pytest.mark.gpu
def test_ops_run_on_their_inputs_device_not_the_current_one(gen):
    import crossfuse

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    B, H, L, D, N = 2, 2, 256, 64, 8192
    host = [torch.randn(B, H, L, D, generator=gen).bfloat16() for _ in range(4)]
    host += [torch.randn(64, N, generator=gen).bfloat16() for _ in range(2)]
    host += [torch.randn(N, generator=gen).bfloat16() for _ in range(2)]

    def run(device):
        q, k, v, do, x, dy, w, b = (t.to(device).requires_grad_(i not in (3, 5)) for i, t in enumerate(host))
        out = crossfuse.relu_attention(q, k, v, causal=True)
        y = crossfuse.layer_norm(x, (N,), w, b)
        grads = torch.autograd.grad((out, y), (q, k, v, x, w, b), (do, dy))
        return [t.detach().cpu() for t in (out, y, *grads)]

    with torch.cuda.device(0):
        expected = run("cuda:0")
        got = run("cuda:1")  # cuda:0 current throughout
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def attention_case(gen):
    from crossfuse.ops import relu_attention as ra

    B, H, L, D = 2, 2, 256, 64
    q, k, v, do = (torch.randn(B, H, L, D, generator=gen).bfloat16().cuda() for _ in range(4))
    for kind in ("fwd", "dkdv"):  # the case must take the descriptor kernels, or it tests nothing
        assert ra.attention_config(kind, D, q.dtype, False, False, L).tma, kind
    assert ra._tma_usable(False, q, k, v, do)

    def run():
        out = ra.relu_attention_fwd(q, k, v, False, False, D**-0.5, 1 / L)
        return (out, *ra.relu_attention_bwd(q, k, v, do, False, False, D**-0.5, 1 / L))

    return run


def layer_norm_case(gen):
    from crossfuse.ops import layer_norm as ln
    from crossfuse.ops.layer_norm import gluon_bwd

    M, N = 64, 8192
    x, dy = (torch.randn(M, N, generator=gen).bfloat16().cuda() for _ in range(2))
    w, b = (torch.randn(N, generator=gen).bfloat16().cuda() for _ in range(2))
    if not ln.launch_config(N, x.dtype, "bwd", M).smem_rows or not gluon_bwd.usable(x, dy, w, False):
        pytest.skip("the Gluon backward (descriptors) does not run here (its Triton version or the GPU)")

    _, mean, rstd = ln.layer_norm_fwd(x, w, b, 1e-5)

    def run():  # the backward alone: the forward's pointer kernels would bind a context (Triton's launcher)
        return ln.layer_norm_bwd(dy, x, w, mean, rstd, True, True)

    return run


@pytest.mark.gpu
@pytest.mark.parametrize("case", [attention_case, layer_norm_case], ids=["relu_attention", "layer_norm"])
def test_descriptor_kernels_run_as_a_new_threads_first_cuda_work(case, gen):
    run = case(gen)
    run()  # on this thread: compiled and loaded here (loading binds this thread's context, not others')
    # the outputs copied to the host and freed: the new thread's allocations are the same blocks, handed
    # out by the caching allocator without a CUDA call, so its first CUDA work is the descriptors'
    expected = [t.cpu() if t is not None else None for t in run()]
    got = on_new_thread(run)
    torch.cuda.synchronize()
    for e, g in zip(expected, got, strict=True):
        assert (e is None) == (g is None)
        if e is not None:
            torch.testing.assert_close(g.cpu(), e, rtol=0, atol=0)


ENGINE_THREAD = """
import torch, crossfuse
gen = torch.Generator(device="cuda").manual_seed(0)
def randn(*shape, grad=True):
    return torch.randn(*shape, device="cuda", generator=gen).bfloat16().requires_grad_(grad)
{body}
torch.cuda.synchronize()
print("ok")
"""

ENGINE_CASES = {
    # the forward, then the backward through the engine: its worker thread's first CUDA work
    "relu_attention": """
q, k, v = (randn(2, 2, 256, 64) for _ in range(3))
do = randn(2, 2, 256, 64, grad=False)
grads = torch.autograd.grad(crossfuse.relu_attention(q, k, v), (q, k, v), do)
assert all(bool(torch.isfinite(g).all()) for g in grads)
""",
    # the sequence that failed without the binding: a raw backward on another thread first, then the kept
    # graph's backward
    "relu_attention_after_another_thread": """
import threading
from crossfuse.ops import relu_attention as ra
q, k, v = (randn(2, 2, 256, 64) for _ in range(3))
do = randn(2, 2, 256, 64, grad=False)
out = crossfuse.relu_attention(q, k, v)
th = threading.Thread(target=lambda: ra.relu_attention_bwd(q.detach(), k.detach(), v.detach(), do, False,
                                                           False, 0.125, 1 / 256))
th.start(); th.join(); torch.cuda.synchronize()
grads = torch.autograd.grad(out, (q, k, v), do)
assert all(bool(torch.isfinite(g).all()) for g in grads)
""",
    # the kernels loaded (compiled, or read from Triton's cache) by the main thread first
    "relu_attention_after_this_thread": """
from crossfuse.ops import relu_attention as ra
q, k, v = (randn(2, 2, 256, 64) for _ in range(3))
do = randn(2, 2, 256, 64, grad=False)
ra.relu_attention_bwd(q.detach(), k.detach(), v.detach(), do, False, False, 0.125, 1 / 256)
torch.cuda.synchronize()
grads = torch.autograd.grad(crossfuse.relu_attention(q, k, v), (q, k, v), do)
assert all(bool(torch.isfinite(g).all()) for g in grads)
""",
    "layer_norm_after_this_thread": """
from crossfuse.ops import layer_norm as ln
x, w, b = randn(64, 8192), randn(8192), randn(8192)
dy = randn(64, 8192, grad=False)
_, mean, rstd = ln.layer_norm_fwd(x.detach(), w.detach(), b.detach(), 1e-5)
ln.layer_norm_bwd(dy, x.detach(), w.detach(), mean, rstd, True, True)
torch.cuda.synchronize()
grads = torch.autograd.grad(crossfuse.layer_norm(x, (8192,), w, b), (x, w, b), dy)
assert all(bool(torch.isfinite(g).all()) for g in grads)
""",
    "layer_norm": """
x, w, b = randn(64, 8192), randn(8192), randn(8192)
dy = randn(64, 8192, grad=False)
grads = torch.autograd.grad(crossfuse.layer_norm(x, (8192,), w, b), (x, w, b), dy)
assert all(bool(torch.isfinite(g).all()) for g in grads)
""",
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(ENGINE_CASES))
def test_backward_runs_as_the_engine_threads_first_cuda_work(name):
    code = ENGINE_THREAD.format(body=ENGINE_CASES[name])
    path = os.pathsep.join(filter(None, [str(ROOT / "python"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
