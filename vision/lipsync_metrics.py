"""Lip-sync metrics: mouth opening, speech envelope, audio-visual lag, mouth-landmark distance, PSNR, mouth SSIM.

Frame clock (shared with talking_head/portrait/speech_drive.py): frame i of a clip at `fps` shows
the instant t_i = i / fps (its presentation time). The speech envelope of frame i is measured on
audio centred on t_i, so a mouth that moves with the sound gives lag 0.

Lag sign: positive lag = the mouth moves *after* the sound (video late), negative = video early.
EBU R37 tolerates +40 / -60 ms.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .align import TEMPLATE_INDEX

# MediaPipe face-mesh lips (subject's right corner 61/78 first).
OUTER_UPPER = (61, 185, 40, 39, 37, 0, 267, 269, 270, 409, 291)
OUTER_LOWER = (146, 91, 181, 84, 17, 314, 405, 321, 375)
INNER_UPPER = (78, 191, 80, 81, 82, 13, 312, 311, 310, 415, 308)
INNER_LOWER = (95, 88, 178, 87, 14, 317, 402, 318, 324)
MOUTH_POINTS = tuple(sorted(set(OUTER_UPPER + OUTER_LOWER + INNER_UPPER + INNER_LOWER)))
# inner-lip pairs straddling the centre of the mouth (upper, lower), for a noise-robust gap
GAP_PAIRS = ((81, 178), (82, 87), (13, 14), (312, 317), (311, 402))
RIGHT_EYE_OUTER, LEFT_EYE_OUTER = 33, 263


def _check_landmarks(landmarks: np.ndarray, name: str) -> np.ndarray:
    lm = np.asarray(landmarks, np.float64)
    if lm.ndim == 2:
        lm = lm[None]
    if lm.ndim != 3 or lm.shape[1] < 468 or lm.shape[2] < 2:
        raise ValueError(f"{name} must be face-mesh landmarks [N, 468, 2 or 3], got {np.shape(landmarks)}")
    return lm[..., :2]


def inter_ocular(landmarks: np.ndarray) -> np.ndarray:
    """[N] distance between the outer eye corners (33, 263), the metrics' unit of length."""
    lm = _check_landmarks(landmarks, "landmarks")
    return np.linalg.norm(lm[:, LEFT_EYE_OUTER] - lm[:, RIGHT_EYE_OUTER], axis=-1)


def mouth_opening(landmarks: np.ndarray) -> np.ndarray:
    """[N] inner-lip gap (mean over the five central inner-lip pairs) / inter-ocular distance."""
    lm = _check_landmarks(landmarks, "landmarks")
    up = lm[:, [p[0] for p in GAP_PAIRS]]
    lo = lm[:, [p[1] for p in GAP_PAIRS]]
    gap = np.linalg.norm(lo - up, axis=-1).mean(-1)
    return gap / np.maximum(inter_ocular(lm), 1e-6)


def speech_envelope(wave: np.ndarray, sr: int, fps: float, n: int, window_s: float | None = None) -> np.ndarray:
    """[n] log-RMS envelope (dB, floored 50 dB under the clip's peak) of the speech band
    (100-4000 Hz) in a Hann window of `window_s` (default 2 frames) centred on each frame time i/fps."""
    x = np.asarray(wave, np.float64).reshape(-1)
    if x.size == 0 or sr <= 0 or fps <= 0 or n <= 0:
        raise ValueError(f"speech_envelope needs samples, sr > 0, fps > 0, n > 0 (got {x.size}, {sr}, {fps}, {n})")
    # speech band via FFT masking of the whole clip (cheap for clips of minutes; no filter delay)
    spec = np.fft.rfft(x)
    freqs = np.fft.rfftfreq(x.size, 1.0 / sr)
    spec[(freqs < 100) | (freqs > 4000)] = 0
    band = np.fft.irfft(spec, x.size)
    win = max(4, int(round((window_s or 2.0 / fps) * sr)))
    w = np.hanning(win)
    w /= w.sum()
    power = np.convolve(band ** 2, w, mode="same")
    centres = np.clip(np.rint(np.arange(n) / fps * sr).astype(np.int64), 0, x.size - 1)
    db = 10 * np.log10(power[centres] + 1e-12)
    inside = np.arange(n) / fps * sr < x.size
    peak = np.percentile(db[inside], 99) if inside.any() else db.max()
    db = np.maximum(db, peak - 50.0)
    db[~inside] = peak - 50.0  # frames past the audio are silence
    return db.astype(np.float32)


def _detrend(x: np.ndarray, fps: float, seconds: float) -> np.ndarray:
    """x minus its moving average over `seconds` (removes head-pose drift / slow loudness changes)."""
    k = max(1, int(round(seconds * fps)))
    if k >= len(x) or k < 3:
        return x - x.mean()
    pad = np.pad(x, (k // 2, k - 1 - k // 2), mode="edge")
    return x - np.convolve(pad, np.ones(k) / k, mode="valid")


def lag_curve(opening: np.ndarray, envelope: np.ndarray, fps: float, max_lag_s: float = 0.3,
              detrend_s: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(lags in frames, Pearson correlation at each lag) of opening[t + k] against envelope[t]."""
    o = np.asarray(opening, np.float64).reshape(-1)
    e = np.asarray(envelope, np.float64).reshape(-1)
    n = min(len(o), len(e))
    if n < 8:
        raise ValueError(f"av_lag needs at least 8 frames of both series, got {len(o)} and {len(e)}")
    o, e = _detrend(o[:n], fps, detrend_s), _detrend(e[:n], fps, detrend_s)
    kmax = max(1, min(int(round(max_lag_s * fps)), n // 4))
    lags = np.arange(-kmax, kmax + 1)
    corr = np.empty(len(lags))
    for i, k in enumerate(lags):
        a, b = (o[k:], e[:n - k]) if k >= 0 else (o[:n + k], e[-k:])
        a, b = a - a.mean(), b - b.mean()
        den = np.sqrt((a * a).sum() * (b * b).sum())
        corr[i] = (a * b).sum() / den if den > 0 else 0.0
    return lags, corr


def av_lag(opening: np.ndarray, envelope: np.ndarray, fps: float, max_lag_s: float = 0.3,
           detrend_s: float = 1.0) -> tuple[float, float]:
    """(lag_ms, correlation at the best lag) between mouth opening and speech envelope per frame.

    The lag is refined below one frame by a parabola through the peak and its neighbours.
    Positive = the mouth moves after the sound."""
    lags, corr = lag_curve(opening, envelope, fps, max_lag_s, detrend_s)
    i = int(np.argmax(corr))
    frac = 0.0
    if 0 < i < len(corr) - 1:
        den = corr[i - 1] - 2 * corr[i] + corr[i + 1]
        if den < 0:
            frac = float(np.clip(0.5 * (corr[i - 1] - corr[i + 1]) / den, -0.5, 0.5))
    return float((lags[i] + frac) * 1000.0 / fps), float(corr[i])


def _similarity_align(src: np.ndarray, dst: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """src [468, 2] mapped by the least-squares similarity taking src[idx] onto dst[idx]."""
    a, b = src[idx], dst[idx]
    ma, mb = a.mean(0), b.mean(0)
    a0, b0 = a - ma, b - mb
    den = (a0 ** 2).sum()
    p = (a0[:, 0] * b0[:, 0] + a0[:, 1] * b0[:, 1]).sum() / den
    q = (a0[:, 0] * b0[:, 1] - a0[:, 1] * b0[:, 0]).sum() / den
    rot = np.array([[p, -q], [q, p]])
    return (src - ma) @ rot.T + mb


def mouth_landmark_distance(pred_lms: np.ndarray, real_lms: np.ndarray, per_frame: bool = False):
    """Mean distance over the lip points (outer + inner) between predicted and real landmarks,
    after aligning each predicted frame to the real one by a similarity fit on the rigid points
    (eyes, nose, cheekbones, forehead), in units of the real inter-ocular distance.
    Returns the mean over frames (or the [N] array with per_frame=True)."""
    p = _check_landmarks(pred_lms, "pred_lms")
    r = _check_landmarks(real_lms, "real_lms")
    if p.shape != r.shape:
        raise ValueError(f"pred_lms {p.shape} and real_lms {r.shape} must have the same frames and points")
    mouth = np.array(MOUTH_POINTS)
    iod = inter_ocular(r)
    d = np.empty(len(p))
    for t in range(len(p)):
        aligned = _similarity_align(p[t], r[t], TEMPLATE_INDEX)
        d[t] = np.linalg.norm(aligned[mouth] - r[t, mouth], axis=-1).mean() / max(iod[t], 1e-6)
    return d if per_frame else float(d.mean())


def psnr_outside_mask(a: np.ndarray, b: np.ndarray, masks: np.ndarray, threshold: float = 1e-3) -> float:
    """PSNR (dB, 8-bit peak) between image stacks a, b [N, H, W, 3] over pixels where the mask
    [N, H, W] (or [H, W]) is <= threshold. inf when those pixels are identical."""
    x, y = np.asarray(a), np.asarray(b)
    if x.shape != y.shape:
        raise ValueError(f"psnr_outside_mask: shapes differ {x.shape} vs {y.shape}")
    m = np.broadcast_to(np.asarray(masks, np.float32), x.shape[:3]) <= threshold
    if not m.any():
        raise ValueError("psnr_outside_mask: the mask covers every pixel; nothing outside it to compare")
    diff = (x.astype(np.float64) - y.astype(np.float64))[m]
    mse = float((diff ** 2).mean())
    return float("inf") if mse == 0 else float(10 * np.log10(255.0 ** 2 / mse))


def _ssim(x: np.ndarray, y: np.ndarray, sigma: float = 1.5) -> float:
    """Mean SSIM of two grey images (float64, 0..255) with a Gaussian window (Wang et al. 2004 constants)."""
    import cv2

    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2

    def blur(a: np.ndarray) -> np.ndarray:
        return cv2.GaussianBlur(a, (0, 0), sigma, borderType=cv2.BORDER_REFLECT)

    mx, my = blur(x), blur(y)
    vx, vy, cxy = blur(x * x) - mx * mx, blur(y * y) - my * my, blur(x * y) - mx * my
    ssim = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return float(ssim.mean())


def mouth_ssim(pred_frames: np.ndarray, real_frames: np.ndarray, real_lms: np.ndarray, margin: float = 0.25,
               per_frame: bool = False):
    """SSIM of the mouth region between generated and real frames [N, H, W, 3] uint8: on the grey
    images, in each frame's box around the real lips (outer + inner points) grown by `margin` x the real
    inter-ocular distance on every side. The same box for both, so a mouth in the wrong place or shape,
    and a mouth interior or lips that do not look like the real ones, all lower it (1 = identical)."""
    p, r = np.asarray(pred_frames), np.asarray(real_frames)
    if p.shape != r.shape or p.ndim != 4:
        raise ValueError(f"mouth_ssim: frames must be [N, H, W, 3] of one shape, got {p.shape} and {r.shape}")
    lms = _check_landmarks(real_lms, "real_lms")
    if len(lms) != len(p):
        raise ValueError(f"mouth_ssim: {len(p)} frames but {len(lms)} landmark sets")
    iod = inter_ocular(lms)
    grey = np.array([0.299, 0.587, 0.114])
    out = np.empty(len(p))
    for t in range(len(p)):
        pts = lms[t, list(MOUTH_POINTS), :2]
        pad = margin * iod[t]
        x0, y0 = np.maximum(np.floor(pts.min(0) - pad).astype(int), 0)
        x1, y1 = np.minimum(np.ceil(pts.max(0) + pad).astype(int), [p.shape[2], p.shape[1]])
        if x1 - x0 < 7 or y1 - y0 < 7:
            raise ValueError(f"mouth_ssim: frame {t}'s mouth box is {x1 - x0}x{y1 - y0} px (outside the frame?)")
        out[t] = _ssim(p[t, y0:y1, x0:x1].astype(np.float64) @ grey, r[t, y0:y1, x0:x1].astype(np.float64) @ grey)
    return out if per_frame else float(out.mean())


def remeasure_landmarks(frames: np.ndarray, prior_landmarks: np.ndarray,
                        run_mesh: Callable[[np.ndarray], dict] | None = None) -> np.ndarray:
    """Run the face mesh again on (generated) frames [N, H, W, 3], each on the region framed by
    `prior_landmarks` [N, 468, >=2] (e.g. the reference track's), as FaceAlign's tracking does.
    Returns [N, 468, 3] source-pixel landmarks: what the generated mouth *looks* like to the mesh."""
    from .track import mesh_from_landmarks

    if run_mesh is None:
        from ..engines.face.detect import default_runners

        run_mesh = default_runners()[1]
    if len(frames) != len(prior_landmarks):
        raise ValueError(f"remeasure_landmarks: {len(frames)} frames but {len(prior_landmarks)} prior landmark sets")
    out = np.empty((len(frames), 468, 3), np.float32)
    for t in range(len(frames)):
        out[t] = mesh_from_landmarks(np.ascontiguousarray(frames[t]), prior_landmarks[t], run_mesh)[0]
    return out
