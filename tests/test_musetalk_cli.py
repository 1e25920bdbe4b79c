"""`digital-human animate --model musetalk`: refused up front (exit 2, every missing file named) without
the user's MuseTalk files, and run to an MP4 with a release-shaped random-weight checkpoint (reduced
configuration; the mouth is noise, the command's path is real)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from digital_human.media.probe import probe_media


def _animate(models: Path, audio: Path, face: Path, out: Path) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run([sys.executable, "-m", "digital_human", "animate", "--audio", str(audio), "--face", str(face),
                           "--model", "musetalk", "--out", str(out), "--json"], capture_output=True, text=True,
                          env={**os.environ, "DIGITAL_HUMAN_MODELS": str(models)}, timeout=600)
    lines = proc.stdout.strip().splitlines()
    return proc, (json.loads(lines[-1]) if lines else {})


def _models_with(tmp_path: Path, musetalk: bool) -> Path:
    """The setup step's face models, plus (or without) a MuseTalk release of random weights."""
    from digital_human.paths import models_root

    root = tmp_path / "models"
    root.mkdir()
    (root / "face").symlink_to(models_root() / "face", target_is_directory=True)
    if musetalk:
        from digital_human.engines.musetalk.random_release import write_release

        write_release(root, "reduced", seed=0)
    return root


def test_without_the_files_animate_stops_before_any_work(tmp_path, data_dir, setup_models):
    out = tmp_path / "results" / "talk.mp4"
    proc, report = _animate(_models_with(tmp_path, musetalk=False), data_dir / "audio" / "spk_en_03.wav",
                            data_dir / "image" / "face_01_female.jpg", out)
    assert proc.returncode == 2 and report["ok"] is False, (proc.returncode, proc.stderr[-2000:])
    for name in ("--model musetalk", "musetalkV15/unet.pth", "sd-vae/config.json", "whisper/config.json",
                 "nothing is downloaded"):
        assert name in report["error"], (name, report["error"])
    assert "Traceback" not in proc.stderr and not (tmp_path / "results").exists()


def test_with_a_release_laid_out_checkpoint_animate_makes_an_mp4(tmp_path, data_dir, setup_models):
    pytest.importorskip("diffusers", reason="MuseTalk is an optional extra: pip install .[musetalk]")
    pytest.importorskip("transformers", reason="MuseTalk is an optional extra: pip install .[musetalk]")
    import soundfile as sf

    wave, rate = sf.read(data_dir / "audio" / "spk_en_03.wav", dtype="float32")
    speech = tmp_path / "speech.wav"
    sf.write(speech, wave[: int(2.0 * rate)], rate)  # 2 s: 50 frames at 25 fps
    out = tmp_path / "talk.mp4"
    proc, report = _animate(_models_with(tmp_path, musetalk=True), speech, data_dir / "image" / "face_01_female.jpg",
                            out)
    assert proc.returncode == 0 and report["ok"] is True, (proc.returncode, proc.stderr[-3000:])
    assert "musetalk" in json.dumps(report["backend"]).lower(), report["backend"]
    probe = probe_media(out)
    assert probe.frame_count == 50 and abs(probe.audio_duration - 2.0) < 0.1, probe
