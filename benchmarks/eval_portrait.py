"""Lip-sync check of the zero-shot `portrait` talking head on a held-out clip (default 01b).

The clip's own face frames are the reference video and its own audio drives them, so the real
frames are the ground truth. Printed:
  * audio-visual lag and correlation at the best lag, of the generated and of the real frames
    (mouth opening re-measured with the face mesh on both, same procedure), and their ratio;
  * PSNR outside the lower-face mask vs the input frames;
  * mouth-landmark distance to the real frames (/ inter-ocular distance) of the output, and of the
    baseline (a): unmodified reference frames. Same-take reference frames *are* the truth
    (distance 0), so the baseline that says something is a different stretch of the same
    session: the reference frames rolled by half the segment, unmodified vs animated;
  * CPU frames/s of animate_portrait (warp + render + paste, no face alignment).

Usage: python -m digital_human.benchmarks.eval_portrait [--clip PATH] [--seconds 10] [--track-cache F.npz]
(or python benchmarks/eval_portrait.py from the checkout). Needs the face models (setup).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _bootstrap import import_pack  # type: ignore[import-not-found]

    import_pack()

from digital_human.talking_head import animate_portrait  # noqa: E402
from digital_human.talking_head.driver import schedule_track  # noqa: E402
from digital_human.talking_head.portrait.animate import portrait_masks  # noqa: E402
from digital_human.media.probe import read_video_audio, read_video_frames  # noqa: E402
from digital_human.vision import align_faces  # noqa: E402
from digital_human.vision import lipsync_metrics as M  # noqa: E402
from digital_human.vision.align import warp_image  # noqa: E402
from digital_human.vision.faces import FaceTrack  # noqa: E402

DEFAULT_CLIP = Path(__file__).resolve().parents[2] / "shared" / "data" / "video" / "talk_en_male_01b.mp4"


def frame_masks(track: FaceTrack, crop_masks: np.ndarray) -> np.ndarray:
    """Crop-space masks warped into their frames (what paste-back blends through)."""
    h, w = track.frames.shape[1:3]
    inv = track.inverse_affines()
    return np.stack([np.clip(warp_image(m, a, w, h, border="zero"), 0, 1) for m, a in zip(crop_masks, inv)])


def load_track(clip: Path, seconds: float, cache: Path | None) -> tuple[FaceTrack, np.ndarray, int]:
    frames, fps = read_video_frames(clip)
    wave, sr = read_video_audio(clip)
    wave = wave.mean(0)
    n = len(frames) if seconds <= 0 else min(len(frames), int(round(seconds * fps)))
    if cache is not None and cache.is_file():
        track = FaceTrack.load_npz(cache)
    else:
        track = align_faces(frames, fps)
        if cache is not None:
            track.save_npz(cache)
    track = schedule_track(track, np.arange(n))
    return track, wave[: int(round(n / track.fps * sr))], sr


def evaluate(track: FaceTrack, wave: np.ndarray, sr: int) -> dict[str, float]:
    fps, n = track.fps, len(track)
    env = M.speech_envelope(wave, sr, fps, n)
    real_lms = M.remeasure_landmarks(track.frames, track.landmarks)
    t = time.perf_counter()
    res = animate_portrait(track, wave, sr, fps)
    cpu_fps = len(res.frames) / (time.perf_counter() - t)
    m = min(n, len(res.frames))
    gen_lms = M.remeasure_landmarks(res.frames[:m], track.landmarks[:m])
    lag_real, corr_real = M.av_lag(M.mouth_opening(real_lms[:m]), env[:m], fps)
    lag_gen, corr_gen = M.av_lag(M.mouth_opening(gen_lms), env[:m], fps)
    masks = frame_masks(schedule_track(track, np.arange(m)), portrait_masks(track, np.arange(m)))
    psnr = M.psnr_outside_mask(res.frames[:m], track.frames[:m], masks)

    # baseline (a) on another stretch of the same session: reference rolled by half the segment
    rolled = schedule_track(track, np.roll(np.arange(n), n // 2))
    res_rolled = animate_portrait(rolled, wave, sr, fps)
    rolled_lms = M.remeasure_landmarks(rolled.frames[:m], rolled.landmarks[:m])
    gen_rolled_lms = M.remeasure_landmarks(res_rolled.frames[:m], rolled.landmarks[:m])
    lag_gr, corr_gr = M.av_lag(M.mouth_opening(gen_rolled_lms), env[:m], fps)
    lag_rr, corr_rr = M.av_lag(M.mouth_opening(rolled_lms), env[:m], fps)
    op_real, op_gen = M.mouth_opening(real_lms[:m]), M.mouth_opening(gen_lms)
    return {
        "frames": m, "fps": fps, "cpu_frames_per_s": cpu_fps,
        "lag_ms_generated": lag_gen, "corr_generated": corr_gen,
        "lag_ms_real": lag_real, "corr_real": corr_real, "corr_ratio": corr_gen / max(corr_real, 1e-9),
        "psnr_outside_mask_db": psnr,
        "mouth_dist_generated_same_take": M.mouth_landmark_distance(gen_lms, real_lms[:m]),
        "mouth_dist_baseline_a_same_take": M.mouth_landmark_distance(real_lms[:m], real_lms[:m]),
        "mouth_dist_generated_other_stretch": M.mouth_landmark_distance(gen_rolled_lms, real_lms[:m]),
        "mouth_dist_baseline_a_other_stretch": M.mouth_landmark_distance(rolled_lms, real_lms[:m]),
        "lag_ms_generated_other_stretch": lag_gr, "corr_generated_other_stretch": corr_gr,
        "lag_ms_baseline_a_other_stretch": lag_rr, "corr_baseline_a_other_stretch": corr_rr,
        "opening_median_real": float(np.median(op_real)), "opening_median_generated": float(np.median(op_gen)),
        "opening_p90_real": float(np.percentile(op_real, 90)),
        "opening_p90_generated": float(np.percentile(op_gen, 90)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clip", type=Path, default=DEFAULT_CLIP)
    ap.add_argument("--seconds", type=float, default=10.0, help="first N seconds (0 = whole clip)")
    ap.add_argument("--track-cache", type=Path, default=None, help="reuse/save the FaceAlign track (.npz)")
    args = ap.parse_args(argv)
    track, wave, sr = load_track(args.clip, args.seconds, args.track_cache)
    r = evaluate(track, wave, sr)
    print(f"clip {args.clip.name}: {r['frames']} frames @ {r['fps']:g} fps")
    for k, v in r.items():
        if k not in ("frames", "fps"):
            print(f"  {k:40s} {v:.4f}" if isinstance(v, float) else f"  {k:40s} {v}")
    ok_lag = abs(r["lag_ms_generated"]) <= 40
    ok_corr = r["corr_ratio"] >= 0.5
    ok_psnr = r["psnr_outside_mask_db"] >= 40
    print(f"bar: |lag| <= 40 ms {'PASS' if ok_lag else 'FAIL'}; corr ratio >= 0.5 {'PASS' if ok_corr else 'FAIL'}; "
          f"PSNR outside mask >= 40 dB {'PASS' if ok_psnr else 'FAIL'}")
    return 0 if ok_lag and ok_corr and ok_psnr else 1


if __name__ == "__main__":
    raise SystemExit(main())
