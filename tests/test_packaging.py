"""What an installed crossfuse needs ships inside the package: the suites, read from any directory."""

from __future__ import annotations

from pathlib import Path

import crossfuse
import pytest
from crossfuse.harness import suite


def test_suites_load_from_the_package_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CROSSFUSE_SUITES", raising=False)
    file = suite.find_suites_file()
    assert file.parent == Path(crossfuse.__file__).parent / "harness"
    assert {"layer_norm", "attention", "memory"} <= set(suite.load_suites())


def test_a_suite_file_given_replaces_the_package_suites(tmp_path, monkeypatch):
    file = tmp_path / "mine.py"
    file.write_text('SUITES = {"tiny": {"groups": [{"ops": ["layer_norm"], "shapes": [(2, 8)]}]}}\n')
    assert set(suite.load_suites(file)) == {"tiny"}
    monkeypatch.setenv("CROSSFUSE_SUITES", str(file))
    assert set(suite.load_suites()) == {"tiny"}
    with pytest.raises(FileNotFoundError, match="no suite file"):
        suite.load_suites(tmp_path / "missing.py")
