"""The runner: every registry implementation of a suite's ops, at every point and mode, one row each.

For one implementation at one point (op, shape, dtype, options) the runner

1. writes ``skip`` rows when it cannot run here (``Implementation.unavailable_reason``), is excluded by the
   suite (with the suite's reason), or the time budget (``deadline``) is spent;
2. computes the relative error against the float64 reference once, outside any timed region, and
   puts it into every mode's row: ``fwd`` rows get the output's error, ``bwd`` rows the largest
   gradient error, ``fwd+bwd`` rows the largest of both. The inputs, the output gradient ``dy`` and
   the float64 reference (``Op.reference_grads``, with the tolerances of :mod:`crossfuse.tolerances`,
   as ``check.run_case`` does) are made once per point and shared by all its implementations, which
   run at the timed shape (no extra compilation). Attention too large for a float64 reference is
   compared on batch entry 0 and its first heads (heads are independent; the note says so).
   Speed-only peers (``same_function=False``) get no relerr;
3. writes ``not timed`` rows for implementations that run here only under the Triton interpreter (with
   the relerr of one interpreted run when that is cheap);
4. hands the measurement to the implementation's own side when it has ``measure`` (Julia times itself);
5. otherwise times and measures it per mode (:func:`.timing.measure`: the eager percentiles, the GPU-only
   median and the host time per call):

   * ``fwd``: the training forward, ``fn(**inputs)`` with the differentiable inputs requiring grad
     (so its memory includes what autograd saves for the backward);
   * ``bwd``: the forward runs once, then ``torch.autograd.grad(out, inputs, dy, retain_graph=True)``
     is timed (an implementation with its own ``vjp`` cannot separate it: a ``skip`` row says so);
   * ``fwd+bwd``: the forward and ``torch.autograd.grad`` together (or ``vjp``).

   The first call (compilation, autotuning) is not timed. Any exception (including out-of-memory)
   becomes an ``error`` row, memory is freed and the run goes on. ``KeyboardInterrupt`` stops the run;
   rows are written (and flushed) as each point's rounds end, so everything before it is kept (of the
   point it cut, the modes of a first round already timed).

With ``rounds`` > 1 a point's implementations are measured that many times, each round in another order
(:func:`round_orders`), and each row is the round with the median ``ms_p50`` (its note says so and gives
the rounds' range). A single measurement depended on what ran just before it until the timer reset
persisting L2 lines before each repeat (:mod:`.timing`; on the H200, a whole-row layer norm measured after a
kernel that loaded its input with evict_last ran 5-9% faster),
and a session measures each point's implementations in one fixed order: rounds guard against what is left
(drifts of the card between measurements). Rows are then written once all rounds of their point are
done (interrupted, from the rounds done), so ``on_row`` fires for a point's rows together. Every round
checks relerr again (one more call per implementation). With two implementations the third order is the
first again.

Within a round (one round by default), a point's implementations are timed together: each mode's calls are
built for all of them, their eager batches interleaved (:func:`.timing.time_eager_many`), so that a drift
of the host's pace, which decides host-bound points, falls on all alike; GPU-only time, host time and
memory then per implementation. A row's note names the implementations its eager time was interleaved
with.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import time
from collections.abc import Callable, Sequence

import torch

from .. import check, registry
from . import memory, timing
from .point_data import PointData
from .rounds import median_row, round_orders
from .schema import BUDGET_SPENT, CsvWriter, Row, device_name, dtype_str, shape_str
from .suite import Point, Suite, points, select

# Interpreted (Triton on the CPU) runs are slow: relerr from one such run only up to this much work.
INTERPRETED_RELERR_MAX_WORK = 1 << 17
NOTE_MAX = 300

# the fields a row takes from an implementation that measures itself (Implementation.measure)
SIDE_MEASURED = frozenset({"ms_p20", "ms_p50", "ms_p80", "gbps", "tflops", "alloc_bytes", "peak_bytes",
                           "gpu_ms_p50", "host_us", "versions", "timestamp"})  # fmt: skip

# the start of the note of a point whose implementation raised in the relerr check
RELERR_RAISED = "relerr check raised"
# the start of the note of one whose output the check could not compare with the reference (another shape,
# gradients missing): a wrong answer, an error row, not a time
NOT_COMPARABLE = "output not comparable with the float64 reference:"


class _Lazy:
    """Calls ``make`` on the first ``get()`` and keeps the result (or re-raises its exception)."""

    def __init__(self, make):
        self._make, self._value, self._exc = make, None, None

    def get(self):
        if self._exc is not None:
            raise self._exc
        if self._value is None:
            try:
                self._value = self._make()
            except Exception as exc:  # keep the message, not the frames (they hold tensors)
                self._exc = RuntimeError(_message(exc))
                self._make = None
                raise self._exc from None
        return self._value


class _NotMeasurable(Exception):
    """This mode cannot be measured for this implementation (a ``skip`` row with the message)."""


@dataclasses.dataclass
class _Ready:
    """An implementation that will be timed at a point: the point's data, its relerr per mode and the
    relerr's note (which every row's note ends with)."""

    data: PointData
    errs: dict
    rnote: str

    def note(self, *parts: str) -> str:
        return "; ".join(s for s in (*parts, self.rnote) if s)


def _message(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= NOTE_MAX else text[: NOTE_MAX - 3] + "..."


def free_memory(device) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def work(op: str, shape: Sequence[int]) -> int:
    """A size measure for deciding what is cheap: elements for normalisations, B*H*L*L*D/64 for attention."""
    if op == "relu_attention":
        b, h, l, d = shape
        return b * h * l * l * d // 64
    return math.prod(shape)


def throughput(op: str, shape, mode: str, dtype: torch.dtype, causal: bool, ms: float | None):
    """(GB/s, TFLOP/s) from the median time, by ``registry.min_bytes`` and ``registry.flops``."""
    if ms is None or not ms > 0:
        return None, None
    nbytes = registry.min_bytes(op, shape, mode, torch.empty((), dtype=dtype).element_size())
    nflops = registry.flops(op, shape, mode, causal)
    gbps = nbytes / (ms * 1e-3) / 1e9 if nbytes else None
    tflops = nflops / (ms * 1e-3) / 1e12 if nflops else None
    return gbps, tflops


class Runner:
    """Runs suites on one device and writes rows as each point is measured.

    ``writer``: a :class:`CsvWriter` (or None); ``on_row``: called with each row after it is written;
    ``deadline``: a ``time.monotonic()`` value after which nothing new is measured (``skip`` rows);
    ``rounds``: how many times each point's implementations are measured, in varied orders (module doc).
    """

    def __init__(
        self,
        device: str = "cpu",
        writer: CsvWriter | None = None,
        quick: bool = False,
        config: timing.TimingConfig | None = None,
        deadline: float | None = None,
        on_row: Callable[[Row], None] | None = None,
        rounds: int = 1,
    ):
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
        self.rounds = rounds
        self.device = str(device)
        self.devtype = torch.device(device).type
        if self.devtype == "cuda" and not torch.cuda.is_available():
            raise ValueError("device 'cuda' requested but torch sees no CUDA device")
        if self.devtype not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {device!r}")
        self.writer, self.quick, self.deadline, self.on_row = writer, quick, deadline, on_row
        self.config = config or (timing.QUICK if quick else timing.DEFAULT)
        self.device_name = device_name(device)
        self.rows: list[Row] = []

    # ------------------------------------------------------------------------------------------------
    def plan(self, suite: Suite, dtypes=None, ops=None, impls: Sequence[str] | None = None) -> list:
        """``(point, implementation)`` pairs the suite measures, in order."""
        out = []
        for p in points(suite, self.quick, dtypes, ops):
            chosen = select(registry.implementations(p.op), p.impls)
            for impl in select(chosen, impls):
                out.append((p, impl))
        return out

    def count(self, suite: Suite, dtypes=None, ops=None, impls=None) -> int:
        """How many rows :meth:`run` will write."""
        n = sum(len(p.modes) for p, _ in self.plan(suite, dtypes, ops, impls))
        return n + (1 if suite.copy_ceiling is not None else 0)

    def run(self, suite: Suite, dtypes=None, ops=None, impls: Sequence[str] | None = None) -> list[Row]:
        """Measure the suite; returns its rows (also written and passed to ``on_row`` one by one)."""
        start = len(self.rows)
        if suite.copy_ceiling is not None:
            self._emit(self.copy_row(suite))
        groups: list[tuple[Point, list]] = []  # the plan's pairs, one group per point, in order
        for p, impl in self.plan(suite, dtypes, ops, impls):
            if not groups or groups[-1][0] is not p:
                groups.append((p, []))
            groups[-1][1].append(impl)
        for i, (p, chosen) in enumerate(groups):
            shared = None  # frees the previous point's tensors before the cache is emptied
            if i and self.devtype == "cuda":
                torch.cuda.empty_cache()
            shared = _Lazy(lambda p=p: PointData(p, self.device))
            self._run_rounds(suite, p, chosen, shared)
        return self.rows[start:]

    def _run_rounds(self, suite: Suite, p: Point, chosen: list, shared: _Lazy) -> None:
        """The point's implementations measured in ``self.rounds`` rounds (:func:`round_orders`), then one
        row per implementation and mode (:func:`median_row`). Interrupted, it writes the rows of the rounds
        done first (of an interrupted first round, the modes already timed), then lets the interrupt
        through."""
        measured: list[list[list[Row]]] = [[] for _ in chosen]  # [impl][round] -> its rows, one per mode
        orders = set()  # those the rounds took: one alone is no variation for a row's note to claim
        try:
            for r, order in enumerate(round_orders(len(chosen), self.rounds)):
                # skipped, not timed or failed in the first round: once is enough
                order = [k for k in order if not r or any(row.ms_p50 is not None for row in measured[k][0])]
                orders.add(tuple(order))
                got: dict[int, list[Row]] = {}
                try:
                    self._round_paired(suite, p, chosen, order, shared, got)
                finally:  # a whole round, or what an interrupted first round measured
                    for k, rows in got.items():
                        if rows and (len(rows) == len(p.modes) or not measured[k]):
                            measured[k].append(rows)
        finally:  # a Ctrl-C (in on_row, say) waits until every measured row of the point is out
            with memory.sigint_deferred():
                for per_round in measured:
                    for rows in zip(*per_round, strict=True):  # one mode, every round done
                        self._emit(median_row(list(rows), varied=len(orders) > 1))

    def _emit(self, row: Row) -> None:
        with memory.sigint_deferred():  # a row on disk is a row counted: Ctrl-C waits for the bookkeeping
            if self.writer is not None:
                self.writer.write(row)
            self.rows.append(row)
        if self.on_row is not None:
            self.on_row(row)

    def _out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    # ------------------------------------------------------------------------------------------------
    def _row(self, suite: Suite | str, p: Point, impl, mode: str, **fields) -> Row:
        return Row(
            op=p.op,
            impl=impl.name,
            side=impl.side,
            peer=impl.peer,
            device=self.devtype,
            device_name=self.device_name,
            dtype=dtype_str(p.dtype),
            shape=shape_str(p.shape),
            causal=bool(p.options.get("causal", False)),
            mode=mode,
            suite=suite if isinstance(suite, str) else suite.name,
            **fields,
        )

    def _prepare(self, suite: Suite, p: Point, impl, shared: _Lazy) -> tuple[list[Row], _Ready | None]:
        """``(rows, None)`` where the implementation is not timed here (its rows, one per mode, say why);
        else ``([], ready)``: its point data and relerr, for :meth:`_timed_row`."""
        reason = None
        for ex in suite.exclude:
            if ex.applies(impl, self.devtype, self.quick):
                reason = ex.reason
                break
        if reason is None:
            reason = impl.unavailable_reason(self.device, p.dtype)
        if reason is None and self._out_of_time():
            reason = BUDGET_SPENT
        if reason is not None:
            return [self._row(suite, p, impl, mode, status="skip", note=reason) for mode in p.modes], None
        try:
            data = shared.get()
        except Exception as exc:  # e.g. out of memory while making the inputs
            msg = _message(exc)
            free_memory(self.device)
            return [self._row(suite, p, impl, mode, status="error", note=f"making inputs failed: {msg}")
                    for mode in p.modes], None  # fmt: skip

        errs, rnote = self.relerr(impl, data)
        if rnote.startswith(NOT_COMPARABLE):
            return [self._row(suite, p, impl, mode, status="error", note=rnote) for mode in p.modes], None
        ready = _Ready(data, errs, rnote)
        if impl.interpreted(self.device):
            why = "runs only under the Triton interpreter on the CPU: a time would measure the interpreter"
            # the one interpreted run raised: the implementation failed here, an error row, not a time
            failed = rnote.startswith(RELERR_RAISED)
            status, text = ("error", rnote) if failed else ("not timed", ready.note(why))
            return [self._row(suite, p, impl, mode, relerr=errs.get(mode), status=status, note=text)
                    for mode in p.modes], None  # fmt: skip
        if impl.measure is not None:
            return [self._measured_by_side(suite, p, impl, mode, errs.get(mode), ready.note())
                    for mode in p.modes], None  # fmt: skip
        return [], ready

    def _timed_row(self, suite: Suite, p: Point, impl, ready: _Ready, mode: str,
                   eager: timing.Timing | None = None, paired: str = "") -> Row:  # fmt: skip
        """The row of one mode: its call built, timed and measured, alone; with ``eager``, its eager time
        measured already (interleaved with the point's other implementations, named by ``paired``), which
        the row keeps even where the time budget has since run out."""
        if eager is None and self._out_of_time():
            return self._row(suite, p, impl, mode, status="skip", note=BUDGET_SPENT)
        status, msg, t, mem = "ok", "", None, None
        try:
            call = self._callable(impl, ready.data, mode)
            t = timing.measure(call, self.device, self.config, eager=eager)
            mem = memory.measure_call(call, self.device)
        except _NotMeasurable as exc:
            status, msg = "skip", str(exc)
        except Exception as exc:  # incl. torch.cuda.OutOfMemoryError: a row, and the run goes on
            status, msg = "error", _message(exc)
        call = None
        if status == "error":
            free_memory(self.device)
        fields = dict(relerr=ready.errs.get(mode), status=status, note=ready.note(msg))
        if t is not None:
            gbps, tflops = throughput(p.op, p.shape, mode, p.dtype, _causal(p), t.p50)
            fields.update(ms_p20=t.p20, ms_p50=t.p50, ms_p80=t.p80, gbps=gbps, tflops=tflops,
                          gpu_ms_p50=t.gpu_p50, host_us=t.host_us, note=ready.note(msg, paired))  # fmt: skip
        if mem is not None:
            fields.update(alloc_bytes=mem.alloc_bytes, peak_bytes=mem.peak_bytes)
        return self._row(suite, p, impl, mode, **fields)

    def _round_paired(self, suite: Suite, p: Point, chosen: list, order: list[int], shared: _Lazy,
                      rows: dict[int, list[Row]]) -> None:  # fmt: skip
        """One round of a point's implementations (``order``: indices into ``chosen``), each mode's calls
        built for all of them first and their eager batches interleaved (:func:`.timing.time_eager_many`),
        so that a change of the host's pace falls on every implementation alike; those calls are then freed,
        and each implementation's GPU-only time, host time and memory come from its call built again alone
        (the others' graphs and saved tensors would otherwise take its memory). Fills ``rows`` ({index: its
        rows, one per mode}) as it goes."""
        ready = {}
        for k in order:
            made, r = self._prepare(suite, p, chosen[k], shared)
            if r is None:
                rows[k] = made
            else:
                ready[k] = r
        for k in ready:
            rows[k] = []
        for mode in p.modes:
            calls = self._calls_together(chosen, ready, mode)
            eager = {}
            if len(calls) > 1 and not self._out_of_time():
                try:
                    times = timing.time_eager_many({chosen[k].key: c for k, c in calls.items()}, self.device,
                                                   self.config)  # fmt: skip
                    eager = {k: times[chosen[k].key] for k in calls}
                except Exception:  # a call that failed while repeated: each alone, its row says how
                    pass
            if calls:  # freed: each row's GPU-only time, host time and memory come from its call alone
                calls = {}
                free_memory(self.device)
            for k, r in ready.items():
                others = ", ".join(chosen[j].name for j in sorted(eager) if j != k)
                paired = f"eager interleaved with {others}" if k in eager else ""
                rows[k].append(self._timed_row(suite, p, chosen[k], r, mode, eager.get(k), paired))

    def _calls_together(self, chosen: list, ready: dict, mode: str) -> dict[int, Callable[[], object]]:
        """``{index: call}`` of ``mode`` for the ready implementations whose call can be built, all held at
        once (their memory together); empty where fewer than two are ready, the time budget is spent, or
        building them together runs out of memory (then each is built alone by its row)."""
        calls: dict[int, Callable[[], object]] = {}
        if len(ready) < 2 or self._out_of_time():
            return calls
        for k, r in ready.items():
            try:
                calls[k] = self._callable(chosen[k], r.data, mode)
            except torch.cuda.OutOfMemoryError:
                break
            except Exception:  # incl. _NotMeasurable: its row, made alone, says what failed
                continue
        else:
            return calls
        calls = {}  # out of memory beside the others' calls: freed outside the handler's frame
        free_memory(self.device)
        return calls

    # ------------------------------------------------------------------------------------------------
    def _callable(self, impl, data: PointData, mode: str) -> Callable[[], object]:
        """The zero-argument call that ``mode`` times; its first call (compile, autotune) happens here."""
        inputs = data.inputs
        leaves = {
            n: inputs[n].detach().clone().requires_grad_(True)
            for n in data.op.grad_args
            if isinstance(inputs.get(n), torch.Tensor)
        }
        ins = {**inputs, **leaves}
        lv = list(leaves.values())
        if mode != "fwd" and not lv:
            raise _NotMeasurable(f"{mode}: the op has no differentiable inputs here")
        out = impl.fn(**ins)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"{impl.key} returned {type(out).__name__}, expected a torch.Tensor")
        if mode == "fwd":
            return lambda: impl.fn(**ins)
        dy = data.dy_like(out)
        if mode == "bwd" and impl.vjp is None and out.requires_grad:
            # the graph of a later call, as in a training loop: a shape's first calls (Triton's dispatch,
            # then the compiled path's programs recorded) build graphs that keep the Python backward
            for _ in range(3):
                torch.autograd.grad(out, lv, dy, allow_unused=True)
                out = impl.fn(**ins)
        if impl.vjp is not None:
            if mode == "bwd":
                raise _NotMeasurable(
                    "bwd alone is not separable: the implementation's vjp runs forward and backward "
                    "together (see fwd+bwd)"
                )
            impl.vjp(inputs, dy)
            return lambda: impl.vjp(inputs, dy)
        if mode == "bwd":
            return _backward_only(impl, out, lv, dy)
        out = None  # fwd+bwd builds a fresh graph every call
        return _forward_backward(impl, ins, lv, dy)

    def relerr(self, impl, data: PointData) -> tuple[dict, str]:
        """``{mode: relative error}`` against the float64 reference, and a note (why there is none, or
        that it is above the tolerance)."""
        p, op = data.p, data.op
        if not impl.same_function:
            return {}, "speed-only peer: computes a different function, no relerr"
        if impl.interpreted(self.device) and work(p.op, p.shape) > INTERPRETED_RELERR_MAX_WORK:
            return {}, "relerr not computed: an interpreted run at this size is too slow"
        grads = any(m != "fwd" for m in p.modes)
        note = ""
        if data.heads is not None:
            which = "head 0" if data.heads == 1 else f"heads 0..{data.heads - 1}"
            note = f"relerr on batch 0, {which} (heads are independent)"
        try:
            with torch.no_grad():
                probe = impl.fn(**data.inputs) if data.dy is None and grads else None
            dy = data.dy_like(probe) if grads else None
            probe = None
            if grads:
                out, got = impl.forward_backward(data.inputs, dy)
            else:
                with torch.no_grad():
                    out, got = impl.fn(**data.inputs), {}
            out = data.part(out).detach().clone()
            got = {k: data.part(g).clone() for k, g in got.items() if g is not None}
        except Exception as exc:  # the implementation's own failure: the timing will say so too
            msg = _message(exc)
            free_memory(self.device)
            return {}, f"{RELERR_RAISED} {msg}"
        if data.ref_error is None:
            try:
                data.reference(grads)
            except Exception as exc:  # e.g. out of memory in float64: say so once per point
                data.ref_error = _message(exc)
                free_memory(self.device)
        if data.ref_error is not None:
            return {}, f"relerr not computed: float64 reference failed: {data.ref_error}"
        ref_out, ref_grads = data.reference(grads)
        dy = None if data.dy is None else data.part(data.dy)
        try:
            c = check.compare(impl, p.dtype, self.device, op.rows(data.inputs), out, got, ref_out, ref_grads,
                              data.reference_inputs(), dy)  # fmt: skip
        except torch.cuda.OutOfMemoryError as exc:  # the comparison's own memory: no relerr, still a time
            msg = _message(exc)
            free_memory(self.device)
            return {}, f"relerr not computed: {msg}"
        except Exception as exc:  # e.g. an output of another shape than the reference's: a wrong answer
            return {}, f"{NOT_COMPARABLE} {_message(exc)}"
        fwd, ok = c.fwd_err, c.ok
        errs = {"fwd": fwd}
        gerrs = list(c.grad_err.values())
        if gerrs:
            g = float("nan") if any(math.isnan(e) for e in gerrs) else max(gerrs)
            errs["bwd"] = g
            errs["fwd+bwd"] = float("nan") if math.isnan(fwd) or math.isnan(g) else max(fwd, g)
        if not ok:
            note = "; ".join(s for s in (note, "relerr above the tolerance of crossfuse.tolerances") if s)
        return errs, note

    def _measured_by_side(self, suite, p: Point, impl, mode: str, relerr, note: str) -> Row:
        """A row from the implementation's own ``measure`` (e.g. Julia timing itself in Julia)."""
        row = self._row(suite, p, impl, mode, relerr=relerr, note=note)
        try:
            fields = dict(impl.measure(p.shape, p.dtype, self.device, mode, dict(p.options)))
            # its times, memory and versions; what the point is and its relerr (against the float64
            # reference, every gradient) stay the runner's: a side's row may name its shape in its own
            # layout or give a relerr of one gradient
            row.update({k: v for k, v in fields.items() if k in SIDE_MEASURED})
            if row.relerr is None and fields.get("relerr") is not None:  # none of the runner's: the side's
                row.relerr = fields["relerr"]
                row.note = "; ".join(s for s in (row.note, "relerr: the side's own check") if s)
        except Exception as exc:
            msg = _message(exc)
            free_memory(self.device)
            return self._row(
                suite,
                p,
                impl,
                mode,
                relerr=relerr,
                status="error",
                note="; ".join(s for s in (f"measure failed: {msg}", note) if s),
            )
        if row.ms_p50 is not None and row.gbps is None and row.tflops is None:
            row.gbps, row.tflops = throughput(p.op, p.shape, mode, p.dtype, _causal(p), row.ms_p50)
        return row

    # ------------------------------------------------------------------------------------------------
    def copy_row(self, suite: Suite | str, dtype: torch.dtype | None = None, numel: int | None = None) -> Row:
        """The copy-bandwidth ceiling: ``y.copy_(x)`` of ``numel`` elements, bytes read + written."""
        name = suite if isinstance(suite, str) else suite.name
        cc = None if isinstance(suite, str) else suite.copy_ceiling
        if dtype is None:
            dtype = cc.dtype if cc is not None else torch.bfloat16
        if numel is None:
            numel = cc.quick_numel if self.quick else cc.numel.get(self.devtype, cc.quick_numel)
        base = dict(
            op="copy",
            impl="torch_copy",
            side="python",
            peer=False,
            device=self.devtype,
            device_name=self.device_name,
            dtype=dtype_str(dtype),
            shape=str(numel),
            causal=False,
            mode="fwd",
            suite=name,
        )
        note = "bandwidth ceiling: y.copy_(x) on one device, bytes read + written"
        try:
            x = torch.ones(numel, dtype=dtype, device=self.device)
            y = torch.empty_like(x)
            y.copy_(x)
            t = timing.measure(lambda: y.copy_(x), self.device, self.config)
            mem = memory.measure_call(lambda: y.copy_(x), self.device)
        except Exception as exc:
            msg = _message(exc)
            x = y = None
            free_memory(self.device)
            return Row(**base, status="error", note=f"{note}; {msg}")
        x = y = None
        nbytes = 2 * numel * torch.empty((), dtype=dtype).element_size()
        return Row(
            **base,
            ms_p20=t.p20,
            ms_p50=t.p50,
            ms_p80=t.p80,
            gbps=nbytes / (t.p50 * 1e-3) / 1e9,
            gpu_ms_p50=t.gpu_p50,
            host_us=t.host_us,
            alloc_bytes=mem.alloc_bytes,
            peak_bytes=mem.peak_bytes,
            note=note,
        )


def _backward_only(impl, out: torch.Tensor, leaves: list, dy: torch.Tensor) -> Callable[[], object]:
    """The gradient call of a retained graph (the forward ran once, outside)."""
    if not out.requires_grad:
        raise TypeError(f"{impl.key}'s output does not require grad: no backward to time")
    torch.autograd.grad(out, leaves, dy, retain_graph=True, allow_unused=True)
    return lambda: torch.autograd.grad(out, leaves, dy, retain_graph=True, allow_unused=True)


def _forward_backward(impl, ins: dict, leaves: list, dy: torch.Tensor) -> Callable[[], object]:
    def call():
        return torch.autograd.grad(impl.fn(**ins), leaves, dy, allow_unused=True)

    call()  # compiles the backward where there is one to compile
    return call


def _causal(p: Point) -> bool:
    return bool(p.options.get("causal", False))


def run_suite(
    suite: Suite, device: str = "cpu", writer: CsvWriter | None = None, quick: bool = False, **kwargs
) -> list[Row]:
    """Convenience: ``Runner(device, writer, quick).run(suite, **kwargs)``."""
    return Runner(device, writer, quick).run(suite, **kwargs)
