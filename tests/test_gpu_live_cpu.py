"""benchmarks/gpu_live.py's CPU smoke run of its profiles (--size reduced --device cpu --phases none): the TTS and
face profiles and the two-lane check run and report every part, the face's first frame also under a concurrent TTS on the default stream
and on the live stages' own streams (the same on a CPU: no streams there). The GPU figures come from the H200 run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

for module in ("transformers", "diffusers", "librosa", "aiohttp", "av"):
    pytest.importorskip(module)

ROOT = Path(__file__).resolve().parents[1]


def test_face_profile_runs_on_the_cpu(setup_models, data_dir, tmp_path):
    from digital_human.paths import models_root

    out = tmp_path / "gl.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_live.py"), "--size", "reduced", "--device", "cpu",
           "--phases", "none", "--face-profile", "2", "--tts-profile", "1", "--tts-lanes", "2", "--lanes-check", "1",
           "--flow-kernels", "fused",
           "--work", str(tmp_path / "work"),
           "--face", str(data_dir / "image" / "face_01_female.jpg"), "--face-models", str(models_root() / "face"),
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    report = json.loads(out.read_text())
    assert report["phases"] == []
    assert report["flow_kernels"] == {"mode": "fused", "compile_note": None}  # the CPU has no fast path: nothing to do
    assert set(report["tts_profile"]) == {"8", "4"}
    lanes = report["lanes_check"]  # two lanes at once speak what each speaks alone
    assert report["tts_lanes"] == 2 and lanes["audio_equal"] and lanes["max_abs_diff"] == 0.0 and lanes["overlap"] > 0
    prof = report["face_profile"]
    assert prof["face_device"] is None and prof["voice_device"] is None  # the CPU: no streams
    assert not prof["silent_piece"] and prof["frames"] >= 4
    parts = prof["parts_synced"]
    for key in ("windows_ms", "render_ms", "step_ms", "paste_ms", "total_ms"):
        assert parts[key] > 0, key
    assert parts["step_ms"] <= parts["render_ms"] <= parts["total_ms"]
    assert parts["windows_ms"] + parts["render_ms"] + parts["paste_ms"] <= parts["total_ms"] * 1.05
    for key in ("alone_default_stream", "alone_own_streams"):
        assert prof[key]["n"] == 2 and prof[key]["p50"] > 0
    for key in ("with_tts_default_stream", "with_tts_own_streams"):
        assert prof[key]["tts_error"] is None and prof[key]["tts_pieces_made"] >= 1
        assert prof[key]["first_frame_ms"]["n"] == 2


def test_the_stack_sampler_counts_every_session_of_a_stage_in_one_row():
    import threading
    import time

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _stack_sampler import StackSampler
    from gpu_live import live_thread_row

    assert live_thread_row("live-s3-1a2b3c4d-_clock") == "live-_clock"
    assert live_thread_row("latentsync-warp_7") == "latentsync-warp"
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))

    threads = [threading.Thread(target=spin, name=f"live-s{i}-0badc0de-_clock") for i in (1, 2)]
    with StackSampler(interval_s=0.002, group=live_thread_row) as sampler:
        for t in threads:
            t.start()
        time.sleep(0.5)
    stop.set()  # after the sampler's last CPU read: the threads' /proc entries are still there
    for t in threads:
        t.join()
    report = sampler.report()
    assert "live-_clock" in report["threads"]
    assert not any(name.startswith("live-s") for name in report["threads"])
    assert report["threads"]["live-_clock"]["samples"] > 10
    assert report["threads"]["live-_clock"]["cpu_s"] > 0


def test_a_phase_names_its_own_turn_taking_load():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_live import parse_phase

    assert parse_phase("8:104") == (8, 104, "opus", 0.0)
    assert parse_phase("8:104", listen=0.5) == (8, 104, "opus", 0.5)
    assert parse_phase("8:104:aac:listen1") == (8, 104, "aac", 1.0)
    assert parse_phase("8:104:listen1.5", listen=0.5) == (8, 104, "opus", 1.5)
    for bad in ("8", "8:x", "8:104:mp3", "8:104:listen-1", "8:104:listenx"):
        with pytest.raises(SystemExit, match="SESSIONS:UTTERANCES"):
            parse_phase(bad)
