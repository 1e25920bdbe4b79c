"""Face/video nodes as ComfyUI calls them, and the `align` / `mux` CLI."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from digital_human.audio import to_comfy_audio
from digital_human.media.probe import probe_media, read_video_audio, read_video_frames
from digital_human.nodes.image_convert import uint8_to_image
from digital_human.nodes.video_nodes import FaceAlign, LoadReferenceVideo, TemporalSmooth, VideoMux
from digital_human.vision.faces import NoFaceError


def _photo(path) -> torch.Tensor:
    from PIL import Image

    with Image.open(path) as img:
        return uint8_to_image(np.asarray(img.convert("RGB"))[None])


def test_face_align_photo_and_preview(data_dir, setup_models):
    faces, preview, report = FaceAlign().align(_photo(data_dir / "image" / "face_01_female.jpg"))
    assert faces.found.tolist() == [True] and tuple(preview.shape) == (1, 256, 256, 3)
    assert "1/1" in report and float(preview.max()) <= 1.0


def test_face_align_no_face_names_input(data_dir, setup_models):
    with pytest.raises(NoFaceError, match="image"):
        FaceAlign().align(_photo(data_dir / "image" / "neg_noface_landscape.png"))


@pytest.fixture(scope="module")
def clip(data_dir):
    frames, fps = read_video_frames(data_dir / "video" / "talk_en_male_01a.mp4", max_frames=40)
    wave, rate = read_video_audio(data_dir / "video" / "talk_en_male_01a.mp4")
    return frames, fps, wave, rate


def test_temporal_smooth_leaves_outside_of_face_untouched(clip, setup_models):
    frames, fps, _, _ = clip
    images = uint8_to_image(frames)
    faces, _, _ = FaceAlign().align(images, fps)
    smoothed, report = TemporalSmooth().smooth(images, fps=fps, faces=faces)
    assert smoothed.shape == images.shape and "lower face" in report
    changed = (smoothed - images).abs().amax(dim=-1)
    assert float(changed[:, :20, :].max()) == 0.0  # the top rows are far from the mouth
    with pytest.raises(ValueError, match="faces has 40 frames but images has 10"):
        TemporalSmooth().smooth(images[:10], fps=fps, faces=faces)


def test_temporal_smooth_falls_back_to_the_cpu_when_the_gpu_is_full(clip, monkeypatch):
    """A box too large for the GPU must not fail the node: the same filter runs with numpy instead."""
    import torch

    from digital_human.media import smoothing

    frames, fps, _, _ = clip
    images = uint8_to_image(frames[:12])
    expected, _ = TemporalSmooth().smooth(images, fps=fps)  # no CUDA here: numpy
    real = smoothing.smooth_frames
    devices = []

    def gpu_full(*args, device=None, **kwargs):
        devices.append(device)
        if device == "cuda":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return real(*args, device=device, **kwargs)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(smoothing, "smooth_frames", gpu_full)
    got, report = TemporalSmooth().smooth(images, fps=fps)
    assert devices == ["cuda", None] and "(cpu)" in report
    assert torch.equal(got, expected)


def test_video_mux_odd_size_probes_and_previews(tmp_path, monkeypatch, clip):
    monkeypatch.setenv("DIGITAL_HUMAN_OUTPUT_DIR", str(tmp_path))
    frames, fps, wave, rate = clip
    odd = uint8_to_image(frames[:, :255, :131])
    audio = to_comfy_audio(wave[:, : int(1.0 * rate)], rate)
    out = VideoMux().mux(odd, audio, fps=fps, filename_prefix="runs/test")
    video, path, report = out["result"]
    info = probe_media(path)
    assert info.width % 2 == 0 and info.height % 2 == 0 and info.pix_fmt == "yuv420p"
    assert info.frame_count == 40 and abs(info.video_duration - info.audio_duration) <= 1 / fps
    assert out["ui"]["images"][0] == {"filename": path.split("/")[-1], "subfolder": "runs", "type": "output"}
    assert "padded" in report
    with pytest.raises(ValueError, match="outside the allowed folders"):
        VideoMux().mux(odd, audio, fps=fps, filename_prefix="../../escape")
    assert not list(tmp_path.parent.glob("escape*"))


def test_load_reference_video_downscales_and_keeps_audio(data_dir):
    images, audio, fps, report = LoadReferenceVideo().load(
        str(data_dir / "video" / "talk_xx_female_05_1080x1920_hevc.mp4"), max_seconds=1.0, max_side=640)
    assert tuple(images.shape)[1:] == (640, 360, 3) and images.shape[0] == 25 and fps == 25.0
    assert audio["sample_rate"] > 0 and abs(audio["waveform"].shape[-1] / audio["sample_rate"] - 1.0) < 0.05


def test_cli_align_and_mux(tmp_path, data_dir, setup_models):
    out = tmp_path / "faces.npz"
    proc = subprocess.run([sys.executable, "-m", "digital_human", "align", "--face",
                           str(data_dir / "image" / "neg_two_faces.jpg"), "--face-index", "1", "--out", str(out),
                           "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["found"] == 1 and out.exists() and (tmp_path / "faces.png").exists()
    assert any("2 faces" in w for w in report["warnings"])
    video = tmp_path / "out.mp4"
    proc = subprocess.run([sys.executable, "-m", "digital_human", "mux", "--frames",
                           str(data_dir / "video" / "talk_en_female_03c.mp4"), "--audio",
                           str(data_dir / "audio" / "spk_en_03.wav"), "--out", str(video), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "padded" in report["action"] and abs(report["video_seconds"] - report["audio_seconds"]) <= 1 / 30
