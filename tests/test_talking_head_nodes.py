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
    # idle_motion off: a still head (with it on, test_idle_motion.py checks what moves)
    out = TRT_TalkingHead().animate(photo_faces, to_comfy_audio(wave, rate), model="portrait", fps=25.0,
                                    idle_motion="off")
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
        TRT_TalkingHead().animate(photo_faces, to_comfy_audio(wave, rate), model="sadtalker")


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


def test_talking_head_video_node_matches_the_three_nodes(tmp_path, monkeypatch, photo_faces, speech):
    """TalkingHeadVideo = TRT_TalkingHead -> TemporalSmooth -> VideoMux in one step: a probed file in the output
    folder with the preview entry, and decoded frames close to the three-node chain's."""
    from digital_human.media.probe import read_video_frames
    from digital_human.nodes.talking_head_nodes import TalkingHeadVideo
    from digital_human.nodes.video_nodes import TemporalSmooth, VideoMux

    monkeypatch.setenv("DIGITAL_HUMAN_OUTPUT_DIR", str(tmp_path))
    wave, rate = speech
    audio = to_comfy_audio(wave, rate)
    out = TalkingHeadVideo().render(photo_faces, audio, model="portrait", fps=25.0, filename_prefix="runs/fast")
    video, path, report = out["result"]
    info = probe_media(path)
    assert info.frame_count == math.ceil(len(wave) / rate * 25.0) and info.video_codec == "h264"
    assert out["ui"]["images"][0] == {"filename": path.split("/")[-1], "subfolder": "runs", "type": "output"}
    assert "portrait" in report and "frames" in report

    frames, track, _ = TRT_TalkingHead().animate(photo_faces, audio, model="portrait", fps=25.0)["result"]
    smoothed, _ = TemporalSmooth().smooth(frames, strength=0.5, fps=25.0, faces=track)
    _, slow_path, _ = VideoMux().mux(smoothed, audio, fps=25.0, filename_prefix="runs/slow")["result"]
    fast, _ = read_video_frames(path)
    slow, _ = read_video_frames(slow_path)
    mse = np.mean((fast.astype(np.float64) - slow.astype(np.float64)) ** 2)
    assert fast.shape == slow.shape and 10 * np.log10(255 ** 2 / max(mse, 1e-12)) >= 40.0
    with pytest.raises(ValueError, match="model must be"):
        TalkingHeadVideo().render(photo_faces, audio, model="nonsense")
    with pytest.raises(ValueError, match="outside the allowed folders"):
        TalkingHeadVideo().render(photo_faces, audio, model="portrait", filename_prefix="../../escape")
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted([path.split("/")[-1],
                                                                             slow_path.split("/")[-1]])
