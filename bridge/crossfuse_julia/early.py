"""Start juliacall before torch is imported: ``import crossfuse_julia.early`` first thing in a program.

juliacall warns when torch was imported before it, and on some systems the two crash at start in that
order (PythonCall issue 215, pytorch issue 78829). Importing this module first resolves the Julia
packages and imports juliacall (which starts Julia) when Julia looks usable
(:func:`crossfuse_julia.available`), and does nothing otherwise; CrossFuse itself is loaded at the
first Julia call. Neither this module nor a failure here imports torch. A failure is cached and
reported by the Julia entries (and, as "broken", fails the cross-language suite). The test-suite's
``tests/conftest.py`` imports it first; elsewhere: ``pytest -p crossfuse_julia.early``.
"""

from __future__ import annotations

from . import JuliaUnavailable, available
from .session import start_juliacall

if available():
    try:
        start_juliacall()
    except JuliaUnavailable:  # the reason is cached; the Julia entries report it
        pass
