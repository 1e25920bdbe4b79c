"""Fit a Kokoro voice to a speaker profile (the voice-imitation step of ExtractSpeakerEmbedding).

Each candidate voice pack speaks fixed probe sentences (never the user's text); the GE2E similarity
of that speech to the speaker's embedding is the score the search in imitation.py maximises. The
result is stored on the profile (and in the disk cache, keyed by content hash + settings) so a voice
is fitted once.

Two probe sentences with different sounds are spoken together: with one sentence the search partly
fitted that sentence (probe gains transferred only ~1/3 to new text) and the base-voice ranking
flipped for 3 of 7 benchmark speakers. When the reference audio is given, the scorer also applies
the long-term spectral EQ of spectral_match.py (re-derived for every candidate from its own probe
speech), so the search optimises the voice as it will finally sound; the EQ of the winner is
stored on the profile and applied by tts.py.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np

from ..engines import speaker_encoder as se
from .imitation import ImitationResult, imitate
from .speaker import SpeakerProfile
from . import spectral_match as sm
from .tts import (KEY_BASE_VOICE, KEY_EQ, KEY_F0, KEY_OFFSET, KEY_SCORES, SAMPLE_RATE, bundled_voices,
                  synthesize_speech)

log = logging.getLogger(__name__)

# Probe text: two short, phonetically different sentences per language, spoken as one utterance (about
# as long as the single v2 probe sentence, so a search costs about the same); disjoint from anything
# the benchmark evaluates on.
PROBES = {
    "en": "Please call Stella and bring these things from the store. How much juice did Joe squeeze on Thursday?",
    "zh": "我们明天早上九点在学校门口见面。这件衬衫的颜色太深了，你觉得呢？",
}
KEY_REFERENCE_LTAS = "reference_ltas"  # dB per mel band of the reference speech (spectral_match.py)
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

    def __init__(self, target: np.ndarray, probe_text: str, backend: str, precision: str,
                 reference_ltas: np.ndarray | None = None) -> None:
        self.target = target
        self.reference_ltas = reference_ltas
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

    def eq(self, pack: np.ndarray, f0: float) -> np.ndarray | None:
        """EQ gains (dB per band) that match this voice's probe speech to the reference, None without one."""
        if self.reference_ltas is None:
            return None
        return sm.fit_eq(self.reference_ltas, self.speech(pack, f0), SAMPLE_RATE)

    def __call__(self, pack: np.ndarray, f0: float) -> float:
        import librosa

        wave = self.speech(pack, f0)
        gains = self.eq(pack, f0)
        if gains is not None:
            wave = sm.apply_eq(wave, SAMPLE_RATE, gains)
        wav16 = librosa.resample(wave, orig_sr=SAMPLE_RATE, target_sr=se.SAMPLE_RATE)
        embedding, _ = se.embed_utterance(wav16, self.embed)
        return se.cosine(embedding, self.target)


def median_pitch(wave: np.ndarray, sample_rate: int = SAMPLE_RATE) -> float:
    """Median F0 (Hz) of voiced frames, NaN when nothing is voiced (pYIN at 8 kHz: cheap, enough here)."""
    import librosa

    wav8 = librosa.resample(wave, orig_sr=sample_rate, target_sr=8000)
    f0, voiced, _ = librosa.pyin(wav8, fmin=60, fmax=450, sr=8000, frame_length=512)
    voiced_f0 = f0[voiced & np.isfinite(f0)]
    return float(np.median(voiced_f0)) if voiced_f0.size else float("nan")


def reference_ltas(reference: Any) -> np.ndarray:
    """Long-term spectrum of a reference clip: a PreparedAudio (waveform, sample_rate) or a (wave, rate) pair."""
    if isinstance(reference, tuple) and len(reference) == 2:
        wave, rate = reference
    elif hasattr(reference, "waveform") and hasattr(reference, "sample_rate"):
        wave, rate = reference.waveform, reference.sample_rate
    else:
        raise TypeError(f"reference must be prepared audio (waveform, sample_rate) or a (wave, rate) tuple, "
                        f"got {type(reference).__name__}")
    return sm.long_term_spectrum(np.asarray(wave, np.float32), int(rate), sm.N_BANDS).astype(np.float32)


def fit_voice(speaker: SpeakerProfile, *, budget: int = 24, seed: int = 0, language: str = "auto",
              backend: str = "auto", precision: str = "auto",
              progress: Callable[[int, int], None] | None = None,
              reference: Any = None) -> tuple[SpeakerProfile, ImitationResult]:
    """Return a copy of `speaker` carrying the imitated voice (base voice + timbre offset + pitch, and
    a spectral EQ when the reference's long-term spectrum is known).

    reference: the prepared reference audio the profile came from (PreparedAudio or (wave, rate)).
    Its long-term spectrum is stored on the profile, so a later refit needs no audio. Without it
    (and without a stored spectrum) the voice is fitted without EQ.
    """
    lang = probe_language(speaker, language)
    ltas = reference_ltas(reference) if reference is not None else speaker.extras.get(KEY_REFERENCE_LTAS)
    ltas = None if ltas is None else np.asarray(ltas, np.float32).reshape(-1)
    scorer = ProbeScorer(speaker.embedding, PROBES[lang], backend, precision, reference_ltas=ltas)
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
    fitted.extras.pop(KEY_EQ, None)
    if ltas is not None:
        fitted.extras[KEY_REFERENCE_LTAS] = ltas
        fitted.extras[KEY_EQ] = scorer.eq(result.apply(voices[result.base_voice]), result.f0_scale)
    fitted.extras[KEY_SETTINGS] = np.array(settings_key(budget, seed, lang))
    fitted.style = result.apply(voices[result.base_voice])[len(voices[result.base_voice]) // 4].reshape(-1)
    return fitted, result


def has_fitted_voice(speaker: SpeakerProfile, budget: int, seed: int, language: str,
                     reference: Any = None) -> bool:
    """True when the speaker carries a voice fitted with these settings (and with an EQ when a
    reference is given now: a voice fitted without the audio is refitted once the audio is known)."""
    settings = speaker.extras.get(KEY_SETTINGS)
    lang = probe_language(speaker, language)
    if reference is not None and KEY_EQ not in speaker.extras:
        return False
    return settings is not None and str(settings) == settings_key(budget, seed, lang)


def settings_key(budget: int, seed: int, lang: str) -> str:
    # v2: the search also fits pitch. v3: two-sentence probe, pitch prior on the base voice, spectral EQ.
    # Voices fitted by older versions are refitted.
    return f"v3;budget={budget};seed={seed};lang={lang}"
