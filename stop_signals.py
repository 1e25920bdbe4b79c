"""SIGTERM stops a command the way Ctrl-C (SIGINT) does: the work unwinds and cleans up after itself.

Ctrl-C raises KeyboardInterrupt in the main thread, so every `finally` and `except BaseException` on
the way out runs: atomic_file.atomic_path removes its temporary, media/mux.py kills ffmpeg and removes
its `.partial-*` video and WAV. SIGTERM - what `timeout`, systemd, Docker, Kubernetes and Ray send -
would otherwise end the process at once and leave those files behind. Here it raises `Stopped`, a
KeyboardInterrupt, so the same clean-up runs; the command then exits with 128 + the signal's number
(143 for SIGTERM, 130 for Ctrl-C) and says it was stopped. Used by the CLI (every command), the
batch driver and its workers, and any long-running server.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator

STOP_SIGNALS = (signal.SIGTERM,)  # SIGINT already raises KeyboardInterrupt


class Stopped(KeyboardInterrupt):
    """The process was asked to stop by a signal; raised in the main thread, like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(f"stopped by {signal.Signals(self.signum).name}")


def _stop(signum: int, frame: Any) -> None:
    # once: a second signal while the first one's clean-up runs is ignored, so that clean-up finishes
    # (a supervisor that cannot wait sends SIGKILL)
    signal.signal(signum, signal.SIG_IGN)
    raise Stopped(signum)


def claim(signals: tuple[int, ...] = STOP_SIGNALS) -> bool:
    """Make `signals` raise Stopped from now on (main thread only: Python runs handlers there).
    For code that replaced the handler meanwhile (ray.init installs its own). False off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    for signum in signals:
        signal.signal(signum, _stop)
    return True


@contextmanager
def stop_on_signals(signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """Within the block, `signals` raise Stopped; the previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers can only be set (and only run) in the main thread
        return
    previous = {signum: signal.getsignal(signum) for signum in signals}
    claim(signals)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def exit_code(stop: KeyboardInterrupt) -> int:
    """The shell's convention: 128 + the signal's number (SIGTERM 143, Ctrl-C 130)."""
    return 128 + (stop.signum if isinstance(stop, Stopped) else int(signal.SIGINT))


def stopped_report(stop: KeyboardInterrupt) -> dict[str, Any]:
    """The JSON report of a stopped command."""
    name = signal.Signals(stop.signum).name if isinstance(stop, Stopped) else "SIGINT"
    return {"ok": False, "stopped": True, "signal": name, "exit_code": exit_code(stop),
            "error": f"stopped by {name} before it finished; its partial files were removed"}


def end_process(code: int) -> None:
    """End a stopped process now, with `code`, once its output is flushed. Its partial files were removed
    while the stop unwound; what is left are worker threads still inside native code (an encoder, an
    ONNX Runtime or torch thread pool), and a normal interpreter exit would run static destructors under
    them (measured: `terminate called without an active exception`, SIGABRT instead of 143)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
