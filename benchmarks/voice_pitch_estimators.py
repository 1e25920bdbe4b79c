"""The listener pitch estimator (voice/pitch.py listener_f0, issue 36) against pYIN (median_f0, the estimator
before it) on every sample recording: median, 10th/90th percentile and voiced frames of each, first 20 s of
each clip's prepared speech. Run from the repo root: python benchmarks/voice_pitch_estimators.py"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from digital_human.audio import load_reference  # noqa: E402
from digital_human.voice.pitch import listener_f0, voiced_f0  # noqa: E402

DATA = REPO.parent / "shared" / "data"


def main() -> int:
    paths = sorted((DATA / "audio").iterdir()) + sorted((DATA / "video").glob("talk_*.mp4"))
    print("| clip | pYIN median Hz | listener median Hz | difference | listener p10-p90 Hz | voiced frames pYIN (20 ms) / listener (10 ms) |")
    print("|---|---|---|---|---|---|")
    for path in paths:
        prepared = load_reference(path, min_speech_seconds=1.0)
        wave = prepared.waveform[: prepared.sample_rate * 20]
        t0 = time.perf_counter()
        pyin = voiced_f0(wave, prepared.sample_rate)
        t1 = time.perf_counter()
        yin = listener_f0(wave, prepared.sample_rate)
        t2 = time.perf_counter()
        print(f"| {path.name} | {np.median(pyin):.0f} | {np.median(yin):.0f} | {np.median(yin) / np.median(pyin) - 1:+.1%} | "
              f"{np.percentile(yin, 10):.0f}-{np.percentile(yin, 90):.0f} | {pyin.size} / {yin.size} "
              f"({t1 - t0:.1f} s / {t2 - t1:.2f} s) |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
