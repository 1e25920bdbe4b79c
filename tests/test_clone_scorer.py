"""ProbeScorer's EQ-variant choice and the stored reference spectra, with a fake synthesizer/encoder."""
import numpy as np
import pytest

from digital_human.voice import clone, parallel
from digital_human.voice import spectral_match as sm

SR = 24000


def _scorer(spectra, similarity):
    scorer = clone.ProbeScorer.__new__(clone.ProbeScorer)  # no models: speech and similarity are faked
    scorer.reference_ltas = spectra
    scorer._speech, scorer._eq = {}, {}
    scorer.speed = clone.SEARCH_SPEED  # set by __init__ (the probe's speaking rate, part of the cache keys)
    rng = np.random.default_rng(0)
    wave = (rng.standard_normal(2 * SR) * 0.1).astype(np.float32)
    scorer.speech = lambda pack, f0, formant=1.0: wave
    scorer.speech_many = lambda candidates: [wave for _ in candidates]
    scorer.pool = parallel.WorkerPool(1)
    scorer.similarity = similarity
    return scorer, wave


def test_scorer_keeps_the_best_eq_variant_and_remembers_it():
    rng = np.random.default_rng(1)
    reference = (rng.standard_normal(2 * SR) * 0.1).astype(np.float32)
    spectra = clone.reference_spectra((reference, SR))
    assert set(spectra) == {"power", "log"} and spectra["log"].shape == (sm.N_BANDS,)
    # a fake encoder that prefers more high-frequency energy: the strongest treble boost should win
    spectra = {k: v + np.linspace(-10, 10, v.size).astype(np.float32) for k, v in spectra.items()}
    calls = []

    def similarity(wave):
        calls.append(1)
        spectrum = np.abs(np.fft.rfft(wave)) ** 2
        return float(spectrum[spectrum.size // 2:].sum() / spectrum.sum())

    scorer, wave = _scorer(spectra, similarity)
    pack = np.zeros((4, 1, 256), np.float32)
    best = scorer(pack, 1.0, 1.0)
    assert len(calls) == len(clone.EQ_DOMAINS) * len(clone.EQ_STRENGTHS)
    gains = scorer.eq(pack, 1.0, 1.0)
    assert best == pytest.approx(similarity(sm.apply_eq(wave, SR, gains)))
    assert gains[-1] > gains[0]  # a treble boost
    scorer(pack, 1.0, 1.0)
    assert len(calls) == len(clone.EQ_DOMAINS) * len(clone.EQ_STRENGTHS) + 1  # cached, not re-scored


def test_scorer_without_spectra_scores_the_plain_speech_and_v3_profiles_use_power_only():
    scorer, wave = _scorer({}, lambda w: 0.5)
    assert scorer(np.zeros((4, 1, 256), np.float32), 1.0) == 0.5 and scorer.eq(np.zeros((4, 1, 256), np.float32), 1.0) is None
    stored = {clone.KEY_REFERENCE_LTAS: np.zeros(sm.N_BANDS, np.float32)}  # a v3 fit stored only this
    assert set(clone.reference_spectra(None, stored)) == {"power"}
    assert clone.reference_spectra(None, {}) == {}
