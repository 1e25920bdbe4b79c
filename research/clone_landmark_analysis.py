"""Where the clone's held-out mouth error comes from, from `gpu_talking_head.py --dump` landmark files
(CPU, numpy only; no images). For each run: the mouth-landmark distance (MLD) vs baseline (a) of the
clone, of the clone given 01b's own neutral frame as reference, and of calibrations that use 01b's
real average mouth (a statistic of the answer: an upper bound for any "match the footage's average"
post-process), plus the mouth opening's mean/spread/correlation against the real frames. With two or
more runs: the MLD of their landmarks averaged (an ensemble's upper bound).

  python research/clone_landmark_analysis.py RUN1/landmarks.npz [RUN2/landmarks.npz ...]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]
from _bootstrap import import_pack  # noqa: E402


def full_mesh(dump, key: str) -> np.ndarray:
    """The dump keeps the metrics' points only; put them back at their mesh indices (others zero)."""
    pts, sub = dump["points"], dump[key]
    out = np.zeros((len(sub), 468, 2), np.float64)
    out[:, pts] = sub
    return out


def analyse(path: Path) -> np.ndarray:
    import_pack()
    from digital_human.vision.lipsync_metrics import MOUTH_POINTS, mouth_landmark_distance, mouth_opening

    dump = np.load(path)
    real, base, clone, clone_refb, real_a, clone_a = (full_mesh(dump, k) for k in (
        "real_b", "base_b", "clone_b", "clone_b_refb", "real_a", "clone_a"))
    base_mld = mouth_landmark_distance(base, real)
    lips = list(MOUTH_POINTS)

    def rel(x: np.ndarray) -> str:
        return f"{100 * (mouth_landmark_distance(x, real) / base_mld - 1):+.1f}%"

    def with_lips(x: np.ndarray, lips_xy: np.ndarray) -> np.ndarray:
        y = x.copy()
        y[:, lips] = lips_xy
        return y

    real_mean = real[:, lips].mean(0)
    print(f"{path}: baseline (a) MLD {base_mld:.4f}")
    print(f"  clone {rel(clone)}; with 01b's neutral frame as reference {rel(clone_refb)}; "
          f"clone on its own training clip 01a: MLD {mouth_landmark_distance(clone_a, real_a):.4f}")
    print(f"  calibrations with 01b's real average lip shape: clone's average moved onto it "
          f"{rel(with_lips(clone, clone[:, lips] - clone[:, lips].mean(0) + real_mean))}; "
          f"01b's average face as a constant (no motion at all) {rel(np.broadcast_to(real.mean(0), real.shape).copy())}")
    gains = []
    for k in (0.5, 0.7, 0.85, 1.2):
        moved = real_mean + k * (clone[:, lips] - clone[:, lips].mean(0))
        gains.append(f"x{k:g} {rel(with_lips(clone, moved))}")
    print(f"  ... and the clone's deviations from its average scaled: {', '.join(gains)}")
    o_real, o_clone = mouth_opening(real), mouth_opening(clone)
    print(f"  opening: mean real 01b {o_real.mean():.4f} / clone {o_clone.mean():.4f} (01a real "
          f"{mouth_opening(real_a).mean():.4f}); std real {o_real.std():.4f} / clone {o_clone.std():.4f}; "
          f"correlation {np.corrcoef(o_real, o_clone)[0, 1]:.3f}")
    return clone


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]]
    if not paths:
        raise SystemExit(__doc__)
    clones = [analyse(p) for p in paths]
    if len(clones) > 1:
        from digital_human.vision.lipsync_metrics import mouth_landmark_distance, mouth_opening

        dump = np.load(paths[0])
        real, base = full_mesh(dump, "real_b"), full_mesh(dump, "base_b")
        mean = np.mean(clones, axis=0)
        rel = 100 * (mouth_landmark_distance(mean, real) / mouth_landmark_distance(base, real) - 1)
        corr = np.corrcoef(mouth_opening(clones[0]), mouth_opening(clones[1]))[0, 1]
        print(f"landmarks of the {len(clones)} runs averaged: {rel:+.1f}% (runs' openings correlate {corr:.3f})")


if __name__ == "__main__":
    main()
