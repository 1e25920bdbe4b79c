"""SIGTERM (timeout, systemd, Docker, Ray) stops a command as Ctrl-C does (stop_signals.py): partial
files removed, exit 143, a JSON line saying it was stopped. The CLI tests send it mid-encode, when
the encoder's `.partial-*` files exist, so without the handler they would be left behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from digital_human import stop_signals


def test_sigterm_raises_stopped_once_and_the_old_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(stop_signals.Stopped) as raised:
        with stop_signals.stop_on_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises in this thread at once; never reached
    assert isinstance(raised.value, KeyboardInterrupt)  # code that cleans up on Ctrl-C cleans up here too
    assert stop_signals.exit_code(raised.value) == 143 and stop_signals.exit_code(KeyboardInterrupt()) == 130
    report = stop_signals.stopped_report(raised.value)
    assert report["stopped"] is True and report["signal"] == "SIGTERM" and report["ok"] is False
    assert signal.getsignal(signal.SIGTERM) == before


def _stop_mid_encode(args: list[str], folder: Path) -> tuple[int, dict, str]:
    """Start the command, send SIGTERM as soon as the encoder's partial files appear; (exit code,
    last JSON line, stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "digital_human", *args, "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline and not list(folder.glob("*.partial-*")):
        time.sleep(0.05)
    assert proc.poll() is None, ("finished before its encoder started", proc.communicate())
    assert list(folder.glob("*.partial-*")), "no partial file appeared"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    lines = out.strip().splitlines()
    return proc.returncode, (json.loads(lines[-1]) if lines else {}), err


@pytest.mark.parametrize("command", ["animate", "run"])
def test_sigterm_mid_encode_leaves_no_partial_file(command, tmp_path, data_dir, setup_models):
    out = tmp_path / "talk.mp4"
    face = ["--face", str(data_dir / "image" / "face_01_female.jpg"), "--max-side", "320", "--out", str(out)]
    if command == "animate":
        args = ["animate", "--audio", str(data_dir / "audio" / "spk_en_03.wav"), "--visemes", "off", *face]
    else:
        args = ["run", "--text", "Hello there, this is a short test of a stopped run.", "--no-imitate",
                "--voice", str(data_dir / "audio" / "spk_en_03.wav"), *face]
    code, report, err = _stop_mid_encode(args, tmp_path)
    assert code == 143, (code, err[-2000:])
    assert report == {"ok": False, "stopped": True, "signal": "SIGTERM", "exit_code": 143,
                      "error": report["error"]} and "stopped by SIGTERM" in report["error"]
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "partial or final files left behind"


def test_a_batch_worker_unwinds_its_job_then_exits_with_143(tmp_path):
    """Renderer's jobs run inside _stopping_the_worker: SIGTERM unwinds the job (its atomic writes clean up),
    then the worker exits as Ray's own SIGTERM handling would end it."""
    from digital_human.atomic_file import atomic_path
    from digital_human.batch.worker import _stopping_the_worker

    target = tmp_path / "job.mp4"
    with pytest.raises(SystemExit) as raised:
        with _stopping_the_worker(), atomic_path(target) as partial:
            partial.write_bytes(b"half a video")
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    assert raised.value.code == 143 and list(tmp_path.iterdir()) == []


def test_claim_takes_sigterm_back_from_a_library():
    """ray.init installs its own SIGTERM handler (a plain exit); the batch driver claims it back."""
    with stop_signals.stop_on_signals():
        signal.signal(signal.SIGTERM, lambda *_: None)  # what a library does
        assert stop_signals.claim()
        with pytest.raises(stop_signals.Stopped):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
