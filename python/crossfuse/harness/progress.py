"""Progress on long runs: tqdm when installed and stderr is a terminal, else a plain counter on stderr."""

from __future__ import annotations

import importlib.util
import sys
import time


class Progress:
    """``update(label)`` after each item. ``style``: ``auto``, ``tqdm``, ``counter`` (one ``\\r`` line),
    ``lines`` (a line per item with the elapsed time: for logs) or ``none``."""

    def __init__(self, total: int, desc: str = "", style: str = "auto", stream=None):
        self.total, self.desc, self.n = total, desc, 0
        self.stream = stream if stream is not None else sys.stderr
        self.t0 = time.monotonic()
        tty = getattr(self.stream, "isatty", lambda: False)()
        if style == "auto":
            style = "tqdm" if tty and importlib.util.find_spec("tqdm") else ("counter" if tty else "lines")
        self.style = style
        self._bar = None
        if style == "tqdm":
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, file=self.stream, dynamic_ncols=True, leave=False)

    def update(self, label: str = "") -> None:
        self.n += 1
        if self.style == "tqdm":
            self._bar.set_postfix_str(label[:60], refresh=False)
            self._bar.update(1)
        elif self.style == "counter":
            self.stream.write(f"\r{self.desc} [{self.n}/{self.total}] {label[:70]:<70}")
            self.stream.flush()
        elif self.style == "lines":
            self.stream.write(
                f"[{time.monotonic() - self.t0:7.1f} s] {self.desc} {self.n}/{self.total} {label}\n"
            )
            self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.style == "counter" and self.n:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
