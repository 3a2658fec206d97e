"""CROSSFUSE_TUNED_CONFIGS: tuned.json files of bench/tune.py override the built-in launch tables."""

import json

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
    # run 26: the warp-specialized loops ("ws": true) gave wrong results; such entries are skipped, the
    # others of the same file still apply
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
    # bench/ab_attn.py --tuned reads a sweep's file without the environment variable; the variable's file,
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
    # included); a session run with that file (CROSSFUSE_TUNED_CONFIGS) must launch exactly the code's
    # configurations, which is how the runs of bench/results/h200 checked their tables
    import importlib.util
    import pathlib

    from crossfuse.ops import layer_norm, relu_attention

    path = pathlib.Path(__file__).resolve().parents[1] / "bench" / "tune.py"
    spec = importlib.util.spec_from_file_location("crossfuse_bench_tune", path)
    tune = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tune)
    tuned_file(tune.code_tables())
    assert _tuning.layer_norm_overrides(LaunchConfig) == layer_norm.TUNED
    assert _tuning.attention_overrides(AttnConfig) == relu_attention.TUNED
    assert any(c.prefetch for c in layer_norm.TUNED.values())
    assert any(c.keep_params for c in layer_norm.TUNED.values())
    assert any(c.smem_rows for c in layer_norm.TUNED.values())
    assert any(c.slices > 1 for c in layer_norm.TUNED.values())


def test_every_layer_norm_flag_of_an_entry_reaches_the_config():
    # a tuned.json entry (or a bench/tune.py candidate) spells each LaunchConfig field; none may be dropped
    entry = dict(kind="bwd", n=16384, dtype="bfloat16", block_m=2, block_n=2048, num_warps=8, pps=2, unroll=2,
                 prefetch=True, keep_params=True, shifted=True, tma_stages=3, coop=True,
                 smem_rows=True, slices=2, lag=2)  # fmt: skip
    cfg = _tuning.layer_norm_config(LaunchConfig, entry)
    assert cfg == LaunchConfig(2, 2048, 8, 2, unroll=2, prefetch=True, keep_params=True, shifted=True,
                               tma_stages=3, coop=True, smem_rows=True, slices=2, lag=2)  # fmt: skip
    assert _tuning.layer_norm_config(LaunchConfig, dict(entry, shifted=False)).shifted is False


def test_tune_kind_bwd_takes_every_backward_candidate(tmp_path):
    # run 109: `--kind bwd` with the attention's descriptor group selected none of its dK/dV and dQ
    # candidates (their kinds are dkdv and dq), and the sweep timed nothing without saying so
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "bench" / "tune.py"
    spec = importlib.util.spec_from_file_location("crossfuse_bench_tune_kind", path)
    tune = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tune)
    cands = tune.attn_tma_candidates()
    bwd = tune.of_kind(cands, "bwd")
    assert bwd and {c["kind"] for c in bwd} == {"dkdv", "dq"}
    assert len(bwd) + len(tune.of_kind(cands, "fwd")) == len(cands)
    assert {c["kind"] for c in tune.of_kind(cands, "dq")} == {"dq"}
    with pytest.raises(SystemExit):  # nothing of that kind: an error, not an empty sweep
        tune.main(["--out", str(tmp_path), "--only", "attn-tma", "--kind", "no-such-kind"])
