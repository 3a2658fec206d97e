"""The benchmark harness: one result schema for both sides, timing, memory, runner, reports, plots.

* :mod:`.schema`: the long-format row (:class:`~.schema.Row`), CSV writing (appended and flushed row by
  row) and reading.
* :mod:`.timing`: CUDA events with an L2 flush, or ``time.perf_counter`` on the CPU; p20/p50/p80.
* :mod:`.memory`: bytes allocated during a call and its peak above the baseline (CUDA allocator
  statistics; on the CPU the profiler's allocation records).
* :mod:`.suite`: suites as data (:mod:`.suites`), loaded and validated.
* :mod:`.runner`: runs a suite over the registry's implementations, one row per measurement.
* :mod:`.report`, :mod:`.plots`: markdown tables (pivot, ratio to the best peer), PNG plots.
* :mod:`.profile`: the PyTorch profiler on the attention implementations.
* :mod:`.toolchain`: the one ptxas a measuring run pins, and which one built each row.
* :mod:`.sweep`: the candidates of the tuning sweep (``bench/tune.py``) and its winners as ``tuned.json``
  entries.

Nothing here imports Triton at import time (Triton kernels are imported by the registry's callables on
first use), so a program can still choose Triton's interpreter after importing the harness.
"""
