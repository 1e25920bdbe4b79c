"""How much of 01b's mouth can audio predict? Landmark-level analysis behind RESULTS.md's clone notes (CPU, ~2 min).

No images and no generator: FaceAlign's landmarks of the talking clips and their log-mel windows
(audio_features.windows_for_frames, the clone model's own features). Printed:
  1. the oracle: 01b's mouth shape projected on 01a's first k principal components, as mouth-landmark
     distance vs baseline (a) (01a's neutral frame's mouth pasted on every 01b frame);
  2. ridge regression from pooled log-mel windows to the mouth opening, trained on 01a, tested on 01b:
     correlation, R^2 on the raw opening, R^2 after removing each clip's mean and scale, and both means;
  3. the same regression trained on the other talking clips (other speakers; never 01b), with and without 01a;
  4. the audio-visual lag curve (opening vs speech envelope, as the lag bar measures it) of the real 01b mouth
     and of the ridge prediction: it oscillates with the syllable rhythm, so the best lag can jump by ~300 ms;
  5. whether 01a alone could teach a generator to follow the footage's average mouth: the spread of 01a's local
     average opening (+-2 s, without +-0.5 s around the frame) and its correlation with the frame's opening.

  python research/mouth_audio_analysis.py [--cache /tmp/dh_talking_head_eval]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]
from _bootstrap import import_pack  # noqa: E402

TEST = "talk_en_male_01b"
TRAIN = "talk_en_male_01a"
OTHERS = ("talk_en_male_02a", "talk_en_male_02b", "talk_en_male_02c", "talk_en_female_03a", "talk_en_female_03b",
          "talk_en_female_03c", "talk_de_male_04", "talk_en_female_07")


def load(name: str, data: Path, cache: Path):
    """(landmarks [N, 468, 2], mel windows [N, 80, T], opening [N]) of the frames with a found face."""
    import eval_talking_head as eth
    from digital_human.talking_head.audio_features import windows_for_frames
    from digital_human.vision.lipsync_metrics import mouth_opening

    eth.VIDEOS = {"x": f"{name}.mp4"}  # load_clip aligns once and caches the track
    track, wave, sr = eth.load_clip("x", data, cache)
    found = np.asarray(track.found, bool)
    windows = windows_for_frames(wave, sr, track.fps, len(track))[:, 0]
    lms = track.landmarks[..., :2].astype(np.float64)
    return lms[found], windows[found].astype(np.float32), mouth_opening(track.landmarks)[found]


def pooled(windows: np.ndarray) -> np.ndarray:
    n, mels, cols = windows.shape
    return windows.reshape(n, mels // 4, 4, cols // 4, 4).mean(axis=(2, 4)).reshape(n, -1)


def ridge(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, lam: float = 1000.0) -> np.ndarray:
    mu, sd = train_x.mean(0), train_x.std(0) + 1e-6
    a, b = (train_x - mu) / sd, (test_x - mu) / sd
    w = np.linalg.solve(a.T @ a + lam * np.eye(a.shape[1]), a.T @ (train_y - train_y.mean()))
    return b @ w + train_y.mean()


def r2(pred: np.ndarray, truth: np.ndarray) -> float:
    return float(1 - ((pred - truth) ** 2).sum() / ((truth - truth.mean()) ** 2).sum())


def zscore(x: np.ndarray) -> np.ndarray:
    return (x - x.mean()) / x.std()


class LipShapes:
    """Lip landmarks of a training clip (a) and a test clip (b) in one frame: each face similarity-aligned
    on the rigid points onto a's average face, the mouth points flattened ([N, 2 * points]); a's mean and
    principal axes (s, vt); baseline (a)'s MLD (a's neutral-frame mouth on every b frame)."""

    def __init__(self, la: np.ndarray, lb: np.ndarray) -> None:
        from digital_human.talking_head.clone.train import pick_neutral_frame
        from digital_human.vision.lipsync_metrics import MOUTH_POINTS, mouth_landmark_distance

        self.lb, self.ref, self.mouth = lb, la.mean(0), np.array(MOUTH_POINTS)
        self.norm_a = self.normalise(la)
        self.norm_b = self.normalise(lb)
        self.mean_a = self.norm_a.mean(0)
        _, self.s, self.vt = np.linalg.svd(self.norm_a - self.mean_a, full_matrices=False)
        neutral = pick_neutral_frame(la, np.arange(len(la)))
        self.base = mouth_landmark_distance(self.as_frames(np.repeat(self.norm_a[neutral][None], len(lb), 0)), lb)

    def normalise(self, lms: np.ndarray) -> np.ndarray:
        from digital_human.vision.lipsync_metrics import TEMPLATE_INDEX, _similarity_align

        return np.stack([_similarity_align(x, self.ref, TEMPLATE_INDEX) for x in lms])[:, self.mouth].reshape(len(lms), -1)

    def as_frames(self, mouths: np.ndarray) -> np.ndarray:
        """Each b frame's landmarks with its mouth replaced by `mouths` (normalised), mapped back to the frame."""
        from digital_human.vision.lipsync_metrics import TEMPLATE_INDEX, _similarity_align

        out = []
        for m, real in zip(mouths, self.lb):
            n = _similarity_align(real, self.ref, TEMPLATE_INDEX)
            n[self.mouth] = m.reshape(-1, 2)
            out.append(_similarity_align(n, real, TEMPLATE_INDEX))
        return np.stack(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path(os.environ.get(
        "DIGITAL_HUMAN_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")))
    ap.add_argument("--cache", type=Path, default=Path("/tmp/dh_talking_head_eval"))
    args = ap.parse_args()
    import_pack()
    from digital_human.vision.lipsync_metrics import mouth_landmark_distance

    clips = {name: load(name, args.data, args.cache) for name in (TRAIN, TEST, *OTHERS)}
    (la, wa, oa), (lb, wb, ob) = clips[TRAIN], clips[TEST]

    # 1. oracle: mouth shapes in a common frame (similarity-aligned on the rigid points)
    shapes = LipShapes(la, lb)
    norm_a, norm_b, mean_a, s, vt = shapes.norm_a, shapes.norm_b, shapes.mean_a, shapes.s, shapes.vt
    as_frames, base = shapes.as_frames, shapes.base
    print(f"baseline (a) MLD {base:.4f}; 01a mouth-shape variance in the first 3 components: "
          f"{np.round(np.cumsum(s ** 2)[:3] / np.sum(s ** 2), 3).tolist()}")
    for k in (1, 2, 3):
        oracle = (norm_b - mean_a) @ vt[:k].T @ vt[:k] + mean_a
        print(f"  oracle with {k} component(s): MLD {100 * (mouth_landmark_distance(as_frames(oracle), lb) / base - 1):+.1f}% "
              "vs baseline (a)")

    # 1b. audio -> the first two shape components (ridge on 01a), as MLD: raw, and with the predictions'
    # average moved to 01b's average shape (what calibrating to the driven footage could give at best)
    comps_a, comps_b = (norm_a - mean_a) @ vt[:2].T, (norm_b - mean_a) @ vt[:2].T
    pred_c = np.stack([ridge(pooled(wa), comps_a[:, j], pooled(wb)) for j in range(2)], axis=1)

    def mld_of(c: np.ndarray) -> float:
        return 100 * (mouth_landmark_distance(as_frames(c @ vt[:2] + mean_a), lb) / base - 1)

    print(f"  audio (ridge, 2 components): {mld_of(pred_c):+.1f}%; its average moved to 01b's: "
          f"{mld_of(pred_c - pred_c.mean(0) + comps_b.mean(0)):+.1f}%; 01b's average shape alone: "
          f"{mld_of(np.repeat(comps_b.mean(0)[None], len(lb), 0)):+.1f}%")

    # 2. audio -> opening, 01a -> 01b
    pred = ridge(pooled(wa), oa, pooled(wb))
    pred_z = ridge(pooled(wa), zscore(oa), pooled(wb))  # each clip's mean and scale removed
    print(f"ridge 01a -> 01b opening: corr {np.corrcoef(pred, ob)[0, 1]:.3f}, R^2 raw {r2(pred, ob):.3f}, "
          f"R^2 per-clip standardised {r2(pred_z, zscore(ob)):.3f}; mean opening 01a {oa.mean():.4f} / 01b "
          f"{ob.mean():.4f} (01a std {oa.std():.4f})")

    # 4. lag curves (the bar's measure: opening vs speech envelope, detrended, Pearson at each lag)
    import eval_talking_head as eth
    from digital_human.vision.lipsync_metrics import av_lag, lag_curve, mouth_opening, speech_envelope

    eth.VIDEOS = {"x": f"{TEST}.mp4"}
    track, wave, sr = eth.load_clip("x", args.data, args.cache)
    envelope = speech_envelope(wave, sr, track.fps, len(track))
    real_open = mouth_opening(track.landmarks[..., :2])
    pred_open = real_open.copy()
    pred_open[np.asarray(track.found, bool)] = pred
    for label, curve in (("real 01b", real_open), ("ridge from 01a audio", pred_open)):
        lags, corr = lag_curve(curve, envelope, track.fps, max_lag_s=0.6)
        lag_ms, best = av_lag(curve, envelope, track.fps)
        points = " ".join(f"{int(round(k * 1000 / track.fps))}:{c:+.2f}" for k, c in zip(lags[::2], corr[::2]))
        print(f"lag curve {label}: bar's best lag {lag_ms:+.0f} ms (corr {best:.3f}); ms:corr {points}")

    # 5. can 01a teach the generator to follow a given average mouth? Its local average barely moves.
    n, local = len(oa), np.empty(len(oa))
    for t in range(n):
        near = np.r_[max(0, t - 60):max(0, t - 15), min(n, t + 16):min(n, t + 61)]
        local[t] = oa[near].mean()
    print(f"01a local average opening (+-2 s without +-0.5 s): std {local.std():.4f} (frames: {oa.std():.4f}), "
          f"correlation with the frame's opening {np.corrcoef(local, oa)[0, 1]:+.3f}")

    # 3. a prior from other speakers (each clip standardised, so only the variation is learned)
    for label, names in (("other clips", OTHERS), ("other clips + 01a", (*OTHERS, TRAIN))):
        x = np.concatenate([pooled(clips[n][1]) for n in names])
        y = np.concatenate([zscore(clips[n][2]) for n in names])
        p = ridge(x, y, pooled(wb))
        print(f"ridge {label} ({len(y)} frames) -> 01b: corr {np.corrcoef(p, ob)[0, 1]:.3f}, "
              f"R^2 standardised {r2(p, zscore(ob)):.3f}")


if __name__ == "__main__":
    main()
