"""The two exceptions of the bridge: Julia cannot be used here, or Julia raised.

Neither module-level import pulls in juliacall or torch.
"""

from __future__ import annotations

from dataclasses import dataclass

HOW_TO_GET_JULIA = (
    "To use the Julia side: pip install 'crossfuse[julia]' (juliacall); then either let juliacall "
    "download Julia and the packages on first use, which needs network (python -m crossfuse_julia "
    "install does it now), or point PYTHON_JULIAPKG_EXE at an existing julia (>= 1.10). "
    "CROSSFUSE_JULIA=0 turns the Julia side off."
)


class JuliaUnavailable(RuntimeError):
    """Julia cannot be used in this process; ``reason`` says why, the message also says how to fix it.

    ``unavailable = True`` tells ``crossfuse check`` that a case raising it is a skip (with ``reason``),
    not an implementation's error: Julia found but failing to start is known only at the first call.
    ``broken`` says whether Julia is here (or required, ``CROSSFUSE_JULIA=1``) and fails, rather than
    absent: the cross-language suite fails on a broken Julia and skips on an absent one."""

    unavailable = True

    def __init__(self, reason: str, broken: bool = False):
        self.reason = reason
        self.broken = broken
        super().__init__(f"Julia is not available: {reason}. {HOW_TO_GET_JULIA}")


@dataclass(frozen=True)
class Problem:
    """Why the Julia side cannot be used: ``reason``, and whether that is a failure (``broken``: Julia
    is here or required and fails) or an absence (a skip)."""

    reason: str
    broken: bool

    def describe(self) -> str:
        """One line for a test report: what kind of problem, and the reason."""
        if self.broken:
            return f"the Julia side is broken (Julia is here or required, and cannot be used): {self.reason}"
        return f"no Julia here: {self.reason}"


class JuliaError(RuntimeError):
    """An exception raised in Julia, with Julia's own message (``showerror``) and backtrace.

    ``julia_exception`` is the original exception (``juliacall.JuliaError``, or the ``TypeError`` of
    :class:`JuliaMethodError`), also chained as ``__cause__``.
    """

    def __init__(self, where: str, exc: BaseException):
        self.where = where
        self.julia_exception = exc
        super().__init__(f"Julia raised in {where}: {exc}")


class JuliaMethodError(JuliaError, TypeError):
    """A Julia ``MethodError`` of the function Python called: PythonCall raises it as a plain Python
    ``TypeError`` (not a ``juliacall.JuliaError``), which this wraps with where it happened. Still a
    ``TypeError``, for callers that catch one."""

    def __init__(self, where: str, exc: BaseException):
        JuliaError.__init__(self, where, exc)
        self.args = (f"Julia raised in {where}: a MethodError (CrossFuse has no method for the arguments the "
                     f"bridge passed): {exc}",)
