"""crossfuse.harness.toolchain: the ptxas a measurement pins, and the rows that say which one built them."""

from __future__ import annotations

import argparse
import os
import stat

import pytest
import torch
from crossfuse.harness import schema, toolchain

VARIABLES = (toolchain.ENV, toolchain.BLACKWELL_ENV, toolchain.CACHE_ENV, "TRITON_HOME")
BANNER = "ptxas: NVIDIA (R) Ptx optimizing assembler\\nCuda compilation tools, release 12.8, V12.8.93"


@pytest.fixture(autouse=True)
def _clean_environment(tmp_path, monkeypatch):
    """None of the variables set, a home of the test's own, and each restored after the test whatever it
    pinned (set first, so that monkeypatch records them and removes what a pin adds)."""
    for name in VARIABLES:
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _fake_ptxas(folder, banner: str = BANNER):
    """An executable ``folder/ptxas`` that prints ``banner`` on ``--version``, as ptxas does."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ptxas"
    path.write_text(f"#!/bin/sh\necho '{banner}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def installs(tmp_path, monkeypatch):
    """Fake torch and Triton installs, each shipping a ptxas, where the module looks for them."""
    roots = {"torch": tmp_path / "site" / "torch", "triton": tmp_path / "site" / "triton"}
    paths = {
        "torch": _fake_ptxas(roots["torch"] / "bin", BANNER.replace("12.8.93", "13.0.88")),
        "triton": _fake_ptxas(roots["triton"] / "backends" / "nvidia" / "bin"),
    }
    monkeypatch.setattr(toolchain, "_package_dir", lambda name: roots.get(name))
    monkeypatch.setattr(toolchain, "_triton_choice", lambda arch: None)  # no Triton to ask
    return paths


def test_bundled_choices_pin_the_variable_torch_compile_would_set(installs):
    assert toolchain.bundled_ptxas() == installs
    assert toolchain.default_choice() == "torch"
    assert toolchain.pin_ptxas() == installs["torch"]  # the default
    assert os.environ[toolchain.ENV] == installs["torch"]
    assert toolchain.BLACKWELL_ENV not in os.environ  # torch.compile does not set that one either
    assert os.environ[toolchain.CACHE_ENV].endswith(os.path.join(".triton", "cache-ptxas-13.0.88-torch"))
    assert toolchain.ptxas_in_use(90) == "13.0.88(torch)"
    del os.environ[toolchain.CACHE_ENV]
    os.environ["TRITON_HOME"] = "/somewhere"  # Triton's own cache lives under it: so does ours
    assert toolchain.pin_ptxas("triton") == installs["triton"]
    assert os.environ[toolchain.CACHE_ENV] == "/somewhere/.triton/cache-ptxas-12.8.93-triton"
    assert toolchain.ptxas_in_use(90) == "12.8.93(triton)"


def test_torch_without_ptxas_falls_back_to_triton_then_to_unpinned(installs):
    os.remove(installs["torch"])
    assert toolchain.default_choice() == "triton"
    message = r"^this torch install ships no ptxas \(bundled ones found: triton\)$"
    with pytest.raises(ValueError, match=message):
        toolchain.pin_ptxas("torch")
    os.remove(installs["triton"])
    assert toolchain.default_choice() == "unpinned"
    assert toolchain.pin_ptxas() is None  # a machine with no bundled ptxas measures as it is
    assert not any(name in os.environ for name in VARIABLES[:3])


def test_a_path_is_pinned_for_every_gpu_with_a_cache_of_its_own(tmp_path, installs):
    fake = _fake_ptxas(tmp_path / "mine")
    assert toolchain.pin_ptxas(fake) == fake
    assert os.environ[toolchain.ENV] == os.environ[toolchain.BLACKWELL_ENV] == fake
    cache = os.environ[toolchain.CACHE_ENV]
    assert cache.startswith(str(tmp_path / "home" / ".triton" / "cache-ptxas-12.8.93-path-"))
    assert toolchain.ptxas_in_use(90) == f"12.8.93({fake})"
    # the same binary by its path is the same choice as by name: one cache folder, not two
    del os.environ[toolchain.CACHE_ENV]
    toolchain.pin_ptxas(installs["torch"])
    assert os.environ[toolchain.CACHE_ENV].endswith("cache-ptxas-13.0.88-torch")


def test_a_cache_the_user_chose_is_kept(tmp_path, installs):
    os.environ[toolchain.CACHE_ENV] = "/my/cache"
    toolchain.pin_ptxas("triton")
    assert os.environ[toolchain.CACHE_ENV] == "/my/cache"


def test_what_triton_says_comes_first(tmp_path, installs, monkeypatch):
    # Triton 3.9 builds sm_90 with its ptxas-blackwell whatever TRITON_PTXAS_PATH says: the rows say so
    other = _fake_ptxas(tmp_path / "blackwell", BANNER.replace("12.8.93", "13.4.1"))
    monkeypatch.setattr(toolchain, "_triton_choice", lambda arch: other if arch >= 90 else None)
    toolchain.pin_ptxas("torch")
    assert toolchain.ptxas_in_use(90) == f"13.4.1({other})"
    assert toolchain.ptxas_in_use(80) == "13.0.88(torch)"


def test_rows_name_the_ptxas_where_a_gpu_is_present(tmp_path, installs, monkeypatch):
    fake = _fake_ptxas(tmp_path / "mine")
    toolchain.pin_ptxas(fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert schema.versions().endswith(f" ptxas=12.8.93({fake})")
    # read at each call: torch.compile may change it mid-run
    os.environ[toolchain.ENV] = installs["torch"]
    assert schema.versions().endswith(" ptxas=13.0.88(torch)")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "ptxas=" not in schema.versions()


def test_unpinned_leaves_the_variables_alone(tmp_path, installs):
    fake = _fake_ptxas(tmp_path / "mine")
    os.environ[toolchain.ENV] = fake
    assert toolchain.pin_ptxas("unpinned") is None
    assert os.environ[toolchain.ENV] == fake
    assert toolchain.CACHE_ENV not in os.environ


def test_a_bad_choice_is_an_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match="ptxas must be one of torch, triton, unpinned or an executable"):
        toolchain.pin_ptxas(str(tmp_path / "no-such-ptxas"))
    not_executable = tmp_path / "plain"
    not_executable.write_text("")
    with pytest.raises(ValueError, match=r"got '.*plain'"):
        toolchain.pin_ptxas(str(not_executable))
    assert not any(name in os.environ for name in VARIABLES[:3])  # nothing pinned on an error


def test_version_of_something_that_is_not_ptxas(tmp_path):
    assert toolchain.ptxas_version(_fake_ptxas(tmp_path / "x", "hello")) == "unknown"
    assert toolchain.ptxas_version(str(tmp_path / "missing")) == "unknown"


def test_pinned_restores_the_variables_after_the_block_and_after_an_error(tmp_path, installs):
    fake = _fake_ptxas(tmp_path / "mine")
    os.environ[toolchain.ENV] = "/before"
    with toolchain.pinned(fake) as path:
        assert path == fake and os.environ[toolchain.ENV] == os.environ[toolchain.BLACKWELL_ENV] == fake
        assert "cache-ptxas-12.8.93-" in os.environ[toolchain.CACHE_ENV]
    assert os.environ[toolchain.ENV] == "/before"
    assert toolchain.BLACKWELL_ENV not in os.environ and toolchain.CACHE_ENV not in os.environ
    with pytest.raises(ValueError), toolchain.pinned(str(tmp_path / "missing")):
        pass
    assert os.environ[toolchain.ENV] == "/before"


def test_pin_for_makes_a_bad_choice_the_parsers_usage_error(tmp_path, capsys):
    ap = argparse.ArgumentParser(prog="probe")
    toolchain.add_argument(ap, "on cuda, ")
    assert "on cuda, the ptxas" in " ".join(ap.format_help().split())
    fake = _fake_ptxas(tmp_path / "mine")
    assert toolchain.pin_for(ap, ap.parse_args(["--ptxas", fake]).ptxas) == fake
    with pytest.raises(SystemExit) as exc:
        toolchain.pin_for(ap, ap.parse_args(["--ptxas", "bogus"]).ptxas)
    assert exc.value.code == 2
    assert "--ptxas: ptxas must be one of torch, triton, unpinned or an executable" in capsys.readouterr().err


def test_crossfuse_bench_on_cuda_pins_for_the_run_only(tmp_path, monkeypatch, capsys, installs):
    # the cuda path without a GPU: the device check and the run itself replaced, the rest of the command real
    from crossfuse import cli
    from crossfuse.harness import runner

    seen = []
    monkeypatch.setattr(cli, "_device", lambda arg: "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runner, "device_name", lambda device: "a GPU")

    def record(*args):
        seen.append((os.environ.get(toolchain.ENV), os.environ.get(toolchain.CACHE_ENV)))
        return 0

    monkeypatch.setattr(cli, "_run_bench", record)
    out = str(tmp_path / "out")
    assert cli.main(["bench", "layer_norm", "--quick", "--out", out]) == 0  # the default: torch's
    assert seen[-1][0] == installs["torch"] and seen[-1][1].endswith("cache-ptxas-13.0.88-torch")
    assert not any(name in os.environ for name in VARIABLES[:3])  # as it was after the run
    assert cli.main(["bench", "layer_norm", "--quick", "--out", out, "--replace", "--ptxas", "bogus"]) == 2
    assert "--ptxas: ptxas must be one of torch, triton, unpinned or an executable" in capsys.readouterr().err
    assert len(seen) == 1 and not any(name in os.environ for name in VARIABLES[:3])  # nothing ran or pinned
    assert cli.main(["bench", "layer_norm", "--quick", "--out", out, "--replace", "--ptxas", "unpinned"]) == 0
    assert seen[-1] == (None, None)
