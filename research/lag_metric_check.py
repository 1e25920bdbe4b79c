"""How far the held-out lag bar (|lag| <= 40 ms, vision/lipsync_metrics.av_lag: argmax over +-300 ms of the
correlation between the mouth opening and the speech envelope) can be trusted, and whether the viseme track
carries a timing offset. CPU only, from the GPU pack (eval_talking_head.py --prepare); no model is run.

  1. The real clips themselves: lag over the whole clip and over 300-frame (10 s) windows.
  2. Synthetic predictions with the real mouth's own timing: the real 01b opening plus noise (white, or
     smoothed over 1.5 frames like a generator's output) at a given correlation with the real opening; the
     share of draws whose envelope lag misses |lag| <= 40 ms, and the share at the search edge.
  3. The viseme track against the real mouth: the lag of the real opening against the track's lip opening
     (same lag_curve; negative = the real mouth moves first), and how well a ridge read-out (trained on 01a,
     scored on 01b) predicts the real opening from the track shifted by -1 / 0 / +1 frames.

  python research/lag_metric_check.py [--pack benchmarks/out/th_pack.npz] [--draws 200]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]
from _bootstrap import import_pack  # noqa: E402


def _smooth(x: np.ndarray, sigma: float) -> np.ndarray:
    r = int(np.ceil(4 * sigma))
    k = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma) ** 2)
    return np.convolve(np.pad(x, r, mode="reflect"), k / k.sum(), mode="valid")


def _ridge_corr(xa: np.ndarray, ya: np.ndarray, xb: np.ndarray, yb: np.ndarray, lam: float = 100.0) -> float:
    mu, sd = xa.mean(0), xa.std(0) + 1e-6
    a, b = (xa - mu) / sd, (xb - mu) / sd
    w = np.linalg.solve(a.T @ a + lam * np.eye(a.shape[1]), a.T @ (ya - ya.mean()))
    return float(np.corrcoef(b @ w, yb)[0, 1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pack", type=Path, default=Path(__file__).resolve().parent / "out" / "th_pack.npz")
    ap.add_argument("--draws", type=int, default=200)
    args = ap.parse_args()
    import_pack()
    from digital_human.talking_head.visemes import FEATURE_NAMES, feature_windows
    from digital_human.vision.lipsync_metrics import av_lag, lag_curve, mouth_opening, speech_envelope

    z = np.load(args.pack)
    clips = {}
    for key in ("a", "b"):
        lms, fps = z[f"{key}_landmarks"].astype(np.float32), float(z[f"{key}_fps"])
        wave = z[f"{key}_wave16k"].astype(np.float32) / 32767.0
        opening = mouth_opening(lms)
        clips[key] = (opening, speech_envelope(wave, 16000, fps, len(opening)), z[f"{key}_visemes"], fps)

    print("1. real clips (pack landmarks): envelope lag over the whole clip and over 300-frame windows")
    for key, (opening, env, _, fps) in clips.items():
        lag, corr = av_lag(opening, env, fps)
        windows = [av_lag(opening[s:s + 300], env[s:s + 300], fps)[0] for s in range(0, len(opening) - 299, 100)]
        print(f"  01{key}: {lag:+.1f} ms (corr {corr:.3f}); windows every 100 frames: "
              + " ".join(f"{w:+.0f}" for w in windows)
              + f"  -> {sum(abs(w) > 40 for w in windows)} of {len(windows)} miss |lag| <= 40 ms")

    print("2. synthetic predictions with the real 01b mouth's timing (real opening + noise)")
    opening, env, _, fps = clips["b"]
    rng = np.random.default_rng(0)
    o = (opening - opening.mean()) / opening.std()
    for rho in (0.3, 0.45, 0.6):
        for sigma in (0.0, 1.5):
            lags = []
            for _ in range(args.draws):
                noise = rng.standard_normal(len(o))
                if sigma:
                    noise = _smooth(noise, sigma)
                noise /= noise.std()
                lags.append(av_lag(rho * o + np.sqrt(1 - rho ** 2) * noise, env, fps)[0])
            lags = np.abs(np.array(lags))
            print(f"  correlation with the real opening {rho:.2f}, noise smoothed {sigma:g} frames: "
                  f"|lag| > 40 ms in {np.mean(lags > 40):.2f}, at the +-300 ms edge in {np.mean(lags >= 299):.2f}")

    print("3. viseme track vs the real mouth (aligner phone loop, as packed)")
    lip = FEATURE_NAMES.index("lip_open")
    for key, (opening, _, vis, fps) in clips.items():
        lags, curve = lag_curve(opening, vis[:, lip], fps)
        i = int(np.argmax(curve))
        print(f"  01{key}: real opening vs the track's lip opening: best lag {lags[i] * 1000 / fps:+.0f} ms "
              f"(corr {curve[i]:.3f}; at 0 ms {curve[len(curve) // 2]:.3f})")
    (oa, _, va, _), (ob, _, vb, _) = clips["a"], clips["b"]
    for frames in (1, 5, 9):
        row = []
        for shift in (-1, 0, 1):  # -1: frame t reads the track at t + 1 (the track earlier by one frame)
            xa, xb = (feature_windows(np.roll(v, shift, axis=0), frames) for v in (va, vb))
            row.append(f"shift {shift:+d}: {_ridge_corr(xa, oa, xb, ob):.3f}")
        print(f"  ridge read-out of the real opening (01a -> 01b), {frames}-frame window: " + ", ".join(row))


if __name__ == "__main__":
    main()
