"""Which Triton the kernels were written for: the gates that choose between a Gluon kernel and its
Triton counterpart.

The Gluon kernels use Triton's experimental Gluon language, whose API changes between minor releases;
they are launched only with the minor version they were written and tested against, and the Triton
kernels take their place elsewhere (correct everywhere, slower where Gluon wins).
"""

from __future__ import annotations

import functools

from ..._backend import triton_version as _triton_version

GLUON_TRITON = (3, 6)  # the Triton (major, minor) the Gluon kernels were written and tested for


@functools.cache
def triton_version() -> tuple[int, int]:
    """The installed Triton's (major, minor), read once."""
    return _triton_version()


def gluon_supported() -> bool:
    """Whether the installed Triton is the one the Gluon kernels were written for."""
    return triton_version() == GLUON_TRITON
