"""`clone` generator: shapes, the hole (nothing outside it changes), ONNX parity through the engine
loader, strict weight loading, and the audio features it is driven with (checked against librosa)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from digital_human.talking_head.audio_features import MelConfig, _raw_log_mel, windows_for_frames
from digital_human.engines.clone_model import (CloneGenerator, GeneratorConfig, crops_to_regions,
                                               export_generator_onnx, generator_spec, load_generator,
                                               regions_into_crops, save_generator)

TINY = GeneratorConfig(crop_size=64, base_channels=4, levels=2, audio_channels=4, audio_dim=16)


def _speechlike(seconds: float, sr: int = 16000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    env = (np.sin(2 * np.pi * 3.0 * t) > 0).astype(np.float32)  # syllable-rate bursts
    return (env * (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.size))).astype(np.float32)


def test_log_mel_matches_librosa():
    librosa = pytest.importorskip("librosa")
    wave = _speechlike(1.0)
    cfg = MelConfig()
    ref = librosa.feature.melspectrogram(y=wave, sr=16000, n_fft=512, win_length=400, hop_length=160, n_mels=80,
                                         fmin=55, fmax=7600, htk=True, norm="slaney", power=2.0)
    ref = np.log10(np.maximum(ref, 1e-5))
    ours = _raw_log_mel(wave, cfg)
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() < 1e-3


def test_windows_centred_on_frames():
    sr, fps = 16000, 25.0
    wave = np.zeros(sr * 2, np.float32)
    wave[sr: sr + 800] = 0.5 * np.sin(np.arange(800) * 0.3)  # a 50 ms click at t = 1.0 s
    win = windows_for_frames(wave, sr, fps, 50)
    cfg = MelConfig()
    assert win.shape == (50, 1, cfg.n_mels, cfg.window_columns) and win.dtype == np.float32
    energy = win[:, 0].mean(1)  # [frames, T]
    centre = cfg.window_columns // 2
    # frame 25 (t = 1.0 s) sees the click just right of its window centre; frames 0 and 49 see only silence
    assert energy[25, centre:centre + 6].max() > energy[25, :centre - 6].max() + 1.0
    assert np.ptp(energy[0]) < 1e-4
    # audio resampled from 48 kHz gives (nearly) the same features
    up = np.repeat(wave, 3)
    assert np.abs(windows_for_frames(up, 48000, fps, 50) - win).mean() < 0.15
    with pytest.raises(ValueError, match="fps"):
        windows_for_frames(wave, sr, 0, 10)
    with pytest.raises(ValueError, match="NaN"):
        windows_for_frames(np.full(100, np.nan, np.float32), sr, fps, 2)


def test_generator_keeps_everything_outside_the_hole():
    torch.manual_seed(0)
    model = CloneGenerator(TINY).eval()
    src, ref, audio = model.example_inputs(2)
    with torch.no_grad():
        out = model(src, ref, audio)
    row = TINY.hole_row()
    assert out.shape == src.shape
    assert torch.equal(out[:, :, :row], src[:, :, :row])
    # the hole depends on the audio and not on the source's own (blanked) lower face
    with torch.no_grad():
        other_audio = model(src, ref, audio + 3.0)
        other_src = src.clone()
        other_src[:, :, row:] = torch.rand_like(other_src[:, :, row:])
        same = model(other_src, ref, audio)
    assert torch.equal(same, out)
    # FiLM starts as identity, but the bottleneck also concatenates the audio embedding
    assert (other_audio - out).abs().max() > 0


def test_default_generator_is_small():
    from digital_human.engines.clone_model import parameter_count

    model = CloneGenerator(GeneratorConfig())
    assert 1e6 < parameter_count(model) < 8e6
    y0, y1, x0, x1 = GeneratorConfig().region_box()
    assert (y1 - y0) % 16 == 0 and (x1 - x0) % 16 == 0 and y1 <= 256 and x0 >= 0


def test_region_roundtrip():
    crops = np.random.default_rng(0).integers(0, 256, (3, 64, 64, 3), dtype=np.uint8)
    regions = crops_to_regions(crops, TINY)
    y0, y1, x0, x1 = TINY.region_box()
    assert regions.shape == (3, 3, y1 - y0, x1 - x0)
    assert np.array_equal(regions_into_crops(crops, regions, TINY), crops)
    back = regions_into_crops(crops, regions.astype(np.float32) / 255.0, TINY)
    assert np.array_equal(back, crops)


def test_onnx_parity_and_engine_loader(tmp_path):
    from digital_human.engines import loader

    torch.manual_seed(1)
    model = CloneGenerator(TINY).eval()
    save_generator(model, tmp_path / "generator.safetensors")
    report = export_generator_onnx(model, tmp_path / "generator.onnx")
    print(report)
    assert report.max_abs_diff < 1e-4
    spec = generator_spec(tmp_path / "generator.onnx")
    assert spec.profiles["source"].max[0] == 64 and spec.profiles["audio"].min[0] == 1
    src, ref, audio = (t.numpy() for t in model.example_inputs(5, seed=3))
    with torch.no_grad():
        expected = model(*(torch.from_numpy(a) for a in (src, ref, audio))).numpy()
    for backend in ("onnxruntime", "torch"):
        runner = loader.get(spec, backend=backend, precision="fp32")
        got = runner({"source": src, "reference": ref, "audio": audio})["region"]
        assert got.shape == expected.shape
        assert np.abs(got - expected).max() < 1e-4, backend


def test_strict_weight_loading(tmp_path):
    model = CloneGenerator(TINY)
    path = save_generator(model, tmp_path / "g.safetensors")
    loaded = load_generator(path)
    assert loaded.config == TINY
    with pytest.raises(ValueError, match="does not fit"):
        load_generator(path, GeneratorConfig(crop_size=64, base_channels=8, levels=2, audio_channels=4, audio_dim=16))
    with pytest.raises(FileNotFoundError):
        load_generator(tmp_path / "missing.safetensors")


def test_saturated_head_keeps_a_gradient_under_bf16_autocast():
    """In bf16, sigmoid(8) rounds to exactly 1.0 and its backward is exactly 0: a head pushed that far
    (one large early update) froze the whole generator in the H200 run. The head runs in FP32 under
    autocast, so a gradient must still reach the weights and the output must stay below 1."""
    from digital_human.talking_head.clone.train import clone_loss

    torch.manual_seed(0)
    model = CloneGenerator(TINY)
    with torch.no_grad():
        model.head.bias.fill_(8.0)
    src, ref, audio = model.example_inputs(2)
    boxes = torch.tensor([[10.0, 30.0, 5.0, 40.0]] * 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(src, ref, audio)
    assert out.dtype == torch.float32
    hole = out[:, :, TINY.hole_row():]
    assert (hole < 1.0).all()
    loss, _ = clone_loss(out, src, model.hole, boxes)
    loss.backward()
    assert model.head.bias.grad.abs().max() > 0
    assert model.stem[0][0].weight.grad.abs().max() > 0
    # outside autocast the graph is unchanged (ONNX / FP16 engine path): plain conv + sigmoid
    with torch.no_grad():
        plain = model(src, ref, audio)
    assert torch.allclose(plain, out.detach(), atol=2e-2)


def test_batch_size_from_free_memory():
    from digital_human.engines.clone_model import (MAX_BATCH, batch_for_free_memory,
                                                   inference_bytes_per_frame)

    config = GeneratorConfig()
    per_frame = inference_bytes_per_frame(config)
    assert 4e6 < per_frame < 20e6  # ~8.7 MB in FP16 at the 256-px default
    assert inference_bytes_per_frame(config, 4) == 2 * per_frame
    assert batch_for_free_memory(100 << 30, config) == MAX_BATCH  # a big GPU: the profile's maximum
    assert batch_for_free_memory(10 * per_frame, config) == 5  # half of the free memory
    assert batch_for_free_memory(0, config) == 1  # never 0


def test_auto_batch_on_cpu_is_32():
    from types import SimpleNamespace

    from digital_human.talking_head.clone.infer import resolve_batch_size

    cpu_runner = SimpleNamespace(info=SimpleNamespace(device="cpu"), precision="fp32")
    assert resolve_batch_size(0, cpu_runner, GeneratorConfig()) == 32
    assert resolve_batch_size(7, cpu_runner, GeneratorConfig()) == 7


def test_audio_dropout_is_training_only_and_forward_parts_matches_forward():
    import torch

    from digital_human.engines.clone_model import CloneGenerator, GeneratorConfig

    torch.manual_seed(0)
    cfg = GeneratorConfig(crop_size=64, base_channels=4, levels=2, audio_channels=4, audio_dim=16)
    model = CloneGenerator(cfg)
    for p in model.parameters():  # FiLM starts at identity; give the audio path weight so dropout shows
        torch.nn.init.normal_(p, std=0.3)
    model.audio_dropout = 0.5
    src, ref, aud = model.example_inputs(2)
    model.eval()
    with torch.no_grad():
        a, b = model(src, ref, aud), model(src, ref, aud)
        region, emb = model.forward_parts(src, ref, aud)
    assert torch.equal(a, b) and torch.equal(a, region) and emb.shape == (2, cfg.audio_dim)
    model.train()
    with torch.no_grad():
        c, d = model(src, ref, aud), model(src, ref, aud)
    assert not torch.equal(c, d)  # dropout acts in training


TINY_VISEMES = GeneratorConfig(crop_size=64, base_channels=4, levels=2, audio_channels=4, audio_dim=16, viseme_frames=3)


def test_viseme_generator_starts_as_the_audio_only_one():
    """Avatars saved before visemes have no viseme_frames in their config and load audio-only; a new
    viseme model starts equal to the audio-only one (zero last layer), and zeros in add exactly nothing."""
    from dataclasses import asdict

    old = {k: v for k, v in asdict(TINY).items() if k != "viseme_frames"}
    assert GeneratorConfig.from_dict(old) == TINY and TINY.input_names() == ("source", "reference", "audio")
    assert TINY_VISEMES.input_names()[-1] == "visemes" and TINY_VISEMES.viseme_width() == 18
    with pytest.raises(ValueError, match="odd"):
        GeneratorConfig(viseme_frames=4).validate()
    torch.manual_seed(0)
    plain = CloneGenerator(TINY).eval()
    with_visemes = CloneGenerator(TINY_VISEMES).eval()
    missing, unexpected = with_visemes.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing and all(k.startswith("visemes.") for k in missing)
    assert not any(k.startswith("visemes.") for k in plain.state_dict())
    src, ref, audio, vis = with_visemes.example_inputs(3, seed=2)
    with torch.no_grad():
        expected = plain(src, ref, audio)
        assert torch.equal(with_visemes(src, ref, audio, vis), expected)  # zero-initialised read-out
        assert torch.equal(with_visemes(src, ref, audio, None), expected)
        torch.nn.init.normal_(with_visemes.visemes.out.weight)
        assert not torch.allclose(with_visemes(src, ref, audio, vis), expected)  # it does read them once trained
        assert torch.equal(with_visemes(src, ref, audio, torch.zeros_like(vis)), expected)  # no phones: audio only


def test_viseme_generator_onnx_parity_and_engine_loader(tmp_path):
    from digital_human.engines import loader

    torch.manual_seed(3)
    model = CloneGenerator(TINY_VISEMES).eval()
    torch.nn.init.normal_(model.visemes.out.weight, std=0.5)  # as if trained: the graph must carry the input
    save_generator(model, tmp_path / "generator.safetensors")
    report = export_generator_onnx(model, tmp_path / "generator.onnx")
    assert report.max_abs_diff < 1e-4
    spec = generator_spec(tmp_path / "generator.onnx")
    assert spec.input_names[-1] == "visemes" and spec.profiles["visemes"].opt == (16, 18)
    feeds = dict(zip(TINY_VISEMES.input_names(), (t.numpy() for t in model.example_inputs(4, seed=5))))
    with torch.no_grad():
        expected = model(*(torch.from_numpy(feeds[k]) for k in TINY_VISEMES.input_names())).numpy()
    for backend in ("onnxruntime", "torch"):
        got = loader.get(spec, backend=backend, precision="fp32")(feeds)["region"]
        assert np.abs(got - expected).max() < 1e-4, backend
