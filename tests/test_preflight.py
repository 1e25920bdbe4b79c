"""Fail fast (issue 18): `run`/`animate`/`speak` check every input before any heavy work; each bad input
gives exit code 2, a message naming the input, the JSON error line and no output file. Also
`--face-index` on `animate`/`run` and the photo `mux` length."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from digital_human import preflight
from digital_human.media.probe import probe_media


def _cli(*args: str, timeout: int = 300) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run([sys.executable, "-m", "digital_human", *args, "--json"], capture_output=True, text=True,
                          env=dict(os.environ), timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    return proc, (json.loads(lines[-1]) if lines else {})


@pytest.fixture(scope="module")
def clips(tmp_path_factory, data_dir) -> dict[str, Path]:
    """Inputs of the bad-input table, made once: a short clip (too little speech to clone, fine to
    animate), a corrupt audio file, a text file that is no image or video, a file in the way of a folder."""
    folder = tmp_path_factory.mktemp("inputs")
    wave, rate = sf.read(data_dir / "audio" / "spk_en_03.wav", dtype="float32")
    short = folder / "short.wav"
    sf.write(short, wave[: int(1.5 * rate)], rate)
    corrupt = folder / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk" + bytes(range(256)) * 4)
    not_media = folder / "face.jpg"
    not_media.write_text("this is not a photo\n" * 50)
    blocker = folder / "blocker"
    blocker.write_text("a file, not a folder")
    empty_text = folder / "empty.txt"
    empty_text.write_text("  \n\t ")
    return {"short": short, "corrupt": corrupt, "not_media": not_media, "blocker": blocker,
            "empty_text": empty_text, "voice": data_dir / "audio" / "spk_en_03.wav",
            "photo": data_dir / "image" / "face_01_female.jpg", "two": data_dir / "image" / "neg_two_faces.jpg",
            "landscape": data_dir / "image" / "neg_noface_landscape.png",
            "dog": data_dir / "image" / "neg_animal_dog.png"}


# (command, {option: clip key or literal}, words the message must hold)
BAD_INPUTS = {
    "run: face file missing": ("run", {"--face": "@missing.jpg"}, ["--face", "not found"]),
    "run: face file is not media": ("run", {"--face": "not_media"}, ["--face", "neither a decodable image"]),
    "run: no face in the photo": ("run", {"--face": "landscape"}, ["--face", "no face found"]),
    "run: a dog is not a face": ("run", {"--face": "dog"}, ["no face found"]),
    "run: face index past the faces": ("run", {"--face-index": "=1"}, ["--face-index 1", "1 face(s)"]),
    "run: empty text": ("run", {"--text": "=   "}, ["--text", "empty"]),
    "run: empty text file": ("run", {"--text-file": "empty_text"}, ["--text-file", "empty"]),
    "run: unsupported language": ("run", {"--text": "=Привет, как дела?"}, ["--text"]),
    "run: voice clip missing": ("run", {"--voice": "@missing.wav"}, ["--voice", "not found"]),
    "run: voice clip corrupt": ("run", {"--voice": "corrupt"}, ["--voice", "decode"]),
    "run: voice clip too short": ("run", {"--voice": "short"}, ["--voice", "speech"]),
    "run: unknown avatar": ("run", {"--model": "=clone:no_such_avatar"}, ["--model", "no_such_avatar", "not found"]),
    "run: output folder unwritable": ("run", {"--out": "blocked"}, ["--out", "cannot write"]),
    "animate: audio missing": ("animate", {"--audio": "@missing.wav"}, ["--audio", "not found"]),
    "animate: audio corrupt": ("animate", {"--audio": "corrupt"}, ["--audio", "decode"]),
    "animate: face file missing": ("animate", {"--face": "@missing.png"}, ["--face", "not found"]),
    "animate: fps zero": ("animate", {"--fps": "=0"}, ["--fps", "> 0"]),
    "animate: output folder unwritable": ("animate", {"--out": "blocked"}, ["--out", "cannot write"]),
    "speak: empty text": ("speak", {"--text": "=  "}, ["--text", "empty"]),
    "speak: voice clip missing": ("speak", {"--voice": "@missing.wav"}, ["--voice", "not found"]),
    "speak: output folder unwritable": ("speak", {"--out": "blocked"}, ["--out", "cannot write"]),
}


def _command(command: str, changes: dict[str, str], clips: dict[str, Path], out: Path) -> list[str]:
    values = {"run": {"--text": "Hello there.", "--voice": str(clips["voice"]), "--face": str(clips["photo"])},
              "animate": {"--audio": str(clips["short"]), "--face": str(clips["photo"])},
              "speak": {"--text": "Hello there."}}[command]
    values["--out"] = str(out)
    for option, value in changes.items():
        if option == "--text-file":
            values.pop("--text", None)
        if value.startswith("="):
            values[option] = value[1:]
        elif value.startswith("@"):
            values[option] = str(out.parent / value[1:])
        elif value == "blocked":  # a folder path through a regular file: no user (root included) can write there
            values[option] = str(clips["blocker"] / "sub" / "out.mp4")
        else:
            values[option] = str(clips[value])
    return [command] + [item for pair in values.items() for item in pair]


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_fails_fast_with_exit_2_and_json(case, clips, tmp_path, setup_models):
    command, changes, words = BAD_INPUTS[case]
    out_dir = tmp_path / "results" / "sub"
    proc, report = _cli(*_command(command, changes, clips, out_dir / "out.mp4"))
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert report["ok"] is False, proc.stdout
    for word in words:
        assert word in report["error"], (word, report["error"])
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("error:") or "\nerror: " in proc.stderr
    assert not (tmp_path / "results").exists()  # nothing written, not even the output's folder
    assert not list(clips["blocker"].parent.glob(".dh_preflight*"))
    # found before any heavy work: no voice fit, synthesis or rendering started
    assert "TTS:" not in proc.stderr and "imitation" not in proc.stderr.lower() and "TalkingHead" not in proc.stderr


def test_unwritable_output_after_the_checks_is_exit_2_not_a_traceback(clips, tmp_path, monkeypatch, capsys):
    """main() turns an OSError raised late (a disk that fills up, a folder made read-only mid-run: root
    ignores permissions, so the write itself is made to fail) into the same clear error + JSON + exit 2 as
    the preflight refusals."""
    from digital_human import cli
    from digital_human.media import mux

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "o.mp4"))

    monkeypatch.setattr(mux, "mux_video", refuse)
    code = cli.main(["mux", "--frames", str(clips["photo"]), "--audio", str(clips["short"]),
                     "--out", str(tmp_path / "o.mp4"), "--json"])
    captured = capsys.readouterr()
    report = json.loads(captured.out.strip().splitlines()[-1])
    assert code == 2 and report["ok"] is False and "Traceback" not in captured.err
    assert "Permission denied" in report["error"] and "writable" in report["error"]


def test_output_check_probes_and_leaves_nothing(tmp_path):
    out = tmp_path / "a" / "b" / "video.mp4"
    assert preflight.check_output(out) == out
    assert out.parent.is_dir() and list(out.parent.iterdir()) == []  # the folder stays for the run, no probe file
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(preflight.PreflightError, match="--out: cannot write into the folder"):
        preflight.check_output(blocker / "deeper" / "video.mp4")
    with pytest.raises(preflight.PreflightError, match="is a folder"):
        preflight.check_output(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "file"]


def test_face_check_on_videos(tmp_path, data_dir, setup_models):
    """A talking video passes on its first frame; a decodable video without a face is refused, with no
    frame beyond the few probed ones decoded."""
    from digital_human.media.mux import mux_video

    assert preflight.check_face(data_dir / "video" / "talk_en_male_01a.mp4") >= 1
    noise = np.random.default_rng(0).integers(0, 255, (60, 96, 128, 3), dtype=np.uint8)
    mux_video(noise, None, 16000, 25.0, tmp_path / "noise.mp4")
    with pytest.raises(preflight.PreflightError, match="no face found in the video"):
        preflight.check_face(tmp_path / "noise.mp4")


def test_face_index_reaches_the_aligner(clips, tmp_path, setup_models):
    """--face-index picks another face in `animate` (as in `align`); the report says which one."""
    heights = {}
    for index in (0, 1):
        out = tmp_path / f"face{index}.mp4"
        proc, report = _cli("animate", "--face", str(clips["two"]), "--audio", str(clips["short"]),
                            "--face-index", str(index), "--out", str(out))
        assert proc.returncode == 0, proc.stderr[-2000:]
        align = report["reports"]["align"]
        assert f"face_index {index};" in align
        heights[index] = float(align.split("face height ~")[1].split("px")[0])
        assert probe_media(out).frame_count == math.ceil(1.5 * 25)
    assert heights[0] > heights[1]  # 0 = the largest face, 1 = the next one


def test_mux_of_a_photo_covers_the_audio(clips, tmp_path):
    out = tmp_path / "photo.mp4"
    proc, report = _cli("mux", "--frames", str(clips["photo"]), "--audio", str(clips["short"]), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = probe_media(out)
    assert report["length_mode"] == "hold_last_frame"
    assert info.frame_count == math.ceil(1.5 * 25) and abs(info.video_duration - 1.5) <= 1 / 25
    assert abs(info.audio_duration - info.video_duration) <= 1 / 25
    # asked for explicitly, the old behaviour is still there: the one frame trims the audio
    proc, report = _cli("mux", "--frames", str(clips["photo"]), "--audio", str(clips["short"]), "--out",
                        str(tmp_path / "trim.mp4"), "--length-mode", "pad_audio")
    assert proc.returncode == 0 and report["frames"] == 1
