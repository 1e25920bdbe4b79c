"""Fit a Kokoro voice to a speaker profile (the voice-imitation step of ExtractSpeakerEmbedding).

Each candidate voice pack speaks fixed probe sentences (never the user's text); the GE2E similarity
of that speech to the speaker's embedding is the score the search in imitation.py maximises. The
result is stored on the profile (and in the disk cache, keyed by content hash + settings) so a voice
is fitted once.
"""
from __future__ import annotations

import logging
from typing import Callable

import numpy as np

from ..engines import speaker_encoder as se
from .imitation import ImitationResult, imitate
from .speaker import SpeakerProfile
from .tts import KEY_BASE_VOICE, KEY_OFFSET, KEY_SCORES, SAMPLE_RATE, bundled_voices, synthesize_speech

log = logging.getLogger(__name__)

# Probe sentences: phonetically varied, and disjoint from anything the benchmark evaluates on.
PROBES = {
    "en": "Please call Stella and ask her to bring these things with her from the store.",
    "zh": "我们明天早上九点在学校门口见面，然后一起去图书馆看书。",
}
KEY_SIMILARITY = "imitation_similarity"
KEY_BASE_SIMILARITY = "imitation_base_similarity"
KEY_SETTINGS = "imitation_settings"


def probe_language(speaker: SpeakerProfile, language: str) -> str:
    if language in PROBES:
        return language
    if speaker.reference_text:
        from ..text.language import detect_language

        try:
            return detect_language(speaker.reference_text)
        except ValueError:
            pass
    return "en"


def make_scorer(target: np.ndarray, probe_text: str, backend: str, precision: str) -> Callable[[np.ndarray], float]:
    """pack -> GE2E cosine of the probe sentence spoken with that pack to the target embedding."""
    import librosa

    embed = se.default_run_fn(backend=backend, precision=precision)

    def score(pack: np.ndarray) -> float:
        speech = synthesize_speech(probe_text, voice_pack=pack, backend=backend, precision=precision).waveform
        wav16 = librosa.resample(speech, orig_sr=SAMPLE_RATE, target_sr=se.SAMPLE_RATE)
        embedding, _ = se.embed_utterance(wav16, embed)
        return se.cosine(embedding, target)

    return score


def fit_voice(speaker: SpeakerProfile, *, budget: int = 24, seed: int = 0, language: str = "auto",
              backend: str = "auto", precision: str = "auto",
              progress: Callable[[int, int], None] | None = None) -> tuple[SpeakerProfile, ImitationResult]:
    """Return a copy of `speaker` carrying the imitated voice (base voice + timbre offset)."""
    lang = probe_language(speaker, language)
    scorer = make_scorer(speaker.embedding, PROBES[lang], backend, precision)
    voices = bundled_voices()
    result = imitate(voices, scorer, budget=budget, seed=seed, progress=progress)
    log.info("voice imitation: best bundled %s %.3f -> imitated %.3f after %d syntheses",
             result.base_voice, result.base_similarity, result.similarity, result.evaluations)
    fitted = speaker.copy()
    fitted.extras[KEY_BASE_VOICE] = np.array(result.base_voice)
    fitted.extras[KEY_OFFSET] = result.timbre_offset.astype(np.float32)
    fitted.extras[KEY_SCORES] = np.array([result.voice_scores[name] for name in voices], np.float32)
    fitted.extras[KEY_SIMILARITY] = np.array(result.similarity, np.float32)
    fitted.extras[KEY_BASE_SIMILARITY] = np.array(result.base_similarity, np.float32)
    fitted.extras[KEY_SETTINGS] = np.array(f"budget={budget};seed={seed};lang={lang}")
    fitted.style = result.apply(voices[result.base_voice])[len(voices[result.base_voice]) // 4].reshape(-1)
    return fitted, result


def has_fitted_voice(speaker: SpeakerProfile, budget: int, seed: int, language: str) -> bool:
    settings = speaker.extras.get(KEY_SETTINGS)
    lang = probe_language(speaker, language)
    return settings is not None and str(settings) == f"budget={budget};seed={seed};lang={lang}"
