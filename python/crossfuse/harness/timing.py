"""Timing: what a call costs, in the three clocks a result row reports.

* **eager** (a row's ``ms_p20``/``ms_p50``/``ms_p80``, the default everywhere): the call as a user makes
  it, nothing hiding its host time. CUDA: batches of back-to-back calls between two CUDA events, no sync
  and no GPU spin inside a batch (``triton.testing.do_bench``'s way), one sample per batch, the batch's
  time divided by its calls; before each batch the L2 is flushed and the GPU synchronised, outside the
  events. An op whose host time (Python, autograd, launches) exceeds its GPU time is measured at its host
  time here, as a training loop would see it. Calls after a batch's first may find their inputs in L2.
  A batch of GPU-bound calls (their host time under half their time) shorter than ``eager_lead_below_ms``
  begins with one untimed call, as a loop's previous call: the first timed call's host time then overlaps
  GPU work, as every later call's does, instead of adding to its GPU time (a call of 0.5 ms or more is a
  batch of one). The L2 buffer is zeroed again after it, without the reset of persisting lines (that
  needs a synchronisation, which would undo the overlap): lines the untimed call loaded with
  ``evict_last`` priority may serve the first timed call, as they serve a batch's later calls. Host-bound
  calls have none: their host time is what the batch measures, all of it.
* **GPU-only** (``gpu_ms_p50``): :func:`time_cuda`, CUDA events around each call, after warm-up; the L2
  is flushed before every repeat by zeroing a 256 MiB buffer (larger than any current L2), outside the
  timed region. Each repeat begins with a synchronisation (``TimingConfig.sync_each_repeat``), so repeats
  do not run back to back (on the H200 that alone measures 4096-row layer norms 1-5% faster). Before the
  flush, lines that earlier kernels loaded with ``evict_last`` (persisting) priority are set back to
  normal (the driver's ``cuCtxResetPersistingL2Cache``, after a synchronisation: the call acts when made,
  not in stream order): the zeroing's normal-priority writes never evict them, so without the reset a
  call reads for free whatever part of its inputs an earlier kernel (its own earlier repeat included)
  kept that way, 5-9% of a float32 4096×2048 layer norm's time on the H200.
  A GPU spin longer than the call's CPU enqueue time precedes each start event, so the time is the GPU's
  (kernels and the gaps between them), not Python or launch overhead: what the kernels cost, and what a
  CUDA graph or ``torch.compile`` would leave of the call.
* **host** (``host_us``): the wall clock of ``TimingConfig.host_calls`` calls back to back without a
  synchronisation (fewer where their GPU work would pass ``cuda_rep_ms``: a full launch queue would make
  the host wait for the GPU), divided by their number, the first call (warm-up) excluded: the CPU's cost
  of one call.
* CPU device: ``time.perf_counter`` around each call, after warm-up, no cache flush; that is the eager
  time and the host time at once (no GPU-only time).

The number of repeats is chosen from an estimate so that they take about ``rep_ms``, within
``[min_reps, max_reps]``. The callable is whatever is measured (the runner builds it: a forward, the
gradient call of a retained graph, or both); its first call (compilation, autotuning) is the caller's
business and is not timed.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
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
    """Percentiles in ms of the clock the function that made it says (:func:`measure`: eager), with, from
    :func:`measure`, the GPU-only median (ms; None on the CPU) and the host time per call (µs)."""

    p20: float  # ms
    p50: float
    p80: float
    reps: int
    gpu_p50: float | None = None  # ms
    host_us: float | None = None


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
    # synchronisation alone measures 4096-row layer norms 1-5% faster than back-to-back repeats)
    sync_each_repeat: bool = True
    # eager: a batch of back-to-back calls lasts about this long (at most eager_max_batch calls)
    eager_batch_ms: float = 1.0
    eager_max_batch: int = 50
    # eager: a GPU-bound batch shorter than this begins with one untimed call (time_cuda_eager_interleaved)
    eager_lead_below_ms: float = 20.0
    # host time: this many calls back to back, without a synchronisation
    host_calls: int = 100
    cpu_warmup_s: float = 0.05
    cpu_rep_s: float = 0.3
    cpu_min_reps: int = 5
    cpu_max_reps: int = 100


DEFAULT = TimingConfig()
QUICK = TimingConfig(
    cuda_warmup_ms=5.0,
    cuda_rep_ms=20.0,
    host_calls=30,
    cpu_warmup_s=0.01,
    cpu_rep_s=0.05,
    cpu_min_reps=3,
    cpu_max_reps=30,
)


def _summarise(times_ms) -> Timing:
    q = np.quantile(np.asarray(times_ms, dtype=np.float64), QUANTILES)
    return Timing(float(q[0]), float(q[1]), float(q[2]), len(times_ms))


def _clamp(n: float, lo: int, hi: int) -> int:
    return int(max(lo, min(hi, n)))


def _rotated(names: list[str], i: int) -> list[str]:
    """``names`` rotated by ``i`` places: the order of repeat ``i`` of the interleaved timers."""
    i %= len(names)
    return names[i:] + names[:i]


def time_cpu(fn: Callable[[], object], config: TimingConfig = DEFAULT) -> Timing:
    """Percentiles of ``fn()``'s wall time on the CPU (``time.perf_counter``); ``host_us`` is their mean (the
    calls run back to back: the wall clock of all of them over their number)."""
    return time_cpu_interleaved({"fn": fn}, config)["fn"]


def time_cpu_interleaved(calls: dict[str, Callable[[], object]], config: TimingConfig = DEFAULT
                         ) -> dict[str, Timing]:  # fmt: skip
    """:func:`time_cpu` of every call of ``calls`` at once: each warmed up in turn, then every repeat times
    each call once, in the listed order rotated by one place a repeat, so that the CPU's changing load falls
    on all of them alike. Every call makes the same number of repeats, about ``cpu_rep_s`` per call."""
    names = list(calls)
    est = {}
    for n in names:
        t0 = time.perf_counter()
        k = 0
        while True:
            calls[n]()
            k += 1
            if time.perf_counter() - t0 >= config.cpu_warmup_s:
                break
        est[n] = (time.perf_counter() - t0) / k
    per_repeat = sum(est.values()) / len(names)
    reps = _clamp(config.cpu_rep_s / max(per_repeat, 1e-9), config.cpu_min_reps, config.cpu_max_reps)
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(reps):
        for n in _rotated(names, i):
            t = time.perf_counter()
            calls[n]()
            times[n].append((time.perf_counter() - t) * 1e3)
    return {n: dataclasses.replace(_summarise(t), host_us=1e3 * float(np.mean(t))) for n, t in times.items()}


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
    """:func:`time_cuda` (GPU-only: what the kernels cost) or :func:`time_cpu` by the device type; the
    probes compare kernels with it. Result rows use :func:`measure` (eager first)."""
    if torch.device(device).type == "cuda":
        return time_cuda(fn, device, config)
    return time_cpu(fn, config)


def time_cuda_eager(fn: Callable[[], object], device="cuda", config: TimingConfig = DEFAULT) -> Timing:
    """Percentiles of ``fn()``'s eager time per call: batches of back-to-back calls between CUDA events,
    nothing hiding host time (see the module's docstring); the L2 flushed and the GPU synchronised before
    each batch, outside the events (:func:`time_cuda_eager_interleaved` of this one call)."""
    return time_cuda_eager_interleaved({"fn": fn}, device, config)["fn"]


def time_cuda_eager_interleaved(calls: dict[str, Callable[[], object]], device="cuda",
                                config: TimingConfig = DEFAULT) -> dict[str, Timing]:  # fmt: skip
    """Eager percentiles of every call of ``calls`` at once (:func:`time_cuda_eager`), their batches
    interleaved: each repeat takes one batch of every call, in the listed order rotated by one place a
    repeat. A call's batch lasts about ``eager_batch_ms``; every call makes the same number of repeats,
    which last about ``cuda_rep_ms`` per call in all. A change of the host's pace (a training step of a
    small model is mostly host time, which drifts by tens of percent within a second) then falls on every
    call alike, where timing one call after the other would give it to whichever call ran then."""
    names = list(calls)
    est, batch, lead = {}, {}, {}
    for n in names:
        torch.cuda.synchronize(device)  # the previous call's warm-up done: each estimate is its own call's
        t = time.perf_counter()
        for _ in range(3):
            calls[n]()
        host = (time.perf_counter() - t) * 1e3 / 3  # enqueueing, before the GPU is waited for
        torch.cuda.synchronize(device)
        est[n] = max((time.perf_counter() - t) * 1e3 / 3, 1e-4)
        for _ in range(_clamp(config.cuda_warmup_ms / est[n], 1, 100)):
            calls[n]()
        batch[n] = _clamp(config.eager_batch_ms / est[n], 1, config.eager_max_batch)
        # GPU-bound (its host time under half its time) and short: see the loop below. Not a host-bound
        # call: the timed calls' host time would then start during the untimed call's GPU work and the
        # second flush, which the events would not count
        lead[n] = host < 0.5 * est[n] and est[n] * batch[n] < config.eager_lead_below_ms
    per_repeat = sum(est[n] * batch[n] for n in names) / len(names)
    reps = _clamp(config.cuda_rep_ms / per_repeat, config.cuda_min_reps, config.cuda_max_reps)
    events = {n: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)] for n in names}  # fmt: skip
    for i in range(reps):
        for n in _rotated(names, i):
            if config.flush_l2:
                flush_l2(device, config.reset_persisting_l2, synchronize=True)
            torch.cuda.synchronize(device)
            if lead[n]:
                # untimed: its GPU work (and the flush queued after it) runs while the host enqueues the
                # first timed call, as a loop's previous call would; without it a batch of one or two
                # long calls added the first call's host time to the GPU's (bf16 4096x65536 backward:
                # 782 us against 560 of GPU time and 161 of host time)
                calls[n]()
                if config.flush_l2:  # no reset of persisting lines: it needs a sync, which the lead is
                    l2_flush_buffer(device).zero_()  # there to avoid (see the module's docstring)
            start, end = events[n][i]
            start.record()
            for _ in range(batch[n]):
                calls[n]()
            end.record()
    torch.cuda.synchronize(device)
    return {n: _summarise([s.elapsed_time(e) / batch[n] for s, e in events[n]]) for n in names}


def host_time_us(fn: Callable[[], object], device, config: TimingConfig = DEFAULT, calls: int | None = None
                 ) -> float:  # fmt: skip
    """Microseconds of CPU per call: ``calls`` (default ``config.host_calls``) calls back to back without a
    synchronisation (a CUDA device is synchronised before and after, outside the clock), after one
    untimed call."""
    cuda = torch.device(device).type == "cuda"
    fn()
    if cuda:
        torch.cuda.synchronize(device)
    n = max(1, config.host_calls if calls is None else calls)
    t = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - t
    if cuda:
        torch.cuda.synchronize(device)
    return elapsed / n * 1e6


def measure(fn: Callable[[], object], device, config: TimingConfig = DEFAULT, eager: Timing | None = None
            ) -> Timing:  # fmt: skip
    """A result row's times: eager percentiles (ms), the GPU-only median (ms) and the host time per call
    (µs) on CUDA; on the CPU :func:`time_cpu` (eager and host at once, no GPU-only time). ``eager``: the
    call's eager time, measured already (:func:`time_eager_many`)."""
    if torch.device(device).type != "cuda":
        return eager if eager is not None else time_cpu(fn, config)
    if eager is None:
        eager = time_cuda_eager(fn, device, config)
    gpu = time_cuda(fn, device, config)
    # a GPU-bound call: fewer calls, so that they queue about cuda_rep_ms of GPU work, not a full queue
    calls = _clamp(config.cuda_rep_ms / max(gpu.p50, 1e-6), 10, config.host_calls)
    return dataclasses.replace(eager, gpu_p50=gpu.p50, host_us=host_time_us(fn, device, config, calls))


def time_eager_many(calls: dict[str, Callable[[], object]], device, config: TimingConfig = DEFAULT
                    ) -> dict[str, Timing]:  # fmt: skip
    """Eager times of several calls, for :func:`measure`'s ``eager``, interleaved: on CUDA their batches
    (:func:`time_cuda_eager_interleaved`), on the CPU their calls (:func:`time_cpu_interleaved`)."""
    if torch.device(device).type == "cuda":
        return time_cuda_eager_interleaved(calls, device, config)
    return time_cpu_interleaved(calls, config)


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
    """How :func:`measure` times a row on ``device``, in words."""
    if torch.device(device).type == "cuda":
        reset = persisting_l2_reset() is not None
        return (
            "eager (ms_p20/50/80): CUDA events around batches of back-to-back calls, no spin; GPU-only "
            "(gpu_ms_p50): CUDA events, L2 flushed (256 MiB zero"
            + (", persisting lines reset first" if reset else "")
            + ") and launch overhead hidden by a GPU spin; host (host_us): wall clock of back-to-back "
            "calls without a sync"
        )
    return "time.perf_counter around each call (eager and host time alike)"
