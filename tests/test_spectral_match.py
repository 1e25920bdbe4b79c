"""Long-term spectral EQ (voice/spectral_match.py) on signals with a known spectrum."""
import numpy as np
import pytest
from scipy.signal import lfilter

from digital_human.voice import spectral_match as sm

SR = 24000


def _noise(seed: int, seconds: float = 3.0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(int(SR * seconds)).astype(np.float32) * 0.1


def _shape(ltas: np.ndarray) -> np.ndarray:
    return ltas - ltas.mean()


def test_eq_moves_the_long_term_spectrum_towards_the_reference():
    reference = lfilter([1.0], [1.0, -0.9], _noise(0)).astype(np.float32)  # strong low-pass tilt (~-20 dB)
    synthetic = _noise(1)  # flat
    ref_ltas, syn_ltas = sm.long_term_spectrum(reference, SR), sm.long_term_spectrum(synthetic, SR)
    gains = sm.eq_curve(ref_ltas, syn_ltas)
    assert gains.shape == (sm.N_BANDS,)
    assert gains[0] > 5 and gains[-1] < -5  # boosts lows, cuts highs
    assert np.abs(gains).max() <= sm.MAX_GAIN_DB + 1e-6
    matched = sm.apply_eq(synthetic, SR, gains)
    before = np.abs(_shape(ref_ltas) - _shape(syn_ltas)).mean()
    after = np.abs(_shape(ref_ltas) - _shape(sm.long_term_spectrum(matched, SR))).mean()
    assert after < 0.5 * before


def test_identical_spectra_give_a_flat_curve_and_a_no_op():
    ltas = sm.long_term_spectrum(_noise(2), SR)
    gains = sm.eq_curve(ltas, ltas)
    assert np.allclose(gains, 0.0)
    wave = _noise(3, 1.0)
    assert np.array_equal(sm.apply_eq(wave, SR, gains), wave)


def test_apply_eq_keeps_length_level_and_timing():
    wave = np.zeros(SR, np.float32)
    wave[SR // 2] = 1.0  # an impulse: any delay would move its peak
    gains = np.linspace(-6, 6, sm.N_BANDS).astype(np.float32)
    out = sm.apply_eq(wave, SR, gains)
    assert out.shape == wave.shape and out.dtype == np.float32
    assert int(np.argmax(np.abs(out))) == SR // 2
    assert np.sqrt(np.mean(out ** 2)) == pytest.approx(np.sqrt(np.mean(wave ** 2)), rel=1e-4)
    half = sm.apply_eq(wave, SR, gains, strength=0.5)
    assert not np.allclose(half, out)


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="non-silent samples"):
        sm.long_term_spectrum(np.zeros(SR, np.float32), SR)
    with pytest.raises(ValueError, match="sample_rate"):
        sm.long_term_spectrum(_noise(4), 8000)
    with pytest.raises(ValueError, match="shapes differ"):
        sm.eq_curve(np.zeros(40), np.zeros(24))


def test_fit_eq_refines_towards_the_reference_and_respects_the_limit():
    reference = lfilter([1.0, -0.7], [1.0], _noise(5)).astype(np.float32)  # high-pass tilt
    synthetic = _noise(6)
    ref_ltas = sm.long_term_spectrum(reference, SR)
    one = sm.fit_eq(ref_ltas, synthetic, SR, iterations=1)
    two = sm.fit_eq(ref_ltas, synthetic, SR, iterations=2)

    def error(gains):
        return np.abs(_shape(ref_ltas) - _shape(sm.long_term_spectrum(sm.apply_eq(synthetic, SR, gains), SR))).mean()

    assert error(two) < error(one) < error(np.zeros_like(one))
    assert np.abs(sm.fit_eq(ref_ltas, synthetic, SR, max_gain_db=2.0)).max() <= 2.0 + 1e-6
