"""Bounded memory on large and long inputs: `animate` on a 4000x3000 photo and on an 8-s 1080x1920
video runs in a child process whose peak RSS stays under a budget that an implementation holding
the whole video would exceed (the 8-s clip alone is 1.5 GB of uint8 frames, 6 GB as float IMAGE;
the photo's 50 output frames at source size are 1.8 GB). benchmarks/memory.py measures the rest."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from digital_human.media.ffmpeg_tools import ffmpeg_exe

BUDGET_MB = 1500

_PROBE = ("import resource, subprocess, sys\n"
          "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
          "sys.stderr.write(p.stderr[-3000:])\n"
          "print((p.stdout.strip().splitlines() or [''])[-1])\n"
          "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)\n")


def _animate_peak(tmp_path, face, audio) -> tuple[dict, int]:
    out = tmp_path / "out.mp4"
    cmd = [sys.executable, "-c", _PROBE, sys.executable, "-m", "digital_human", "animate", "--face", str(face),
           "--audio", str(audio), "--out", str(out), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    report_line, last = proc.stdout.strip().splitlines()[-2:]
    rc, peak_mb = (int(v) for v in last.split())
    assert rc == 0, proc.stderr[-2000:]
    return json.loads(report_line), peak_mb


@pytest.fixture(scope="module")
def speech2(tmp_path_factory, data_dir):
    path = tmp_path_factory.mktemp("speech") / "speech2.wav"
    subprocess.run([ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-y", "-i",
                    str(data_dir / "audio" / "spk_en_male_01.wav"), "-ss", "2.8", "-t", "2", str(path)], check=True)
    return path


def test_large_photo_is_capped_and_bounded(tmp_path, data_dir, speech2, setup_models):
    from PIL import Image

    photo = tmp_path / "phone_photo.jpg"
    canvas = Image.new("RGB", (4000, 3000), (96, 110, 120))
    canvas.paste(Image.open(data_dir / "image" / "face_02_male.png").convert("RGB").resize((1500, 1500)), (1250, 900))
    canvas.save(photo, quality=90)
    report, peak_mb = _animate_peak(tmp_path, photo, speech2)
    assert report["ok"] and report["frames"] == 50
    assert report["reports"]["output_size"] == [1920, 1440]  # the source size capped at --max-side 1920
    assert peak_mb < BUDGET_MB, f"peak RSS {peak_mb} MB"


def test_long_hd_video_is_streamed(tmp_path, data_dir, speech2, setup_models):
    video = tmp_path / "talk_1080x1920.mp4"
    # a talking head (~350 px face, as in a phone video) in a 1080x1920 frame, 8 s
    subprocess.run([ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-y", "-stream_loop", "-1", "-i",
                    str(data_dir / "video" / "talk_en_male_01a.mp4"), "-t", "8",
                    "-vf", "scale=540:540,pad=1080:1920:270:500,setsar=1", "-c:v", "libx264", "-preset",
                    "ultrafast", "-crf", "26", "-an", str(video)], check=True)
    report, peak_mb = _animate_peak(tmp_path, video, speech2)
    assert report["ok"] and report["reports"]["output_size"] == [1080, 1920]
    assert peak_mb < BUDGET_MB, f"peak RSS {peak_mb} MB"
