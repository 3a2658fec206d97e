"""``crossfuse bench models`` (:mod:`crossfuse.harness.models`): end to end on the CPU with tiny
configurations (crossfuse's rows checked, not timed), its error measure, and its bad input."""

from __future__ import annotations

import csv
import math
from types import SimpleNamespace

import pytest
import torch
from crossfuse import cli
from crossfuse.harness import models, models_out


def _transformers_missing() -> str | None:
    return models.missing_library("gpt2")


def test_quick_run_on_the_cpu_end_to_end(tmp_path, capsys):
    out = tmp_path / "m"
    args = ["bench", "models", "--quick", "--device", "cpu", "--dtype", "float32", "--out", str(out)]
    assert cli.main(args) == 0
    captured = capsys.readouterr()
    assert "[models" in captured.err  # progress lines on stderr
    with open(out / "models-quick-cpu.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and list(rows[0]) == list(models.COLUMNS)
    md = (out / "models-quick-cpu.md").read_text()
    assert "### pre-norm blocks" in md and md in captured.out
    blocks = {r["impl"]: r for r in rows if r["table"] == "blocks" and r["case"] == "short"}
    assert set(blocks) == {"crossfuse", "torch_relu", "torch_sdpa"}
    assert blocks["crossfuse"]["status"] == "not timed" and "interpreter" in blocks["crossfuse"]["note"]
    assert float(blocks["torch_relu"]["train_ms"]) > 0 and float(blocks["torch_sdpa"]["infer_ms"]) > 0
    assert float(blocks["crossfuse"]["grad_err_vs_torch"]) < 1e-4  # float32: the same math
    assert float(blocks["crossfuse"]["loss_err_vs_fp32"]) < 1e-5
    model_rows = [r for r in rows if r["table"] == "models"]
    assert {r["model"].split(" ")[0] for r in model_rows} == {"gpt2", "bert", "vit"}
    assert len(model_rows) == 2 * 2 * 3  # torch and crossfuse, two cases, three families
    why = _transformers_missing()
    if why is not None:
        assert {r["status"] for r in model_rows} == {"skip"} and all(r["note"] == why for r in model_rows)
    else:
        assert "### models" in md
        for r in model_rows:
            if r["impl"] == "crossfuse":
                assert r["status"] == "not timed" and int(r["swapped"]) >= 3, r
                assert float(r["loss_err_vs_torch"]) < 1e-5 and float(r["grad_err_vs_torch"]) < 1e-4, r
            else:
                assert r["status"] == "ok" and float(r["train_ms"]) > 0 and float(r["infer_ms"]) > 0, r
                assert float(r["grad_err_vs_fp32"]) == 0.0  # float32: the copy is the same model


def test_gradient_error_takes_all_parameters_as_one_vector():
    ref = (torch.tensor(2.0), {"w": torch.tensor([3.0, 4.0]), "key_bias": torch.tensor([1e-9, 0.0])})
    got = (torch.tensor(2.02), {"w": torch.tensor([3.0, 4.0]), "key_bias": torch.tensor([-1e-9, 1e-9])})
    loss_err, grad_err = models.errors(got, ref)
    assert loss_err == pytest.approx(0.01)
    assert grad_err < 1e-9  # a rounding-noise gradient does not dominate (per parameter it would be ~2)
    assert math.isnan(models.errors((torch.tensor(1.0), {}), (torch.tensor(1.0), {}))[1])


@pytest.mark.parametrize(
    "kw, words",
    [(dict(rounds=0), "rounds must be >= 1"), (dict(families=("gpt2", "resnet")), "unknown families")],
)
def test_bad_configuration_names_the_field(kw, words):
    with pytest.raises(ValueError, match=words):
        models.ModelsConfig(device="cpu", **kw)


@pytest.mark.parametrize(
    "extra, words",
    [(["--op", "layer_norm"], "--op do not apply"), (["--dtype", "float32,bfloat16"], "takes one --dtype"),
     (["--rounds", "0"], "--rounds must be >= 1"), (["--threads", "2"], "--threads do not apply"),
     (["--budget-s", "60"], "--budget-s do not apply"), (["--append"], "--append do not apply")],
)  # fmt: skip
def test_bad_command_line_is_a_usage_error(extra, words, tmp_path, capsys):
    assert cli.main(["bench", "models", "--quick", "--device", "cpu", "--out", str(tmp_path), *extra]) == 2
    assert words in capsys.readouterr().err


@pytest.mark.gpu
def test_quick_run_on_the_gpu_times_both_alternately(tmp_path):
    cfg = models.ModelsConfig(device="cuda", quick=True, rounds=2)
    rows, csv_path, md_path = models_out.bench_models(cfg, tmp_path)
    assert csv_path.exists() and md_path.exists()
    timed = [r for r in rows if r.status == "ok"]
    for r in timed:
        assert r.train_ms > 0 and r.infer_ms > 0 and r.peak_mib > 0 and r.rounds == 2
    for r in rows:
        if r.impl == "crossfuse" and r.status == "ok":
            assert r.train_speedup > 0 and r.infer_speedup > 0 and r.grad_err_vs_fp32 < 0.05
            if r.table == "blocks":  # and against the speed peer, torch LayerNorm + SDPA
                assert r.train_vs_peer > 0 and r.infer_vs_peer > 0
    # every model case also times the unswapped model a second time: the A/A control of the run's noise
    again = [r for r in rows if r.impl == models.AGAIN]
    torch_rows = [r for r in rows if r.table == "models" and r.impl == "torch" and r.status == "ok"]
    measured = {(r.model, r.case) for r in torch_rows}
    assert again and {(r.model, r.case) for r in again} == measured
    assert all(r.status == "ok" and r.train_speedup > 0 and r.infer_speedup > 0 for r in again)
    assert "torch again (A/A control)" in md_path.read_text()
    assert not [r for r in rows if r.status == "error"]


def test_an_interrupted_run_keeps_the_cases_it_measured(tmp_path, capsys, monkeypatch):
    # Ctrl-C in the middle: the cases measured before it are in both files, the report says it is a
    # partial run, and the command exits 130 naming the files
    real = models._blocks_case
    calls = []

    def blocks_then_stop(case, cfg, say):
        calls.append(case.label)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(case, cfg, say)

    monkeypatch.setattr(models, "_blocks_case", blocks_then_stop)
    out = tmp_path / "m"
    args = ["bench", "models", "--quick", "--device", "cpu", "--dtype", "float32", "--out", str(out)]
    assert cli.main(args) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "models-quick-cpu.csv" in err
    with open(out / "models-quick-cpu.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["table"] for r in rows} == {"models", "blocks"}  # every model case, then the first block case
    assert len(calls) == 2 and {r["case"] for r in rows if r["table"] == "blocks"} == {calls[0]}
    md = (out / "models-quick-cpu.md").read_text()
    assert "**Partial run**: interrupted" in md and "### pre-norm blocks" in md


def test_speed_is_the_median_of_each_rounds_ratio():
    # paired by round: a round where the host ran slow for both says the same as a fast one
    assert models.speedup([10.0, 20.0, 30.0], [5.0, 20.0, 15.0]) == 2.0
    assert models.speedup([1.0, 2.0], [1.0, 1.0]) == 1.5  # an even count: the mean of the middle two


def test_models_rounds_vary_each_implementations_place_and_predecessor():
    # the order of :func:`.rounds.round_orders`: the second implementation (crossfuse in the table) is not
    # always measured in the middle, right after the first
    made = []

    def time_round(calls, device, config):
        made.extend(fn() for fn in calls.values())
        return {name: SimpleNamespace(p50=1.0) for name in calls}

    calls = {name: (lambda name=name: name) for name in ("torch", "crossfuse", "torch_again")}
    per_round = models.alternate(calls, 6, "cuda", None, lambda s: None, time_round)
    assert per_round == {name: [1.0] * 6 for name in calls} and len(made) == 18
    rounds = [made[i : i + 3] for i in range(0, 18, 3)]
    assert all(sorted(r) == sorted(calls) for r in rounds)
    places = {r.index("crossfuse") for r in rounds}
    before = {made[i - 1] for i in range(1, 18) if made[i] == "crossfuse"}
    assert len(places) > 1 and len(before) > 1


def test_blocks_give_crossfuse_a_paired_speed_against_the_speed_peer():
    # measure(peer=...) pairs every implementation but the reference and the peer with the peer's rounds,
    # as the speedups against the reference are; the blocks table shows it in columns of its own
    cfg = models.ModelsConfig(device="cpu", quick=True)
    impls = {n: torch.nn.Linear(4, 4) for n in ("crossfuse", "torch_relu", "torch_sdpa")}
    x = torch.randn(3, 4)
    times = models.measure(impls, list(impls), "torch_relu", {"x": x}, lambda m, ins: m(ins["x"]).sum(), cfg,
                           lambda s: None, peer="torch_sdpa")  # fmt: skip
    assert times["crossfuse"]["train_vs_peer"] > 0 and times["crossfuse"]["infer_vs_peer"] > 0
    assert "train_vs_peer" not in times["torch_relu"] and "train_vs_peer" not in times["torch_sdpa"]
    assert "train_speedup" in times["torch_sdpa"] and "train_speedup" not in times["torch_relu"]
    row = dict(table="blocks", model="4 blocks", case="short", batch=8, seq=256, peer=False, device="cuda",
               device_name="GPU", dtype="bfloat16", train_ms=6.5, infer_ms=1.6)  # fmt: skip
    rows = [models.Row(impl="crossfuse", train_vs_peer=1.14, infer_vs_peer=1.13, **row),
            models.Row(impl="torch_sdpa", **{**row, "peer": True})]
    md = models_out.render(rows, "t")
    header = next(line for line in md.splitlines() if line.startswith("| model"))
    assert "| train vs torch_sdpa | infer vs torch_sdpa |" in header
    cells = next(line for line in md.splitlines() if "| crossfuse |" in line).split(" | ")
    assert cells[header.split(" | ").index("train vs torch_sdpa")] == "1.14×"


def test_an_earlier_runs_files_are_kept_not_overwritten(tmp_path, capsys, monkeypatch):
    out = tmp_path / "m"
    out.mkdir()
    (out / "models-quick-cpu.csv").write_text("an earlier run's rows\n")
    (out / "models-quick-cpu.md").write_text("an earlier run's report\n")
    ran = []

    def bench(cfg, where):  # stands in for the run: what it was asked, and its two files
        ran.append(cfg.rounds)
        paths = models_out.output_paths(cfg, where)
        for p in paths:
            p.write_text("this run\n")
        return [], *paths

    monkeypatch.setattr(models_out, "bench_models", bench)
    args = ["bench", "models", "--quick", "--device", "cpu", "--dtype", "float32", "--out", str(out)]
    assert cli.main(args) == 2
    assert "holds an earlier run's results: pass --replace" in capsys.readouterr().err
    assert not ran and (out / "models-quick-cpu.csv").read_text() == "an earlier run's rows\n"
    assert cli.main([*args, "--replace", "--rounds", "1"]) == 0
    assert ran == [1]  # --rounds 1 is one round, not the default
    kept = sorted(p.name for p in out.iterdir() if p.name.count(".") == 2)
    assert len(kept) == 2 and all(n.startswith("models-quick-cpu.") for n in kept)
    assert {(out / n).read_text() for n in kept} == {"an earlier run's rows\n", "an earlier run's report\n"}
    assert (out / "models-quick-cpu.csv").read_text() == "this run\n"
