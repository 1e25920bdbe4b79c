"""`digital-human animate --model sonic`: refused up front (exit 2, every missing file named) without the
user's Sonic release, and run to an MP4 whose frame count and length match the audio with a random-weight
release in the full layout (reduced widths; the head is noise, the command's path is real)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from digital_human.media.probe import probe_media


def _animate(models: Path, audio: Path, face: Path, out: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run([sys.executable, "-m", "digital_human", "animate", "--audio", str(audio), "--face", str(face),
                           "--model", "sonic", "--out", str(out), "--json", *extra], capture_output=True, text=True,
                          env={**os.environ, "DIGITAL_HUMAN_MODELS": str(models)}, timeout=600)
    lines = proc.stdout.strip().splitlines()
    return proc, (json.loads(lines[-1]) if lines else {})


def _models_with(tmp_path: Path, sonic: bool) -> Path:
    from digital_human.paths import models_root

    root = tmp_path / "models"
    root.mkdir()
    (root / "face").symlink_to(models_root() / "face", target_is_directory=True)
    if sonic:
        from digital_human.engines.sonic.random_release import write_random_release

        write_random_release(root, seed=0, reduced=True)
    return root


def test_without_the_files_animate_names_every_missing_file(tmp_path, data_dir, setup_models):
    out = tmp_path / "results" / "talk.mp4"
    proc, report = _animate(_models_with(tmp_path, sonic=False), data_dir / "audio" / "spk_en_03.wav",
                            data_dir / "image" / "face_01_female.jpg", out)
    assert proc.returncode == 2 and report["ok"] is False, (proc.returncode, proc.stderr[-2000:])
    from digital_human.engines.sonic.files import REQUIRED

    for names, _ in REQUIRED:  # all 14, each with where it goes
        assert names[0] in report["error"], (names[0], report["error"])
    assert "14 more file(s)" in report["error"] and "CC BY-NC-SA 4.0" in report["error"]
    assert "Traceback" not in proc.stderr and not (tmp_path / "results").exists()


def test_with_a_release_laid_out_random_checkpoint_animate_makes_an_mp4_as_long_as_the_audio(tmp_path, data_dir,
                                                                                           setup_models):
    pytest.importorskip("diffusers", reason="Sonic is an optional extra: pip install .[sonic]")
    pytest.importorskip("transformers", reason="Sonic is an optional extra: pip install .[sonic]")
    import soundfile as sf

    wave, rate = sf.read(data_dir / "audio" / "spk_en_03.wav", dtype="float32")
    speech = tmp_path / "speech.wav"
    sf.write(speech, wave[: int(1.1 * rate)], rate)  # 1.1 s: 28 frames at 25 fps; 13 model frames (one window)
    out = tmp_path / "talk.mp4"
    proc, report = _animate(_models_with(tmp_path, sonic=True), speech, data_dir / "image" / "face_01_female.jpg",
                            out, "--set", "resolution=128", "--set", "steps=2")
    assert proc.returncode == 0 and report["ok"] is True, (proc.returncode, proc.stderr[-3000:])
    assert "sonic" in report["backend"]
    probe = probe_media(out)
    assert probe.frame_count == 28, probe
    assert abs(probe.frame_count / 25.0 - 1.1) <= 1 / 25 and abs(probe.audio_duration - 1.1) < 0.05, probe
    assert (probe.width, probe.height) == (128, 128), probe  # the model's own square face crop


def test_an_unknown_setting_is_refused_with_what_the_model_reads(tmp_path, data_dir, setup_models):
    proc, report = _animate(_models_with(tmp_path, sonic=False), data_dir / "audio" / "spk_en_03.wav",
                            data_dir / "image" / "face_01_female.jpg", tmp_path / "x.mp4", "--model", "portrait",
                            "--set", "steps=3")
    assert proc.returncode == 2 and "--set steps: model portrait reads" in report["error"], report
