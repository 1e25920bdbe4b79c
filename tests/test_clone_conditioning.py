"""The `visemes` input of a viseme avatar: the viseme features plus, for a mouth_drive config, portrait's
mouth drive of the same speech, built by one function for training and inference."""
from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest
import torch

from digital_human.engines.clone_model import CloneGenerator, GeneratorConfig
from digital_human.talking_head.clone.conditioning import condition_windows, frame_conditioning
from digital_human.talking_head.portrait.speech_drive import mouth_params
from digital_human.talking_head.portrait.viseme_drive import speech_mouth
from digital_human.talking_head.visemes import frame_features, viseme_track

SR, FPS, N = 16000, 25.0, 30
PHONES = [("HH", 0.05, 0.12), ("AA", 0.12, 0.40), ("M", 0.40, 0.52), ("UW", 0.52, 0.9), ("SIL", 0.9, 1.2)]
TINY_DRIVE = GeneratorConfig(crop_size=64, base_channels=4, levels=2, audio_channels=4, audio_dim=16,
                             viseme_frames=3, mouth_drive=True)


def _speech(seconds: float = 1.2, seed: int = 0) -> np.ndarray:
    """Noise bursts under a syllable-rate envelope: loud and quiet frames for the drive to follow."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    return (rng.normal(0, 0.2, t.size) * np.clip(np.sin(2 * np.pi * 3 * t), 0, None)).astype(np.float32)


def test_drive_channels_are_portraits_drive_with_and_without_phones():
    wave = _speech()
    with_phones = frame_conditioning(PHONES, wave, SR, FPS, N, mouth_drive=True)
    assert with_phones.shape == (N, 10) and with_phones.dtype == np.float32
    track = viseme_track(PHONES, FPS, N)
    assert np.array_equal(with_phones[:, :6], frame_features(track, N))
    drive = speech_mouth(wave, SR, FPS, N, track)
    assert np.allclose(with_phones[:, 6:], np.stack([drive.jaw_open, drive.lip_open, drive.width, drive.round], 1))
    assert not with_phones[(PHONES[2][1] * FPS < np.arange(N)) & (np.arange(N) < PHONES[2][2] * FPS - 1), 7].any()  # lips shut on M

    without = frame_conditioning(None, wave, SR, FPS, N, mouth_drive=True)
    audio_only = mouth_params(wave, SR, FPS, N)
    assert not without[:, :6].any()  # no phones: viseme features are zeros (confidence 0) ...
    assert np.allclose(without[:, 6:], np.stack([audio_only.jaw_open, audio_only.lip_open, audio_only.width,
                                                 audio_only.round], 1))  # ... the drive is the audio's alone
    assert without[:, 6].max() > 0.3 and not np.allclose(without[:, 6:], with_phones[:, 6:])
    assert np.array_equal(frame_conditioning(PHONES, wave, SR, FPS, N, mouth_drive=False), frame_features(track, N))


def test_windows_follow_the_config_and_old_configs_load_without_the_drive():
    wave = _speech()
    plain = GeneratorConfig(crop_size=64, base_channels=4, levels=2, audio_channels=4, audio_dim=16)
    assert condition_windows(PHONES, wave, SR, FPS, N, plain) is None
    phones_only = GeneratorConfig(**{**asdict(TINY_DRIVE), "mouth_drive": False})
    assert condition_windows(PHONES, wave, SR, FPS, N, phones_only).shape == (N, 3 * 6)
    win = condition_windows(PHONES, wave, SR, FPS, N, TINY_DRIVE)
    assert win.shape == (N, TINY_DRIVE.viseme_width()) == (N, 3 * 10)
    assert np.array_equal(win[5, 10:20], frame_conditioning(PHONES, wave, SR, FPS, N, True)[5])  # the centre frame
    old = {k: v for k, v in asdict(phones_only).items() if k != "mouth_drive"}  # an avatar saved before the drive
    assert GeneratorConfig.from_dict(old) == phones_only and not phones_only.mouth_drive
    with pytest.raises(ValueError, match="viseme_frames"):
        GeneratorConfig(mouth_drive=True).validate()


def test_checkpoint_fingerprint_of_a_config_without_the_drive_is_unchanged():
    """A training interrupted before the drive existed must still resume: its config text is the same."""
    from digital_human.talking_head.clone.train import _config_key

    config = GeneratorConfig(viseme_frames=9)
    assert "mouth_drive" not in _config_key(config) and _config_key(config).endswith("viseme_frames=9)")
    assert "mouth_drive=True" in _config_key(GeneratorConfig(viseme_frames=9, mouth_drive=True))


def test_prepare_data_needs_the_phoneless_windows_of_a_drive_config():
    from digital_human.talking_head.clone.train import prepare_data

    n, s = 6, TINY_DRIVE.crop_size
    crops = np.zeros((n, s, s, 3), np.uint8)
    lms = np.tile(np.random.default_rng(0).uniform(20, 44, (1, 478, 2)).astype(np.float32), (n, 1, 1))
    windows = np.zeros((n, 1, TINY_DRIVE.n_mels, TINY_DRIVE.audio_columns), np.float32)
    vis = np.ones((n, TINY_DRIVE.viseme_width()), np.float32)
    with pytest.raises(ValueError, match="phone-less viseme windows"):
        prepare_data(crops, lms, np.ones(n, bool), windows, FPS, TINY_DRIVE, visemes=vis)
    data = prepare_data(crops, lms, np.ones(n, bool), windows, FPS, TINY_DRIVE, visemes=vis,
                        visemes_without_phones=vis * 0.5)
    assert data.visemes_without_phones.shape == vis.shape
    other = prepare_data(crops, lms, np.ones(n, bool), windows, FPS, TINY_DRIVE, visemes=vis,
                         visemes_without_phones=vis * 0.25)
    assert data.fingerprint() != other.fingerprint()  # a checkpoint of other phone-less windows is not continued


def test_audio_mute_draws_muted_samples_from_the_visemes_alone():
    torch.manual_seed(0)
    model = CloneGenerator(TINY_DRIVE)
    torch.nn.init.normal_(model.visemes.out.weight)
    src, ref, audio, vis = model.example_inputs(4, seed=1)
    with torch.no_grad():
        audio_part, viseme_part = model.audio(audio), model.visemes(vis)
        model.train()
        model.audio_mute = 0.999999
        _, muted = model.forward_parts(src, ref, audio, vis)
        assert torch.allclose(muted, viseme_part)
        model.audio_mute = 0.0
        _, heard = model.forward_parts(src, ref, audio, vis)
        assert torch.allclose(heard, audio_part + viseme_part)
        model.eval()
        model.audio_mute = 0.999999  # training only: inference always hears the audio
        _, infer = model.forward_parts(src, ref, audio, vis)
        assert torch.allclose(infer, audio_part + viseme_part)
