"""Wav2Lip: the user's files (one error naming both checkpoints), the strict loader of the release's format, and
parity with the reference code (Rudrabha/Wav2Lip inference.py) on a fixture its own code produced
(benchmarks/wav2lip_parity.py: seeded random weights, a 4-frame video with FaceAlign's boxes, 0.4 s of speech)."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from digital_human.engines.wav2lip import audio as w2l_audio
from digital_human.engines.wav2lip.files import Wav2LipFilesError, Wav2LipWeightsError, locate
from digital_human.engines.wav2lip.networks import expected_shapes, inference_generator, read_state_dict
from digital_human.talking_head.wav2lip import geometry

FIXTURE = Path(__file__).parent / "fixtures" / "wav2lip" / "parity.npz"


@pytest.fixture(scope="module")
def fixture() -> dict:
    return dict(np.load(FIXTURE))


@pytest.fixture(scope="module")
def release(tmp_path_factory, fixture) -> Path:
    """The fixture's seeded random checkpoint, written in the release's format."""
    from digital_human.engines.wav2lip.random_release import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("w2l") / "wav2lip.pth", int(fixture["seed"]))


def test_without_a_checkpoint_the_error_names_both_and_where_they_go(tmp_path, monkeypatch):
    monkeypatch.delenv("DIGITAL_HUMAN_WAV2LIP_CHECKPOINT", raising=False)
    with pytest.raises(Wav2LipFilesError) as err:
        locate(tmp_path)
    msg = str(err.value)
    for name in (str(tmp_path / "wav2lip" / "wav2lip.pth"), str(tmp_path / "wav2lip" / "wav2lip_gan.pth"),
                 "nothing is downloaded", "non-commercial"):
        assert name in msg, (name, msg)
    (tmp_path / "wav2lip").mkdir()
    (tmp_path / "wav2lip" / "wav2lip.pth").write_bytes(b"x")
    assert locate(tmp_path).kind == "wav2lip"
    monkeypatch.setenv("DIGITAL_HUMAN_WAV2LIP_CHECKPOINT", "wav2lip_gan")
    with pytest.raises(Wav2LipFilesError, match="wav2lip_gan.pth"):
        locate(tmp_path)
    (tmp_path / "wav2lip" / "wav2lip_gan.pth").write_bytes(b"x")
    monkeypatch.setenv("DIGITAL_HUMAN_WAV2LIP_CHECKPOINT", "auto")
    assert locate(tmp_path).kind == "wav2lip_gan"  # auto prefers the GAN checkpoint
    monkeypatch.setenv("DIGITAL_HUMAN_WAV2LIP_CHECKPOINT", "wav2lip")
    assert locate(tmp_path).kind == "wav2lip"


def test_the_loader_refuses_other_checkpoints_naming_every_wrong_key(tmp_path):
    shapes = expected_shapes()
    keys = list(shapes)
    state = {f"module.{k}": torch.zeros(s) for k, s in shapes.items()}
    del state[f"module.{keys[0]}"], state[f"module.{keys[-1]}"]
    state[f"module.{keys[5]}"] = torch.zeros(3, 3)
    state["module.extra.weight"] = torch.zeros(1)
    torch.save({"state_dict": state}, tmp_path / "bad.pth")
    with pytest.raises(Wav2LipWeightsError) as err:
        read_state_dict(tmp_path / "bad.pth")
    msg = str(err.value)
    assert "2 missing" in msg and keys[0] in msg and keys[-1] in msg, msg
    assert "1 unexpected: extra.weight" in msg and f"{keys[5]} (3, 3)" in msg, msg
    torch.save({"model": {}}, tmp_path / "nostate.pth")
    with pytest.raises(Wav2LipWeightsError, match="no 'state_dict'"):
        read_state_dict(tmp_path / "nostate.pth")

    class Code:  # a pickle that would run code: torch.load(weights_only=True) refuses it
        def __reduce__(self):
            return (print, ("ran",))

    with open(tmp_path / "code.pth", "wb") as fh:
        pickle.dump({"state_dict": Code()}, fh)
    with pytest.raises(Wav2LipWeightsError, match="not a readable Wav2Lip checkpoint"):
        read_state_dict(tmp_path / "code.pth")


def test_mel_and_windows_equal_the_reference(fixture):
    mel = w2l_audio.melspectrogram(fixture["wave16k"])
    np.testing.assert_allclose(mel, fixture["ref_mel"], atol=1e-5)
    n = len(fixture["ref_coords"])
    starts = w2l_audio.window_starts(n, float(fixture["fps"]), mel.shape[1])
    # inference.py's chunks: int(i * 80 / fps), then the last 16 frames once a window runs past the end
    assert starts[-1] == mel.shape[1] - 16 and (np.diff(starts) >= 0).all()
    np.testing.assert_allclose(w2l_audio.mel_windows(mel, starts), fixture["ref_melb"].transpose(0, 3, 1, 2),
                               atol=1e-5)


def test_boxes_and_network_inputs_equal_the_reference(fixture):
    from digital_human.talking_head.driver import frame_schedule
    from digital_human.talking_head.wav2lip.crops import network_inputs

    frames = fixture["frames"]
    h, w = frames.shape[1:3]
    n = len(fixture["ref_coords"])
    boxes = geometry.wav2lip_boxes_from_rects(fixture["rects"], h, w)
    idx = frame_schedule(len(frames), n, "loop")
    np.testing.assert_array_equal(boxes[idx], fixture["ref_coords"][:, [2, 0, 3, 1]])
    faces = np.stack([geometry.face_input(frames[r], boxes[r])[..., ::-1] for r in idx])
    x = network_inputs(faces)
    np.testing.assert_array_equal(np.round(x * 255).astype(np.uint8), fixture["ref_img_u8"].transpose(0, 3, 1, 2))


def test_network_inputs_equal_the_float64_division_bit_for_bit():
    """network_inputs divides in float32: for every uint8 value that equals the reference's float64 / 255
    rounded to float32 (its np.float32 batch), so the generator sees the same inputs."""
    from digital_human.talking_head.wav2lip.crops import network_inputs

    values = np.arange(256, dtype=np.uint8)
    assert np.array_equal(values.astype(np.float32) / np.float32(255.0), (values / 255.0).astype(np.float32))
    faces = np.random.default_rng(0).integers(0, 256, (3, 96, 96, 3), dtype=np.uint8)
    masked = faces.copy()
    masked[:, 48:] = 0
    reference = (np.concatenate((masked, faces), axis=3) / 255.0).transpose(0, 3, 1, 2).astype(np.float32)
    got = network_inputs(faces)
    assert got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, reference)


def test_network_and_paste_equal_the_reference(fixture, release):
    from digital_human.talking_head.driver import frame_schedule
    from digital_human.talking_head.wav2lip.crops import output_uint8

    k = len(fixture["ref_pred"])
    frames = fixture["frames"]
    mel = w2l_audio.melspectrogram(fixture["wave16k"])
    starts = w2l_audio.window_starts(k, float(fixture["fps"]), mel.shape[1])
    x = torch.from_numpy(fixture["ref_img_u8"][:k].transpose(0, 3, 1, 2).astype(np.float32) / 255.0)
    net = inference_generator(release, "cpu", "fp32")  # strict load of the release format, BatchNorms folded
    with torch.inference_mode():
        pred = net(torch.from_numpy(w2l_audio.mel_windows(mel, starts)), x.contiguous(memory_format=torch.channels_last))
    np.testing.assert_allclose(pred.numpy(), fixture["ref_pred"], atol=2e-5)
    out = output_uint8(pred)
    ref_u8 = (fixture["ref_pred"].transpose(0, 2, 3, 1) * 255.0).astype(np.uint8)
    assert np.abs(out.astype(int) - ref_u8).max() <= 1 and (out != ref_u8).mean() < 1e-3
    h, w = frames.shape[1:3]
    boxes = geometry.wav2lip_boxes_from_rects(fixture["rects"], h, w)
    idx = frame_schedule(len(frames), k, "loop")
    for i, r in enumerate(idx):
        pasted = geometry.paste_reference(frames[r][..., ::-1], ref_u8[i], boxes[r])[..., ::-1]
        np.testing.assert_array_equal(pasted, fixture["ref_frames"][i])


def test_onnx_export_matches_torch_on_onnxruntime_cpu(tmp_path, release):
    from digital_human.engines.onnx_export import parity
    from digital_human.engines.wav2lip.export import example_inputs, export_generator, generator_spec

    net = inference_generator(release, "cpu", "fp32")
    path = export_generator(net, tmp_path / "wav2lip.onnx")
    report = parity(net.to(memory_format=torch.contiguous_format), path, example_inputs(3, seed=1), name="wav2lip")
    assert report.outputs == 1 and report.max_abs_diff < 1e-4, report  # batch 3: the dynamic axis works
    spec = generator_spec(path, max_batch=256)
    assert spec.profiles["faces"].max == (256, 6, 96, 96) and spec.profiles["mel"].min == (1, 1, 80, 16)


def test_node_and_headless_crops_agree_and_only_the_box_changes(tmp_path, release, data_dir, setup_models):
    """Two frames of a talking video through wav2lip_crops: the node path's crops (composited over the reference crop) and the headless
    path's streamed crops are the same inside the paste mask, and the pasted frames change only the padded box
    (its 1-px bilinear edge aside): the reference's hard rectangle paste."""
    import soundfile as sf

    from digital_human.media.probe import read_video_frames
    from digital_human.talking_head.driver import paste_generated
    from digital_human.talking_head.wav2lip.crops import wav2lip_crops
    from digital_human.vision.align import align_faces

    frames, fps = read_video_frames(data_dir / "video" / "talk_en_female_03a.mp4", max_frames=2)
    track = align_faces(frames, fps)
    wave, rate = sf.read(data_dir / "audio" / "spk_en_03.wav", dtype="float32")
    (tmp_path / "wav2lip").mkdir()
    (tmp_path / "wav2lip" / "wav2lip.pth").symlink_to(release)
    kw = dict(models_root=tmp_path, checkpoint="wav2lip", precision="fp32", loop_mode="loop")
    node = wav2lip_crops(track, wave[: int(0.3 * rate)], rate, fps, **kw)
    assert len(node) == int(np.ceil(0.3 * fps - 1e-6)) and "checkpoint: wav2lip.pth" in " ".join(node.warnings)
    stream = wav2lip_crops(track, wave[: int(0.3 * rate)], rate, fps, streaming=True, **kw)
    crops, _ = stream.render(0, len(stream))
    masks = stream.mask_stack(0, len(stream))[..., None] > 0
    np.testing.assert_array_equal(np.where(masks, crops, 0), np.where(masks, node.crops, 0))
    pasted = paste_generated(node).frames
    renderer = stream.render.__self__
    for i, r in enumerate(node.idx):
        x1, y1, x2, y2 = renderer.boxes[r]
        outside = np.ones(frames.shape[1:3], bool)
        outside[max(0, y1 - 2):y2 + 2, max(0, x1 - 2):x2 + 2] = False
        assert np.array_equal(pasted[i][outside], frames[r][outside])
        inside = (slice(y1 + 2, y2 - 2), slice(x1 + 2, x2 - 2))
        assert np.abs(pasted[i][inside].astype(int) - frames[r][inside]).mean() > 1  # the generated face is in


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_inplace_inference_forward_equals_the_out_of_place_one(dtype):
    """Without autograd the blocks add the residual and apply the ReLU in place: the same values, bit for bit,
    as the reference's out-of-place forward (run here with grad mode on)."""
    import torch

    from digital_human.engines.wav2lip.networks import Wav2LipGenerator, fold_batchnorms

    torch.manual_seed(0)
    net = fold_batchnorms(Wav2LipGenerator().eval()).to(getattr(torch, dtype), memory_format=torch.channels_last)
    mel = torch.randn(2, 1, 80, 16).to(getattr(torch, dtype))
    faces = torch.rand(2, 6, 96, 96).to(getattr(torch, dtype)).contiguous(memory_format=torch.channels_last)
    with torch.enable_grad():
        reference = net(mel, faces).detach()
    with torch.inference_mode():
        got = net(mel, faces)
    assert torch.equal(got, reference)
