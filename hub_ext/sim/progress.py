"""A one-line progress bar on stderr, only for runs long enough to need one."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, after_s: float = 2.0, stream=sys.stderr) -> None:
        self.label, self.after_s, self.stream = label, after_s, stream
        self.start = time.monotonic()
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        elapsed = time.monotonic() - self.start
        if elapsed < self.after_s or not total:
            return
        self.shown = True
        width = 30
        filled = int(width * done / total)
        eta = elapsed / max(done, 1) * (total - done)
        self.stream.write(
            f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
            f" {elapsed:.0f}s, ~{eta:.0f}s left"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
