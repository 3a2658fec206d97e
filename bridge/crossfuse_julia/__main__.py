"""``python -m crossfuse_julia [status|install]``: is Julia usable here; install Julia and the packages.

``status`` (the default) prints what detection found and exits 0 when Julia looks usable, 1 when not.
``install`` runs ``juliapkg.resolve()`` with its progress shown (needs network the first time), then
prints the status. Neither starts Julia inside this process.
"""

from __future__ import annotations

import argparse
import sys

from . import _detect, install
from .errors import HOW_TO_GET_JULIA, JuliaUnavailable
from .session import checked_timeout


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m crossfuse_julia", description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=("status", "install"), default="status")
    parser.add_argument("--timeout", type=float, default=None, help="seconds for `install` (default 1800)")
    args = parser.parse_args(argv)
    if args.timeout is not None:  # the rule resolve_packages applies, said before anything runs
        try:
            checked_timeout(args.timeout, "--timeout ")
        except JuliaUnavailable as exc:
            parser.error(exc.reason)
    if args.command == "install":
        try:
            install(args.timeout)
        except JuliaUnavailable as exc:
            print(f"crossfuse_julia: {exc}", file=sys.stderr)
            return 1
    d = _detect.detect()
    if d.available:
        version = ".".join(map(str, d.version)) if d.version else "?"
        print(f"Julia: available: {d.executable or '(running)'} (Julia {version}, from {d.source}); "
              f"checked in {d.seconds:.2f} s")
        return 0
    print(f"Julia: not available: {d.reason} (checked in {d.seconds:.2f} s)\n{HOW_TO_GET_JULIA}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
