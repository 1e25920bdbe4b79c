"""The aligned crop size for models whose crops follow the face (talking_head/crop_choice.py, CLI --crop-size)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from digital_human.talking_head.crop_choice import MAX_UPSCALE, choose_crop_size, paste_upscale


def _affine(scale: float, angle: float = 0.3) -> np.ndarray:
    c, s = np.cos(angle) * scale, np.sin(angle) * scale
    return np.array([[[c, -s, 10.0], [s, c, -4.0]]])


def test_upscale_is_source_pixels_per_crop_pixel():
    assert paste_upscale(_affine(0.5)) == pytest.approx(2.0)
    assert paste_upscale(np.concatenate([_affine(0.5), _affine(0.25)])) == pytest.approx(4.0)  # the worst frame
    assert choose_crop_size(_affine(1 / (MAX_UPSCALE * 1.01)))[0] == 512
    assert choose_crop_size(_affine(1 / (MAX_UPSCALE * 0.99)))[0] == 256


def test_only_models_whose_crops_follow_the_face_adapt():
    from digital_human.talking_head.registry import MODELS

    assert MODELS["portrait"].adaptive_crop and not MODELS["musetalk"].adaptive_crop
    assert not MODELS["clone"].adaptive_crop


@pytest.mark.parametrize("crop, expected", [("auto", 512), ("256", 256)])
def test_cli_picks_512_for_a_large_face(crop, expected, data_dir, tmp_path, setup_models):
    from digital_human.media.wav_float import write_float_wav

    audio = tmp_path / "s.wav"
    t = np.arange(8000) / 16000
    write_float_wav(audio, (0.2 * np.sin(2 * np.pi * 180 * t))[None].astype(np.float32), 16000)  # 0.5 s
    cmd = [sys.executable, "-m", "digital_human", "animate", "--face", str(data_dir / "image" / "face_03_male.jpg"),
           "--audio", str(audio), "--out", str(tmp_path / "o.mp4"), "--json", "--no-idle-motion",
           "--visemes", "off", "--max-side", "1024", "--crop-size", crop]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])["reports"]["align"]
    assert f"crop {expected}px" in report
    assert ("over 2x" in report) == (crop == "auto")


def test_a_video_without_a_face_on_its_first_frame_keeps_256(data_dir, setup_models, monkeypatch):
    from PIL import Image

    from digital_human.pipeline import main_job  # the main job's face step (the CLI calls it)

    with Image.open(data_dir / "image" / "face_03_male.jpg") as img:  # a large face: auto would pick 512
        face = np.asarray(img.convert("RGB").resize((768, 768)))
    frames = np.stack([np.zeros_like(face)] + [face] * 5)
    monkeypatch.setattr(main_job, "_read_frames", lambda *a, **k: (frames, 25.0, None))
    faces, _, report = main_job._faces_from_file(main_job.StageTimer(), data_dir / "x.mp4", None, "auto", 10.0)
    assert faces.crop_size == 256 and "no face on the video's first frame" in report
    monkeypatch.setattr(main_job, "_read_frames", lambda *a, **k: (frames[1:], 25.0, None))
    faces, _, report = main_job._faces_from_file(main_job.StageTimer(), data_dir / "x.mp4", None, "auto", 10.0)
    assert faces.crop_size == 512 and "over 2x" in report
