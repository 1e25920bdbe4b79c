"""benchmarks/tts_piece_calls.py runs and counts what its docstring says: fusing q/k/v removes 5 calls per transformer
block per step (56 blocks x 10 steps), and no stage's count depends on the length (the graphs' one call replaces
a fixed number of launches)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_piece_call_counts(tmp_path):
    out = tmp_path / "calls.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tts_piece_calls.py"), "--out", str(out),
                           "--frames", "16,48", "--tokens", "9,20", "--hift-frames", "4,9"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    solves = report["flow_solve"]
    assert solves["16"] == solves["48"] and solves["16"]["plain"] - solves["16"]["fused"] == 56 * 10 * 5
    assert report["encoder"]["9"] == report["encoder"]["20"] > 100
    assert report["hift"]["4"] == report["hift"]["9"] > 100
