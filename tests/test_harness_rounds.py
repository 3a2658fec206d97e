"""The runner's rounds and the pairing of a point's implementations: their orders, the median row, the
eager batches interleaved and the calls freed after, interrupts, failures and running out of memory while
they are held together."""

from __future__ import annotations

import itertools
import os
import signal
import weakref

import pytest
import torch
from _harness import _layer_norm, _raise_runtime, registered, row, tiny_suite
from crossfuse import registry
from crossfuse.harness import memory, rounds, runner, schema, suite, timing


@pytest.mark.parametrize("n", range(1, 9))
def test_round_orders_vary_every_implementations_predecessor(n):
    orders = rounds.round_orders(n, 6)
    assert len(orders) == 6 and all(sorted(o) == list(range(n)) for o in orders)
    assert orders[0] == list(range(n)) and rounds.round_orders(n, 1) == [list(range(n))]
    if n == 2:
        assert orders[1] == [1, 0]
    if n >= 3:  # a pair adjacent in the first order is not adjacent, in that order, in the next two rounds
        first = set(itertools.pairwise(orders[0]))
        walk = orders[0] + orders[1] + orders[2]  # the boundaries too: a round's last, the next one's first
        assert not first & set(itertools.pairwise(walk[n - 1 :]))
        assert orders[1][0] != orders[0][-1] and orders[2][0] != orders[1][-1]


def test_median_row_takes_the_middle_timed_round():
    timed = [row(ms_p50=3.0, note="a"), row(ms_p50=1.0, note="b"), row(ms_p50=2.0, note="c")]
    got = rounds.median_row(timed)
    assert got.ms_p50 == 2.0 and got.note.startswith("median of 3 of 3 rounds") and got.note.endswith("; c")
    assert "1-3 ms" in got.note
    # an untimed round (the budget ran out) does not count; the slower middle of an even count
    budget = row(status="skip", note=schema.BUDGET_SPENT)
    got = rounds.median_row([row(ms_p50=4.0), budget, row(ms_p50=2.0)])
    assert got.ms_p50 == 4.0 and "median of 2 of 3 rounds" in got.note and "round 2" not in got.note
    # a round that failed where others were timed is named; one timed round says so
    got = rounds.median_row([row(ms_p50=4.0), row(status="error", note="OutOfMemoryError: x"), budget])
    assert got.ms_p50 == 4.0
    assert got.note.startswith("timed in 1 of 3 rounds; round 2: error: OutOfMemoryError")
    # no timed round: the first round's row as it is
    skip = row(status="skip", note="why")
    assert rounds.median_row([skip, row(status="skip", note="other")]) is skip
    assert rounds.median_row([timed[0]]) is timed[0]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_runner_rejects_bad_rounds(bad):
    with pytest.raises(ValueError, match="rounds must be an integer >= 1"):
        runner.Runner("cpu", quick=True, rounds=bad)


def test_rounds_measure_each_point_in_varied_orders_and_write_one_row_per_mode(tmp_path, monkeypatch):
    names = ("test_r0", "test_r1", "test_r2")
    fakes = [registry.Implementation("layer_norm", n, "python", _layer_norm) for n in names]
    broken = registry.Implementation("layer_norm", "test_broken", "python", _raise_runtime)
    s = tiny_suite()
    path = tmp_path / "r.csv"
    with registered(*fakes, broken), schema.CsvWriter(path) as w:
        once = runner.Runner("cpu", quick=True).run(s, impls=["test_*"])
        measured = []
        prepare = runner.Runner._prepare

        def traced(self, suite, p, impl, shared):
            measured.append(impl.name)
            return prepare(self, suite, p, impl, shared)

        monkeypatch.setattr(runner.Runner, "_prepare", traced)
        r = runner.Runner("cpu", w, quick=True, rounds=3)
        rows = r.run(s, impls=["test_*"])
        count = r.count(s, impls=["test_*"])
    assert len(rows) == count == len(once) == len(schema.read_csv(path))
    assert [(x.impl, x.mode) for x in rows] == [(x.impl, x.mode) for x in once]
    timed = [x for x in rows if x.impl != "test_broken"]
    assert all(x.status == "ok" and "median of 3 of 3 rounds" in x.note for x in timed)
    # each mode's eager batches interleaved with the others timed at the point (not the broken one)
    for x in timed:
        others = ", ".join(n for n in names if n != x.impl)
        assert f"eager interleaved with {others}" in x.note
    failed = [x for x in rows if x.impl == "test_broken"]
    assert failed and all(x.status == "error" and "deliberately broken" in x.note for x in failed)
    # the rounds' orders; test_broken (listed last) is measured in the first round only
    assert measured == [*names, "test_broken", *names[::-1], "test_r0", "test_r2", "test_r1"]


def test_an_interrupt_in_a_later_round_keeps_the_rounds_done(tmp_path, monkeypatch):
    fakes = [registry.Implementation("layer_norm", n, "python", _layer_norm) for n in ("test_a", "test_b")]
    seen: list[str] = []
    prepare = runner.Runner._prepare

    def interrupted(self, suite, p, impl, shared):
        seen.append(impl.name)
        if len(seen) == 6:  # round 3 (as listed), its second implementation: test_b
            raise KeyboardInterrupt
        return prepare(self, suite, p, impl, shared)

    monkeypatch.setattr(runner.Runner, "_prepare", interrupted)
    path = tmp_path / "r.csv"
    with registered(*fakes), schema.CsvWriter(path) as w:
        with pytest.raises(KeyboardInterrupt):
            runner.Runner("cpu", w, quick=True, rounds=3).run(tiny_suite(), impls=["test_*"])
    assert seen == ["test_a", "test_b", "test_b", "test_a", "test_a", "test_b"]
    kept = schema.read_csv(path)
    # a round is the point's implementations together (their eager batches interleaved): the two whole
    # rounds of each, their median written when the interrupt came, and nothing of the third
    assert list(zip(kept["impl"], kept["mode"], strict=True)) == [
        ("test_a", "fwd"), ("test_a", "bwd"), ("test_b", "fwd"), ("test_b", "bwd")]  # fmt: skip
    assert (kept["status"] == "ok").all()
    assert all("median of 2 of 2 rounds" in n for n in kept["note"].fillna("").tolist())


def _interrupt_at_64(**kw):
    if kw["x"].shape[-1] == 64:
        raise KeyboardInterrupt
    return _layer_norm(**kw)


def test_an_interrupted_run_keeps_the_rows_measured_before(tmp_path):
    fake = registry.Implementation("layer_norm", "test_interrupt", "python", _interrupt_at_64)
    path = tmp_path / "r.csv"
    s = tiny_suite(shape=(8, 32))
    s = suite.Suite(s.name, "", (*s.groups, tiny_suite(shape=(8, 64)).groups[0]))
    with registered(fake), schema.CsvWriter(path) as w, pytest.raises(KeyboardInterrupt):
        runner.Runner("cpu", w, quick=True).run(s, impls=["torch", "test_interrupt"])
    df = schema.read_csv(path)
    # the first point whole; the second's round was cut before anything of it was timed
    assert df["impl"].tolist() == ["torch", "torch", "test_interrupt", "test_interrupt"]
    assert df["shape"].tolist() == ["8x32"] * 4 and (df["status"] == "ok").all()


def test_a_call_failing_while_timed_is_an_error_row_and_the_others_are_timed():
    made = []

    def fails_when_repeated(**kw):  # the relerr check and building the call pass; timing repeats it
        made.append(1)
        if len(made) > 4:
            raise RuntimeError("fails on its fifth call")
        return _layer_norm(**kw)

    fake = registry.Implementation("layer_norm", "test_fails_later", "python", fails_when_repeated)
    with registered(fake):
        rows = runner.Runner("cpu", quick=True).run(tiny_suite(modes=("fwd",)), impls=["torch", "test_*"])
    got = {r.impl: r for r in rows}
    assert got["torch"].status == "ok" and got["torch"].ms_p50 is not None
    assert got["test_fails_later"].status == "error" and "fifth call" in got["test_fails_later"].note


def test_out_of_memory_beside_the_others_calls_times_each_alone():
    made = []

    def out_of_memory_when_held_with_others(**kw):  # the relerr check passes; building the calls does not
        made.append(1)
        if len(made) > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (a stand-in)")
        return _layer_norm(**kw)

    fake = registry.Implementation("layer_norm", "test_oom", "python", out_of_memory_when_held_with_others)
    with registered(fake):
        rows = runner.Runner("cpu", quick=True).run(tiny_suite(modes=("fwd",)), impls=["torch", "test_*"])
    got = {r.impl: r for r in rows}
    # torch timed alone (nothing to interleave with), the other an error row; the run went on
    assert got["torch"].status == "ok" and "interleaved" not in got["torch"].note
    assert got["test_oom"].status == "error" and "out of memory" in got["test_oom"].note


def test_an_interrupt_mid_round_keeps_the_modes_measured(tmp_path, monkeypatch):
    fakes = [registry.Implementation("layer_norm", n, "python", _layer_norm) for n in ("test_a", "test_b")]
    timed = runner.Runner._timed_row
    done: list[str] = []

    def interrupted(self, suite, p, impl, ready, mode, *args):
        if len(done) == 3:  # the second mode's second implementation
            raise KeyboardInterrupt
        done.append(f"{impl.name} {mode}")
        return timed(self, suite, p, impl, ready, mode, *args)

    monkeypatch.setattr(runner.Runner, "_timed_row", interrupted)
    path = tmp_path / "r.csv"
    with registered(*fakes), schema.CsvWriter(path) as w, pytest.raises(KeyboardInterrupt):
        runner.Runner("cpu", w, quick=True).run(tiny_suite(), impls=["test_*"])
    df = schema.read_csv(path)
    assert done == ["test_a fwd", "test_b fwd", "test_a bwd"]
    kept = [("test_a", "fwd"), ("test_a", "bwd"), ("test_b", "fwd")]
    assert list(zip(df["impl"], df["mode"], strict=True)) == kept


def test_one_order_is_not_called_varied():
    rows = runner.Runner("cpu", quick=True, rounds=3).run(tiny_suite(modes=("fwd",)), impls=["python/torch"])
    assert rows[0].note.startswith("median of 3 of 3 rounds (p50 ")


def test_an_output_the_reference_cannot_be_compared_with_is_an_error_row():
    # one column short: the comparison raises; the run goes on, the others timed
    short = registry.Implementation("layer_norm", "test_short", "python",
                                    lambda **kw: _layer_norm(**kw)[:, :-1])  # fmt: skip
    with registered(short):
        rows = runner.Runner("cpu", quick=True).run(tiny_suite(modes=("fwd",)), impls=["torch", "test_*"])
    got = {r.impl: r for r in rows}
    assert got["torch"].status == "ok" and got["torch"].ms_p50 is not None
    assert got["test_short"].status == "error" and got["test_short"].ms_p50 is None
    assert got["test_short"].note.startswith(runner.NOT_COMPARABLE) and "shape" in got["test_short"].note


def test_calls_timed_together_are_freed_before_each_is_measured_alone(monkeypatch):
    fakes = [registry.Implementation("layer_norm", n, "python", _layer_norm) for n in ("test_a", "test_b")]
    made: dict[str, list] = {}
    alive_beside: list[list[str]] = []
    build, measure_call = runner.Runner._callable, memory.measure_call

    def traced_build(self, impl, data, mode):
        call = build(self, impl, data, mode)
        made.setdefault(impl.name, []).append(weakref.ref(call))
        return call

    def traced_measure(call, device):
        alive_beside.append(sorted(n for n, refs in made.items() for r in refs if r() not in (None, call)))
        return measure_call(call, device)

    monkeypatch.setattr(runner.Runner, "_callable", traced_build)
    monkeypatch.setattr(memory, "measure_call", traced_measure)
    with registered(*fakes):
        rows = runner.Runner("cpu", quick=True).run(tiny_suite(modes=("bwd",)), impls=["test_*"])
    assert all("eager interleaved with" in r.note for r in rows)
    assert alive_beside == [[], []]  # no other call (graph, saved tensors) alive while one is measured


def test_cpu_eager_times_are_interleaved_too():
    seq: list[str] = []
    calls = {n: (lambda n=n: seq.append(n)) for n in ("a", "b", "c")}
    config = timing.TimingConfig(cpu_warmup_s=0.0, cpu_rep_s=0.0, cpu_min_reps=6, cpu_max_reps=6)
    got = timing.time_eager_many(calls, "cpu", config)
    assert set(got) == set(calls) and all(t.reps == 6 for t in got.values())
    timed = seq[3:]  # after one warm-up call each
    assert timed[:6] == ["a", "b", "c", "b", "c", "a"]  # one call of each a repeat, the order rotated
    assert all(timed.count(n) == 6 for n in calls)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_while_a_points_rows_are_written_keeps_them_all(tmp_path, sig):
    from crossfuse._cli_out import sigterm_as_interrupt  # SIGTERM as the command line takes it

    fakes = [registry.Implementation("layer_norm", n, "python", _layer_norm) for n in ("test_a", "test_b")]
    path = tmp_path / "r.csv"
    on_row = lambda _: os.kill(os.getpid(), sig)  # noqa: E731 (the signal in the progress line)
    with registered(*fakes), schema.CsvWriter(path) as w, sigterm_as_interrupt():
        with pytest.raises(KeyboardInterrupt):
            runner.Runner("cpu", w, quick=True, on_row=on_row).run(tiny_suite(), impls=["test_*"])
    assert len(schema.read_csv(path)) == 4  # the point's four rows, measured before the signal came


def _grad_5_percent_off(inputs, dy):
    x, w, b = (inputs[k].detach().requires_grad_(True) for k in ("x", "weight", "bias"))
    out = torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, inputs["eps"])
    gx, gw, gb = torch.autograd.grad(out, (x, w, b), dy)
    return out.detach(), {"x": gx, "weight": gw * 1.05, "bias": gb}


def test_a_side_that_measures_itself_keeps_the_runners_relerr_and_point():
    def side_row(shape, dtype, device, mode, options):  # as Julia's: a whole row, in its own terms
        return {"ms_p20": 1.0, "ms_p50": 2.0, "ms_p80": 3.0, "relerr": 1e-9, "causal": None,
                "shape": "32x8", "versions": "julia=1.12"}  # fmt: skip

    ln = registry.get("layer_norm", "torch").fn
    side = registry.Implementation("layer_norm", "test_side", "python", ln, vjp=_grad_5_percent_off,
                                   measure=side_row)  # fmt: skip
    with registered(side):
        (r,) = runner.Runner("cpu", quick=True).run(tiny_suite(modes=("fwd+bwd",)), impls=["test_side"])
    assert r.ms_p50 == 2.0 and r.versions == "julia=1.12"  # its times and versions
    assert r.relerr == pytest.approx(0.05, rel=1e-2) and "relerr above the tolerance" in r.note
    assert r.shape == "8x32" and r.causal is False
