"""Test configuration: choose Triton's interpreter before anything imports Triton when no GPU exists."""

from __future__ import annotations

try:  # juliacall before torch, where Julia is usable (juliacall warns otherwise; pytorch issue 78829)
    import crossfuse_julia.early  # noqa: F401
except ImportError:  # the bridge is not on the path: no Julia side to start
    pass

from crossfuse import _backend

INTERPRETED = _backend.enable_interpreter_if_no_gpu()

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_report_header(config):
    mode = "Triton interpreter on the CPU" if INTERPRETED else "compiled Triton kernels"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return f"crossfuse: {mode}; GPU: {gpu}"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available() and not INTERPRETED:
        return
    skip = pytest.mark.skip(
        reason="needs a CUDA GPU with compiled Triton kernels (run `pytest -m gpu` there)"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    """Where the kernels under test run: the GPU when there is one, else the CPU (interpreted)."""
    return "cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu"


@pytest.fixture
def gen():
    """A freshly seeded generator; the seed is printed so a failure can be replayed."""
    from crossfuse.check import fresh_generator

    g, seed = fresh_generator()
    print(f"generator seed: {seed}")
    return g


@pytest.fixture(autouse=True)
def _fresh_attention_caches():
    """Each test starts without the attention's launch plans and eager entries of earlier tests, so that
    the launches it counts are its own (``crossfuse.ops.relu_attention``: ``clear_plans``,
    ``clear_eager``)."""
    from crossfuse.ops import relu_attention as ra

    ra.clear_plans()
    ra.clear_eager()
    yield
    ra.clear_plans()
    ra.clear_eager()


@pytest.fixture
def fresh_layer_norm_plans():
    """The test starts from no layer-norm plans (nor compiled programs) and leaves none: some build theirs
    under stand-ins, and counts of what a call builds need a first call of their own."""
    from crossfuse.ops.layer_norm import api

    api.clear_plans()
    yield
    api.clear_plans()


@pytest.fixture
def launched(monkeypatch):
    """The kernels the attention launchers launch through ``_launch`` during the test, in order (a spy)."""
    from crossfuse.ops.relu_attention import launch as launch_module

    kernels = []
    launch = launch_module._launch

    def spy(kernel, grid, key, *args, **options):
        kernels.append(kernel)
        return launch(kernel, grid, key, *args, **options)

    monkeypatch.setattr(launch_module, "_launch", spy)
    return kernels


@pytest.fixture
def copies(monkeypatch):
    """How many tensors each launch of float32's copies with unit stride on L (``_l_major_copies``, not
    launched through ``_launch``) copied during the test, in order (a spy)."""
    from crossfuse.ops.relu_attention import copies as copies_module

    counts, copy = [], copies_module._l_major_copies
    monkeypatch.setattr(copies_module, "_l_major_copies",
                        lambda ts, *a: counts.append(len(ts)) or copy(ts, *a))  # fmt: skip
    return counts


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """An environment with no Julia anywhere (the bridge's tests); returns the folder that is the whole
    PATH."""
    from _bridge_env import isolate

    return isolate(monkeypatch, tmp_path)
