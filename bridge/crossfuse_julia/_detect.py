"""Is Julia usable here? Answered from cheap checks, within a few seconds, once per process.

Never starts Julia, never imports juliacall (importing it resolves packages and may download Julia,
which blocks without a timeout when there is no network). Checks, in order, stopping at the first
that fails:

1. ``CROSSFUSE_JULIA`` is not ``0``/``false``/``no``/``off``;
2. juliacall is installed (``importlib.util.find_spec``, no import);
3. ``juliapkg.json`` is next to this file and names the Julia package ``CrossFuse``, and that package
   is where it says (``julia``, next to it);
4. a Julia executable, searched the way juliapkg searches (``PYTHON_JULIACALL_EXE``,
   ``PYTHON_JULIAPKG_EXE``, juliapkg's own install folder, juliaup's installed versions, ``julia`` on
   ``PATH``), answers ``julia --version`` within :data:`PROBE_TIMEOUT_S` seconds with a version of at
   least :data:`MIN_JULIA`. Each probe runs in its own process group, killed on timeout;
5. ``PYTHON_JULIAPKG_OFFLINE=yes`` is not set before the packages were ever installed.

Two kinds of "cannot be used", told apart by :attr:`Detection.broken`: **absent** (the side is off,
juliacall or the Julia package is not installed, no Julia executable anywhere): a skip, with the
reason; **broken** (a Julia executable is there, or was named, and cannot be used: it fails, hangs, is
too old, cannot install its packages offline): a failure. With ``CROSSFUSE_JULIA=1`` the Julia side
is required, and every reason is a failure (``make julia-test`` and CI set it).

Julia found is not yet Julia started: the session (``session.py``) may still fail (packages that do
not resolve, a crash at start, CrossFuse failing to load); that failure is cached there, is always
"broken", and is reported by :func:`crossfuse_julia.unavailable_reason` too.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

OFF = ("0", "false", "no", "off")
ON = ("1", "true", "yes", "on")

MIN_JULIA = (1, 10, 3)  # juliacall's own juliapkg.json asks for julia ^1.10.3
PROBE_TIMEOUT_S = 2.0  # one `julia --version`
BUDGET_S = 4.0  # all probes together: detection answers within 5 s

HERE = Path(__file__).resolve().parent
JULIAPKG_JSON = HERE / "juliapkg.json"

_VERSION_RE = re.compile(r"julia version (\d+)\.(\d+)\.(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Detection:
    """What detection found. ``reason`` is ``None`` exactly when Julia looks usable; ``broken`` says
    that a reason is a failure (Julia is here, or required, and cannot be used), not an absence."""

    reason: str | None
    executable: str | None = None
    version: tuple[int, int, int] | None = None
    source: str | None = None  # where the executable came from, e.g. "PATH", "PYTHON_JULIAPKG_EXE"
    seconds: float = 0.0
    tried: tuple[str, ...] = field(default=())  # one line per candidate probed
    broken: bool = False

    @property
    def available(self) -> bool:
        return self.reason is None


_CACHE: Detection | None = None


def env_flag(name: str) -> bool | None:
    """``True``/``False`` for an on/off environment variable, ``None`` when unset or empty."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return None
    if value in OFF:
        return False
    if value in ON:
        return True
    raise ValueError(f"{name}={os.environ[name]!r}: expected one of {', '.join(ON + OFF)}")


def detect(refresh: bool = False) -> Detection:
    """The cached :class:`Detection`; ``refresh=True`` checks again (e.g. after changing the environment)."""
    global _CACHE
    if _CACHE is None or refresh:
        t0 = time.monotonic()
        d = _detect()
        broken = d.broken or (d.reason is not None and required())
        _CACHE = dataclasses.replace(d, seconds=time.monotonic() - t0, broken=broken)
    return _CACHE


def off_reason() -> str:
    """The reason when ``CROSSFUSE_JULIA`` turns the side off, naming the value as it was set."""
    return f"CROSSFUSE_JULIA={os.environ.get('CROSSFUSE_JULIA', '0')} turns the Julia side off"


def required() -> bool:
    """Whether ``CROSSFUSE_JULIA`` is on (``1``/``true``/``yes``/``on``): every reason the Julia side
    cannot be used is then a failure, not a skip. A value that is no flag counts as required: it is
    reported as a failure, naming the value."""
    try:
        return env_flag("CROSSFUSE_JULIA") is True
    except ValueError:
        return True


def _detect() -> Detection:
    try:
        switch = env_flag("CROSSFUSE_JULIA")
    except ValueError as exc:
        return Detection(str(exc), broken=True)
    if switch is False:
        return Detection(off_reason())
    if juliacall_started():
        return Detection(None, source="juliacall already started in this process")
    if not juliacall_installed():
        return Detection(JULIACALL_MISSING)
    reason = package_reason()
    if reason:
        return Detection(reason)
    found = find_julia()
    if found.reason:
        return found
    reason = offline_reason()
    if reason:  # Julia is here, but its packages cannot be installed: broken
        return dataclasses.replace(found, reason=reason, broken=True)
    return found


JULIACALL_MISSING = "juliacall is not installed (pip install 'crossfuse[julia]', or pip install juliacall)"


def juliacall_installed() -> bool:
    """Whether juliacall can be imported (looked up, not imported: importing it starts Julia)."""
    return importlib.util.find_spec("juliacall") is not None


def juliacall_started() -> bool:
    """Whether juliacall has already started Julia in this process."""
    jc = sys.modules.get("juliacall")
    config = getattr(jc, "CONFIG", None)
    return isinstance(config, dict) and bool(config.get("inited"))


def crossfuse_julia_dir(json_path: Path = JULIAPKG_JSON) -> Path:
    """Where ``juliapkg.json`` (``json_path``) says the Julia package ``CrossFuse`` is (resolved like
    juliapkg does: relative to the folder holding the json). Raises ``ValueError`` naming the file when
    it is missing, unreadable or does not declare CrossFuse with a path."""
    try:
        spec = json.loads(Path(json_path).read_text())["packages"]["CrossFuse"]
        return (Path(json_path).parent / spec["path"]).resolve()
    except OSError as exc:
        raise ValueError(f"cannot read {json_path} ({exc.strerror or exc}): this install of crossfuse_julia "
                         "lacks the file that declares its Julia packages; reinstall crossfuse "
                         "(pip install -e . from a checkout)") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{json_path} does not declare the Julia package CrossFuse with a path "
                         f"({type(exc).__name__}: {exc})") from None


def package_reason(json_path: Path = JULIAPKG_JSON) -> str | None:
    """Why the Julia package CrossFuse cannot be found from ``json_path``, or ``None``."""
    try:
        path = crossfuse_julia_dir(json_path)
    except ValueError as exc:
        return str(exc)
    if not (path / "Project.toml").is_file():
        return (f"the Julia package CrossFuse is not at {path} (where {json_path} points); reinstall "
                "crossfuse (pip install -e . from a checkout, or a wheel that ships it)")
    return None


def juliapkg_paths() -> dict:
    """juliapkg's project folder, its meta file and its Julia install folder, as juliapkg computes them
    (``juliapkg.state`` when importable: it reads the environment, resolves nothing)."""
    try:
        from juliapkg.state import STATE

        return {"project": STATE["project"], "meta": STATE["meta"], "install": STATE["install"]}
    except Exception:  # an older or newer juliapkg: compute the same paths
        pass
    project = os.environ.get("PYTHON_JULIAPKG_PROJECT")
    if not project:
        prefix = sys.prefix if sys.prefix != sys.base_prefix else os.environ.get("CONDA_PREFIX")
        if prefix:
            project = os.path.join(prefix, "julia_env")
        else:
            depot = os.environ.get("JULIA_DEPOT_PATH", "").split(os.pathsep)[0]
            project = os.path.join(depot or os.path.expanduser("~/.julia"), "environments", "pyjuliapkg")
    pre = os.path.join(project, "pyjuliapkg")
    meta, install = os.path.join(pre, "meta.json"), os.path.join(pre, "install")
    return {"project": project, "meta": meta, "install": install}


def offline_reason() -> str | None:
    offline = os.environ.get("PYTHON_JULIAPKG_OFFLINE", "").strip().lower() in ("yes", "true", "1")
    meta = juliapkg_paths()["meta"]
    if offline and not os.path.isfile(meta):
        return ("PYTHON_JULIAPKG_OFFLINE=yes but the Julia packages were never installed in this environment "
                f"(no {meta}); install them once with network: python -m crossfuse_julia install")
    return None


def candidates() -> tuple[list[tuple[str, str]], bool]:
    """Julia executables to probe, as (source, path), and whether the first is an explicit override
    (juliacall/juliapkg then use it and nothing else)."""
    for var in ("PYTHON_JULIACALL_EXE", "PYTHON_JULIAPKG_EXE"):
        value = os.environ.get(var)
        if value:
            return [(var, shutil.which(value) or value)], True
    found: list[tuple[str, str]] = []
    exe = "julia.exe" if os.name == "nt" else "julia"
    inst = os.path.join(juliapkg_paths()["install"], "bin", exe)
    if os.path.isfile(inst):
        found.append(("juliapkg's install folder", inst))
    found += [("juliaup", p) for p in _juliaup_binaries()]
    on_path = shutil.which("julia")
    if on_path:
        found.append(("PATH", on_path))
    seen, unique = set(), []
    for source, path in found:
        if path not in seen:
            seen.add(path)
            unique.append((source, path))
    return unique, False


def _juliaup_binaries() -> list[str]:
    """Binaries juliaup has installed, newest first, from its juliaup.json (read, not run)."""
    depot = os.environ.get("JULIAUP_DEPOT_PATH") or os.path.expanduser("~/.julia")
    meta = os.path.join(depot, "juliaup", "juliaup.json")
    try:
        with open(meta) as fp:
            installed = json.load(fp).get("InstalledVersions", {})
    except (OSError, ValueError):
        return []
    out = []
    for info in installed.values():
        rel = info.get("BinaryPath")
        if not rel and "Path" in info:
            rel = os.path.join(info["Path"], "bin", "julia")
        if rel:
            path = os.path.abspath(os.path.join(depot, "juliaup", rel))
            if os.path.isfile(path):
                out.append(path)
    return sorted(out, reverse=True)


def probe_version(exe: str, timeout: float = PROBE_TIMEOUT_S) -> tuple[tuple[int, int, int] | None, str]:
    """Run ``exe --version`` with a timeout; (version, "") or (None, what went wrong)."""
    try:
        proc = subprocess.Popen([exe, "--version"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    except OSError as exc:
        return None, f"cannot run it ({exc.strerror or exc})"
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return None, f"`--version` did not answer within {timeout:g} s"
    if proc.returncode != 0:
        tail = (err or out).strip().splitlines()[-1:] or [""]
        return None, f"`--version` exited with status {proc.returncode} {tail[0][:200]!r}".rstrip()
    m = _VERSION_RE.search(out)
    if not m:
        return None, f"`--version` printed {out.strip()[:200]!r}, not a Julia version"
    return (int(m[1]), int(m[2]), int(m[3])), ""


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the probe we started and anything it spawned (its own process group), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (OSError, AttributeError):
        proc.kill()
    try:
        proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        pass
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _version_str(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def find_julia(budget: float = BUDGET_S) -> Detection:
    """Probe the candidates (see :func:`candidates`) within ``budget`` seconds."""
    found, override = candidates()
    if not found:
        ins = juliapkg_paths()["install"]
        return Detection("no Julia executable found (PYTHON_JULIAPKG_EXE is unset, no `julia` on PATH, no "
                         f"juliaup-installed version, nothing in juliapkg's install folder {ins}); juliacall "
                         "would download Julia on first use, which needs network")
    deadline = time.monotonic() + budget
    tried = []
    for source, path in found:
        left = deadline - time.monotonic()
        if left <= 0.05:
            tried.append(f"{path} ({source}): not probed, detection ran out of time")
            break
        version, problem = probe_version(path, min(PROBE_TIMEOUT_S, left))
        if version is not None and version < MIN_JULIA:
            problem = f"is Julia {_version_str(version)}; juliacall needs >= {_version_str(MIN_JULIA)}"
        if not problem:
            return Detection(None, path, version, source, tried=tuple(tried))
        tried.append(f"{path} ({source}): {problem}")
        if override:
            break
    # a Julia executable exists (or was named) and cannot be used: broken, not absent
    return Detection("no usable Julia executable: " + "; ".join(tried), tried=tuple(tried), broken=True)
