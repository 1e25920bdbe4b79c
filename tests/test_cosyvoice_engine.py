"""CosyVoice 2 behind the TTS engine protocol, on a random-weight release folder.

The folder is the reduced fixture's (weights rebuilt from its seed, same architecture as the release)
with random ONNX stand-ins for campplus.onnx and speech_tokenizer_v2.onnx. Random weights say nothing
about voice quality; these tests check the plumbing: speaker state, save/load, determinism, lengths.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="CosyVoice 2 needs the optional extra: pip install .[cosyvoice]")

from digital_human.audio import load_reference  # noqa: E402
from digital_human.engines.cosyvoice.engine import CosyVoice2Engine  # noqa: E402
from digital_human.engines.cosyvoice.parity import write_release_from_fixture  # noqa: E402
from digital_human.voice.engines import ENGINES, engine_state, get_engine  # noqa: E402
from digital_human.voice.speaker import SpeakerProfile  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "cosyvoice" / "reduced.npz"


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> CosyVoice2Engine:
    data = dict(np.load(FIXTURE, allow_pickle=False))
    folder = write_release_from_fixture(data, tmp_path_factory.mktemp("cv2e") / "CosyVoice2-0.5B")
    return CosyVoice2Engine(folder)


@pytest.fixture(scope="module")
def speaker(engine, data_dir):
    prepared = load_reference(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=7)
    base = SpeakerProfile(embedding=np.ones(256, np.float32) / 16, segment_embeddings=np.zeros((0, 256), np.float32),
                          content_hash="x", speech_seconds=prepared.speech_seconds, name="male01")
    return engine.prepare_speaker(prepared, "Hello there, this is my voice.", base)


def test_registry_lists_both_engines():
    assert {"kokoro", "cosyvoice2"} <= set(ENGINES)
    with pytest.raises(ValueError, match="unknown TTS engine"):
        get_engine("nope")


def test_speaker_state_is_consistent_and_survives_save(speaker, tmp_path):
    state = engine_state(speaker, "cosyvoice2")
    assert state["prompt_feat"].shape == (2 * state["prompt_token"].size, 80)
    assert state["embedding"].shape == (192,) and np.all(np.isfinite(state["embedding"]))
    assert state["prompt_text_ids"].size > 0 and state["prompt_token"].max() < 100
    loaded = SpeakerProfile.load_npz(speaker.save_npz(tmp_path / "s.npz"))
    for key, value in state.items():
        np.testing.assert_array_equal(engine_state(loaded, "cosyvoice2")[key], value)


def test_synthesis_is_seeded_and_sized(engine, speaker):
    torch.set_num_threads(2)
    a = engine.synthesize("Hi.", speaker, seed=3)
    b = engine.synthesize("Hi.", speaker, seed=3)
    c = engine.synthesize("Hi.", speaker, seed=4)
    assert a.sample_rate == 24000 and a.waveform.size % 960 == 0  # 2 mel frames x 480 samples per token
    np.testing.assert_array_equal(a.waveform, b.waveform)
    assert a.waveform.size != c.waveform.size or not np.array_equal(a.waveform, c.waveform)
    assert np.abs(a.waveform).max() <= 0.99


def test_unprepared_speaker_is_refused(engine):
    bare = SpeakerProfile(embedding=np.ones(256, np.float32) / 16, segment_embeddings=np.zeros((0, 256), np.float32),
                          content_hash="x", speech_seconds=5.0)
    with pytest.raises(ValueError, match="not prepared for CosyVoice 2"):
        engine.synthesize("Hi.", bare)
