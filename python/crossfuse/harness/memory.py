"""Memory of one call: bytes allocated during it (``alloc_bytes``) and its peak above the pre-call
baseline (``peak_bytes``). The result of the call is kept alive until the measurement ends, so both
include the output and whatever autograd saved for the backward.

* CUDA: ``torch.cuda.memory_stats()["allocated_bytes.all.allocated"]`` after minus before (every byte
  the caching allocator handed out during the call, freed or not), and
  ``torch.cuda.max_memory_allocated()`` after ``reset_peak_memory_stats()`` minus
  ``memory_allocated()`` before.
* CPU: torch's CPU allocator keeps no statistics (and ``tracemalloc`` does not see tensor memory), so
  the call runs once under ``torch.profiler.profile(profile_memory=True)``, which records every
  allocation and free of torch's CPU allocator with its size and time. ``alloc_bytes`` is the sum of
  the allocations; ``peak_bytes`` the maximum of the running sum of allocations minus frees (frees of
  tensors that existed before the call count too, so this is the peak above the baseline). It reads
  the raw records (``prof.profiler.kineto_results.events()``, name ``[memory]``), present from torch
  2.4 to at least 2.13. Memory allocated by a library outside torch's allocator (e.g. Julia's GC)
  is not seen; the Julia side measures itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

CUDA_METHOD = "torch.cuda.memory_stats allocated_bytes difference; max_memory_allocated above baseline"
CPU_METHOD = "torch.profiler(profile_memory=True) allocation records: sum of allocations; peak of running sum"


@dataclass(frozen=True)
class Memory:
    alloc_bytes: int | None
    peak_bytes: int | None


def measure_cuda(fn: Callable[[], object], device="cuda") -> Memory:
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    a0 = torch.cuda.memory_stats(device).get("allocated_bytes.all.allocated", 0)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    a1 = torch.cuda.memory_stats(device).get("allocated_bytes.all.allocated", 0)
    del out
    return Memory(int(a1 - a0), int(max(peak, 0)))


def _start_ns(ev) -> int:
    if hasattr(ev, "start_ns"):
        return int(ev.start_ns())
    return int(ev.start_us() * 1000)  # older torch


def cpu_memory_records(prof) -> list[tuple[int, int]]:
    """``(time_ns, bytes)`` of the CPU allocator's records in a finished profiler (bytes < 0: a free)."""
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if results is None:
        raise RuntimeError("this torch's profiler exposes no allocation records (kineto_results)")
    recs = []
    for ev in results.events():
        if ev.name() != "[memory]" or ev.device_type() != torch.autograd.DeviceType.CPU:
            continue
        recs.append((_start_ns(ev), int(ev.nbytes())))
    recs.sort(key=lambda r: r[0])
    return recs


def summarise_records(recs: list[tuple[int, int]]) -> Memory:
    alloc = sum(b for _, b in recs if b > 0)
    running = peak = 0
    for _, b in recs:
        running += b
        peak = max(peak, running)
    return Memory(int(alloc), int(peak))


@contextlib.contextmanager
def quiet_native_stderr():
    """Silence file descriptor 2 (Kineto logs ``profiler_start``/``profiler_stop`` lines from C++ on
    every profiler start and stop in some torch versions). Use only around the profiler's own start and
    stop, never around the measured call (its warnings must stay visible)."""
    fd = 2  # the C++ side writes to the process's fd 2, whatever sys.stderr is
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    try:
        saved = os.dup(fd)
    except OSError:  # no fd 2 at all: nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), fd)
            yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


@contextlib.contextmanager
def sigint_deferred():
    """Ctrl-C (SIGINT), and SIGTERM (which the command line takes as Ctrl-C), held back until the block
    ends, then delivered: a KeyboardInterrupt inside the profiler's start, stop or profiled call left it
    half-stopped, and the process crashed (SIGSEGV) at exit after keeping its rows. Only the main thread can
    set a handler; elsewhere nothing is deferred."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in held}
    try:
        yield
    finally:
        for s in held:
            signal.signal(s, previous[s])
        if caught:
            first = caught[0]
            handler = previous[first]
            if callable(handler):
                handler(first, None)  # Python's default SIGINT handler raises KeyboardInterrupt
            elif handler == signal.SIG_DFL:
                signal.raise_signal(first)  # the default action (SIGTERM's: end the process)


def measure_cpu(fn: Callable[[], object]) -> Memory:
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with sigint_deferred():
        with quiet_native_stderr():
            prof.__enter__()
        try:
            out = fn()
        finally:
            with quiet_native_stderr():
                prof.__exit__(None, None, None)
        mem = summarise_records(cpu_memory_records(prof))
        del out
    return mem


def measure_call(fn: Callable[[], object], device) -> Memory:
    if torch.device(device).type == "cuda":
        return measure_cuda(fn, device)
    return measure_cpu(fn)


def method(device) -> str:
    return CUDA_METHOD if torch.device(device).type == "cuda" else CPU_METHOD
