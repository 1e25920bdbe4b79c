"""Kokoro-82M (with the pack's voice imitation) as a TTS engine: today's path, unchanged."""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from .imitation import DEFAULT_BUDGET
from .speaker import SpeakerProfile
from .tts import SAMPLE_RATE, SpeechResult, synthesize_speech


class KokoroEngine:
    name = "kokoro"
    sample_rate = SAMPLE_RATE
    description = "Kokoro-82M (Apache-2.0), embedded; the voice is imitated from the reference by a timbre search."

    def check_files(self) -> None:  # embedded: its files come with the pack's setup step
        return None

    def prepare_speaker(self, prepared: Any, transcript: str = "", speaker: SpeakerProfile | None = None,
                        budget: int = DEFAULT_BUDGET, seed: int = 0, backend: str = "auto", **_: Any) -> SpeakerProfile:
        from .clone import fit_voice

        if speaker is None:
            raise ValueError("prepare_speaker needs the speaker profile of the clip (ExtractSpeakerEmbedding makes it)")
        return fit_voice(speaker, budget=budget, seed=seed, backend=backend, reference=prepared)[0]

    def synthesize(self, text: str, speaker: SpeakerProfile | None, language: str = "auto", speed: float = 1.0,
                   seed: int = 0, **options: Any) -> SpeechResult:
        return synthesize_speech(text, speaker, language=language, speed=speed, **options)  # Kokoro ignores seed

    def stream(self, text: str, speaker: SpeakerProfile | None, language: str = "auto", speed: float = 1.0,
               seed: int = 0, **options: Any) -> Iterator[np.ndarray]:
        """Sentence by sentence (Kokoro speaks each chunk independently anyway)."""
        from ..text.chunking import split_sentences

        for sentence in split_sentences(text):
            wave = synthesize_speech(sentence.text, speaker, language=language, speed=speed, **options).waveform
            yield np.concatenate([wave, np.zeros(int(round(sentence.pause_after_s * SAMPLE_RATE)), np.float32)])
