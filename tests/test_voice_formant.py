"""Formant scaling (voice/formant.py) and the log-domain EQ (voice/spectral_match.py) on known signals."""
import numpy as np
import pytest
from scipy.signal import lfilter

from digital_human.voice import spectral_match as sm
from digital_human.voice.formant import FORMANT_RANGE, clip_formant, formant_shift, synthesis_controls

SR = 24000


def _peak_hz(wave: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(wave * np.hanning(wave.size)))
    return float(np.fft.rfftfreq(wave.size, 1 / SR)[np.argmax(spectrum)])


def test_formant_shift_scales_every_frequency_and_the_duration():
    t = np.arange(SR) / SR
    tone = (0.5 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32)
    up = formant_shift(tone, SR, 1.1)
    assert up.dtype == np.float32
    assert abs(up.size - SR / 1.1) <= 2
    assert _peak_hz(up) == pytest.approx(1100, abs=3)
    assert _peak_hz(formant_shift(tone, SR, 0.9)) == pytest.approx(900, abs=3)
    assert np.array_equal(formant_shift(tone, SR, 1.0), tone)  # 1 is an exact no-op


@pytest.mark.parametrize("size", [1, 7, 24000 * 2 + 17])
@pytest.mark.parametrize("formant", [0.8, 1.08, 1.32])
def test_formant_shift_is_exactly_what_librosa_resample_gives(size: int, formant: float):
    # soxr is called directly (no librosa import at startup): voices fitted before must sound the same
    librosa = pytest.importorskip("librosa")
    wave = (0.3 * np.random.default_rng(size).standard_normal(size)).astype(np.float32)
    expected = librosa.resample(wave, orig_sr=SR * formant, target_sr=float(SR), res_type="soxr_hq")
    assert np.array_equal(formant_shift(wave, SR, formant), expected.astype(np.float32))


def test_synthesis_controls_cancel_the_pitch_and_tempo_change():
    f0, speed = synthesis_controls(1.2, 1.0, 1.1)
    # Kokoro speaks at pitch 1.2/1.1 and 1/1.1 the speed; playing it 1.1x faster gives pitch 1.2, tempo 1
    assert f0 * 1.1 == pytest.approx(1.2) and speed * 1.1 == pytest.approx(1.0)
    assert clip_formant(5.0) == FORMANT_RANGE[1] and clip_formant(0.1) == FORMANT_RANGE[0]
    with pytest.raises(ValueError, match="formant"):
        formant_shift(np.ones(100, np.float32), SR, 3.0)


def test_log_domain_eq_matches_the_log_spectrum():
    rng = np.random.default_rng(0)
    reference = lfilter([1.0], [1.0, -0.9], rng.standard_normal(3 * SR) * 0.1).astype(np.float32)
    synthetic = (rng.standard_normal(3 * SR) * 0.1).astype(np.float32)
    ref_log = sm.long_term_log_spectrum(reference, SR)
    assert ref_log.shape == (sm.N_BANDS,) and ref_log[0] > ref_log[-1] + 10  # low-pass tilt seen
    gains = sm.fit_eq(ref_log, synthetic, SR, domain="log")
    matched = sm.long_term_log_spectrum(sm.apply_eq(synthetic, SR, gains), SR)
    before = np.abs((ref_log - ref_log.mean()) - (sm.long_term_log_spectrum(synthetic, SR)
                                                    - sm.long_term_log_spectrum(synthetic, SR).mean())).mean()
    after = np.abs((ref_log - ref_log.mean()) - (matched - matched.mean())).mean()
    assert after < 0.5 * before
    with pytest.raises(ValueError, match="domain"):
        sm.fit_eq(ref_log, synthetic, SR, domain="cepstrum")
