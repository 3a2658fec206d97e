"""crossfuse.harness.toolchain: the ptxas a measurement pins, and the rows that say which one built them."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from crossfuse.harness import schema, toolchain


@pytest.fixture(autouse=True)
def _clean_environment(tmp_path, monkeypatch):
    """Neither variable set, a home of the test's own: whatever a test pins is undone after it."""
    monkeypatch.delenv(toolchain.ENV, raising=False)
    monkeypatch.delenv(toolchain.CACHE_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _fake_ptxas(tmp_path, banner: str):
    """An executable that prints ``banner`` on ``--version``, as ptxas does."""
    path = tmp_path / "ptxas"
    path.write_text(f"#!/bin/sh\necho '{banner}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


BANNER = "ptxas: NVIDIA (R) Ptx optimizing assembler\\nCuda compilation tools, release 12.8, V12.8.93"


def test_pin_a_path_sets_the_variable_and_rows_name_its_version(tmp_path, monkeypatch):
    fake = _fake_ptxas(tmp_path, BANNER)
    assert toolchain.pin_ptxas(fake) == fake
    assert os.environ[toolchain.ENV] == fake
    # a kernel cache of that ptxas's own (no build of another ptxas loaded under the same key)
    cache = os.environ[toolchain.CACHE_ENV]
    assert cache.startswith(str(tmp_path / "home" / ".triton" / "cache-ptxas-12.8.93-"))
    assert toolchain.ptxas_in_use() == f"12.8.93({fake})"
    # rows read it at each call (torch.compile may change it mid-run); only where a GPU is present
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert schema.versions().endswith(f" ptxas=12.8.93({fake})")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "ptxas=" not in schema.versions()


def test_unpinned_leaves_the_variable_alone(tmp_path, monkeypatch):
    fake = _fake_ptxas(tmp_path, BANNER)
    monkeypatch.setenv(toolchain.ENV, fake)
    assert toolchain.pin_ptxas("unpinned") is None
    assert os.environ[toolchain.ENV] == fake
    monkeypatch.delenv(toolchain.ENV)
    assert toolchain.pin_ptxas("unpinned") is None
    assert toolchain.ENV not in os.environ


def test_a_bad_choice_is_an_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match="ptxas must be one of torch, triton, unpinned or an executable"):
        toolchain.pin_ptxas(str(tmp_path / "no-such-ptxas"))
    not_executable = tmp_path / "plain"
    not_executable.write_text("")
    with pytest.raises(ValueError, match=r"got '.*plain'"):
        toolchain.pin_ptxas(str(not_executable))
    assert toolchain.ENV not in os.environ and toolchain.CACHE_ENV not in os.environ  # nothing pinned


def test_bundled_choices(monkeypatch):
    found = toolchain.bundled_ptxas()
    for whose in ("torch", "triton"):
        monkeypatch.delenv(toolchain.CACHE_ENV, raising=False)
        if whose in found:
            assert toolchain.pin_ptxas(whose) == found[whose]
            assert os.environ[toolchain.CACHE_ENV].endswith(f"-{whose}")
            assert os.access(found[whose], os.X_OK)
            assert toolchain.ptxas_in_use().endswith(f"({whose})")
        else:
            with pytest.raises(ValueError, match=f"this {whose} install ships no ptxas"):
                toolchain.pin_ptxas(whose)
    assert toolchain.default_choice() == ("torch" if "torch" in found else "triton")


def test_version_of_something_that_is_not_ptxas(tmp_path):
    assert toolchain.ptxas_version(_fake_ptxas(tmp_path, "hello")) == "unknown"
    assert toolchain.ptxas_version(str(tmp_path / "missing")) == "unknown"


def test_pinned_restores_the_variables_after_the_block_and_after_an_error(tmp_path, monkeypatch):
    fake = _fake_ptxas(tmp_path, BANNER)
    monkeypatch.setenv(toolchain.ENV, "/before")
    monkeypatch.setenv(toolchain.CACHE_ENV, "/my/cache")
    with toolchain.pinned(fake) as path:
        assert path == fake and os.environ[toolchain.ENV] == fake
        assert os.environ[toolchain.CACHE_ENV] == "/my/cache"  # a cache the user chose is kept
    assert os.environ[toolchain.ENV] == "/before"
    with pytest.raises(ValueError), toolchain.pinned(str(tmp_path / "missing")):
        pass
    assert os.environ[toolchain.ENV] == "/before"
    monkeypatch.delenv(toolchain.ENV)
    monkeypatch.delenv(toolchain.CACHE_ENV)
    with toolchain.pinned(fake):
        assert "cache-ptxas-12.8.93-" in os.environ[toolchain.CACHE_ENV]
    assert toolchain.ENV not in os.environ and toolchain.CACHE_ENV not in os.environ


def test_crossfuse_bench_on_cuda_pins_for_the_run_only(tmp_path, monkeypatch, capsys):
    # the cuda path without a GPU: the device check and the run itself replaced, the rest of the command real
    from crossfuse import cli
    from crossfuse.harness import runner

    seen = []
    monkeypatch.setattr(cli, "_device", lambda arg: "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runner, "device_name", lambda device: "a GPU")
    monkeypatch.setattr(cli, "_run_bench", lambda *a: seen.append(os.environ.get(toolchain.ENV)) or 0)
    fake = _fake_ptxas(tmp_path, BANNER)
    out = str(tmp_path / "out")
    assert cli.main(["bench", "layer_norm", "--quick", "--out", out, "--ptxas", fake]) == 0
    assert seen == [fake] and toolchain.ENV not in os.environ and toolchain.CACHE_ENV not in os.environ
    assert cli.main(["bench", "layer_norm", "--quick", "--out", out, "--replace", "--ptxas", "bogus"]) == 2
    assert "--ptxas: ptxas must be one of torch, triton, unpinned or an executable" in capsys.readouterr().err
    assert seen == [fake] and toolchain.ENV not in os.environ  # nothing ran, nothing pinned
    assert cli.main(["bench", "layer_norm", "--quick", "--out", out, "--replace", "--ptxas", "unpinned"]) == 0
    assert seen == [fake, None]


def test_pin_for_makes_a_bad_choice_the_parsers_usage_error(tmp_path, capsys):
    import argparse

    ap = argparse.ArgumentParser(prog="probe")
    toolchain.add_argument(ap, "on cuda, ")
    assert "on cuda, the ptxas" in ap.format_help().replace("\n", " ").replace("  ", " ")
    fake = _fake_ptxas(tmp_path, BANNER)
    assert toolchain.pin_for(ap, ap.parse_args(["--ptxas", fake]).ptxas) == fake
    with pytest.raises(SystemExit) as exc:
        toolchain.pin_for(ap, ap.parse_args(["--ptxas", "bogus"]).ptxas)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "ptxas must be one of torch, triton, unpinned or an executable, got 'bogus'" in err
