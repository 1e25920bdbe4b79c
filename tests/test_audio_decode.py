"""decode_audio: every common format from a real speech clip, the real sample files, and the
failure modes (missing, empty, corrupt, truncated, zero-length)."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
import soundfile as sf
from scipy.signal import correlate

from digital_human.audio import decode as D
from digital_human.audio.decode import (
    AudioDecodeError,
    AudioFileNotFoundError,
    AudioInputError,
    EmptyAudioError,
    EmptyAudioFileError,
    decode_audio,
)

CLIP = "spk_en_male_01.wav"        # 60 s, 16 kHz mono PCM_16, continuous English speech


def _ffmpeg(*args: str) -> None:
    subprocess.run([D.ffmpeg_exe(), "-hide_banner", "-nostdin", "-v", "error", "-y", *args],
                   check=True, capture_output=True)


def _best_corr(ref: np.ndarray, got: np.ndarray, max_lag: int) -> tuple[float, int]:
    """Peak normalized cross-correlation within +-max_lag samples, and its lag."""
    n = min(len(ref), len(got))
    a, b = ref[:n].astype(np.float64), got[:n].astype(np.float64)
    c = correlate(b, a, mode="full", method="fft")
    mid = n - 1
    window = c[mid - max_lag: mid + max_lag + 1]
    k = int(np.argmax(window))
    return float(window[k] / np.sqrt(np.dot(a, a) * np.dot(b, b))), k - max_lag


@pytest.fixture(scope="module")
def ref(data_dir):
    """8 s stereo excerpt of a real speech clip (right channel = 0.5 x left, so channel order
    and count are checked too) at 16 kHz."""
    mono, sr = sf.read(data_dir / "audio" / CLIP, dtype="float32")
    x = mono[5 * sr: 13 * sr] * 0.8
    return np.stack([x, 0.5 * x]), sr


@pytest.fixture(scope="module")
def encoded(ref, tmp_path_factory):
    """{name: (path, lossless)} for every format we claim to read."""
    wave, sr = ref
    d = tmp_path_factory.mktemp("formats")
    out = {}
    for name, fmt, subtype in [("pcm16.wav", "WAV", "PCM_16"), ("pcm24.wav", "WAV", "PCM_24"),
                               ("pcm32.wav", "WAV", "PCM_32"), ("float.wav", "WAV", "FLOAT"),
                               ("clip.flac", "FLAC", "PCM_16"), ("clip.ogg", "OGG", "VORBIS")]:
        sf.write(d / name, wave.T, sr, format=fmt, subtype=subtype)
        out[name] = (d / name, fmt in ("WAV", "FLAC"))
    src = d / "float.wav"
    _ffmpeg("-i", str(src), "-c:a", "libmp3lame", "-b:a", "128k", str(d / "clip.mp3"))
    _ffmpeg("-i", str(src), "-c:a", "aac", "-b:a", "128k", str(d / "clip.m4a"))
    _ffmpeg("-i", str(src), "-c:a", "aac", "-b:a", "128k", "-f", "adts", str(d / "clip.aac"))
    for name in ("clip.mp3", "clip.m4a", "clip.aac"):
        out[name] = (d / name, False)
    return out


FORMATS = ["pcm16.wav", "pcm24.wav", "pcm32.wav", "float.wav", "clip.flac", "clip.ogg",
           "clip.mp3", "clip.m4a", "clip.aac"]


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_decodes_faithfully(name, encoded, ref):
    path, lossless = encoded[name]
    wave, sr = ref
    got, got_sr = decode_audio(path)
    assert got.dtype == np.float32 and got.ndim == 2
    assert got_sr == sr
    assert got.shape[0] == 2, f"{name}: channels {got.shape[0]}"
    # Encoders pad to whole frames (mp3 1152, aac 1024 samples + priming); gapless metadata
    # removes most of it, raw ADTS aac cannot.
    assert abs(got.shape[1] - wave.shape[1]) <= (0 if lossless else 2100), got.shape
    if lossless:
        lsb = {"pcm16.wav": 2.0 ** -15, "clip.flac": 2.0 ** -15, "pcm24.wav": 2.0 ** -23,
               "pcm32.wav": 2.0 ** -31, "float.wav": 0.0}[name]
        np.testing.assert_allclose(got, wave, rtol=0, atol=lsb + 1e-9)
    else:
        corr, lag = _best_corr(wave[0], got[0], max_lag=2100)
        assert corr > 0.97, f"{name}: correlation {corr:.3f}"
        # mp3/m4a/ogg carry their encoder delay; the decoded audio must not be shifted.
        if name != "clip.aac":
            assert abs(lag) <= 2, f"{name}: shifted by {lag} samples"
        # Channel 2 stayed half of channel 1 (channel order / count preserved).
        ratio = np.dot(got[1], got[0]) / np.dot(got[0], got[0])
        assert ratio == pytest.approx(0.5, abs=0.03)


def test_m4a_needs_and_uses_the_ffmpeg_fallback(encoded):
    path, _ = encoded["clip.m4a"]
    with pytest.raises(Exception):
        sf.info(str(path))   # libsndfile cannot read it: the fallback is what makes it work
    got, sr = decode_audio(path)
    assert sr == 16000 and got.shape[0] == 2


def test_ffmpeg_path_alone_is_exact_on_pcm(encoded, ref):
    """The ffmpeg fallback reads rate and channel count itself; on PCM it must be bit-exact."""
    wave, sr = ref
    failures: list[str] = []
    got = D._decode_ffmpeg(encoded["pcm24.wav"][0], None, failures)
    assert got is not None, failures
    np.testing.assert_allclose(got[0], wave, atol=2.0 ** -23)
    assert got[1] == sr


@pytest.mark.parametrize("name", ["pcm16.wav", "clip.m4a"])
def test_max_seconds_limits_decoding(name, encoded):
    got, sr = decode_audio(encoded[name][0], max_seconds=2.5)
    assert abs(got.shape[1] - int(2.5 * sr)) <= 1


@pytest.mark.parametrize("fname", ["audio/spk_en_male_01.wav", "audio/spk_zh_female_02.wav",
                                   "audio/spk_zh_female_01.wav", "audio/spk_en_female_02.mp3",
                                   "audio/spk_en_male_04_bilingual.m4a",
                                   "video/talk_en_male_01a.mp4"])
def test_real_sample_files(fname, data_dir):
    expect = {  # (rate, channels, seconds) from the files' own headers (SOURCES.md / ffprobe)
        "audio/spk_en_male_01.wav": (16000, 1, 60.0),
        "audio/spk_zh_female_02.wav": (24000, 1, 3.48),        # 32-bit float wav
        "audio/spk_zh_female_01.wav": (44100, 2, 10.05),
        "audio/spk_en_female_02.mp3": (44100, 1, 58.82),
        "audio/spk_en_male_04_bilingual.m4a": (48000, 1, 16.57),
        "video/talk_en_male_01a.mp4": (16000, 1, 25.01),  # audio track (the video runs 25.07 s)
    }[fname]
    wave, sr = decode_audio(data_dir / fname)
    assert (sr, wave.shape[0]) == expect[:2]
    assert wave.shape[1] / sr == pytest.approx(expect[2], abs=0.05)
    assert np.isfinite(wave).all() and 0.05 < np.abs(wave).max() <= 1.0


# ----------------------------------------------------------------------------- failure modes
def test_missing_file(tmp_path):
    p = tmp_path / "nope.wav"
    with pytest.raises(AudioFileNotFoundError, match="nope.wav") as e:
        decode_audio(p)
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, ValueError)
    assert "upload" in str(e.value).lower()


def test_directory_is_not_a_file(tmp_path):
    with pytest.raises(AudioFileNotFoundError, match="not a file"):
        decode_audio(tmp_path)


def test_empty_file(tmp_path):
    p = tmp_path / "empty.mp3"
    p.write_bytes(b"")
    with pytest.raises(EmptyAudioFileError, match=r"empty\.mp3.*0 bytes"):
        decode_audio(p)


@pytest.mark.parametrize("name", ["junk.wav", "junk.mp3", "junk.m4a"])
def test_corrupt_file_names_file_and_decoders(name, tmp_path):
    p = tmp_path / name
    p.write_bytes(np.random.default_rng(7).integers(0, 256, 40000, dtype=np.uint8).tobytes())
    with pytest.raises(AudioDecodeError) as e:
        decode_audio(p)
    msg = str(e.value)
    assert name in msg and "soundfile" in msg and "ffmpeg" in msg and "Re-export" in msg
    assert isinstance(e.value, AudioInputError)


def test_truncated_m4a(encoded, tmp_path):
    """An interrupted upload: half an m4a (its index is written at the end) cannot be read."""
    data = encoded["clip.m4a"][0].read_bytes()
    p = tmp_path / "half.m4a"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(AudioDecodeError, match="half.m4a"):
        decode_audio(p)


def test_zero_length_audio(tmp_path):
    p = tmp_path / "nothing.wav"
    sf.write(p, np.zeros((0, 1), np.float32), 16000)
    assert p.stat().st_size > 0                     # a valid header, no samples
    with pytest.raises(EmptyAudioError, match="nothing.wav.*zero samples"):
        decode_audio(p)


def test_non_audio_media_without_audio_stream(tmp_path):
    p = tmp_path / "still.png"
    _ffmpeg("-f", "lavfi", "-i", "color=c=red:s=16x16", "-frames:v", "1", str(p))
    with pytest.raises(AudioDecodeError, match="no audio stream"):
        decode_audio(p)
