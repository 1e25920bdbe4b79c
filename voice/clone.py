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
from .tts import KEY_BASE_VOICE, KEY_F0, KEY_OFFSET, KEY_SCORES, SAMPLE_RATE, bundled_voices, synthesize_speech

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


class ProbeScorer:
    """(voice pack, f0 scale) -> GE2E cosine of the probe sentence spoken that way to the target.

    Remembers the speech of the last syntheses so measuring a voice's pitch and scoring it share
    one synthesis.
    """

    def __init__(self, target: np.ndarray, probe_text: str, backend: str, precision: str) -> None:
        self.target = target
        self.probe_text = probe_text
        self.backend, self.precision = backend, precision
        self.embed = se.default_run_fn(backend=backend, precision=precision)
        self._speech: dict[tuple[bytes, float], np.ndarray] = {}

    def speech(self, pack: np.ndarray, f0: float) -> np.ndarray:
        import hashlib

        key = (hashlib.sha1(np.ascontiguousarray(pack).tobytes()).digest(), round(float(f0), 5))
        if key not in self._speech:
            if len(self._speech) > 16:
                self._speech.clear()
            self._speech[key] = synthesize_speech(self.probe_text, voice_pack=pack, f0_scale=f0,
                                                  backend=self.backend, precision=self.precision).waveform
        return self._speech[key]

    def __call__(self, pack: np.ndarray, f0: float) -> float:
        import librosa

        wav16 = librosa.resample(self.speech(pack, f0), orig_sr=SAMPLE_RATE, target_sr=se.SAMPLE_RATE)
        embedding, _ = se.embed_utterance(wav16, self.embed)
        return se.cosine(embedding, self.target)


def median_pitch(wave: np.ndarray, sample_rate: int = SAMPLE_RATE) -> float:
    """Median F0 (Hz) of voiced frames, NaN when nothing is voiced (pYIN at 8 kHz: cheap, enough here)."""
    import librosa

    wav8 = librosa.resample(wave, orig_sr=sample_rate, target_sr=8000)
    f0, voiced, _ = librosa.pyin(wav8, fmin=60, fmax=450, sr=8000, frame_length=512)
    voiced_f0 = f0[voiced & np.isfinite(f0)]
    return float(np.median(voiced_f0)) if voiced_f0.size else float("nan")


def fit_voice(speaker: SpeakerProfile, *, budget: int = 24, seed: int = 0, language: str = "auto",
              backend: str = "auto", precision: str = "auto",
              progress: Callable[[int, int], None] | None = None) -> tuple[SpeakerProfile, ImitationResult]:
    """Return a copy of `speaker` carrying the imitated voice (base voice + timbre offset)."""
    lang = probe_language(speaker, language)
    scorer = ProbeScorer(speaker.embedding, PROBES[lang], backend, precision)
    voices = bundled_voices()
    pitch_match = None
    target_pitch = float(speaker.pitch_hz_median)
    if np.isfinite(target_pitch) and target_pitch > 0:
        # each voice's own pitch on the probe; the synthesis is reused when the search scores it
        pitch_match = {name: target_pitch / median_pitch(scorer.speech(pack, 1.0)) for name, pack in voices.items()}
        pitch_match = {name: ratio for name, ratio in pitch_match.items() if np.isfinite(ratio)}
    result = imitate(voices, scorer, budget=budget, seed=seed, progress=progress, pitch_match=pitch_match)
    log.info("voice imitation: best bundled voice %.3f -> imitated %.3f (%s, pitch x%.2f) after %d syntheses",
             result.base_similarity, result.similarity, result.base_voice, result.f0_scale, result.evaluations)
    fitted = speaker.copy()
    fitted.extras[KEY_BASE_VOICE] = np.array(result.base_voice)
    fitted.extras[KEY_OFFSET] = result.timbre_offset.astype(np.float32)
    fitted.extras[KEY_F0] = np.array(result.f0_scale, np.float32)
    fitted.extras[KEY_SCORES] = np.array([result.voice_scores[name] for name in voices], np.float32)
    fitted.extras[KEY_SIMILARITY] = np.array(result.similarity, np.float32)
    fitted.extras[KEY_BASE_SIMILARITY] = np.array(result.base_similarity, np.float32)
    fitted.extras[KEY_SETTINGS] = np.array(settings_key(budget, seed, lang))
    fitted.style = result.apply(voices[result.base_voice])[len(voices[result.base_voice]) // 4].reshape(-1)
    return fitted, result


def has_fitted_voice(speaker: SpeakerProfile, budget: int, seed: int, language: str) -> bool:
    settings = speaker.extras.get(KEY_SETTINGS)
    lang = probe_language(speaker, language)
    return settings is not None and str(settings) == settings_key(budget, seed, lang)


def settings_key(budget: int, seed: int, lang: str) -> str:
    # v2: the search also fits pitch; voices fitted by v1 are refitted
    return f"v2;budget={budget};seed={seed};lang={lang}"
