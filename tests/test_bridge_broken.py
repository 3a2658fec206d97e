"""The cross-language suite cannot pass by skipping: pointed at a Julia executable that exists and
fails, it fails, naming the cause.

Each test runs two tests of ``tests/test_cross_language.py`` in a child pytest, with
``PYTHON_JULIAPKG_EXE`` naming a shell script that stands in for ``julia``, and with stand-ins for
juliacall and juliapkg on the child's path (neither is installed here, and the real ones would try to
download a Julia). The stand-ins do what the real ones do with the executable, at the level the bridge
sees: ``juliapkg.resolve()`` runs it with a Pkg script and raises when it exits non-zero (pyjuliapkg
``src/juliapkg/deps.py``: ``run([exe, "--project=...", "--startup-file=no", "-e", script],
check=True)``); ``import juliacall`` runs it to start Julia and raises when it fails;
``Main.include(file)`` runs it on the file and raises its error. Three ways to be broken:

* ``--version`` exits non-zero: detection rejects the executable (a Julia is here, and unusable);
* ``--version`` answers, resolving the packages fails;
* everything answers but loading CrossFuse fails.

The juliacall stand-in also records whether torch was imported before it, which tests/conftest.py
prevents (juliacall warns otherwise).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _bridge_env import ROOT

SELECTED = [
    "tests/test_cross_language.py::test_julia_and_python_agree[normalise/normal_new-random-float32-cpu]",
    "tests/test_cross_language.py::test_julia_entry_passes_the_registry_check[normalise/normal_new]",
]
CHILD = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-rfEs", *SELECTED]

JULIAPKG = '''"""A stand-in for juliapkg: resolve() runs the Julia executable with a Pkg script."""
import os
import subprocess


def resolve(force=False, dry_run=False):
    exe = os.environ["PYTHON_JULIAPKG_EXE"]
    script = "import Pkg; Pkg.develop(path=raw\\"CrossFuse\\"); Pkg.resolve(); Pkg.precompile()"
    subprocess.run([exe, "--project=stand-in", "--startup-file=no", "-e", script], check=True, timeout=60)
    return True
'''

JULIACALL = '''"""A stand-in for juliacall: importing it runs the Julia executable, as starting Julia does."""
import os
import subprocess
import sys

with open(os.environ["CROSSFUSE_TEST_JULIACALL_LOG"], "a") as log:
    log.write(f"torch imported before juliacall: {'torch' in sys.modules}\\n")


class JuliaError(Exception):
    pass


def _run(code):
    exe = os.environ["PYTHON_JULIAPKG_EXE"]
    proc = subprocess.run([exe, "--startup-file=no", "-e", code], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise JuliaError((proc.stderr or proc.stdout).strip())


_run("print(Sys.BINDIR)")


class _Main:
    def include(self, path):
        _run(f"include(raw\\"{path}\\")")
        raise JuliaError("the stand-in cannot run Julia code")

    def seval(self, code):
        _run(code)
        raise JuliaError("the stand-in cannot run Julia code")


Main = _Main()
'''

VERSION_OK = 'case "$1" in --version) echo "julia version 1.11.3"; exit 0;; esac\n'
SCRIPTS = {
    "exits-non-zero": (
        'echo "ERROR: could not load library libjulia-internal.so" >&2\nexit 1',
        "exited with status 1",
    ),
    "resolve-fails": (
        VERSION_OK + 'echo "ERROR: Unsatisfiable requirements detected for package Zygote" >&2\nexit 1',
        "resolving the Julia packages (juliapkg.resolve) failed with status 1",
    ),
    "load-fails": (
        VERSION_OK
        + 'case "$*" in *include*) echo "ERROR: LoadError: ArgumentError: Package CrossFuse not found" >&2;'
        + " exit 1;; esac\nexit 0",
        "loading CrossFuse into Julia failed",
    ),
}


def stand_ins(folder: Path) -> Path:
    """The folder holding the juliapkg and juliacall stand-ins."""
    for name, text in (("juliapkg", JULIAPKG), ("juliacall", JULIACALL)):
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(text)
    return folder


def run_suite(tmp_path: Path, script: str) -> tuple[subprocess.CompletedProcess, str]:
    """The two tests in a child pytest with the stand-in ``julia`` (``script``), and the stand-in's log."""
    julia = tmp_path / "bin" / "julia"
    julia.parent.mkdir()
    julia.write_text("#!/bin/sh\n" + script + "\n")
    julia.chmod(0o755)
    stubs = stand_ins(tmp_path / "stubs")
    log = tmp_path / "juliacall.log"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CROSSFUSE_JULIA", "PYTHON_JULIA", "PYTEST_"))}  # fmt: skip
    path = os.pathsep.join([str(stubs), str(ROOT / "python"), str(ROOT / "bridge")])
    env.update(PYTHONPATH=path, PYTHON_JULIAPKG_EXE=str(julia), CROSSFUSE_TEST_JULIACALL_LOG=str(log),
               PYTHON_JULIAPKG_PROJECT=str(tmp_path / "julia_env"))  # fmt: skip
    proc = subprocess.run(CHILD, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return proc, log.read_text() if log.exists() else ""


@pytest.mark.skipif(os.name == "nt", reason="the stand-in julia is a POSIX shell script")
@pytest.mark.parametrize("case", list(SCRIPTS))
def test_a_broken_julia_fails_the_cross_language_suite(tmp_path, case):
    script, cause = SCRIPTS[case]
    proc, log = run_suite(tmp_path, script)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out  # tests failed: not 0 (passed or skipped) and not 2+ (a crash)
    assert "2 failed" in out, out
    assert "skipped" not in out, out
    assert out.count(cause) >= 2, out  # each failure names the cause
    assert "the Julia side is broken" in out, out
    if case == "load-fails":  # juliacall started (by tests/conftest.py), before torch
        assert log.splitlines()[0] == "torch imported before juliacall: False", log


@pytest.mark.skipif(os.name == "nt", reason="the stand-in julia is a POSIX shell script")
def test_no_julia_skips_the_suite_and_required_fails_it(tmp_path):
    """Without Julia the same two tests skip with the reason; with CROSSFUSE_JULIA=1 they fail."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CROSSFUSE_JULIA", "PYTHON_JULIA", "PYTEST_"))}  # fmt: skip
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT / "python"), str(ROOT / "bridge")]), PATH=str(tmp_path),
               JULIAUP_DEPOT_PATH=str(tmp_path),
               PYTHON_JULIAPKG_PROJECT=str(tmp_path / "julia_env"))  # fmt: skip
    cmd = CHILD
    absent_reasons = ("juliacall is not installed", "no Julia executable found")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "2 skipped" in out, out
    assert any(r in out for r in absent_reasons), out
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(env, CROSSFUSE_JULIA="1"), capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "2 failed" in out, out
    assert any(r in out for r in absent_reasons), out
