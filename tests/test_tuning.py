"""CROSSFUSE_TUNED_CONFIGS: tuned.json files of bench/tune.py override the built-in launch tables."""

import json
import os
import subprocess
import sys

import pytest
from crossfuse import _tuning
from crossfuse.ops.layer_norm import LaunchConfig
from crossfuse.ops.relu_attention import AttnConfig


@pytest.fixture
def tuned_file(tmp_path, monkeypatch):
    def write(entries: dict):
        path = tmp_path / "tuned.json"
        path.write_text(json.dumps(entries))
        monkeypatch.setenv("CROSSFUSE_TUNED_CONFIGS", str(path))
        _tuning._entries.cache_clear()

    yield write
    _tuning._entries.cache_clear()


def test_layer_norm_entries_by_row_regime(tuned_file):
    tuned_file({
        "ln/fwd/bfloat16/4096/many": dict(kind="fwd", dtype="bfloat16", n=4096, block_m=1, num_warps=4, pps=0,
                                          rows="many"),
        "ln/bwd/float32/1024/few": dict(kind="bwd", dtype="float32", n=1024, block_m=2, num_warps=8, pps=4,
                                        rows="few"),
    })  # fmt: skip
    got = _tuning.layer_norm_overrides(LaunchConfig)
    assert got == {
        ("fwd", 2, 4096, True): LaunchConfig(1, 4096, 4, 0),
        ("bwd", 4, 1024, False): LaunchConfig(2, 1024, 8, 4),
    }


def test_layer_norm_entries_of_earlier_files_serve_both_regimes(tuned_file):
    # files written before the row regimes: no "rows"; their forward ran one program per tile (pps 1 then)
    old = dict(kind="fwd", dtype="float32", n=2048, block_m=2, num_warps=4, pps=1)
    tuned_file({"ln/fwd/float32/2048": old})
    got = _tuning.layer_norm_overrides(LaunchConfig)
    assert got == {("fwd", 4, 2048, many): LaunchConfig(2, 2048, 4, 0) for many in (False, True)}


def test_attention_entries_by_length(tuned_file):
    tuned_file({
        "attn/fwd/128/True/short": dict(kind="fwd", d=128, causal=True, block_m=128, block_n=64, num_warps=8,
                                        num_stages=3, length="short"),
        "attn/dq/64/False": dict(kind="dq", d=64, causal=False, block_m=64, block_n=32, num_warps=4,
                                 num_stages=2),
    })  # fmt: skip
    got = _tuning.attention_overrides(AttnConfig)
    assert got[("fwd", 128, 2, True, False)] == AttnConfig(128, 64, 8, 3)
    assert ("fwd", 128, 2, True, True) not in got
    assert got[("dq", 64, 2, False, False)] == got[("dq", 64, 2, False, True)] == AttnConfig(64, 32, 4, 2)


def test_warp_specialized_attention_entries_are_not_applied(tuned_file):
    # Triton's warp-specialized loops ("ws": true) gave wrong results on the H200; such entries are
    # skipped, the others of the same file still apply
    tuned_file({
        "attn/fwd/128/True/ws": dict(kind="fwd", d=128, causal=True, block_m=128, block_n=64, num_warps=8,
                                     num_stages=3, ws=True),
        "attn/fwd/64/True": dict(kind="fwd", d=64, causal=True, block_m=64, block_n=32, num_warps=4,
                                 num_stages=2, ws=False),
    })  # fmt: skip
    got = _tuning.attention_overrides(AttnConfig)
    assert got == {("fwd", 64, 2, True, long): AttnConfig(64, 32, 4, 2) for long in (False, True)}


def test_unreadable_file_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CROSSFUSE_TUNED_CONFIGS", str(tmp_path / "missing.json"))
    _tuning._entries.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="CROSSFUSE_TUNED_CONFIGS"):
            _tuning.layer_norm_overrides(LaunchConfig)
    finally:
        _tuning._entries.cache_clear()


_LN = dict(kind="fwd", dtype="bfloat16", n=4096, block_m=1, num_warps=4, pps=0)
_ATTN = dict(kind="fwd", d=64, causal=True, block_m=128, block_n=64, num_warps=4, num_stages=2)


@pytest.mark.parametrize(
    "key, entry, words",
    [
        ("ln/fwd/bfloat16/4096", [1, 2], "must be an object"),
        ("ln/fwd/bfloat16/4096", {k: v for k, v in _LN.items() if k != "n"}, "has no 'n'"),
        ("ln/fwd/float64/4096", {**_LN, "dtype": "float64"}, "dtype must be one of"),
        ("ln/fwd/bfloat16/768", {**_LN, "n": 768}, "n must be a power of 2"),
        ("ln/fwd/bfloat16/4096", {**_LN, "num_warps": 3}, "num_warps must be"),
        ("ln/fwd/bfloat16/4096", {**_LN, "block_m": 0}, "block_m must be a power of 2"),
        ("ln/fwd/bfloat16/4096", {**_LN, "block_n": 0}, "block_n must be a power of 2"),
        ("attn/fwd/64/true", {**_ATTN, "causal": "true"}, "causal must be true or false"),
        ("attn/fwd/64/True", {**_ATTN, "d": 48}, "d must be one of"),
        # layer norm's kernels take 16 and 32 warps, the attention kernels do not
        ("attn/fwd/64/True", {**_ATTN, "num_warps": 16}, "num_warps must be one of (1, 2, 4, 8)"),
        ("attn/fwd/64/True", {**_ATTN, "num_warps": 32}, "num_warps must be one of (1, 2, 4, 8)"),
        # a causal forward whose key tile does not divide its query tile computes wrong rows, silently
        ("attn/fwd/64/True", {**_ATTN, "block_m": 64, "block_n": 128}, "block_n must divide block_m"),
        ("attn/dkdv/64/True", {**_ATTN, "kind": "dkdv", "block_m": 64, "block_n": 32}, "block_m must divide"),
    ],
    ids=["not an object", "no n", "dtype", "n not a power of 2", "warps", "block_m 0", "block_n 0",
         "causal as a string", "head dim", "attn warps 16", "attn warps 32", "fwd tiles", "dkdv tiles"],
)  # fmt: skip
def test_an_entry_the_launchers_cannot_use_is_a_clear_error(key, entry, words, tuned_file):
    tuned_file({key: entry})
    overrides = _tuning.attention_overrides if key.startswith("attn/") else _tuning.layer_norm_overrides
    with pytest.raises(RuntimeError) as info:
        overrides(AttnConfig if key.startswith("attn/") else LaunchConfig)
    assert "CROSSFUSE_TUNED_CONFIGS=" in str(info.value) and repr(key) in str(info.value)
    assert words in str(info.value)


def test_attention_entries_from_a_file_given_directly(tmp_path, monkeypatch):
    # a sweep's file read directly (read_tuned), without the environment variable; the variable's file,
    # if any, is not consulted, and a missing file is an error naming where its path came from
    monkeypatch.delenv("CROSSFUSE_TUNED_CONFIGS", raising=False)
    path = tmp_path / "sweep.json"
    entry = dict(kind="dkdv", d=128, causal=False, block_m=64, block_n=128, num_warps=8, num_stages=4,
                 tma=True, length="long")  # fmt: skip
    path.write_text(json.dumps({"attn/dkdv/bfloat16/128/False/long": entry}))
    got = _tuning.attention_overrides(AttnConfig, _tuning.read_tuned(str(path)))
    assert got == {("dkdv", 128, 2, False, True): AttnConfig(64, 128, 8, 4, True)}
    with pytest.raises(RuntimeError, match=r"--tuned .*missing\.json"):
        _tuning.read_tuned(str(tmp_path / "missing.json"), "--tuned ")


def test_code_tables_round_trip_through_a_tuned_file(tuned_file):
    # bench/tune.py --base code writes the code's tables as tuned.json entries (prefetch and keep_params
    # included); a session with that file (CROSSFUSE_TUNED_CONFIGS) must launch exactly the code's
    # configurations, which is how bench/results/<gpu>/tuned.json records the tables a session ran
    from crossfuse.harness import sweep
    from crossfuse.ops import layer_norm, relu_attention

    tuned_file(sweep.code_tables())
    ln_tables = sweep.merged(layer_norm.tables_for(None))
    assert _tuning.layer_norm_overrides(LaunchConfig) == ln_tables
    assert _tuning.attention_overrides(AttnConfig) == sweep.merged(relu_attention.tables_for(None))
    assert any(c.prefetch for c in ln_tables.values())
    assert any(c.keep_params for c in ln_tables.values())
    assert any(c.smem_rows for c in ln_tables.values())
    assert any(c.slices > 1 for c in ln_tables.values())
    # every model's entries, the H100's narrow rows and head dims among them
    assert ("bwd", 2, 512, True) in ln_tables and ("fwd", 2, 1024, True) in ln_tables


def test_every_layer_norm_flag_of_an_entry_reaches_the_config():
    # a tuned.json entry (or a bench/tune.py candidate) spells each LaunchConfig field; none may be dropped
    entry = dict(kind="bwd", n=16384, dtype="bfloat16", block_m=2, block_n=2048, num_warps=8, pps=2, unroll=2,
                 prefetch=True, keep_params=True, shifted=True, tma_stages=3, coop=True,
                 smem_rows=True, slices=2, lag=2)  # fmt: skip
    cfg = _tuning.layer_norm_config(LaunchConfig, entry)
    assert cfg == LaunchConfig(2, 2048, 8, 2, unroll=2, prefetch=True, keep_params=True, shifted=True,
                               tma_stages=3, coop=True, smem_rows=True, slices=2, lag=2)  # fmt: skip
    assert _tuning.layer_norm_config(LaunchConfig, dict(entry, shifted=False)).shifted is False


def test_tune_kind_bwd_takes_every_backward_candidate():
    # `--kind bwd` must select the attention's dK/dV and dQ candidates too (their kinds are dkdv and dq),
    # or a sweep of the descriptor group times nothing without saying so
    from crossfuse.harness import sweep

    cands = sweep.attn_tma_candidates()
    bwd = sweep.of_kind(cands, "bwd")
    assert bwd and {c["kind"] for c in bwd} == {"dkdv", "dq"}
    assert len(bwd) + len(sweep.of_kind(cands, "fwd")) == len(cands)
    assert {c["kind"] for c in sweep.of_kind(cands, "dq")} == {"dq"}
    assert sweep.of_kind(cands, "no-such-kind") == []


def test_sweep_groups_are_checked():
    from crossfuse.harness import sweep

    assert sweep.candidates({"ln"}, quick=True)
    with pytest.raises(ValueError, match="unknown groups"):
        sweep.candidates({"no-such-group"})
    with pytest.raises(ValueError, match="pairs_from"):
        sweep.candidates({"attn-pairs"})


def test_sweep_winners_split_a_pair_into_its_kernels():
    from crossfuse.harness import sweep

    pair = dict(kind="bwd", d=64, causal=False, dkdv=[64, 128, 8, 3], dq=[128, 64, 8, 2])
    single = dict(kind="dkdv", d=64, causal=False, block_m=32, block_n=128, num_warps=4, num_stages=2)
    rows = [dict(pair, shape="4x32x4096x64", status="ok", rate=500.0, ms=1.0),
            dict(single, shape="4x32x4096x64", status="ok", rate=400.0, ms=1.2)]  # fmt: skip
    best = sweep.winners(rows)
    dkdv, dq = best["attn/dkdv/bfloat16/64/False/long"], best["attn/dq/bfloat16/64/False/long"]
    assert dkdv[0] == dq[0] == 500.0
    assert (dkdv[1]["block_m"], dkdv[1]["block_n"], dkdv[1]["paired"]) == (64, 128, True)
    assert (dq[1]["block_m"], dq[1]["num_stages"], dq[1]["length"]) == (128, 2, "long")


def test_sweep_winner_of_a_regime_timed_at_two_shapes_is_the_best_geometric_mean():
    # a long row's "few rows" entry stands for 1000 and 4096 rows: a candidate a little faster at 4096 rows
    # but far slower at 1000 loses it; the many-rows shape gives its own entry; a candidate a budget cut
    # after one of the two shapes does not compete on one shape alone
    from crossfuse.harness import sweep

    base = dict(kind="bwd", n=65536, dtype="float32", long_rows=True, block_m=2, num_warps=8, pps=1)
    a, b, cut = dict(base, block_n=2048), dict(base, block_n=4096), dict(base, block_n=1024)
    rows = [dict(a, shape="1000x65536", status="ok", rate=1000.0, ms=1.0),
            dict(a, shape="4096x65536", status="ok", rate=2100.0, ms=1.0),
            dict(b, shape="1000x65536", status="ok", rate=1500.0, ms=1.0),
            dict(b, shape="4096x65536", status="ok", rate=2000.0, ms=1.0),
            dict(cut, shape="1000x65536", status="ok", rate=9000.0, ms=1.0),
            dict(cut, shape="4096x65536", status="budget", rate=None, ms=None),
            dict(a, shape="16384x65536", status="ok", rate=2500.0, ms=1.0),
            dict(b, shape="16384x65536", status="ok", rate=2400.0, ms=1.0)]  # fmt: skip
    best = sweep.winners(rows)
    few, many = best["ln/bwd/float32/65536/few"], best["ln/bwd/float32/65536/many"]
    assert few[1]["block_n"] == 4096 and few[0] == pytest.approx((1500.0 * 2000.0) ** 0.5)
    assert (many[0], many[1]["block_n"]) == (2500.0, 2048)
    assert "long_rows" not in few[1] and few[1]["rows"] == "few"


def test_long_row_candidates_are_launches_the_layer_norm_takes():
    # the rule's configurations among them (what runs where no table has an entry), every one a
    # LaunchConfig, a chunked forward's chunk shorter than the row, and the layer norm's paired groups kept
    # when an earlier run's entry competes again (paired is an attention pair's flag too)
    from crossfuse import _tuning
    from crossfuse.harness import sweep
    from crossfuse.ops import layer_norm as ln

    cands = sweep.candidates({"ln-long"})
    for n in sweep.LN_LONG_NS:
        for kind in ("fwd", "bwd"):
            rule = ln.rule_config(n, kind)
            spelled = [_tuning.layer_norm_config(ln.LaunchConfig, c) for c in cands
                       if c["n"] == n and c["kind"] == kind]  # fmt: skip
            assert rule in spelled
    for c in cands:
        cfg = _tuning.layer_norm_config(ln.LaunchConfig, c)
        assert c["long_rows"] and c["n"] > ln.FUSED_MAX_N
        assert cfg.smem_rows or cfg.block_n < c["n"], c
    grouped = next(c for c in cands if c.get("smem_rows"))
    entry = {k: v for k, v in grouped.items() if k != "long_rows"}
    again = sweep.base_candidates({"k": dict(entry, rows="few", score=1.0)}, cands)
    assert again == [grouped] and again[0]["paired"] is True


def _check_in_a_process(entries: dict, script: str, tmp_path) -> None:
    """Run ``script`` under the interpreter in a process of its own with ``entries`` as its tuned.json (the
    tables are read once, at import)."""
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(entries))
    env = dict(os.environ, CROSSFUSE_TUNED_CONFIGS=str(path), TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


_LONG_ROW_CHECK = """
import torch
from crossfuse.ops import layer_norm as ln
from crossfuse.ops._runtime.device import Card

h100 = Card("NVIDIA H100 80GB HBM3", (9, 0), 232448)
entry = ln.LaunchConfig(1, 8192, 16, 0, shifted=True)
for m in (1000, 100000):  # the file's few-rows entry serves both regimes where it is the only one
    assert ln.launch_config(40000, torch.float32, "fwd", m, h100) == entry
assert ln.launch_config(65536, torch.float32, "fwd", 1000, h100) == entry
for dtype, kind in ((torch.bfloat16, "fwd"), (torch.float32, "bwd")):  # the code table's, the file's aside
    table = ln.TUNED_H100[(kind, dtype.itemsize, 65536, False)]
    assert ln.launch_config(40000, dtype, kind, 1000, h100) == table
assert ln.launch_config(70000, torch.float32, "fwd", 1000, h100) == ln.rule_config(70000, "fwd")
x = torch.randn(3, 40000, dtype=torch.float64).float() * 2 + 3
w, b = torch.randn(40000), torch.randn(40000)
y, _, _ = ln.layer_norm_fwd(x, w, b, 1e-5, config=entry)
ref = torch.nn.functional.layer_norm(x.double(), (40000,), w.double(), b.double(), 1e-5)
assert (y.double() - ref).abs().max().item() < 1e-4
"""


def test_a_tuned_entry_of_long_rows_serves_every_row_up_to_its_power_of_two(tmp_path):
    # bench/tune.py --only ln-long keys rows past the whole-row kernels by their power of two, as the tables
    # key shorter rows: an entry for 65536 serves N = 40000 (chunks of 8192 in two passes here, run under
    # the interpreter against float64), and the code tables' entries or the rule stay where the file has
    # none (another dtype, a kind without one, rows past 65536). The tables are read once, at import: a
    # process of its own
    entry = dict(kind="fwd", dtype="float32", n=65536, block_m=1, block_n=8192, num_warps=16, pps=0,
                 rows="few", shifted=True)  # fmt: skip
    _check_in_a_process({"ln/fwd/float32/65536/few": entry}, _LONG_ROW_CHECK, tmp_path)


_PADDED_CHECK = """
import torch
from crossfuse.ops import layer_norm as ln
from crossfuse.ops._runtime.device import Card

h100 = Card("NVIDIA H100 80GB HBM3", (9, 0), 232448)
assert ln.launch_config(5000, torch.bfloat16, "bwd", 4096, h100) == ln.LaunchConfig(2, 8192, 16, 1)
assert ln.launch_config(5000, torch.bfloat16, "fwd", 4096, h100) == ln.PADDED_ROWS.config(5000, "fwd")
"""


def test_a_tuned_entry_comes_before_the_padded_rows_configuration(tmp_path):
    # a tuned.json measured on the user's card is read first for the rows PADDED_ROWS takes too; where it has
    # no entry (the forward here) they keep PADDED_ROWS'. The tables are read once, at import: a process of
    # its own
    entry = dict(kind="bwd", dtype="bfloat16", n=8192, block_m=2, num_warps=16, pps=1, rows="few")
    _check_in_a_process({"ln/bwd/bfloat16/8192/few": entry}, _PADDED_CHECK, tmp_path)
