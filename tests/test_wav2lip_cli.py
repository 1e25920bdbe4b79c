"""`digital-human animate --model wav2lip`: refused up front (exit 2, both checkpoint names and where they go)
without the user's checkpoint, and run to an MP4 of the audio's length on a talking video with a release-format
random-weight checkpoint (the mouth is noise, the command's path is real)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from digital_human.media.probe import probe_media


def _animate(models: Path, audio: Path, face: Path, out: Path) -> tuple[subprocess.CompletedProcess, dict]:
    env = {k: v for k, v in os.environ.items() if k != "DIGITAL_HUMAN_WAV2LIP_CHECKPOINT"}
    proc = subprocess.run([sys.executable, "-m", "digital_human", "animate", "--audio", str(audio), "--face", str(face),
                           "--model", "wav2lip", "--out", str(out), "--json"], capture_output=True, text=True,
                          env={**env, "DIGITAL_HUMAN_MODELS": str(models)}, timeout=600)
    lines = proc.stdout.strip().splitlines()
    return proc, (json.loads(lines[-1]) if lines else {})


def _models_with(tmp_path: Path, wav2lip: bool) -> Path:
    """The setup step's face models, plus (or without) a Wav2Lip checkpoint of random weights."""
    from digital_human.paths import models_root

    root = tmp_path / "models"
    root.mkdir()
    (root / "face").symlink_to(models_root() / "face", target_is_directory=True)
    if wav2lip:
        from digital_human.engines.wav2lip.random_release import write_release

        write_release(root, ("wav2lip",), seed=0)
    return root


def test_without_the_checkpoint_animate_stops_before_any_work(tmp_path, data_dir, setup_models):
    out = tmp_path / "results" / "talk.mp4"
    proc, report = _animate(_models_with(tmp_path, wav2lip=False), data_dir / "audio" / "spk_en_03.wav",
                            data_dir / "video" / "talk_en_female_03a.mp4", out)
    assert proc.returncode == 2 and report["ok"] is False, (proc.returncode, proc.stderr[-2000:])
    for name in ("--model wav2lip", str(tmp_path / "models" / "wav2lip" / "wav2lip.pth"),
                 str(tmp_path / "models" / "wav2lip" / "wav2lip_gan.pth"), "nothing is downloaded"):
        assert name in report["error"], (name, report["error"])
    assert "Traceback" not in proc.stderr and not (tmp_path / "results").exists()


def test_on_a_talking_video_animate_makes_an_mp4_of_the_audio_length(tmp_path, data_dir, setup_models):
    import soundfile as sf

    wave, rate = sf.read(data_dir / "audio" / "spk_en_03.wav", dtype="float32")
    speech = tmp_path / "speech.wav"
    sf.write(speech, wave[: int(1.5 * rate)], rate)
    out = tmp_path / "talk.mp4"
    video = data_dir / "video" / "talk_en_female_03a.mp4"
    proc, report = _animate(_models_with(tmp_path, wav2lip=True), speech, video, out)
    assert proc.returncode == 0 and report["ok"] is True, (proc.returncode, proc.stderr[-3000:])
    assert "wav2lip.pth" in json.dumps(report).lower(), report
    probe = probe_media(out)
    fps = probe_media(video).fps
    assert probe.frame_count == round(1.5 * fps) and abs(probe.audio_duration - 1.5) < 0.1, probe
