"""Where the talking head's phones come from (talking_head/phone_source.py): the TTS's, else the aligner's,
else none with the reason; and the node/CLI plumbing that reports it."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from digital_human.talking_head.phone_source import VISEME_MODES, speech_phones

CARRIED = [("b", 0.0, 0.1), ("a", 0.1, 0.3)]


def _no_aligner(monkeypatch):
    monkeypatch.setattr("digital_human.audio.phone_align.align_phones",
                        lambda *a, **k: pytest.fail("the aligner must not run"))


def test_modes_match_the_nodes_menu():
    from digital_human.nodes.talking_head_nodes import VISEME_MODES as NODE_MODES

    assert list(VISEME_MODES) == NODE_MODES


def test_carried_phones_win_and_off_gives_none(monkeypatch):
    _no_aligner(monkeypatch)
    wave = np.zeros(16000, np.float32)
    got = speech_phones(CARRIED, wave, 16000, "auto")
    assert got.phones == CARRIED and "TTS" in got.note
    assert speech_phones(CARRIED, wave, 16000, "tts-only").phones == CARRIED
    off = speech_phones(CARRIED, wave, 16000, "off")
    assert off.phones is None and off.note == ""
    none = speech_phones(None, wave, 16000, "tts-only")
    assert none.phones is None and "audio features" in none.note
    with pytest.raises(ValueError, match="visemes must be one of"):
        speech_phones(None, wave, 16000, "always")


def test_models_that_do_not_read_phones_are_not_aligned(monkeypatch):
    _no_aligner(monkeypatch)
    wave = np.zeros(16000, np.float32)
    assert speech_phones(None, wave, 16000, "auto", model_reads_phones=False).phones is None
    assert speech_phones(CARRIED, wave, 16000, "auto", model_reads_phones=False).phones == CARRIED


def test_failed_alignment_is_announced_not_silent():
    silence = np.zeros(3 * 16000, np.float32)
    got = speech_phones(None, silence, 16000, "auto")
    assert got.phones is None and got.note.startswith("no phone timings (") and "audio features" in got.note
    zh = speech_phones(None, silence, 16000, "auto", language="zh")
    assert zh.phones is None and "Mandarin" in zh.note


@pytest.fixture(scope="module")
def english_clip(data_dir):
    from digital_human.audio import decode_audio
    from digital_human.audio.phone_align import aligner_available

    if aligner_available():
        pytest.skip(aligner_available())
    wave, rate = decode_audio(data_dir / "audio" / "spk_en_03.wav")
    return np.asarray(wave, np.float32), rate


def test_user_speech_gets_the_aligners_phones(english_clip):
    wave, rate = english_clip
    loop = speech_phones(None, wave, rate, "auto")
    assert loop.phones and "phone recognition" in loop.note
    labels = [p[0] for p in loop.phones]
    assert all(a[1] < a[2] <= b[1] + 1e-6 for a, b in zip(loop.phones, loop.phones[1:]))
    assert sum(lab != "SIL" for lab in labels) >= 10 and all(len(p) == 4 and 0 < p[3] <= 1 for p in loop.phones)
    # torch [B, C, T] (ComfyUI's AUDIO layout) gives the same phones as the mono numpy wave
    import torch

    batched = speech_phones(None, torch.from_numpy(np.concatenate([wave, wave]))[None], rate, "auto")
    assert batched.phones == loop.phones
    forced = speech_phones(None, wave, rate, "auto", transcript="someone call me nature others call me mother nature")
    assert forced.phones and "forced alignment" in forced.note


def test_animate_cli_reports_where_the_phones_came_from(english_clip, data_dir, tmp_path):
    out = tmp_path / "a.mp4"
    cmd = [sys.executable, "-m", "digital_human", "animate", "--face", str(data_dir / "image" / "face_02_male.png"),
           "--audio", str(data_dir / "audio" / "spk_en_03.wav"), "--out", str(out), "--json", "--no-idle-motion"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["reports"]["visemes"].startswith("visemes from the aligner") and "phones" in report["timings"]
    assert out.is_file()
    off = subprocess.run(cmd[:-1] + ["--visemes", "off", "--no-idle-motion"], capture_output=True, text=True,
                         timeout=900)
    assert off.returncode == 0 and "visemes" not in json.loads(off.stdout.strip().splitlines()[-1])["reports"]



def test_side_channel_carries_the_aligners_confidence():
    import torch

    from digital_human.audio.phone_channel import PHONES_KEY, phones_from_audio, with_phones

    audio = {"waveform": torch.zeros(1, 1, 16000), "sample_rate": 16000}
    aligned = [("B", 0.0, 0.1, 0.8), ("AA", 0.1, 0.5, 0.8)]
    assert phones_from_audio(with_phones(dict(audio), aligned)) == aligned
    assert phones_from_audio(with_phones(dict(audio), CARRIED)) == CARRIED
    bad = dict(audio, **{PHONES_KEY: [("B", 0.0, 0.1, 1.5)]})
    assert phones_from_audio(bad) is None
