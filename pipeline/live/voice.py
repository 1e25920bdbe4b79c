"""The live server's voice: one TTS engine and speaker shared by every session; text -> pieces as they are made."""
from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

log = logging.getLogger("digital_human.live")


class FirstPiecesFirst:
    """The voice's lock, served by (priority, arrival) instead of whoever wakes first: an utterance's first piece
    (priority 0) goes before later pieces (1) of other sessions. Why: the engine is shared and its calls are
    serialised, so with 8 sessions a new utterance's first piece queued behind up to 7 other sessions' later
    pieces (each a hop of the LM + flow + vocoder); a later piece has slack (the speech already made plays
    meanwhile), a first piece is the latency a person waits for. Within a priority, first come first served."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._busy = False
        self._waiting: list[tuple[int, int]] = []  # heap of (priority, ticket)
        self._tickets = itertools.count()

    def first_piece_waiting(self) -> bool:
        """Whether an utterance's first piece (priority 0) waits for the lock now."""
        with self._cv:
            return bool(self._waiting) and self._waiting[0][0] == 0

    @contextmanager
    def hold(self, priority: int = 1) -> Iterator[None]:
        with self._cv:
            mine = (int(priority), next(self._tickets))
            heapq.heappush(self._waiting, mine)
            while self._busy or self._waiting[0] != mine:
                self._cv.wait()
            heapq.heappop(self._waiting)
            self._busy = True
        try:
            yield
        finally:
            with self._cv:
                self._busy = False
                self._cv.notify_all()


MAX_TTS_LANES = 8  # as the CosyVoice 2 engine's MAX_LANES (each lane holds CUDA graphs of its own)


LANES_CUDA_ENV = "DIGITAL_HUMAN_TTS_LANES_CUDA"  # "1": let --tts-lanes above 1 run on a CUDA GPU (to debug them)


def check_tts_lanes(lanes: int, cuda: bool = False) -> int:
    """`lanes` if it is a lane count `serve --tts-lanes` takes, else one error naming the option and the fix.
    cuda: the voice runs on a CUDA GPU, where more than one lane is refused unless LANES_CUDA_ENV is 1. Why (H200,
    benchmarks/RESULTS_live.md): at 17:21 on 2026-12-03, 4 lanes under 8 sessions voiced nothing for 190 s and two
    lanes at once gave other audio than each alone (max diff 1.98): every lane's graphs had been captured on one
    stream, sharing cuBLAS's workspace. With a capture stream per graph owner (cuda_streams.capture_stream) the
    re-run at 21:13 came within 0.012 of each lane alone, but two lanes at once took as long as the two one after
    the other (overlap 1.02): on that machine lanes add no capacity, only graphs and memory."""
    if not 1 <= int(lanes) <= MAX_TTS_LANES:
        raise ValueError(f"--tts-lanes must be 1 to {MAX_TTS_LANES}, got {lanes} (at least 1: with 1, sessions take "
                         "turns on one lane)")
    if int(lanes) > 1 and cuda and os.environ.get(LANES_CUDA_ENV, "").strip() != "1":
        raise ValueError(f"--tts-lanes {lanes} is turned off on a CUDA GPU: on the H200 two lanes at once ran no faster "
                         "than one after the other, and their audio differed a little from each alone (docs/live.md); "
                         "use --tts-lanes 1 (sessions take turns on one lane, the first pieces first), or set "
                         f"{LANES_CUDA_ENV}=1 to try lanes anyway")
    return int(lanes)


LEAD_KEEP_S = 0.08   # silence kept before a Kokoro piece's first sound (room for the mouth's anticipation)
TAIL_KEEP_S = 0.10   # and after its last (the decay of the last phone)


def trim_edges(wave: np.ndarray, rate: int, phones: Any = None, floor: float = 0.02) -> tuple[np.ndarray, Any]:
    """(wave, phones) with the silence at both ends cut to LEAD_KEEP_S / TAIL_KEEP_S; phone times moved with it.
    Why: Kokoro starts and ends every synthesis with ~0.3 s of silence (its pad tokens), so live speech was heard
    ~0.3 s after its first frame, and a first sentence cut in two (split_first_piece) had a ~0.6-s hole at the cut.
    "Sound" = above `floor` x the piece's peak; the phones' own span is never cut."""
    wave = np.asarray(wave, np.float32)
    peak = float(np.abs(wave).max()) if wave.size else 0.0
    loud = np.flatnonzero(np.abs(wave) > floor * peak) if peak > 0 else np.zeros(0, np.int64)
    if not loud.size:
        return wave, phones
    first, last = int(loud[0]), int(loud[-1])
    if phones:
        first = min(first, int(float(phones[0][1]) * rate))
        last = max(last, int(float(phones[-1][2]) * rate) - 1)
    a = max(0, first - int(round(LEAD_KEEP_S * rate)))
    b = min(len(wave), last + 1 + int(round(TAIL_KEEP_S * rate)))
    if phones:
        shift = a / float(rate)
        phones = [(p[0], round(float(p[1]) - shift, 6), round(float(p[2]) - shift, 6), *p[3:]) for p in phones]
    return wave[a:b], phones


@dataclass
class Piece:
    wave: np.ndarray          # float32 mono at the voice's rate
    phones: Any = None        # (phone, start_s, end_s) of the piece, when the engine says (Kokoro)
    # an utterance's first piece: when (time.perf_counter) it crossed the voice's inner borders - "tts_lock": the
    # lane's lock was first granted (with a batched LM, which takes no lock: the voice's first call); "tts_tokens"
    # (--tts-batch): its LM tokens were ready, the audio still to make.
    # Why: under load the first audio's wait splits into queueing for the LM, the LM, and the flow + vocoder
    marks: dict[str, float] = field(default_factory=dict)


class LiveVoice:
    """engine + speaker (+ a bundled Kokoro voice); `pieces(text)` yields speech as it is made: Kokoro sentence by
    sentence with the first sentence cut short (text/chunking.split_first_piece: the first audio after a few
    words' synthesis, not a whole sentence's); CosyVoice 2 through its live stream (the LM's tokens vocoded every
    hop, the first piece after FIRST_HOP_TOKENS); other engines as their `stream` yields. One lock (first pieces
    first: FirstPiecesFirst) per lane: the engines' sessions are shared. `engine` may be an engine object already made (benchmarks: a given release folder).
    token_limits: CosyVoice 2 only, text -> {"min_tokens", "max_tokens"} (benchmarks on random weights)."""

    def __init__(self, engine: Any = "kokoro", speaker: Any = None, base_voice: str = "auto",
                 backend: str = "auto", language: str = "auto", speed: float = 1.0,
                 token_limits: Callable[[str], dict] | None = None, first_hop_tokens: int | None = None,
                 engine_options: dict[str, Any] | None = None, lanes: int = 1, batch_rows: int = 1) -> None:
        """engine_options: get_engine's options for an engine named by `engine` (voice.engines.engine_options:
        the fast path on CUDA). lanes: utterances the engine may speak at the same time (engines with `set_lanes`:
        CosyVoice 2's live stream; each lane a decoder and flow solver of its own over the same weights); a new
        utterance takes the lane with the fewest utterances under way. Other engines have one lane (logged).
        batch_rows (serve --tts-batch): with one lane, up to this many sessions' pieces share one flow solve (engines
        with `set_flow_rows`: CosyVoice 2's fast path); the lane's lock is then held for a piece's tokens only, its
        audio made outside it (see _pieces). 1 = off."""
        from ...voice.engines import get_engine

        self.engine = get_engine(engine, **(engine_options or {})) if isinstance(engine, str) else engine
        self.engine_name = engine if isinstance(engine, str) else self.engine.name
        self.speaker, self.base_voice = speaker, base_voice
        self.backend, self.language, self.speed = backend, language, speed
        self.token_limits = token_limits
        self.first_hop_tokens = first_hop_tokens  # CosyVoice 2's first piece (None: the engine's FIRST_HOP_TOKENS)
        self.prepared: dict[str, int] = {}  # what warm() captured ahead (CosyVoice 2 on CUDA)
        self.engine.check_files()
        self.rate = int(self.engine.sample_rate)
        self.lanes = self._make_lanes(int(lanes))
        self.lm_rows = 1  # --tts-batch's LM half: sessions' generations decode together (no lock around the LM)
        self.batch_rows = self._make_batch_rows(int(batch_rows))
        self._locks = [FirstPiecesFirst() for _ in range(self.lanes)]
        self._under_way = [0] * self.lanes  # utterances speaking on each lane
        self._assign = threading.Lock()

    def _make_lanes(self, lanes: int) -> int:
        if check_tts_lanes(lanes, cuda=self.cuda_device is not None) == 1:
            return 1
        if not (hasattr(self.engine, "set_lanes") and hasattr(self.engine, "live_stream") and self.speed == 1.0):
            log.warning("live: the %s voice speaks one piece at a time (lanes are CosyVoice 2's live stream's); "
                        "--tts-lanes %d ignored", self.engine_name, lanes)
            return 1
        if self.cuda_device is None:
            log.warning("live: %d TTS lanes on the CPU share its cores (lanes pay off on a GPU, where their work "
                        "overlaps)", lanes)
        made = int(self.engine.set_lanes(lanes))
        if made < lanes:
            log.warning("live: %d TTS lanes asked, %d made (the engine's most)", lanes, made)
        return made

    def _make_batch_rows(self, rows: int) -> int:
        if rows < 1:
            raise ValueError(f"--tts-batch must be at least 1, got {rows} (1: each session's piece solved alone)")
        if rows == 1:
            return 1
        if self.lanes > 1 or self.speed != 1.0 or not hasattr(self.engine, "set_flow_rows"):
            log.warning("live: --tts-batch %d ignored (it batches CosyVoice 2's live stream on one lane at speed 1; "
                        "this voice: %s, %d lanes, speed %.2f)", rows, self.engine_name, self.lanes, self.speed)
            return 1
        made = int(self.engine.set_flow_rows(rows))
        self.lm_rows = int(self.engine.set_lm_rows(rows)) if hasattr(self.engine, "set_lm_rows") else 1
        if made == 1 and self.lm_rows == 1:
            log.warning("live: --tts-batch %d ignored: the %s voice has no padded flow solver (its fast path is off)",
                        rows, self.engine_name)
            return 1
        log.info("live: --tts-batch %d: flow solves shared by up to %d sessions' pieces, LM steps by up to %d "
                 "sessions (1: not shared)", rows, made, self.lm_rows)
        return max(made, self.lm_rows)

    @property
    def flow_batching(self) -> dict[str, int] | None:
        """How the flow solves were shared (--tts-batch; the engine's flow_batching), or None."""
        return self.engine.flow_batching() if self.batch_rows > 1 else None

    @property
    def lm_batching(self) -> dict[str, Any] | None:
        """How the LM steps were shared (--tts-batch; the engine's lm_batching), or None."""
        return self.engine.lm_batching() if self.lm_rows > 1 else None

    @contextmanager
    def _lane(self) -> Iterator[int]:
        """The lane for one utterance: the one with the fewest utterances under way (the lowest on a tie)."""
        with self._assign:
            lane = min(range(self.lanes), key=lambda i: (self._under_way[i], i))
            self._under_way[lane] += 1
        try:
            yield lane
        finally:
            with self._assign:
                self._under_way[lane] -= 1

    @property
    def cuda_device(self) -> str | None:
        """The CUDA device the engine runs on ("cuda", "cuda:1"; CosyVoice 2 and 3 say theirs), or None (the CPU,
        ONNX Runtime, an engine that does not say): a session's TTS stage queues its work on a stream of its own
        there (session.Session._stage_stream). Loads nothing."""
        from ...engines.cuda_streams import cuda_device_name

        return cuda_device_name(getattr(self.engine, "device", None))

    def warm(self, max_speech_seconds: float = 20.0) -> Piece:
        """One short sentence, so that no utterance pays the model load; and
        an engine with CUDA graphs (CosyVoice 2's fast path) captures every graph a text chunk of up to
        `max_speech_seconds` needs now: a capture while sessions run the talking head on other threads would stall
        the stream (and, in CUDA's global capture mode, fail)."""
        if hasattr(self.engine, "prepare_live") and self.speaker is not None:
            with ExitStack() as held:
                for lock in self._locks:
                    held.enter_context(lock.hold(0))
                self.prepared = self.engine.prepare_live(self.speaker, max_speech_seconds)
        warmed = [list(self._pieces("Hello.", lane))[0] for lane in range(self.lanes)]  # every lane's first use
        return warmed[0]

    def pieces(self, text: str) -> Iterator[Piece]:
        with self._lane() as lane:
            yield from self._pieces(text, lane)

    def _on_lane(self, lane: int) -> Any:
        """The context of one call on `lane`: with several lanes on a CUDA device, the lane's own stream
        (cuda_streams.tts_lane_role; the session's TTS stage stream is one stream for every session, and lanes on one
        stream would run one after another on the device); with one lane, or off CUDA, nothing."""
        if self.lanes == 1:
            return nullcontext()
        from ...engines.cuda_streams import thread_stream, tts_lane_role, tts_priority

        return thread_stream(self.cuda_device, tts_priority(), role=tts_lane_role(lane))

    def _pieces(self, text: str, lane: int) -> Iterator[Piece]:
        lock = self._locks[lane]
        if self.engine_name != "kokoro":
            if hasattr(self.engine, "live_stream") and self.speed == 1.0:
                # pausable: PAUSEs every 16 tokens without a piece, where a waiting first piece may take the LM (below)
                hop = {"pausable": True}
                if self.first_hop_tokens:
                    hop["first_hop_tokens"] = self.first_hop_tokens
                if self.lanes > 1:
                    hop["lane"] = lane
                if self.batch_rows > 1:
                    hop["deferred"] = True
                stream = self.engine.live_stream(text, self.speaker, language=self.language, limits=self.token_limits,
                                                 **hop)
            else:
                stream = self.engine.stream(text, self.speaker, language=self.language, speed=self.speed)
            made, marks = 0, {}
            batched_lm = self.lm_rows > 1  # the LM decodes every session's row together: no turns to take
            while True:
                with (nullcontext() if batched_lm else lock.hold(0 if made == 0 else 1)), self._on_lane(lane):
                    if not made:  # per call: never across a yield
                        marks.setdefault("tts_lock", time.perf_counter())
                    wave = next(stream, None)
                    # a deferred stream's pause (--tts-batch): the LM goes to a waiting first piece, else on
                    while getattr(wave, "is_pause", False) and (batched_lm or not lock.first_piece_waiting()):
                        wave = next(stream, None)
                if getattr(wave, "is_pause", False):
                    continue  # given up for a first piece; this utterance queues again at its own priority
                if wave is None:
                    return
                if callable(wave):  # deferred (--tts-batch): the audio made outside the lock, where the flow solves
                    if not made:    # of sessions whose tokens are ready meet in the flow batcher
                        marks["tts_tokens"] = time.perf_counter()
                    wave = wave()
                made += 1
                yield Piece(np.asarray(wave, np.float32), marks=marks if made == 1 else {})
        from ...text.chunking import split_first_piece, split_sentences
        from ...voice.tts import synthesize_speech

        marks = {}
        for i, sentence in enumerate(split_first_piece(split_sentences(text))):
            with lock.hold(0 if i == 0 else 1):
                if i == 0:
                    marks["tts_lock"] = time.perf_counter()
                result = synthesize_speech(sentence.text, self.speaker, language=self.language, speed=self.speed,
                                           backend=self.backend, base_voice=self.base_voice)
            wave, phones = trim_edges(result.waveform, result.sample_rate, result.phones)
            pause = np.zeros(int(round(sentence.pause_after_s * result.sample_rate)), np.float32)
            yield Piece(np.concatenate([wave, pause]), phones, marks=marks if i == 0 else {})
