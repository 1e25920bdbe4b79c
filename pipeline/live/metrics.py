"""Per-utterance stage timestamps and the server's P50/P95/P99 per stage (GET /metrics)."""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import numpy as np

# every stage border an utterance crosses, in order; the values are seconds after the request
STAGES = ("tts_lock",            # the first piece got the voice's lock (the time before it: queued behind others;
                                 # with --tts-batch's batched LM no lock is taken: the voice's first call)
          "tts_tokens",          # --tts-batch: the first piece's LM tokens are ready (its flow + vocoder follow)
          "tts_first_audio",     # the first TTS piece is ready
          "first_frame",         # the talking head made the first frame of the first piece
          "first_sent",          # the clock sent the first speaking tick to the encoders
          "first_packet",        # an encoder produced its first packet of speech (websocket / WebRTC)
          "client_shown")        # the client reported the first speaking frame shown (where it reports)
KEPT = 10000  # values per stage: a bounded window, never growth


class Utterance:
    """One `say`: its text, the epoch it belongs to and the time it crossed each stage border."""

    def __init__(self, uid: int, text: str, epoch: int) -> None:
        self.id, self.text, self.epoch = uid, text, epoch
        self.requested = time.perf_counter()
        self.times: dict[str, float] = {}
        self.audio_seconds = 0.0
        self.frames = 0
        self.state = "queued"  # queued -> speaking -> done | interrupted | failed
        self.error: str | None = None

    def mark(self, stage: str, at: float | None = None) -> bool:
        """Record `stage` once (the first time it happens; at: when it happened, time.perf_counter, default now);
        True when this call recorded it."""
        if stage in self.times:
            return False
        self.times[stage] = (time.perf_counter() if at is None else at) - self.requested
        return True

    def report(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state, "chars": len(self.text), "audio_seconds": round(self.audio_seconds, 3),
                "frames": self.frames, "error": self.error,
                "stages": {k: round(v, 4) for k, v in self.times.items()}}

    def summary(self) -> str:
        stages = " ".join(f"{k}={v * 1000:.0f}ms" for k, v in self.times.items())
        return f"utterance {self.id} ({len(self.text)} chars, {self.audio_seconds:.2f} s audio, {self.state}): {stages}"


class StageMetrics:
    """Seconds per stage over the last KEPT utterances of every session; percentiles on request."""

    def __init__(self) -> None:
        self._values: dict[str, deque[float]] = {s: deque(maxlen=KEPT) for s in STAGES}
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, stage: str, seconds: float) -> None:
        with self._lock:
            self._values.setdefault(stage, deque(maxlen=KEPT)).append(float(seconds))

    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self._counts[what] = self._counts.get(what, 0) + n

    def add_utterance(self, utterance: Utterance) -> None:
        for stage, seconds in utterance.times.items():
            self.add(stage, seconds)
        self.count(f"utterances_{utterance.state}")

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            stages = {}
            for stage, values in self._values.items():
                if values:
                    arr = np.asarray(values, np.float64)
                    p50, p95, p99 = np.percentile(arr, [50, 95, 99])
                    stages[stage] = {"n": len(arr), "p50_ms": round(p50 * 1000, 1), "p95_ms": round(p95 * 1000, 1),
                                     "p99_ms": round(p99 * 1000, 1), "max_ms": round(float(arr.max()) * 1000, 1)}
            return {"stages": stages, "counts": dict(self._counts)}
