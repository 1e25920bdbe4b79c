"""prepare_reference / load_reference (mono, resample, trim, normalize, segment, errors) and the
ComfyUI AUDIO conversion, on real speech."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from digital_human.audio import (
    AudioInputError,
    NotEnoughSpeechError,
    SilentAudioError,
    from_comfy_audio,
    load_reference,
    prepare_reference,
    to_comfy_audio,
)
from digital_human.audio.prepare import SEGMENT_MAX_S, SEGMENT_MIN_S, TARGET_PEAK

CLIP = "spk_en_male_01.wav"        # 60 s, 16 kHz mono, continuous English speech
SR = 16000


@pytest.fixture(scope="module")
def speech(data_dir) -> np.ndarray:
    x, sr = sf.read(data_dir / "audio" / CLIP, dtype="float32")
    assert sr == SR
    return x


def _check_segments(p) -> None:
    sr = p.sample_rate
    last_end = 0
    for a, b in p.segments:
        assert SEGMENT_MIN_S * sr <= b - a <= SEGMENT_MAX_S * sr, (a, b)
        assert last_end <= a < b <= len(p.waveform)
        last_end = b


def _silence_with_noise(seconds: float, db: float, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(seconds * SR)) * 10 ** (db / 20)
            ).astype(np.float32)


# ----------------------------------------------------------------------------- happy path
def test_real_clip_end_to_end(data_dir):
    p = load_reference(data_dir / "audio" / CLIP)
    assert p.source == CLIP and p.sample_rate == 24000
    assert p.waveform.dtype == np.float32 and p.waveform.ndim == 1
    assert np.abs(p.waveform).max() == pytest.approx(TARGET_PEAK, abs=1e-3)
    assert p.duration_seconds == pytest.approx(len(p.waveform) / 24000)
    assert 35.0 < p.speech_seconds <= p.duration_seconds <= 60.0
    assert not p.capped and p.clipped_fraction == 0.0
    assert len(p.segments) >= 4
    _check_segments(p)
    # The segments hold most of the speech (none of it silently dropped).
    assert sum(b - a for a, b in p.segments) / 24000 >= 0.9 * p.speech_seconds
    assert not any("clipped" in w or "noise" in w for w in p.warnings), p.warnings


@pytest.mark.parametrize("fname", ["spk_zh_female_01.wav", "spk_en_female_02.mp3",
                                   "spk_zh_male_04_bilingual.m4a"])
def test_other_real_files(fname, data_dir):
    """Stereo 44.1 kHz wav, 44.1 kHz mp3, 48 kHz m4a -> mono 24 kHz, normalized, segmented."""
    p = load_reference(data_dir / "audio" / fname)
    assert p.waveform.ndim == 1 and p.sample_rate == 24000
    assert np.abs(p.waveform).max() == pytest.approx(TARGET_PEAK, abs=1e-3)
    assert p.segments
    _check_segments(p)


def test_trims_leading_and_trailing_silence(speech):
    core = speech[10 * SR: 18 * SR]
    pad = _silence_with_noise(2.0, -65)
    x = np.concatenate([pad, core, pad])
    p = prepare_reference(x, SR)
    # 4 s of padding removed; at most the VAD's onset/offset padding (~0.3 s) kept per side,
    # and no speech cut off (the excerpt starts/ends mid-speech).
    assert 7.5 <= p.duration_seconds <= 8.0 + 0.7, p.duration_seconds
    lead = np.argmax(np.abs(p.waveform) > 0.05) / 24000
    assert lead < 0.4


def test_resamples_to_target_rate(speech):
    p = prepare_reference(speech[: 12 * SR], SR, target_sr=22050)
    assert p.sample_rate == 22050
    assert 8.0 < p.duration_seconds <= 12.0     # the clip opens with ~3 s of silence


def test_integer_and_float_inputs_agree(speech):
    x = speech[: 10 * SR]
    pi = prepare_reference(np.round(x * 32767).astype(np.int16), SR)
    pf = prepare_reference(x, SR)
    assert len(pi.waveform) == len(pf.waveform)
    assert np.abs(pi.waveform - pf.waveform).max() < 1e-3


def test_polarity_cancelling_stereo_uses_one_channel(speech):
    x = speech[: 10 * SR]
    p = prepare_reference(np.stack([x, -x]), SR)
    assert any("cancel" in w for w in p.warnings)
    assert p.speech_seconds > 5.0


def test_quiet_recording_is_normalized_and_warned(speech):
    p = prepare_reference(speech[: 10 * SR] * 0.02, SR)
    assert np.abs(p.waveform).max() == pytest.approx(TARGET_PEAK, abs=1e-3)
    assert any("quietly" in w for w in p.warnings)


def test_click_louder_than_speech_is_warned(speech):
    """Peak normalization is set by a click, so the speech ends up quiet: say so."""
    x = speech[: 10 * SR] * 0.03
    x[5 * SR] = 0.95
    p = prepare_reference(x, SR)
    assert np.abs(p.waveform).max() == pytest.approx(TARGET_PEAK, abs=1e-3)
    assert any("click or bang" in w for w in p.warnings), p.warnings
    clean = prepare_reference(speech[: 10 * SR], SR)
    assert not any("click or bang" in w for w in clean.warnings)


def test_clipping_is_measured_and_warned(speech):
    x = np.clip(speech[: 10 * SR] * 6.0, -1.0, 1.0)
    p = prepare_reference(x, SR)
    expected = np.count_nonzero(np.abs(x) >= 0.999) / x.size
    assert p.clipped_fraction == pytest.approx(expected) and expected > 0.01
    assert any("clipped" in w for w in p.warnings)
    assert np.abs(p.waveform).max() == pytest.approx(TARGET_PEAK, abs=1e-3)


def test_noisy_recording_is_warned(speech):
    x = speech[: 15 * SR]
    noise = _silence_with_noise(15.0, 20 * np.log10(np.abs(x).max()) - 25, seed=3)
    p = prepare_reference(x + noise, SR)
    assert any("background noise" in w for w in p.warnings), p.warnings
    clean = prepare_reference(x, SR)
    assert p.speech_seconds > 0.8 * clean.speech_seconds   # speech still found under the noise


def test_long_input_is_capped_not_rejected(speech):
    p = prepare_reference(speech, SR, max_seconds=12.0)
    assert p.capped and p.input_seconds == pytest.approx(12.0)
    assert p.duration_seconds <= 12.0
    assert any("longer than 12 s" in w for w in p.warnings)
    _check_segments(p)


def test_load_reference_caps_while_decoding(data_dir):
    p = load_reference(data_dir / "audio" / "spk_en_female_02.mp3", max_seconds=9.0)
    assert p.capped and p.input_seconds == pytest.approx(9.0, abs=1e-3)
    assert p.source == "spk_en_female_02.mp3"


def test_scattered_words_still_give_a_segment(speech):
    """Five 0.9 s bursts 2.5 s apart: 4.5 s of speech, no pause short enough to merge across."""
    gap = _silence_with_noise(2.5, -70)
    parts = []
    for k in range(5):
        parts += [speech[(6 + 5 * k) * SR: int((6.9 + 5 * k) * SR)], gap]
    p = prepare_reference(np.concatenate(parts), SR)
    assert p.speech_seconds >= 3.0
    assert len(p.segments) == 1
    _check_segments(p)
    a, b = p.segments[0]
    assert (b - a) / 24000 >= 6.0      # spans several words, not one word padded with silence


# ----------------------------------------------------------------------------- errors
def test_digital_silence(speech):
    with pytest.raises(SilentAudioError, match=r"'take1.wav' is silent \(all samples are zero\)"):
        prepare_reference(np.zeros(5 * SR, np.float32), SR, source="take1.wav")


def test_near_silence_reports_peak():
    with pytest.raises(SilentAudioError, match=r"is silent \(peak -\d+ dBFS\); record again"):
        prepare_reference(_silence_with_noise(5.0, -80), SR)


def test_two_seconds_of_speech_is_too_little(speech):
    x = np.concatenate([_silence_with_noise(3.0, -65), speech[20 * SR: 22 * SR],
                        _silence_with_noise(3.0, -65, seed=1)])
    with pytest.raises(NotEnoughSpeechError) as e:
        prepare_reference(x, SR, source="short.wav")
    msg = str(e.value)
    found = float(re.search(r"only ([\d.]+) s of speech", msg).group(1))
    assert 1.0 <= found <= 2.1 and "at least 3 s" in msg and "short.wav" in msg


def test_noise_is_not_speech():
    with pytest.raises(NotEnoughSpeechError, match=r"only 0\.\d s of speech"):
        prepare_reference(_silence_with_noise(8.0, -25), SR)


def test_min_speech_is_configurable(speech):
    x = speech[20 * SR: 22 * SR]
    p = prepare_reference(x, SR, min_speech_seconds=1.0)
    assert p.speech_seconds >= 1.0 and p.segments == []   # too short for a 3 s segment


@pytest.mark.parametrize("bad, match", [
    (np.zeros((SR * 2, 2), np.float32), r"\[samples, channels\]"),
    (np.zeros((1, 2, 100), np.float32), r"shape \(1, 2, 100\)"),
    (np.zeros(0, np.float32), "no samples"),
])
def test_malformed_arrays(bad, match):
    with pytest.raises(AudioInputError, match=match):
        prepare_reference(bad, SR)


def test_bad_sample_rate(speech):
    with pytest.raises(AudioInputError, match="sample rate"):
        prepare_reference(speech[:SR], 0)


# ----------------------------------------------------------------------------- ComfyUI AUDIO
def test_comfy_audio_round_trip(speech):
    torch = pytest.importorskip("torch")
    wave = np.stack([speech[:SR], 0.5 * speech[:SR]])
    audio = to_comfy_audio(wave, SR)
    assert audio["waveform"].dtype == torch.float32
    assert tuple(audio["waveform"].shape) == (1, 2, SR) and audio["sample_rate"] == SR
    back, sr = from_comfy_audio(audio)
    assert sr == SR and back.dtype == np.float32
    np.testing.assert_array_equal(back, wave)
    mono = to_comfy_audio(speech[:SR], SR)
    assert tuple(mono["waveform"].shape) == (1, 1, SR)


def test_comfy_audio_batch_and_dtypes():
    torch = pytest.importorskip("torch")
    w = torch.arange(2 * 1 * 8, dtype=torch.float16).reshape(2, 1, 8)
    got, sr = from_comfy_audio({"waveform": w, "sample_rate": torch.tensor(8000)}, batch_index=1)
    assert sr == 8000 and got.dtype == np.float32 and got[0, 0] == 8.0


@pytest.mark.parametrize("audio, match", [
    ("a.wav", "got str"),
    ({"waveform": None}, "lacks \\['sample_rate'\\]"),
    ({"waveform": [0.0, 1.0], "sample_rate": 16000}, "must be a tensor"),
    ({"waveform": np.zeros(5, np.float32), "sample_rate": 16000}, r"got \(5,\)"),
    ({"waveform": np.zeros((1, 1, 5), np.float32), "sample_rate": 0}, "sample_rate"),
    ({"waveform": np.zeros((1, 1, 5), np.float32), "sample_rate": 22050.5}, "whole number"),
    ({"waveform": np.zeros((1, 1, 0), np.float32), "sample_rate": 16000}, "empty"),
])
def test_comfy_audio_malformed(audio, match):
    pytest.importorskip("torch")
    with pytest.raises(AudioInputError, match=match):
        from_comfy_audio(audio)


def test_comfy_audio_batch_index_out_of_range():
    pytest.importorskip("torch")
    with pytest.raises(AudioInputError, match="batch_index 3 is out of range for a batch of 1"):
        from_comfy_audio({"waveform": np.zeros((1, 1, 5), np.float32), "sample_rate": 8000}, 3)


def test_audio_package_imports_without_torch():
    """ComfyUI start-up must not pay for (or require) torch when importing the audio code."""
    pkg = Path(__file__).resolve().parents[1] / "audio"
    code = (
        "import sys, importlib.util\n"
        "sys.modules['torch'] = None\n"          # any `import torch` now raises ImportError
        f"spec = importlib.util.spec_from_file_location('dh_audio', r'{pkg / '__init__.py'}',"
        f" submodule_search_locations=[r'{pkg}'])\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['dh_audio'] = m\n"
        "spec.loader.exec_module(m)\n"
        "print(m.load_reference.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "load_reference" in out.stdout


def test_load_reference_reuses_the_last_decode_of_an_unchanged_file(speech, tmp_path, monkeypatch):
    """The CLI checks the clip, then LoadReferenceAudio reads it again: the second read is the first's
    result (own lists, read-only shared samples); a changed file or other options decode again."""
    import os

    from digital_human.audio import prepare as prepare_mod

    path = tmp_path / "clip.wav"
    sf.write(path, speech[: 8 * SR], SR)
    calls: list[str] = []
    real_decode = prepare_mod.decode_audio
    monkeypatch.setattr(prepare_mod, "decode_audio", lambda *a, **k: (calls.append("decode"), real_decode(*a, **k))[1])
    first = load_reference(path)
    said = list(first.warnings)
    first.warnings.append("a caller's own note")
    second = load_reference(path)
    assert calls == ["decode"] and second.warnings == said and second.segments == first.segments
    assert np.array_equal(first.waveform, second.waveform)
    with pytest.raises(ValueError):
        second.waveform[0] = 1.0  # shared between callers: nobody may change it in place
    load_reference(path, max_seconds=7.9)
    assert calls == ["decode"] * 2
    sf.write(path, speech[8 * SR: 16 * SR], SR)
    os.utime(path, ns=(1, 1))  # a rewritten file (even with a reset mtime) has another identity
    third = load_reference(path)
    assert calls == ["decode"] * 3 and not np.array_equal(third.waveform, first.waveform)
