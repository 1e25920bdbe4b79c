"""TRT_TalkingHead as ComfyUI calls it, and the `animate` CLI (portrait model; clone has its own tests)."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from digital_human.audio import to_comfy_audio
from digital_human.media.probe import probe_media
from digital_human.nodes.image_convert import uint8_to_image
from digital_human.nodes.talking_head_nodes import TRT_TalkingHead
from digital_human.nodes.video_nodes import FaceAlign


@pytest.fixture(scope="module")
def photo_faces(data_dir, setup_models):
    from PIL import Image

    with Image.open(data_dir / "image" / "face_03_male.jpg") as img:
        image = uint8_to_image(np.asarray(img.convert("RGB").resize((512, 512)))[None])
    faces, _, _ = FaceAlign().align(image)
    return faces


@pytest.fixture(scope="module")
def speech(data_dir):
    wave, rate = sf.read(data_dir / "audio" / "spk_en_03.wav", dtype="float32")
    return wave[: int(1.3 * rate)], rate


def test_portrait_frame_count_size_and_only_mouth_changes(photo_faces, speech):
    wave, rate = speech
    out = TRT_TalkingHead().animate(photo_faces, to_comfy_audio(wave, rate), model="portrait", fps=25.0)
    frames, track, report = out["result"]
    assert frames.shape[0] == math.ceil(len(wave) / rate * 25.0) and tuple(frames.shape[1:]) == (512, 512, 3)
    assert len(track.frames) == frames.shape[0] and "portrait" in report
    source = photo_faces.frames[0].astype(np.float32) / 255.0
    diff = np.abs(frames.numpy() - source[None]).max(axis=(0, 3))
    assert diff[:150].max() == 0.0  # forehead and eyes untouched
    assert diff.max() > 0.05  # the mouth moved


def test_talking_head_errors(photo_faces, speech):
    wave, rate = speech
    with pytest.raises(ValueError, match="silent"):
        TRT_TalkingHead().animate(photo_faces, to_comfy_audio(np.zeros(rate, np.float32), rate))
    with pytest.raises(ValueError, match="max_audio_seconds"):
        TRT_TalkingHead().animate(photo_faces, to_comfy_audio(wave, rate), max_audio_seconds=1.0)
    with pytest.raises(ValueError, match="model must be"):
        TRT_TalkingHead().animate(photo_faces, to_comfy_audio(wave, rate), model="wav2lip")


def test_cli_animate_writes_probe_valid_mp4(tmp_path, data_dir, speech, setup_models):
    wave, rate = speech
    audio = tmp_path / "speech.wav"
    sf.write(audio, wave, rate)
    out = tmp_path / "talk.mp4"
    proc = subprocess.run([sys.executable, "-m", "digital_human", "animate", "--face",
                           str(data_dir / "image" / "face_01_female.jpg"), "--audio", str(audio), "--out", str(out),
                           "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    info = probe_media(out)
    assert info.video_codec == "h264" and info.frame_count == math.ceil(len(wave) / rate * 25)
    assert abs(info.video_duration - info.audio_duration) <= 1 / 25 and report["fps"] == 25.0
