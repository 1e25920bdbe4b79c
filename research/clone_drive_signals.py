"""How well does each per-frame speech signal follow the real mouth of 01a/01b? (CPU, ~1 min; RESULTS.md,
2026-12-02 `clone` notes.)

From a pack of eval_talking_head.py --prepare: the correlation with the real mouth opening (the clone trainer's
`mouth_opening` of the pack's FaceAlign landmarks, found frames) of the viseme track's jaw/lip targets (the
aligner's phone loop), portrait's blended drive, the audio-only drive, and - with --asr - the viseme track of a
forced alignment to the clip's own pocketsphinx transcript (benchmarks/asr.py). Also both clips' mean opening.

  python research/clone_drive_signals.py --pack benchmarks/out/th_pack.npz [--asr]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]
from _bootstrap import import_pack  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pack", type=Path, required=True)
    ap.add_argument("--asr", action="store_true", help="also align to a pocketsphinx transcript (~25 s per clip)")
    args = ap.parse_args()
    import_pack()
    from digital_human.talking_head.clone.train import mouth_opening
    from digital_human.talking_head.phone_source import speech_phones
    from digital_human.talking_head.visemes import frame_features, viseme_track

    with np.load(args.pack, allow_pickle=False) as z:
        pack = {k: z[k] for k in z.files}
    for key in ("a", "b"):
        found = pack[f"{key}_found"]
        opening = mouth_opening(pack[f"{key}_landmarks"].astype(np.float32))

        def corr(x: np.ndarray) -> float:
            return float(np.corrcoef(x[found], opening[found])[0, 1])

        signals = {"viseme track": pack[f"{key}_visemes"], "portrait drive": pack[f"{key}_drive"],
                   "audio-only drive": pack[f"{key}_drive_audio"]}
        if args.asr:
            from asr import transcribe

            wave = pack[f"{key}_wave16k"].astype(np.float32) / 32767.0
            fps, n = float(pack[f"{key}_fps"]), len(found)
            phones = speech_phones(None, wave, 16000, "auto", transcript=transcribe(wave, 16000)).phones
            signals["viseme track, forced to ASR words"] = frame_features(viseme_track(phones, fps, n) if phones
                                                                          else None, n)
        print(f"{key}: mean opening {opening[found].mean():.4f} (std {opening[found].std():.4f})")
        for name, feats in signals.items():
            print(f"  {name:<36} jaw {corr(feats[:, 0]):+.3f}  lip {corr(feats[:, 1]):+.3f}")


if __name__ == "__main__":
    main()
