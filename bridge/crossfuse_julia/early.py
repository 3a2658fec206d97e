"""Start Julia before torch is imported: ``import crossfuse_julia.early`` first thing in a program.

juliacall warns when torch was imported before it, and on some systems the two crash at start in that
order (PythonCall issue 215, pytorch issue 78829). Importing this module first starts Julia when it is
usable (:func:`crossfuse_julia.available`) and does nothing otherwise. For pytest:
``pytest -p crossfuse_julia.early``.
"""

from __future__ import annotations

from . import JuliaUnavailable, available, start

if available():
    try:
        start()
    except JuliaUnavailable:  # the reason is cached; the Julia entries report it
        pass
