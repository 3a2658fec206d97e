"""Timing: the 20th, 50th and 80th percentile of a call's duration, in milliseconds.

* CUDA: CUDA events around each call, after warm-up; the L2 cache is flushed before every repeat by
  zeroing a 256 MiB buffer (larger than any current L2), outside the timed region (the method of
  ``triton.testing.do_bench``, written out here so it does not depend on a Triton version). Each
  repeat begins with a synchronisation (``TimingConfig.sync_each_repeat``), so repeats do not run back
  to back (on the H200 that alone measures 4096-row layer norms 1-5% faster, run 224). Before
  the flush, lines that earlier kernels loaded with ``evict_last`` (persisting) priority are set back
  to normal (the driver's ``cuCtxResetPersistingL2Cache``, after a synchronisation: the call acts when
  made, not in stream order): the zeroing's normal-priority writes never
  evict them, so without the reset a call reads for free whatever part of its inputs an earlier kernel
  (its own earlier repeat included) kept that way, 5-9% of a float32 4096×2048 layer norm's time on the
  H200 (bench/results/h200/NOTES.md, runs 219-220). A GPU spin longer than the call's CPU enqueue time
  precedes each start event, so the time is the GPU's (kernels and the gaps between them), not Python
  or launch overhead. The number of repeats is chosen from an estimate so that they take about
  ``rep_ms``, within ``[min_reps, max_reps]``.
* CPU: ``time.perf_counter`` around each call, after warm-up; no cache flush.

The callable is whatever is measured (the runner builds it: a forward, the gradient call of a retained
graph, or both); its first call (compilation, autotuning) is the caller's business and is not timed.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

QUANTILES = (0.2, 0.5, 0.8)
L2_FLUSH_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Timing:
    p20: float  # ms
    p50: float
    p80: float
    reps: int


@dataclass(frozen=True)
class TimingConfig:
    """How long to warm up and to repeat. CUDA budgets in ms, CPU budgets in seconds."""

    cuda_warmup_ms: float = 10.0
    cuda_rep_ms: float = 40.0
    cuda_min_reps: int = 10
    cuda_max_reps: int = 200
    flush_l2: bool = True
    # with flush_l2: persisting L2 lines reset to normal before every repeat's flush (see the module's
    # docstring); the reset acts when called, not in stream order, so it always follows a synchronisation
    reset_persisting_l2: bool = True
    # with flush_l2: the GPU synchronised before every repeat's flush, whether or not the reset runs (a
    # driver that refuses it then changes what the timer is blind to, not its level: on the H200 the
    # synchronisation alone measures 4096-row layer norms 1-5% faster than back-to-back repeats, run 224)
    sync_each_repeat: bool = True
    cpu_warmup_s: float = 0.05
    cpu_rep_s: float = 0.3
    cpu_min_reps: int = 5
    cpu_max_reps: int = 100


DEFAULT = TimingConfig()
QUICK = TimingConfig(
    cuda_warmup_ms=5.0, cuda_rep_ms=20.0, cpu_warmup_s=0.01, cpu_rep_s=0.05, cpu_min_reps=3, cpu_max_reps=30
)


def _summarise(times_ms) -> Timing:
    q = np.quantile(np.asarray(times_ms, dtype=np.float64), QUANTILES)
    return Timing(float(q[0]), float(q[1]), float(q[2]), len(times_ms))


def _clamp(n: float, lo: int, hi: int) -> int:
    return int(max(lo, min(hi, n)))


def time_cpu(fn: Callable[[], object], config: TimingConfig = DEFAULT) -> Timing:
    """Percentiles of ``fn()``'s wall time on the CPU (``time.perf_counter``)."""
    t0 = time.perf_counter()
    n = 0
    while True:
        fn()
        n += 1
        if time.perf_counter() - t0 >= config.cpu_warmup_s:
            break
    est = (time.perf_counter() - t0) / n
    reps = _clamp(config.cpu_rep_s / max(est, 1e-9), config.cpu_min_reps, config.cpu_max_reps)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return _summarise(times)


_FLUSH: dict[int, torch.Tensor] = {}


def l2_flush_buffer(device) -> torch.Tensor:
    """A 256 MiB buffer on ``device`` whose zeroing evicts the L2 cache (allocated once per device)."""
    dev = torch.device(device)
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    if idx not in _FLUSH:
        _FLUSH[idx] = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=torch.device("cuda", idx))
    return _FLUSH[idx]


_PERSISTING_RESET: list = []  # [the driver's cuCtxResetPersistingL2Cache, or None], once looked up


def persisting_l2_reset() -> Callable[[], int] | None:
    """The CUDA driver's ``cuCtxResetPersistingL2Cache`` (through ctypes; it returns a ``CUresult``, 0 on
    success, and acts on the calling thread's current context), or None where the driver library or the
    function cannot be loaded."""
    if not _PERSISTING_RESET:
        fn = None
        for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
            try:
                fn = ctypes.CDLL(name).cuCtxResetPersistingL2Cache
            except (OSError, AttributeError):
                continue
            fn.restype, fn.argtypes = ctypes.c_int, []
            break
        _PERSISTING_RESET.append(fn)
    return _PERSISTING_RESET[0]


def _reset_persisting_l2(device=None) -> bool:
    """Persisting L2 lines of ``device`` (default: the current one) back to normal priority now; False,
    with a warning and no further tries in this process, where the driver refuses (it returns an error
    code)."""
    fn = persisting_l2_reset()
    if fn is None:
        return False
    # the driver call acts on the calling thread's current context: make it the device's
    with torch.cuda.device(device) if device is not None else contextlib.nullcontext():
        rc = fn()
    if rc != 0:
        _PERSISTING_RESET[0] = None
        warnings.warn(
            f"cuCtxResetPersistingL2Cache returned CUresult {rc}: the CUDA timer goes on without resetting "
            "persisting L2 lines (rows' versions say l2reset=off)",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True


def flush_l2(device="cuda", reset_persisting: bool = True, synchronize: bool = True) -> None:
    """Empty ``device``'s L2 as :func:`time_cuda` does before every repeat: the GPU synchronised where
    ``synchronize``, its persisting lines reset to normal where ``reset_persisting`` and the driver allow
    (always after a synchronisation: the reset acts when called, not in stream order), then
    :func:`l2_flush_buffer` zeroed (queued)."""
    reset = reset_persisting and persisting_l2_reset() is not None
    if synchronize or reset:
        torch.cuda.synchronize(device)
    if reset:
        _reset_persisting_l2(device)
    l2_flush_buffer(device).zero_()


def _gpu_sleep():
    return getattr(torch.cuda, "_sleep", None)


def time_cuda(fn: Callable[[], object], device="cuda", config: TimingConfig = DEFAULT) -> Timing:
    """Percentiles of ``fn()``'s GPU time between two CUDA events, L2 flushed before every repeat (its
    persisting lines reset to normal first, where ``config.reset_persisting_l2`` and the driver allow).

    The CPU time ``fn`` needs to enqueue its work (Python, autograd, launches) is measured during the
    warm-up; before each repeat a GPU spin (``torch.cuda._sleep``) longer than that keeps the GPU busy
    while the CPU enqueues, so the events bracket queued GPU work only, not launch overhead.
    """
    cache = l2_flush_buffer(device) if config.flush_l2 else None
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n_est = 3
    start.record()
    for _ in range(n_est):
        if cache is not None:
            cache.zero_()
        fn()
    end.record()
    torch.cuda.synchronize(device)
    est = start.elapsed_time(end) / n_est  # includes the flush and any launch gaps: conservative
    enqueue_s = 0.0
    for _ in range(_clamp(config.cuda_warmup_ms / max(est, 1e-6), 3, 100)):
        t = time.perf_counter()
        fn()
        enqueue_s = max(enqueue_s, time.perf_counter() - t)
        torch.cuda.synchronize(device)
    sleep = _gpu_sleep()
    # cycles at <= 2.5 GHz: a lower clock only makes the spin longer; capped at 50 ms
    cycles = int(min(enqueue_s * 1.5 + 20e-6, 0.05) * 2.5e9)
    reps = _clamp(config.cuda_rep_ms / max(est, 1e-6), config.cuda_min_reps, config.cuda_max_reps)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if cache is not None:
            flush_l2(device, config.reset_persisting_l2, config.sync_each_repeat)
        if sleep is not None:
            sleep(cycles)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize(device)
    return _summarise([s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)])


def time_call(fn: Callable[[], object], device, config: TimingConfig = DEFAULT) -> Timing:
    """:func:`time_cuda` or :func:`time_cpu` by the device type."""
    if torch.device(device).type == "cuda":
        return time_cuda(fn, device, config)
    return time_cpu(fn, config)


def alternate(calls: dict, rounds: int, device="cuda", config: TimingConfig = DEFAULT) -> dict:
    """``{name: [median ms of round 0, round 1, ...]}`` of each zero-argument call of ``calls``, timed in
    ``rounds`` rounds that take every call in turn (a drift of the card's clock or temperature then
    falls on all of them alike; the probes' and A/B scripts' way of comparing kernels). Each call runs
    once first, untimed (compilation), and the device is synchronised before the first round."""
    for fn in calls.values():
        fn()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            times[name].append(time_call(fn, device, config).p50)
    return times


def method(device) -> str:
    if torch.device(device).type == "cuda":
        reset = persisting_l2_reset() is not None
        return (
            "CUDA events, L2 flushed (256 MiB zero"
            + (", persisting lines reset first" if reset else "")
            + ") and launch overhead hidden by a GPU spin"
        )
    return "time.perf_counter around each call"
