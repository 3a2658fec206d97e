"""The two exceptions of the bridge: Julia cannot be used here, or Julia raised.

Neither module-level import pulls in juliacall or torch.
"""

from __future__ import annotations

HOW_TO_GET_JULIA = (
    "To use the Julia side: pip install 'crossfuse[julia]' (juliacall); then either let juliacall "
    "download Julia and the packages on first use, which needs network (python -m crossfuse_julia "
    "install does it now), or point PYTHON_JULIAPKG_EXE at an existing julia (>= 1.10). "
    "CROSSFUSE_JULIA=0 turns the Julia side off."
)


class JuliaUnavailable(RuntimeError):
    """Julia cannot be used in this process; ``reason`` says why, the message also says how to fix it.

    ``unavailable = True`` tells ``crossfuse check`` that a case raising it is a skip (with ``reason``),
    not an implementation's error: Julia found but failing to start is known only at the first call."""

    unavailable = True

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"Julia is not available: {reason}. {HOW_TO_GET_JULIA}")


class JuliaError(RuntimeError):
    """An exception raised in Julia, with Julia's own message (``showerror``) and backtrace.

    ``julia_exception`` is the original ``juliacall.JuliaError`` (also chained as ``__cause__``).
    """

    def __init__(self, where: str, exc: BaseException):
        self.where = where
        self.julia_exception = exc
        super().__init__(f"Julia raised in {where}: {exc}")
