"""bench/host_time.py's table: the paired ratio of each round beside the medians (the timing itself needs
a GPU; this checks what it reports from given rounds)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def host_time():
    path = Path(__file__).resolve().parents[1] / "bench" / "host_time.py"
    spec = importlib.util.spec_from_file_location("host_time_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(label, rounds, entry="layer_norm", mode="bwd"):
    return dict(entry=entry, mode=mode, shape="4x8", impl=label, label=label, rounds_us=rounds,
                host_us=sorted(rounds)[len(rounds) // 2], min_us=min(rounds), max_us=max(rounds))  # fmt: skip


def test_paired_ratio_is_the_median_of_each_rounds_ratio(host_time):
    # the host slows in round 2 for both: the medians of each side alone (90 against 88) would call
    # crossfuse slower, the rounds' own ratios call it faster in two rounds of three
    rows = [_row("crossfuse", [80.0, 180.0, 90.0]), _row("torch", [88.0, 200.0, 85.0]),
            _row("crossfuse before", [70.0, 70.0, 70.0]), _row("crossfuse", [10.0], mode="fwd")]  # fmt: skip
    got = host_time.paired(rows)
    assert list(got) == [("layer_norm", "bwd", "4x8")]  # a row without its peer has no ratio
    median, low, high = got["layer_norm", "bwd", "4x8"]
    assert median == pytest.approx(1.1) and low == pytest.approx(85 / 90) and high == pytest.approx(200 / 180)
    table = host_time._table(rows, ["crossfuse", "torch"])
    assert "| layer_norm | bwd | 4x8 | 90.0 | 88.0 | 1.100 (0.94–1.11) |" in table
    assert "| layer_norm | fwd | 4x8 | 10.0 |  |  |" in table
