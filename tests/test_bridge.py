"""The bridge's own logic, tested without Julia: detection, the off switch, error messages, registration,
the array layout mapping, input checks, and the declared Julia dependencies.

Detection tests run in a controlled environment (fixture ``isolated``): ``PATH`` is a fresh folder that
holds nothing unless the test puts a fake ``julia`` script there, juliapkg's and juliaup's folders point
into ``tmp_path``, and the process-wide caches are restored afterwards. No test here starts Julia or
imports juliacall.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import crossfuse_julia
import pytest
from _bridge_env import DETECTION_LIMIT_S, ROOT, fake_julia
from crossfuse import registry
from crossfuse_julia import _detect, session

# the environment with no Julia: the fixture ``isolated`` (tests/conftest.py, tests/_bridge_env.py)


def timed_detect():
    t0 = time.monotonic()
    d = _detect.detect(refresh=True)
    return d, time.monotonic() - t0


# ----------------------------------------------------------------------------------------------------
# detection
# ----------------------------------------------------------------------------------------------------


def test_no_julia_anywhere_is_answered_fast_with_the_reason(isolated):
    d, seconds = timed_detect()
    assert not d.available
    assert "no Julia executable found" in d.reason
    assert "PYTHON_JULIAPKG_EXE" in d.reason
    assert seconds < DETECTION_LIMIT_S
    assert crossfuse_julia.available() is False
    assert crossfuse_julia.unavailable_reason() == d.reason


def test_fake_julia_that_fails_is_rejected(isolated):
    path = fake_julia(isolated, 'echo "julia: broken install" >&2\nexit 3')
    d, _ = timed_detect()
    assert not d.available
    assert str(path) in d.reason
    assert "exited with status 3" in d.reason
    assert "broken install" in d.reason


def test_fake_julia_with_a_bogus_version_is_rejected(isolated):
    fake_julia(isolated, 'echo "definitely not julia 9.9"')
    d, _ = timed_detect()
    assert not d.available
    assert "not a Julia version" in d.reason


def test_the_minimum_julia_version_is_compared_to_the_patch_level(isolated):
    # juliacall needs 1.10.3: 1.10.0 to 1.10.2 must be rejected although 1.10 is the minimum's minor
    major, minor, patch = _detect.MIN_JULIA
    assert patch > 0
    below, lowest = f"{major}.{minor}.{patch - 1}", f"{major}.{minor}.{patch}"
    fake_julia(isolated, f'echo "julia version {below}"')
    d, _ = timed_detect()
    assert not d.available
    assert f"is Julia {below}; juliacall needs >= {lowest}" in d.reason
    fake_julia(isolated, f'echo "julia version {lowest}"')
    d, _ = timed_detect()
    assert d.available, d.reason
    assert d.version == _detect.MIN_JULIA


def test_julia_older_than_juliacall_needs_is_rejected(isolated):
    fake_julia(isolated, 'echo "julia version 1.6.7"')
    d, _ = timed_detect()
    assert not d.available
    assert "Julia 1.6.7" in d.reason
    assert ">= 1.10.3" in d.reason


def test_fake_julia_that_hangs_does_not_hang_detection(isolated):
    sleep = shutil.which("sleep", path="/usr/bin:/bin")
    if sleep is None:
        pytest.skip("no `sleep` executable to build a hanging fake julia with")
    fake_julia(isolated, f"exec {sleep} 60")
    d, seconds = timed_detect()
    assert not d.available
    assert "did not answer within" in d.reason
    assert seconds < _detect.PROBE_TIMEOUT_S + 2.0
    assert seconds < DETECTION_LIMIT_S


def test_a_working_julia_on_path_is_found(isolated):
    path = fake_julia(isolated, 'echo "julia version 1.11.3"')
    d, _ = timed_detect()
    assert d.available, d.reason
    assert d.executable == str(path)
    assert d.version == (1, 11, 3)
    assert d.source == "PATH"
    assert crossfuse_julia.available()


def test_pythonjuliapkg_exe_is_used_and_nothing_else(isolated, monkeypatch, tmp_path):
    fake_julia(isolated, "exit 1")  # a broken julia on PATH must not matter
    good = fake_julia(tmp_path, 'echo "julia version 1.10.5"', name="my-julia")
    monkeypatch.setenv("PYTHON_JULIAPKG_EXE", str(good))
    d, _ = timed_detect()
    assert d.available, d.reason
    assert (d.executable, d.source) == (str(good), "PYTHON_JULIAPKG_EXE")

    monkeypatch.setenv("PYTHON_JULIAPKG_EXE", str(tmp_path / "missing-julia"))
    fake_julia(isolated, 'echo "julia version 1.11.0"')  # a good one on PATH: juliapkg would not use it
    d, _ = timed_detect()
    assert not d.available
    assert "PYTHON_JULIAPKG_EXE" in d.reason
    assert "missing-julia" in d.reason


def test_juliaup_installed_versions_are_probed(isolated, monkeypatch, tmp_path):
    depot = Path(os.environ["JULIAUP_DEPOT_PATH"])
    exe = fake_julia(tmp_path, 'echo "julia version 1.12.1"', name="julia-from-juliaup")
    (depot / "juliaup").mkdir(parents=True)
    meta = {"InstalledVersions": {"1.12.1+0.x64.linux.gnu": {"Path": "x", "BinaryPath": str(exe)}}}
    (depot / "juliaup" / "juliaup.json").write_text(json.dumps(meta))
    d, _ = timed_detect()
    assert d.available, d.reason
    assert (d.executable, d.source, d.version) == (str(exe), "juliaup", (1, 12, 1))


@pytest.mark.parametrize("value", ["0", "false", "off", "no", "OFF", "False", " No "])
def test_crossfuse_julia_0_turns_the_julia_side_off(isolated, monkeypatch, value):
    fake_julia(isolated, 'echo "julia version 1.11.3"')  # even with a working Julia
    monkeypatch.setenv("CROSSFUSE_JULIA", value)
    d, _ = timed_detect()
    assert not d.available
    assert f"CROSSFUSE_JULIA={value} turns the Julia side off" == d.reason


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "Yes", "ON"])
def test_a_cuda_flag_is_read_in_any_case(isolated, monkeypatch, value):
    from crossfuse_julia import ops

    monkeypatch.setenv("CROSSFUSE_JULIA_CUDA", value)
    monkeypatch.setattr(_detect, "_CACHE", _detect.Detection(None, "/fake/julia", (1, 11, 0), "PATH"))
    monkeypatch.setattr(session, "_SESSION", None)
    assert session.cuda_requested() is True
    assert session.cuda_flag_problem() is None
    assert ops.unavailable_reason("cuda") is None  # the GPU path asked for; Julia not started to check


def test_a_bad_crossfuse_julia_value_is_named(isolated, monkeypatch):
    monkeypatch.setenv("CROSSFUSE_JULIA", "maybe")
    d, _ = timed_detect()
    assert not d.available
    assert "CROSSFUSE_JULIA='maybe'" in d.reason


def test_missing_juliacall_is_the_reason(isolated, monkeypatch):
    monkeypatch.setattr(_detect, "juliacall_installed", lambda: False)
    d, _ = timed_detect()
    assert d.reason == _detect.JULIACALL_MISSING
    assert "pip install 'crossfuse[julia]'" in d.reason


def test_offline_before_any_install_is_the_reason(isolated, monkeypatch):
    fake_julia(isolated, 'echo "julia version 1.11.3"')
    monkeypatch.setenv("PYTHON_JULIAPKG_OFFLINE", "yes")
    d, _ = timed_detect()
    assert not d.available
    assert "PYTHON_JULIAPKG_OFFLINE=yes" in d.reason
    assert "python -m crossfuse_julia install" in d.reason


def test_missing_julia_package_is_the_reason(tmp_path):
    json_path = tmp_path / "juliapkg.json"
    json_path.write_text(json.dumps({"packages": {"CrossFuse": {"uuid": "x", "path": "nowhere"}}}))
    reason = _detect.package_reason(json_path)
    assert "the Julia package CrossFuse is not at" in reason and str(json_path) in reason
    assert "pip install -e" in reason


@pytest.mark.parametrize(
    "content, words",
    [
        (None, "cannot read"),  # the file is missing: a wheel without it
        ("{not json", "does not declare the Julia package CrossFuse"),
        (json.dumps({"packages": {}}), "does not declare the Julia package CrossFuse"),
        (json.dumps({"packages": {"CrossFuse": {"uuid": "x"}}}), "does not declare the Julia package"),
    ],
    ids=["missing", "not-json", "no-crossfuse", "no-path"],
)
def test_a_missing_or_broken_juliapkg_json_is_a_reason_not_an_exception(tmp_path, content, words):
    json_path = tmp_path / "juliapkg.json"
    if content is not None:
        json_path.write_text(content)
    reason = _detect.package_reason(json_path)  # never FileNotFoundError, KeyError or JSONDecodeError
    assert words in reason and str(json_path) in reason


def test_the_shipped_juliapkg_json_finds_the_julia_package():
    assert _detect.package_reason() is None
    assert _detect.crossfuse_julia_dir() == (ROOT / "julia").resolve()


def test_detection_is_cached_until_refreshed(isolated):
    first = _detect.detect()
    assert _detect.detect() is first
    fake_julia(isolated, 'echo "julia version 1.11.3"')
    assert _detect.detect() is first  # cached: the new julia is not seen
    assert _detect.detect(refresh=True).available


def test_a_failed_start_is_reported_and_cached(isolated, monkeypatch):
    fake_julia(isolated, 'echo "julia version 1.11.3"')
    monkeypatch.setattr(session, "_FAILED", "juliacall could not start Julia (boom)")
    assert crossfuse_julia.unavailable_reason() == "juliacall could not start Julia (boom)"
    with pytest.raises(crossfuse_julia.JuliaUnavailable, match="boom"):
        crossfuse_julia.start()


def test_cheap_checks_never_start_julia(isolated, monkeypatch):
    from crossfuse_julia.ops import unavailable_reason

    fake_julia(isolated, 'echo "julia version 1.11.3"')
    monkeypatch.setattr(session, "_SESSION", None)
    assert unavailable_reason("cpu") is None
    assert "set CROSSFUSE_JULIA_CUDA=1" in unavailable_reason("cuda")
    assert registry.get("normalise", "normal_new", side="julia").unavailable_reason("cpu") is None
    assert session._SESSION is None and session.failure() is None  # nothing was started or tried


def test_package_resolution_is_killed_at_its_timeout(monkeypatch):
    t0 = time.monotonic()
    with pytest.raises(crossfuse_julia.JuliaUnavailable, match="did not finish within 1 s"):
        session.resolve_packages(1.0, cmd=[sys.executable, "-c", "import time; time.sleep(60)"])
    assert time.monotonic() - t0 < 4.0
    traceback = r"(?s)failed with status 1:\nTraceback.*KeyError"  # a Python error exits with status 1
    with pytest.raises(crossfuse_julia.JuliaUnavailable, match=traceback):
        session.resolve_packages(10.0, cmd=[sys.executable, "-c", "raise KeyError('juliapkg')"])
    with pytest.raises(crossfuse_julia.JuliaUnavailable, match=r"failed with status 3:\nno registry here"):
        failing = [sys.executable, "-c", "print('no registry here'); raise SystemExit(3)"]
        session.resolve_packages(10.0, cmd=failing)
    monkeypatch.setenv("CROSSFUSE_JULIA_SETUP_TIMEOUT", "soon")
    with pytest.raises(crossfuse_julia.JuliaUnavailable, match="not a number of seconds"):
        session.setup_timeout()


def test_available_in_a_fresh_process_is_fast():
    """The number the issue asks for: ``available()`` in a new process, on this machine, as it is."""
    code = ("import time; t = time.monotonic(); import crossfuse_julia as c; a = c.available(); "
            "print(a, time.monotonic() - t, c.unavailable_reason())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    answer, seconds, reason = proc.stdout.split(" ", 2)
    assert float(seconds) < DETECTION_LIMIT_S, proc.stdout
    assert (answer == "True") == (reason.strip() == "None")


def test_module_cli_reports_the_reason(tmp_path):
    env = dict(os.environ, CROSSFUSE_JULIA="0")
    proc = subprocess.run([sys.executable, "-m", "crossfuse_julia"], capture_output=True, text=True, env=env,
                          timeout=30)
    assert proc.returncode == 1
    assert "CROSSFUSE_JULIA=0 turns the Julia side off" in proc.stdout
    assert "PYTHON_JULIAPKG_EXE" in proc.stdout


# ----------------------------------------------------------------------------------------------------
# errors
# ----------------------------------------------------------------------------------------------------


def test_julia_unavailable_names_the_reason_and_the_fix():
    exc = crossfuse_julia.JuliaUnavailable("no Julia executable found (test)")
    text = str(exc)
    assert exc.reason == "no Julia executable found (test)"
    assert text.startswith("Julia is not available: no Julia executable found (test)")
    assert "pip install 'crossfuse[julia]'" in text
    assert "PYTHON_JULIAPKG_EXE" in text
    assert "python -m crossfuse_julia install" in text
    assert "CROSSFUSE_JULIA=0" in text
    assert isinstance(exc, RuntimeError)


def test_a_julia_exception_becomes_julia_error_with_the_julia_message(monkeypatch):
    class FakeJuliaError(Exception):  # juliacall.JuliaError's str() is Julia's showerror output
        pass

    fake = types.ModuleType("juliacall")
    fake.JuliaError = FakeJuliaError
    monkeypatch.setitem(sys.modules, "juliacall", fake)
    message = ("DimensionMismatch: layernorm: `scale` has 3 elements, but the normalised dimensions have "
               "size (4, 1) (4 elements)")

    def raises():
        raise FakeJuliaError(message)

    with pytest.raises(crossfuse_julia.JuliaError) as info:
        session.call("CrossFuse.layernorm (layer_norm, forward)", raises)
    assert message in str(info.value)
    assert "CrossFuse.layernorm (layer_norm, forward)" in str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert isinstance(info.value.__cause__, FakeJuliaError)
    assert info.value.julia_exception is info.value.__cause__

    def raises_python():
        raise KeyError("not from Julia")

    with pytest.raises(KeyError):  # Python's own exceptions pass through unchanged
        session.call("somewhere", raises_python)


def test_a_julia_method_error_arriving_as_a_type_error_is_wrapped():
    """PythonCall raises a Julia MethodError of the called function as a plain Python TypeError (its
    src/JlWrap/any.jl): the bridge wraps it with where it happened, and it stays a TypeError."""

    class JuliaFunction:  # what juliacall wraps a Julia function in: a type defined in juliacall
        def __call__(self, *args):
            raise TypeError("MethodError: no method matching host_forward(::String, ::Int64)")

    JuliaFunction.__module__ = "juliacall"
    with pytest.raises(crossfuse_julia.JuliaMethodError) as info:
        session.call("CrossFuse.normal_new (normalise, forward)", JuliaFunction(), "x", 1)
    assert isinstance(info.value, TypeError) and isinstance(info.value, crossfuse_julia.JuliaError)
    assert "CrossFuse.normal_new (normalise, forward)" in str(info.value)
    assert "no method matching host_forward" in str(info.value)
    assert isinstance(info.value.__cause__, TypeError)

    def python_function(*_):
        raise TypeError("a Python TypeError")

    with pytest.raises(TypeError) as plain:  # a Python function's own TypeError passes through unchanged
        session.call("somewhere", python_function)
    assert not isinstance(plain.value, crossfuse_julia.JuliaError)


# ----------------------------------------------------------------------------------------------------
# no Julia here (a skip) or Julia here and broken (a failure)
# ----------------------------------------------------------------------------------------------------


def broken_after_detection():
    d = _detect.detect(refresh=True)
    p = crossfuse_julia.problem()
    assert (p is None) == (d.reason is None)
    return d


@pytest.mark.parametrize(
    "body, env, broken, words",
    [
        (None, {}, False, "no Julia executable found"),
        (None, {"CROSSFUSE_JULIA": "0"}, False, "turns the Julia side off"),
        (None, {"CROSSFUSE_JULIA": "1"}, True, "no Julia executable found"),  # required: any reason fails
        (None, {"CROSSFUSE_JULIA": "maybe"}, True, "CROSSFUSE_JULIA='maybe'"),
        ('echo "julia: broken install" >&2\nexit 3', {}, True, "exited with status 3"),
        ('echo "julia version 1.6.7"', {}, True, "Julia 1.6.7"),
        ('echo "julia version 1.11.3"', {"PYTHON_JULIAPKG_OFFLINE": "yes"}, True, "PYTHON_JULIAPKG_OFFLINE"),
        ('echo "julia version 1.11.3"', {"CROSSFUSE_JULIA": "0"}, False, "turns the Julia side off"),
    ],
    ids=["absent", "off", "required-absent", "bad-switch", "fails", "too-old", "offline-uninstalled",
         "off-with-julia"],
)
def test_absent_julia_is_told_from_broken_julia(isolated, monkeypatch, body, env, broken, words):
    if body is not None:
        fake_julia(isolated, body)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    d = broken_after_detection()
    assert words in d.reason
    assert d.broken is broken
    p = crossfuse_julia.problem()
    assert p.broken is broken
    assert p.describe().startswith("the Julia side is broken" if broken else "no Julia here")


def test_a_named_julia_that_is_missing_is_broken(isolated, monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHON_JULIAPKG_EXE", str(tmp_path / "no-such-julia"))
    d = broken_after_detection()
    assert "no-such-julia" in d.reason and d.broken


def test_missing_juliacall_is_an_absence(isolated, monkeypatch):
    fake_julia(isolated, 'echo "julia version 1.11.3"')
    monkeypatch.setattr(_detect, "juliacall_installed", lambda: False)
    d = broken_after_detection()
    assert d.reason == _detect.JULIACALL_MISSING and not d.broken


def test_a_failed_start_is_broken(isolated, monkeypatch):
    """Julia was found, so any failure at start (resolving, loading CrossFuse) is a failure to report."""
    fake_julia(isolated, 'echo "julia version 1.11.3"')
    monkeypatch.setattr(session, "_SESSION", None)
    monkeypatch.setattr(session, "_JULIACALL", None)
    monkeypatch.setattr(session, "resolve_packages", lambda: None)
    monkeypatch.setitem(sys.modules, "juliacall", None)  # importing it fails, as a broken juliacall does
    with pytest.raises(crossfuse_julia.JuliaUnavailable) as info:
        crossfuse_julia.start()
    assert info.value.broken
    assert "juliacall could not start Julia" in info.value.reason
    p = crossfuse_julia.problem()
    assert p.broken and "juliacall could not start Julia" in p.reason
    from crossfuse_julia.ops import problem

    assert problem("cpu").broken
    with pytest.raises(crossfuse_julia.JuliaUnavailable) as again:  # cached: not tried again
        session.start_juliacall()
    assert again.value.broken and again.value.reason == info.value.reason


def test_an_absent_julia_raises_unavailable_that_is_not_broken(isolated, monkeypatch):
    monkeypatch.setattr(session, "_SESSION", None)
    with pytest.raises(crossfuse_julia.JuliaUnavailable) as info:
        crossfuse_julia.start()
    assert not info.value.broken and "no Julia executable found" in info.value.reason


def test_the_early_import_starts_neither_torch_nor_julia_without_julia(tmp_path):
    """``crossfuse_julia.early`` (imported first by tests/conftest.py) costs nothing without Julia."""
    code = "import sys, crossfuse_julia.early; print('torch' in sys.modules, 'juliacall' in sys.modules)"
    env = dict(os.environ, PATH=str(tmp_path), CROSSFUSE_JULIA="",
               PYTHON_JULIAPKG_EXE=str(tmp_path / "no-julia-here"))  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]


# ----------------------------------------------------------------------------------------------------
# CROSSFUSE_JULIA=0: said once per command
# ----------------------------------------------------------------------------------------------------


class _Registry(types.SimpleNamespace):
    """Enough of crossfuse.registry to count what register() adds."""


def test_the_off_switch_registers_nothing_and_says_so_once(monkeypatch, caplog):
    from crossfuse_julia.registry import VARIANTS, register

    added = []
    fake = _Registry(register=lambda impl, replace: added.append(impl),
                     Implementation=registry.Implementation)
    monkeypatch.setenv("CROSSFUSE_JULIA", "0")
    with caplog.at_level("WARNING", logger="crossfuse_julia"):
        assert register(fake) is False
    assert added == []
    assert [r.getMessage() for r in caplog.records] == [
        "crossfuse_julia: CROSSFUSE_JULIA=0 turns the Julia side off: its entries are not registered"
    ]
    assert register(fake, honour_off_switch=False) is True  # the tests' own registration
    assert len(added) == sum(len(v) for v in VARIANTS.values())


@pytest.mark.parametrize("command", [["info"], ["check", "--side", "julia"], ["check", "--op", "normalise",
                                                                            "--impl", "python/torch*"]])
def test_the_off_switch_message_appears_once_per_command(command):
    if not list(importlib.metadata.entry_points(group="crossfuse.implementations")):
        pytest.skip("crossfuse is not installed (pip install -e .): the CLI loads no plugin to switch off")
    env = dict(os.environ, CROSSFUSE_JULIA="0")
    proc = subprocess.run([sys.executable, "-m", "crossfuse.cli", *command], capture_output=True, text=True,
                          env=env, timeout=300)
    out = proc.stdout + proc.stderr
    assert out.count("CROSSFUSE_JULIA=0") == 1, out
    if command[:3] == ["check", "--side", "julia"]:  # asked to check the Julia side, checked nothing
        assert proc.returncode != 0


def test_the_julia_workflow_runs_only_make_targets():
    """CI (.github/workflows/julia.yml) runs nothing that ``make`` does not offer a user with Julia, on the
    LTS and the current Julia, with the actions it names at the versions checked upstream."""
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "julia.yml").read_text())
    job = workflow["jobs"]["julia"]
    assert job["runs-on"] == "ubuntu-latest"
    assert job["strategy"]["matrix"]["julia-version"] == ["1.10", "1"]
    makefile = (ROOT / "Makefile").read_text()
    uses, runs = [], []
    for step in job["steps"]:
        (uses if "uses" in step else runs).append(step.get("uses") or step["run"])
    assert uses == ["actions/checkout@v4", "julia-actions/setup-julia@v2", "julia-actions/cache@v2",
                    "actions/setup-python@v5"]  # fmt: skip
    assert runs
    for run in runs:
        make, target, *_ = run.split()
        assert make == "make" and re.search(rf"^{re.escape(target)}:", makefile, re.M), run
    assert re.search(r"^julia-test: julia-pkg-test julia-cross-test$", makefile, re.M)
