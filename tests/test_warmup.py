"""The CLI's warm-up thread (warmup.py): it loads the TTS session the main path then finds cached, and the
process waits for it before exiting (ONNX Runtime aborts a process that exits mid-build)."""
from __future__ import annotations

import threading
import time

from digital_human import warmup


def test_warmup_loads_the_tts_session_and_is_waited_for(monkeypatch):
    from digital_human.engines import loader

    asked: list[tuple] = []
    release = threading.Event()

    def slow_get(spec, backend="auto", precision="auto", stage=""):
        asked.append((spec.name, backend, precision, stage))
        release.wait(5)
        return object()

    monkeypatch.setattr(loader, "get", slow_get)
    thread = warmup.start_warmup(tts_backend="onnxruntime")
    deadline = time.monotonic() + 10
    while not asked and time.monotonic() < deadline:  # the thread imports the Kokoro spec first
        time.sleep(0.01)
    assert thread.is_alive() and asked and asked[0][1:] == ("onnxruntime", "auto", "voice")
    threading.Timer(0.2, release.set).start()
    warmup.wait_for_warmup()
    assert not thread.is_alive() and not warmup._STARTED


def test_a_failing_warmup_is_silent(monkeypatch):
    from digital_human.engines import loader

    def broken(*_a, **_k):
        raise RuntimeError("no such model here")

    monkeypatch.setattr(loader, "get", broken)
    warmup.start_warmup(tts_backend="auto")
    warmup.wait_for_warmup()  # no exception: the main path meets the problem and reports it itself
