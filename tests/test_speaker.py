"""DH_SPEAKER: profile extraction on real speech, mixed-speaker warning, cache, .npz round trip."""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from digital_human.engines import speaker_encoder as se
from digital_human.paths import models_root
from digital_human.voice.embedding_cache import EmbeddingCache
from digital_human.voice.speaker import SpeakerProfile, content_hash, extract_speaker_profile

SR = 24000  # what audio preparation hands over (the TTS rate), so resampling is exercised


@dataclass
class Prepared:
    """Stand-in with PreparedAudio's fields (audio/prepare.py is written in parallel)."""

    waveform: np.ndarray
    sample_rate: int
    segments: list[tuple[int, int]]
    speech_seconds: float
    warnings: list[str] = field(default_factory=list)


def decode(path: Path, sr: int = SR) -> np.ndarray:
    import imageio_ffmpeg

    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-i", str(path), "-ac", "1", "-ar", str(sr),
           "-f", "f32le", "-"]
    return np.frombuffer(subprocess.run(cmd, capture_output=True, check=True).stdout, dtype=np.float32).copy()


def speech_only(wav: np.ndarray) -> np.ndarray:
    """Drop pauses the way audio preparation does (GE2E embeddings of mostly-silent windows drift)."""
    import librosa

    return np.concatenate([wav[a:b] for a, b in librosa.effects.split(wav, top_db=35)])


def prepared_from(wav: np.ndarray, seconds: float = 5.0, sr: int = SR) -> Prepared:
    step = int(seconds * sr)
    segments = [(a, min(a + step, len(wav))) for a in range(0, len(wav) - sr, step)]
    return Prepared(wav, sr, segments, len(wav) / sr)


class CountingRun:
    """run_fn wrapper that counts encoder calls (to prove the cache skips the model)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def __call__(self, mels):
        self.calls += 1
        return self.inner(mels)


@pytest.fixture(scope="module")
def run_fn():
    folder = models_root() / "speaker_encoder"
    if not ((folder / se.ONNX_NAME).is_file() and (folder / se.SAFETENSORS_NAME).is_file()):
        wheel_dir = os.environ.get("DIGITAL_HUMAN_WHEEL_DIR")
        try:
            se.install_ge2e_weights(wheel_dir=Path(wheel_dir) if wheel_dir else None)
        except Exception as exc:
            pytest.skip(f"GE2E weights unavailable and could not be installed: {exc}")
    return se.default_run_fn()


@pytest.fixture(scope="module")
def male(data_dir) -> np.ndarray:
    return speech_only(decode(data_dir / "audio" / "spk_en_male_01.wav"))[: 30 * SR]


@pytest.fixture(scope="module")
def female(data_dir) -> np.ndarray:
    return speech_only(decode(data_dir / "audio" / "spk_en_female_02.mp3"))[: 30 * SR]


def test_profile_of_one_speaker(run_fn, male, tmp_path):
    profile = extract_speaker_profile(prepared_from(male), run_fn=run_fn, cache=EmbeddingCache(tmp_path))
    assert profile.embedding.shape == (256,)
    assert np.isclose(np.linalg.norm(profile.embedding), 1.0, atol=1e-5)
    assert profile.segment_embeddings.shape == (6, 256)
    lo, mean = profile.segment_agreement()
    print(f"male_01 segment agreement min {lo:.3f} mean {mean:.3f}, pitch {profile.pitch_hz_median:.0f} Hz")
    assert lo > 0.8 and mean >= lo
    assert not any("disagree" in w for w in profile.warnings)
    assert 100 < profile.pitch_hz_median < 170  # a male voice, ~133 Hz by pYIN on the full clip
    assert profile.pitch_hz_iqr > 0
    assert profile.content_hash == content_hash(male, SR) != content_hash(male, 16000)


def test_mixed_speakers_warn(run_fn, male, female, tmp_path):
    mixed = np.concatenate([male[: 10 * SR], female[: 10 * SR]])
    profile = extract_speaker_profile(prepared_from(mixed), run_fn=run_fn, cache=EmbeddingCache(tmp_path))
    lo, _ = profile.segment_agreement()
    print(f"male_01 + female_02 segment min cosine {lo:.3f}")
    assert any(w.startswith("segments disagree (min cosine") for w in profile.warnings), profile.warnings


def test_short_speech_warns_and_no_segments_fails(run_fn, male, tmp_path):
    short = male[: int(2.5 * SR)]
    profile = extract_speaker_profile(Prepared(short, SR, [(0, len(short))], 2.5), run_fn=run_fn,
                                      cache=EmbeddingCache(tmp_path))
    assert any("2.5 s of speech" in w for w in profile.warnings)
    with pytest.raises(ValueError, match="no speech segments"):
        extract_speaker_profile(Prepared(short, SR, [], 0.0), run_fn=run_fn, cache=False)
    with pytest.raises(TypeError, match="lacks"):
        extract_speaker_profile(object(), run_fn=run_fn, cache=False)


def test_cache_hit_skips_model(run_fn, male, tmp_path):
    prepared = prepared_from(male[: 12 * SR])
    counting = CountingRun(run_fn)
    cache = EmbeddingCache(tmp_path)
    first = extract_speaker_profile(prepared, run_fn=counting, cache=cache, name="anchor")
    assert counting.calls == 1 and (cache.hits, cache.misses) == (0, 1)
    first.style = np.ones(256, np.float32)  # a caller changing its copy must not touch the cache
    second = extract_speaker_profile(prepared, run_fn=counting, cache=cache)
    assert counting.calls == 1 and cache.hits == 1
    assert second.style is None and second.name == ""
    np.testing.assert_array_equal(first.embedding, second.embedding)
    # a fresh process (new cache object, same folder) reads the .npz instead of running the model
    disk_cache = EmbeddingCache(tmp_path)
    third = extract_speaker_profile(prepared, run_fn=counting, cache=disk_cache)
    assert counting.calls == 1 and disk_cache.disk_hits == 1
    np.testing.assert_array_equal(first.segment_embeddings, third.segment_embeddings)
    # different audio is a miss
    extract_speaker_profile(prepared_from(male[12 * SR: 24 * SR]), run_fn=counting, cache=disk_cache)
    assert counting.calls == 2 and disk_cache.misses == 1


def test_npz_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    emb = rng.standard_normal(256).astype(np.float32)
    profile = SpeakerProfile(
        embedding=emb / np.linalg.norm(emb), segment_embeddings=rng.standard_normal((3, 256)),
        content_hash="ab" * 32, speech_seconds=12.5, pitch_hz_median=133.0, pitch_hz_iqr=27.0,
        reference_text="希望你以后能够做的比我还好呦。", style=rng.standard_normal((1, 256)),
        extras={"f0_curve": np.arange(5.0), "stats/mean": np.ones(3, np.float32)},
        warnings=["only 2.5 s of speech", "segments disagree (min cosine 0.41)"], name="Zoë",
    )
    path = profile.save_npz(tmp_path / "voice.npz")
    loaded = SpeakerProfile.load_npz(path)
    for attr in ("content_hash", "speech_seconds", "pitch_hz_median", "pitch_hz_iqr", "reference_text",
                 "warnings", "name", "encoder"):
        assert getattr(loaded, attr) == getattr(profile, attr), attr
    np.testing.assert_array_equal(loaded.embedding, profile.embedding)
    np.testing.assert_array_equal(loaded.segment_embeddings, profile.segment_embeddings)
    np.testing.assert_array_equal(loaded.style, profile.style)
    assert loaded.extras.keys() == profile.extras.keys()
    np.testing.assert_array_equal(loaded.extras["stats/mean"], profile.extras["stats/mean"])
    # NaN pitch and no style survive too
    bare = SpeakerProfile(embedding=profile.embedding, segment_embeddings=np.zeros((0, 256)),
                          content_hash="cd" * 32, speech_seconds=3.0)
    again = SpeakerProfile.load_npz(bare.save_npz(tmp_path / "bare.npz"))
    assert again.style is None and np.isnan(again.pitch_hz_median) and again.warnings == []
    assert again.segment_embeddings.shape == (0, 256)


def test_npz_refuses_pickles_and_foreign_files(tmp_path):
    pickled = tmp_path / "evil.npz"
    np.savez(pickled, format_version=np.array(1), embedding=np.array([object()], dtype=object))
    with pytest.raises(ValueError, match="not a plain speaker"):
        SpeakerProfile.load_npz(pickled)
    other = tmp_path / "other.npz"
    np.savez(other, weights=np.zeros(3))
    with pytest.raises(ValueError, match="not a speaker file"):
        SpeakerProfile.load_npz(other)
    with pytest.raises(FileNotFoundError):
        SpeakerProfile.load_npz(tmp_path / "missing.npz")
