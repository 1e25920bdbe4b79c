"""The live server's voice: one TTS engine and speaker shared by every session; text -> pieces as they are made."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Piece:
    wave: np.ndarray          # float32 mono at the voice's rate
    phones: Any = None        # (phone, start_s, end_s) of the piece, when the engine says (Kokoro)


class LiveVoice:
    """engine + speaker (+ a bundled Kokoro voice); `pieces(text)` yields speech sentence by sentence (Kokoro),
    or as the engine's stream yields it (CosyVoice 2). One lock: the engines' sessions are shared."""

    def __init__(self, engine: str = "kokoro", speaker: Any = None, base_voice: str = "auto",
                 backend: str = "auto", language: str = "auto", speed: float = 1.0) -> None:
        from ...voice.engines import get_engine

        self.engine_name, self.speaker, self.base_voice = engine, speaker, base_voice
        self.backend, self.language, self.speed = backend, language, speed
        self.engine = get_engine(engine)
        self.engine.check_files()
        self.rate = int(self.engine.sample_rate)
        self._lock = threading.Lock()

    def warm(self) -> Piece:
        """One short sentence, so the first utterance of the first live session does not pay the model load."""
        return list(self.pieces("Hello."))[0]

    def pieces(self, text: str) -> Iterator[Piece]:
        if self.engine_name != "kokoro":
            stream = self.engine.stream(text, self.speaker, language=self.language, speed=self.speed)
            while True:
                with self._lock:
                    wave = next(stream, None)
                if wave is None:
                    return
                yield Piece(np.asarray(wave, np.float32))
        from ...text.chunking import split_sentences
        from ...voice.tts import synthesize_speech

        for sentence in split_sentences(text):
            with self._lock:
                result = synthesize_speech(sentence.text, self.speaker, language=self.language, speed=self.speed,
                                           backend=self.backend, base_voice=self.base_voice)
            pause = np.zeros(int(round(sentence.pause_after_s * result.sample_rate)), np.float32)
            yield Piece(np.concatenate([result.waveform, pause]), result.phones)
