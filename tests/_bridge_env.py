"""Shared by the bridge's tests: the checkout's paths, an environment with no Julia in it (``isolate``,
behind the fixture ``isolated`` of tests/conftest.py) and shell scripts standing in for a Julia
executable (``fake_julia``)."""

from __future__ import annotations

from pathlib import Path

from crossfuse_julia import _detect, session

ROOT = Path(__file__).resolve().parents[1]  # the checkout
BRIDGE = ROOT / "bridge" / "crossfuse_julia"
DETECTION_LIMIT_S = 5.0  # the promise: available() answers within 5 seconds


def isolate(monkeypatch, tmp_path) -> Path:
    """Make an environment with no Julia anywhere (for the fixture ``isolated``);
    returns the folder that is the whole PATH."""
    for var in ("CROSSFUSE_JULIA", "CROSSFUSE_JULIA_CUDA", "PYTHON_JULIAPKG_EXE", "PYTHON_JULIACALL_EXE",
                "PYTHON_JULIAPKG_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setenv("JULIAUP_DEPOT_PATH", str(tmp_path / "juliaup-depot"))
    pkg = tmp_path / "julia_env" / "pyjuliapkg"
    paths = {"project": str(pkg.parent), "meta": str(pkg / "meta.json"), "install": str(pkg / "install")}
    monkeypatch.setattr(_detect, "juliapkg_paths", lambda: paths)
    monkeypatch.setattr(_detect, "juliacall_installed", lambda: True)
    monkeypatch.setattr(_detect, "juliacall_started", lambda: False)
    monkeypatch.setattr(_detect, "_CACHE", None)
    monkeypatch.setattr(session, "_FAILED", None)
    return bindir


def fake_julia(folder: Path, body: str, name: str = "julia") -> Path:
    """A shell script standing in for Julia: ``body`` runs for any arguments."""
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path
