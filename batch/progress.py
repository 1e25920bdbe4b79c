"""A progress bar over a batch's jobs on stderr (redrawn in place on a terminal, a line per finished
job otherwise, so logs stay readable)."""
from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    WIDTH = 24

    def __init__(self, total: int, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.total = total
        self.enabled = enabled and total > 0
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = self.failed = self.running = self.retried = 0
        self.speech = 0.0
        self.start = time.perf_counter()

    def update(self, event: str, audio_seconds: float | None) -> None:
        """event: running (a job was handed out), done, failed, retry (its worker died)."""
        if event == "running":
            self.running += 1
        elif event in ("done", "failed", "retry"):
            self.running = max(0, self.running - 1)
            if event == "done":
                self.done += 1
                self.speech += audio_seconds or 0.0
            elif event == "failed":
                self.failed += 1
            else:
                self.retried += 1
        if self.enabled and (self.tty or event != "running"):
            self._draw()

    def line(self) -> str:
        finished = self.done + self.failed
        filled = int(self.WIDTH * finished / max(self.total, 1))
        elapsed = time.perf_counter() - self.start
        rate = self.speech / elapsed if elapsed > 0 else 0.0
        eta = elapsed / finished * (self.total - finished) if finished else float("nan")
        eta_text = f"{eta:.0f}s" if eta == eta else "?"
        return (f"batch [{'#' * filled}{'.' * (self.WIDTH - filled)}] {finished}/{self.total} "
                f"({self.done} done, {self.failed} failed, {self.running} running, {self.retried} retried) "
                f"{rate:.2f} speech s/s, eta {eta_text}")

    def _draw(self) -> None:
        if self.tty:
            self.stream.write("\r" + self.line() + "\033[K")
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
