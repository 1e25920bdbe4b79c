"""MuseTalk 1.5 runtime: parity with outputs of the reference code (committed fixture, reduced
configuration, random weights re-made from the fixture's seed), strict loading of the release layout,
the talking-head contract on a real face, ONNX export of the UNet."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("diffusers", reason="MuseTalk is an optional extra: pip install .[musetalk]")
pytest.importorskip("transformers", reason="MuseTalk is an optional extra: pip install .[musetalk]")
torch = pytest.importorskip("torch")

from digital_human.engines.musetalk import audio as mt_audio  # noqa: E402
from digital_human.talking_head.musetalk.blend import paste_face  # noqa: E402
from digital_human.engines.musetalk.files import (MuseTalkFilesError, MuseTalkWeightsError, file_status,  # noqa: E402
                                                  locate)
from digital_human.engines.musetalk.networks import load_networks  # noqa: E402
from digital_human.engines.musetalk.pipeline import MuseTalkPipeline  # noqa: E402
from digital_human.engines.musetalk.random_release import write_release  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "musetalk" / "reduced.npz"


@pytest.fixture(scope="module")
def fixture():
    return dict(np.load(FIXTURE))


@pytest.fixture(scope="module")
def release(tmp_path_factory, fixture):
    root = tmp_path_factory.mktemp("mt_models")
    write_release(root, "reduced", seed=int(fixture["seed"]))
    return root


@pytest.fixture(scope="module")
def networks(release):
    return load_networks(models_root=release)


# --- parity with the reference code's outputs --------------------------------------------------------
def test_audio_windows_match_reference(fixture, networks):
    wave, rate, fps = fixture["wave"], int(fixture["rate"]), float(fixture["fps"])
    n = int(fixture["n_chunks"])
    windows = mt_audio.audio_windows(networks.whisper, mt_audio.feature_extractor(networks.files.whisper_dir),
                                     wave, rate, fps, n)
    assert len(windows) == n
    ours = windows(0, n).numpy()[fixture["chunk_frames"]]
    assert ours.shape == fixture["whisper_chunks"].shape
    diff = float(np.abs(ours - fixture["whisper_chunks"]).max())
    print(f"\naudio windows max abs diff vs reference: {diff:.2e}")
    assert diff <= 1e-5


def test_end_to_end_matches_reference(fixture, networks):
    pipe = MuseTalkPipeline(networks, seed=int(fixture["seed"]))
    crop = np.ascontiguousarray(fixture["crop_bgr"][:, :, ::-1])
    latents = pipe.encode_references(crop[None])
    assert float((latents - torch.from_numpy(fixture["latents"])).abs().max()) <= 1e-4
    n = len(fixture["pred_latents"])
    windows = mt_audio.audio_windows(networks.whisper, mt_audio.feature_extractor(networks.files.whisper_dir),
                                     fixture["wave"], int(fixture["rate"]), float(fixture["fps"]), n)
    pred = pipe.unet_step(latents.repeat(n, 1, 1, 1), windows(0, n))
    decoded = pipe.decode(pred)
    d_pred = float((pred - torch.from_numpy(fixture["pred_latents"])).abs().max())
    d_dec = float(np.abs(decoded[0, :, 64:192, 64:192].numpy() - fixture["decoded0_center"]).max())
    faces = pipe.to_uint8(decoded)
    d_u8 = int(np.abs(faces.astype(int) - fixture["recon_bgr"][..., ::-1].astype(int)).max())
    print(f"\npred latents {d_pred:.2e}, decoded {d_dec:.2e}, uint8 {d_u8}")
    assert d_pred <= 1e-3 and d_dec <= 1e-3 and d_u8 <= 1


def test_blend_matches_reference(fixture):
    out = paste_face(fixture["blend_case_image"], fixture["blend_case_face"], fixture["blend_case_box"],
                     fixture["blend_case_mask"])
    assert np.array_equal(out, fixture["blend_case_out"])


def test_reference_latents_cached_and_seeded(fixture, networks):
    pipe = MuseTalkPipeline(networks, seed=int(fixture["seed"]))
    crop = np.ascontiguousarray(fixture["crop_bgr"][:, :, ::-1])
    calls = []
    a = pipe.reference_latents(3, lambda: calls.append(1) or crop)
    b = pipe.reference_latents(3, lambda: calls.append(1) or crop)
    assert a is b and len(calls) == 1  # encoded once per reference frame
    other = MuseTalkPipeline(networks, seed=int(fixture["seed"]) + 1).encode_references(crop[None])
    assert float((other - a).abs().max()) > 1e-3  # the seed is the posterior draw


def test_reference_latents_in_one_batch_equal_one_at_a_time(fixture, networks):
    crop = np.ascontiguousarray(fixture["crop_bgr"][:, :, ::-1])
    crops = {k: np.ascontiguousarray(np.roll(crop, 7 * k, axis=1)) for k in range(5)}  # five distinct frames
    one = MuseTalkPipeline(networks, seed=int(fixture["seed"]))
    expected = torch.cat([one.reference_latents(k, crops[k]) for k in (0, 1, 2, 1, 4)])
    batched = MuseTalkPipeline(networks, seed=int(fixture["seed"]), cache_size=4)
    made = []
    got = batched.reference_latents_batch([0, 1, 2, 1, 4], lambda k: made.append(k) or crops[k])
    assert made == [0, 1, 2, 4]  # each distinct frame encoded once, in one batch
    assert torch.allclose(got, expected, atol=1e-5, rtol=0)
    assert len(batched._latents) == 4 and batched.reference_latents_batch([4], lambda k: made.append(k)) is not None
    assert made == [0, 1, 2, 4]  # a cached frame is not encoded again


def test_frame_windows_cover_the_driver_clock():
    states = torch.arange(2 * 50 * 2 * 3, dtype=torch.float32).reshape(1, 100, 2, 3)  # 2 s, 2 layers
    w = mt_audio.FrameWindows(states, 25.0, 50)
    assert w(0, 50).shape == (50, 20, 3)
    # frame 0 starts 4 zero states before the audio (2 x ceil(50/25) padding); frame 2 at state 0
    assert float(w(0, 1)[0, :8].abs().sum()) == 0.0 and torch.equal(w(2, 3)[0, :2], states[0, 0])
    # a clock longer than floor(seconds x fps) (the driver's ceil, or 29.97 fps) stays in bounds
    assert mt_audio.FrameWindows(states, 29.97, 61)(0, 61).shape == (61, 20, 3)


# --- strict loading -----------------------------------------------------------------------------------
def test_missing_files_listed_with_where_they_go(tmp_path):
    with pytest.raises(MuseTalkFilesError) as err:
        locate(tmp_path)
    msg = str(err.value)
    for name in ("musetalkV15/musetalk.json", "musetalkV15/unet.pth", "sd-vae/config.json",
                 "sd-vae/diffusion_pytorch_model.safetensors", "whisper/config.json",
                 "whisper/preprocessor_config.json", "whisper/model.safetensors"):
        assert str(tmp_path / "musetalk" / name) in msg
    assert "7 more file(s)" in msg and "huggingface.co/stabilityai/sd-vae-ft-mse" in msg


def test_partly_missing_lists_only_the_missing(tmp_path, release):
    shutil.copytree(release / "musetalk", tmp_path / "musetalk")
    (tmp_path / "musetalk" / "musetalkV15" / "unet.pth").unlink()
    (tmp_path / "musetalk" / "whisper" / "preprocessor_config.json").unlink()
    status = {name: present for name, present, _ in file_status(tmp_path)}
    assert status["sd-vae/diffusion_pytorch_model.bin"] and not status["musetalkV15/unet.pth"]
    with pytest.raises(MuseTalkFilesError, match=r"2 more file\(s\)") as err:
        locate(tmp_path)
    assert "unet.pth" in str(err.value) and "preprocessor_config.json" in str(err.value)
    assert "sd-vae" not in str(err.value)


def _copy(release: Path, tmp: Path) -> Path:
    shutil.copytree(release / "musetalk", tmp / "musetalk")
    return tmp


def test_wrong_shape_and_unexpected_key_rejected(tmp_path, release):
    root = _copy(release, tmp_path)
    path = root / "musetalk" / "musetalkV15" / "unet.pth"
    state = torch.load(path, weights_only=True)
    state["conv_in.weight"] = state["conv_in.weight"][:, :4]  # a v1.0/SD-style 4-channel input
    state["extra.weight"] = torch.zeros(1)
    del state["conv_out.bias"]
    torch.save(state, path)
    with pytest.raises(MuseTalkWeightsError) as err:
        load_networks(models_root=root)
    msg = str(err.value)
    assert "conv_in.weight: file (32, 4, 3, 3), expected (32, 8, 3, 3)" in msg
    assert "extra.weight" in msg and "conv_out.bias" in msg and "missing" in msg and "unexpected" in msg


def test_config_that_is_not_musetalk_rejected(tmp_path, release):
    root = _copy(release, tmp_path)
    cfg_path = root / "musetalk" / "musetalkV15" / "musetalk.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps(dict(cfg, in_channels=4)))
    with pytest.raises(MuseTalkWeightsError, match="in_channels 8"):
        load_networks(models_root=root)


def test_pickled_code_is_refused(tmp_path, release):
    root = _copy(release, tmp_path)
    path = root / "musetalk" / "sd-vae" / "diffusion_pytorch_model.bin"
    torch.save({"weights": object()}, path)  # not tensors: weights_only refuses to unpickle it
    with pytest.raises(MuseTalkWeightsError, match="weights-only"):
        load_networks(models_root=root)


def test_safetensors_preferred_and_equal(tmp_path, release, networks):
    root = _copy(release, tmp_path)
    from safetensors.torch import save_file

    vae_bin = root / "musetalk" / "sd-vae" / "diffusion_pytorch_model.bin"
    state = torch.load(vae_bin, weights_only=True)
    save_file(state, str(vae_bin.with_suffix(".safetensors")))
    vae_bin.write_bytes(b"broken")  # would fail if it were read
    files = locate(root)
    assert files.vae_weights.suffix == ".safetensors"
    net = load_networks(files)
    for k, v in networks.vae.state_dict().items():
        assert torch.equal(v, net.vae.state_dict()[k])


def test_whisper_encoder_only_file_accepted(tmp_path, release, networks):
    root = _copy(release, tmp_path)
    path = root / "musetalk" / "whisper" / "pytorch_model.bin"
    state = torch.load(path, weights_only=True)
    torch.save({k[len("model."):]: v for k, v in state.items() if k.startswith("model.encoder.")}, path)
    net = load_networks(models_root=root)
    for k, v in networks.whisper.state_dict().items():
        assert torch.equal(v, net.whisper.state_dict()[k])


# --- ONNX export through the engine layer -------------------------------------------------------------
def test_unet_onnx_export_parity(tmp_path, networks):
    from digital_human.engines import loader
    from digital_human.engines.musetalk.export import example_inputs, export_unet, unet_spec, unet_step_module
    from digital_human.engines.onnx_export import parity

    path = export_unet(networks.unet, tmp_path / "musetalk_unet.onnx", audio_len=20)
    module = unet_step_module(networks.unet, 20)
    report = parity(module, path, example_inputs(3, 20, seed=1), name="musetalk-unet")  # batch 3: dynamic axis
    print(f"\n{report}")
    assert report.max_abs_diff <= 1e-3
    spec = unet_spec(path, audio_len=20, max_batch=8)
    assert spec.profiles["latents"].max == (8, 8, 32, 32) and spec.profiles["latents"].contains((5, 8, 32, 32))
    assert not spec.profiles["latents"].contains((1, 8, 64, 64))  # the crop is fixed at 256x256
    runner = loader.get(spec, backend="onnxruntime", precision="fp32")
    lat, aud = example_inputs(1, 20, seed=2)
    got = runner({"latents": lat, "audio": aud})["pred"]
    with torch.no_grad():
        want = module(torch.from_numpy(lat), torch.from_numpy(aud)).numpy()
    assert float(np.abs(got - want).max()) <= 1e-3
    loader.release()


# --- the talking-head contract on a real face ----------------------------------------------------------
@pytest.fixture(scope="module")
def photo_track(data_dir, face_runners):
    from digital_human.media.probe import read_video_frames
    from digital_human.vision import align_faces

    frames, _ = read_video_frames(data_dir / "image" / "face_02_male.png")
    return align_faces(frames, 0, runners=face_runners)


def test_musetalk_crops_contract(photo_track, release, data_dir):
    from digital_human.audio.decode import decode_audio
    from digital_human.talking_head.musetalk.geometry import musetalk_box
    from digital_human.talking_head.musetalk.crops import iter_musetalk_chunks, musetalk_crops

    wave, sr = decode_audio(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=4.0)
    wave = wave.mean(0)[int(3.0 * sr): int(3.6 * sr)]
    fps = 25.0
    gen = musetalk_crops(photo_track, wave, sr, fps, batch_size=4, models_root=release)
    n, s = 15, photo_track.crop_size
    assert len(gen) == n and gen.crops.shape == (n, s, s, 3) and gen.crops.dtype == np.uint8
    assert gen.model == "musetalk" and gen.backend == "torch-cpu fp32"
    mask = gen.mask(0)
    assert mask.shape == (s, s) and 0.0 <= mask.min() and mask.max() <= 1.0 and mask.max() > 0.5
    changed = np.any(gen.crops != photo_track.crops[0][None], axis=(0, 3))
    ys, xs = np.nonzero(changed)
    lms = photo_track.crop_landmarks()[0]
    x1, y1, x2, _ = musetalk_box(lms, s)
    assert ys.min() >= y1 and xs.min() >= x1 and xs.max() <= x2  # only MuseTalk's face box changes
    rows = np.nonzero(mask.max(1) > 0)[0]
    assert rows.min() > lms[5, 1] - 0.05 * s  # the paste mask keeps the lower half only
    # the streaming generator yields the same crops, chunk by chunk, with their masks; chunks of whole
    # batches, so both paths run the same UNet batches (CPU convolutions may round differently per batch size)
    chunks = list(iter_musetalk_chunks(photo_track, wave, sr, fps, chunk=8, batch_size=4, models_root=release))
    assert [(a, b) for a, b, _, _ in chunks] == [(0, 8), (8, 15)]
    assert np.array_equal(np.concatenate([c for _, _, c, _ in chunks]), gen.crops)
    assert chunks[0][3].shape == (8, s, s) and np.array_equal(chunks[0][3][0], mask)


def test_musetalk_crops_missing_files_first(photo_track, tmp_path):
    from digital_human.talking_head.musetalk.crops import musetalk_crops

    with pytest.raises(MuseTalkFilesError, match="musetalkV15/unet.pth"):
        musetalk_crops(photo_track, np.zeros(100, np.float32), 16000, 25.0, models_root=tmp_path)


# --- CLI and node glue -------------------------------------------------------------------------------
def test_setup_check_and_node_validation(tmp_path, release, monkeypatch, capsys):
    import argparse

    from digital_human.cli import _cmd_setup
    from digital_human.nodes.talking_head_nodes import TRT_TalkingHead

    monkeypatch.setenv("DIGITAL_HUMAN_MODELS", str(tmp_path))
    report = _cmd_setup(argparse.Namespace(check="musetalk", wheel_dir=None, only=None))
    assert report["ready"] is False and len(report["missing"]) == 7
    assert "MISSING" in capsys.readouterr().out
    msg = TRT_TalkingHead.VALIDATE_INPUTS(model="musetalk")
    assert isinstance(msg, str) and "musetalkV15/unet.pth" in msg and "7 more file(s)" in msg
    assert "musetalk" in TRT_TalkingHead.INPUT_TYPES()["required"]["model"][0]

    monkeypatch.setenv("DIGITAL_HUMAN_MODELS", str(release))
    report = _cmd_setup(argparse.Namespace(check="musetalk", wheel_dir=None, only=None))
    assert report["ready"] is True and not report["missing"]
    assert TRT_TalkingHead.VALIDATE_INPUTS(model="musetalk") is True
