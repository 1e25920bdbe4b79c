"""One live session: text -> TTS pieces -> talking-head frames -> one media clock -> the session's outputs.

Stages run on their own threads joined by small bounded queues (back-pressure, never growth). The clock is the
audio: every tick is one video frame and the `samples_per_frame` audio samples shown with it, so tick k's video
timestamp is k * samples_per_frame audio samples and audio and video cannot drift apart. When no speech frame
is ready the tick is an idle frame with silence. Interrupt = a new epoch: every stage compares its work's epoch
with the session's and drops what is stale, queued frames included. On a GPU the TTS and talking-head stages each
queue their device work on a CUDA stream of their stage, the talking head's at a higher priority (_stage_stream).
"""
from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .metrics import StageMetrics, Utterance

log = logging.getLogger("digital_human.live")
MAX_TEXT_CHARS = 2000       # one `say`; longer text is refused (split it into several says)
TEXT_QUEUE = 4              # says waiting behind the one being spoken
PIECE_QUEUE = 2             # TTS pieces made ahead of the talking head
FRAME_QUEUE = 8             # frames made ahead of the clock (0.32 s at 25 fps): the most an interrupt could show
MAX_CATCH_UP_S = 0.5        # a clock later than this (a stalled host) skips wall time, never media time
OPENCV_THREADS_ENV = "DIGITAL_HUMAN_LIVE_OPENCV_THREADS"  # OpenCV's threads in a live server (default 1)
SWITCH_INTERVAL_ENV = "DIGITAL_HUMAN_LIVE_SWITCH_INTERVAL_MS"  # the interpreter's switch interval (default 0.5)


def live_opencv_threads() -> int:
    """Set OpenCV's thread count for a live server (process-wide) and return it: 1 unless OPENCV_THREADS_ENV says
    otherwise. Why: a live frame's OpenCV calls are small (a 512-px head warp is ~4 ms), and OpenCV split each over
    every core; with 8 sessions on a 16-core H200 host the clocks' warps then contended with each other and the
    process used 8.8 cores for 14 frames/s a session (2026-12-03, RESULTS_live.md). Split over 2 cores here, one
    tick's warp cost 6.8 ms of CPU for 3.6 ms of wall; on one thread 4.4 ms of both. Concurrent sessions are the
    parallelism."""
    import os

    try:
        import cv2
    except ImportError:  # OpenCV is optional for the live path's numpy fallbacks
        return 0
    raw = os.environ.get(OPENCV_THREADS_ENV, "").strip() or "1"
    try:
        threads = int(raw)
    except ValueError:
        raise ValueError(f"{OPENCV_THREADS_ENV}={raw!r}: give a whole number of threads (1 = one per call)") from None
    cv2.setNumThreads(threads)
    return int(cv2.getNumThreads())


def live_switch_interval() -> float:
    """Set the interpreter's thread switch interval for a live server (process-wide) and return it in ms: 0.5
    unless SWITCH_INTERVAL_ENV says otherwise (Python's default is 5). Why: the sessions' threads mostly wait in
    numpy, OpenCV and CUDA calls that let the interpreter lock go; each must win it back from whichever thread
    runs Python meanwhile (the TTS loop, the server), and with the default a waiter can lose up to 5 ms each
    time. Measured on 2 cores (benchmarks/head_warp_threads.py: 8 threads warping 512-px frames beside one busy
    Python thread): 152 frames/s at 5 ms, 275 at 0.5 ms, 314 with no busy thread (benchmarks/RESULTS_live.md,
    2026-12-03 21:13)."""
    import os
    import sys

    raw = os.environ.get(SWITCH_INTERVAL_ENV, "").strip() or "0.5"
    try:
        ms = float(raw)
        if not 0 < ms <= 100:
            raise ValueError
    except ValueError:
        raise ValueError(f"{SWITCH_INTERVAL_ENV}={raw!r}: give milliseconds between 0 and 100 (0.5 by default, "
                         "Python's own 5)") from None
    sys.setswitchinterval(ms / 1000.0)
    return round(sys.getswitchinterval() * 1000.0, 3)


class SessionError(ValueError):
    """A request the session refuses (empty or too long text, a closed session)."""


@dataclass
class Tick:
    index: int                 # clock frame k; its audio starts at sample k * samples_per_frame
    frame: np.ndarray          # uint8 [H, W, 3]
    audio: np.ndarray          # int16 [samples_per_frame] mono
    speaking: bool
    utterance: Utterance | None


class Session:
    def __init__(self, sid: str, face: Any, voice: Any, metrics: StageMetrics, *,
                 on_done: Callable[[Utterance], None] | None = None) -> None:
        self.id, self.face, self.voice, self.metrics = sid, face, voice, metrics
        self.rate = voice.rate
        spf = voice.rate / face.fps
        if abs(spf - round(spf)) > 1e-9:
            raise ValueError(f"the audio rate {voice.rate} Hz is not a whole number of samples per frame at "
                             f"{face.fps:g} fps; choose an fps that divides it (25 or 24 for 24 kHz)")
        self.samples_per_frame = int(round(spf))
        self.epoch = 0
        self._ids = itertools.count(1)
        self._texts: queue.Queue = queue.Queue(maxsize=TEXT_QUEUE)
        self._pieces: queue.Queue = queue.Queue(maxsize=PIECE_QUEUE)
        self._frames: queue.Queue = queue.Queue(maxsize=FRAME_QUEUE)
        self._outputs: list[Callable[[Tick], None]] = []
        self._outputs_lock = threading.Lock()
        self._closed = threading.Event()
        self.clock_frame = 0           # the next tick's index
        self.utterances: dict[int, Utterance] = {}
        self._on_done = on_done
        self.created = time.time()
        self._threads = [threading.Thread(target=fn, name=f"live-{sid}-{fn.__name__}", daemon=True)
                         for fn in (self._tts_stage, self._face_stage, self._clock)]
        for t in self._threads:
            t.start()

    # --- requests ---------------------------------------------------------------------------------
    def say(self, text: Any, interrupt: bool = False) -> Utterance:
        if self._closed.is_set():
            raise SessionError(f"session {self.id} is closed")
        if not isinstance(text, str) or not text.strip():
            raise SessionError("text is empty: send {\"text\": \"what the avatar should say\"}")
        if len(text) > MAX_TEXT_CHARS:
            raise SessionError(f"text has {len(text)} characters; one say takes at most {MAX_TEXT_CHARS} "
                               "(send it as several says, e.g. paragraph by paragraph)")
        if interrupt:
            self.interrupt()
        utterance = Utterance(next(self._ids), text, self.epoch)
        try:
            self._texts.put_nowait(utterance)
        except queue.Full:
            raise SessionError(f"{TEXT_QUEUE} says are already waiting; wait, or send interrupt: true") from None
        self.utterances[utterance.id] = utterance
        while len(self.utterances) > 64:  # a bounded history for GET /sessions/{id}
            self.utterances.pop(next(iter(self.utterances)))
        return utterance

    def interrupt(self) -> None:
        """Stop the current speech in every stage: a new epoch; queued work is dropped now."""
        self.epoch += 1
        for q in (self._texts, self._pieces, self._frames):
            while True:
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    break
                utterance = item if isinstance(item, Utterance) else item[1]
                self._finish(utterance, "interrupted")

    def current(self, tick: Tick) -> Tick:
        """`tick` as it should be shown now: a speech tick of an interrupted epoch (waiting in an output's queue)
        becomes the idle tick of the same clock frame, so an interrupt also stops what the transports hold."""
        if tick.speaking and tick.utterance is not None and tick.utterance.epoch != self.epoch:
            silence = np.zeros(self.samples_per_frame, np.int16)
            return Tick(tick.index, self.face.finish(self.face.idle(tick.index), tick.index), silence, False, None)
        return tick

    def add_output(self, output: Callable[[Tick], None]) -> Callable[[], None]:
        """Call `output(tick)` for every tick from now on (on the clock thread: it must not block).
        Returns the function that removes it."""
        with self._outputs_lock:
            self._outputs.append(output)

        def remove() -> None:
            with self._outputs_lock:
                if output in self._outputs:
                    self._outputs.remove(output)
        return remove

    def close(self) -> None:
        self.interrupt()
        self._closed.set()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def report(self) -> dict[str, Any]:
        return {"id": self.id, "clock_frame": self.clock_frame, "epoch": self.epoch,
                "media_seconds": round(self.clock_frame / self.face.fps, 3),
                "utterances": [u.report() for u in self.utterances.values()]}

    # --- stages -----------------------------------------------------------------------------------
    def _put(self, q: queue.Queue, item: Any, epoch: int) -> bool:
        """Put with back-pressure; False when the work went stale or the session closed meanwhile."""
        while not self._closed.is_set() and epoch == self.epoch:
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _get(self, q: queue.Queue) -> Any:
        while not self._closed.is_set():
            try:
                return q.get(timeout=0.05)
            except queue.Empty:
                continue
        return None

    def _finish(self, utterance: Utterance, state: str, error: str | None = None) -> None:
        if utterance.state in ("done", "interrupted", "failed"):
            return
        utterance.state, utterance.error = state, error
        self.metrics.add_utterance(utterance)
        if self._on_done is not None:
            self._on_done(utterance)

    def _stage_stream(self, part: Any, role: str, priority: int) -> Any:
        """The context a stage thread runs its whole loop in: the CUDA stream of its stage (`role`: every session's
        TTS threads share one, their talking-head threads another, at a higher priority) on the device of `part`
        (the face or the voice: its `cuda_device`), so that TTS work and talking-head work do not queue behind each
        other on the default stream (engines/cuda_streams.py says why a stage's, not a thread's); a no-op on the
        CPU, and with DIGITAL_HUMAN_LIVE_STREAMS=0. What the stages hand each other is host data (numpy pieces and
        frames), made and read back on the stage's stream."""
        from ...engines import cuda_streams

        try:
            device = getattr(part, "cuda_device", None)
        except Exception as exc:  # noqa: BLE001 - no stream of its own is slower, never wrong
            log.warning("session %s: device of %s unknown (%s); default stream", self.id, type(part).__name__, exc)
            device = None
        return cuda_streams.thread_stream(device, priority=priority, role=role)

    def _tts_stage(self) -> None:
        from ...engines.cuda_streams import TTS_ROLE, tts_priority

        with self._stage_stream(self.voice, TTS_ROLE, tts_priority()):
            self._tts_loop()

    def _face_stage(self) -> None:
        from ...engines.cuda_streams import FACE_PRIORITY, FACE_ROLE

        with self._stage_stream(self.face, FACE_ROLE, FACE_PRIORITY):  # frames have deadlines: the higher priority
            self._face_loop()

    def _tts_loop(self) -> None:
        while (utterance := self._get(self._texts)) is not None:
            epoch = utterance.epoch
            if epoch != self.epoch:
                self._finish(utterance, "interrupted")
                continue
            try:
                for piece in self.voice.pieces(utterance.text):
                    if epoch != self.epoch:
                        break
                    for stage, at in (getattr(piece, "marks", None) or {}).items():  # the voice's inner borders
                        utterance.mark(stage, at)
                    utterance.mark("tts_first_audio")
                    if not self._put(self._pieces, (epoch, utterance, piece, False), epoch):
                        break
            except Exception as exc:  # noqa: BLE001 - a bad text must not end the session
                log.warning("session %s: TTS failed: %s", self.id, exc)
                self._finish(utterance, "failed", str(exc))
                continue
            if epoch == self.epoch:
                self._put(self._pieces, (epoch, utterance, None, True), epoch)  # end of this utterance
            else:
                self._finish(utterance, "interrupted")

    def _face_loop(self) -> None:
        spf = self.samples_per_frame
        while (item := self._get(self._pieces)) is not None:
            epoch, utterance, piece, last = item
            if epoch != self.epoch:
                self._finish(utterance, "interrupted")
                continue
            if last:
                self._put(self._frames, (epoch, utterance, None, None, True), epoch)
                continue
            wave = np.asarray(piece.wave, np.float32)
            wave = np.concatenate([wave, np.zeros(-len(wave) % spf, np.float32)])  # whole frames
            pcm = (np.clip(wave, -1.0, 1.0) * 32767.0).astype(np.int16)
            utterance.audio_seconds += len(wave) / self.rate
            # where the frames will be shown: after what is queued (a video takes its frames from there)
            k0 = self.clock_frame + self._frames.qsize()
            stale = lambda: epoch != self.epoch or self._closed.is_set()  # noqa: E731
            try:
                for j, frame in enumerate(self.face.speech(wave, self.rate, k0, phones=piece.phones, should_stop=stale)):
                    utterance.mark("first_frame")
                    if j * spf >= len(pcm) or not self._put(self._frames, (epoch, utterance, frame,
                                                                           pcm[j * spf:(j + 1) * spf], False), epoch):
                        break
            except Exception as exc:  # noqa: BLE001
                log.warning("session %s: talking head failed: %s", self.id, exc)
                self._finish(utterance, "failed", str(exc))
            if epoch != self.epoch:
                self._finish(utterance, "interrupted")

    def _clock(self) -> None:
        """One tick per 1/fps of wall time; the tick's index is the media clock."""
        fps = self.face.fps
        silence = np.zeros(self.samples_per_frame, np.int16)
        start = time.perf_counter()
        while not self._closed.is_set():
            k = self.clock_frame
            delay = start + k / fps - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            elif -delay > MAX_CATCH_UP_S:  # the host stalled: do not burst the backlog, keep media time
                start = time.perf_counter() - k / fps
            tick = self._next_tick(k, silence)
            with self._outputs_lock:
                outputs = list(self._outputs)
            for output in outputs:
                try:
                    output(tick)
                except Exception as exc:  # noqa: BLE001 - one bad output must not stop the clock
                    log.warning("session %s: an output failed and was removed: %s", self.id, exc)
                    with self._outputs_lock:
                        if output in self._outputs:
                            self._outputs.remove(output)
            if tick.speaking and tick.utterance is not None and tick.utterance.mark("first_sent"):
                tick.utterance.state = "speaking"
            self.clock_frame = k + 1

    def _next_tick(self, k: int, silence: np.ndarray) -> Tick:
        while True:
            try:
                epoch, utterance, frame, audio, last = self._frames.get_nowait()
            except queue.Empty:
                return Tick(k, self.face.finish(self.face.idle(k), k), silence, False, None)
            if epoch != self.epoch:
                self._finish(utterance, "interrupted")
                continue
            if last:
                self._finish(utterance, "done")
                continue
            utterance.frames += 1
            return Tick(k, self.face.finish(frame, k), audio, True, utterance)


class SessionManager:
    """Every session of a server: one face and one voice shared (one copy of each model), a capacity limit."""

    def __init__(self, face: Any, voice: Any, max_sessions: int = 4) -> None:
        self.face, self.voice, self.max_sessions = face, voice, max(1, int(max_sessions))
        self.opencv_threads = live_opencv_threads()
        self.switch_interval_ms = live_switch_interval()
        from ...engines.cuda_streams import tts_priority

        self.tts_priority = tts_priority()  # a bad DIGITAL_HUMAN_LIVE_TTS_PRIORITY is refused here, at start
        self.metrics = StageMetrics()
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def create(self) -> Session:
        import secrets

        with self._lock:
            if len(self.sessions) >= self.max_sessions:
                self.metrics.count("sessions_refused")
                raise CapacityError(f"the server is at capacity ({self.max_sessions} live sessions); close one "
                                    "(DELETE /sessions/{id}) or start the server with a larger --max-sessions")
            sid = f"s{next(self._ids)}-{secrets.token_hex(4)}"
            session = Session(sid, self.face, self.voice, self.metrics, on_done=lambda u: log.info("%s: %s", sid, u.summary()))
            self.sessions[sid] = session
            self.metrics.count("sessions_opened")
            return session

    def get(self, sid: str) -> Session:
        session = self.sessions.get(sid)
        if session is None:
            raise KeyError(f"no live session '{sid}' (closed, or never opened: POST /sessions opens one)")
        return session

    def close(self, sid: str) -> None:
        with self._lock:
            session = self.sessions.pop(sid, None)
        if session is None:
            raise KeyError(f"no live session '{sid}' (closed, or never opened: POST /sessions opens one)")
        session.close()

    def close_all(self) -> None:
        for sid in list(self.sessions):
            try:
                self.close(sid)
            except KeyError:
                pass


class CapacityError(RuntimeError):
    pass
