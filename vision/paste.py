"""Paste generated face crops back into their source frames (the inverse of FaceAlign).

A generated crop only replaces the lower face (under the nose, cheek to cheek, down past the
chin), through a feathered mask, so eyes, hair and background stay the original pixels. The
crop's colours are matched (mean/std per channel) to the original crop in the mask's feathered
band, where a mismatch would show as a seam, then crop and mask are warped into the frame with the
inverse affine and alpha-blended. Only the mask's footprint in the frame is touched.

keep_detail=True pastes the *change* (generated minus the re-cropped original) instead of the
crop itself: resampling to the crop and back loses fine detail (skin texture, stubble) whenever
the crop is smaller than the face in the frame; pasting the change keeps that detail where the
generator kept the content. The cost: where the generator moved an edge (lips), a faint trace of
the old edge's fine detail remains. An unmodified crop then leaves the frame bit-identical.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..parallel import for_each_frame
from . import align as _align
from .align import warp_image
from .faces import apply_affines, invert_affines

# MediaPipe face-mesh silhouette, in order around the face (forehead 10 -> right side -> chin 152).
FACE_OVAL = (10, 338, 297, 332, 284, 251, 389, 356, 454, 323, 361, 288, 397, 365, 379, 378, 400, 377,
             152, 148, 176, 149, 150, 136, 172, 58, 132, 93, 234, 127, 162, 21, 54, 103, 67, 109)
NOSE_BASE, UPPER_LIP_INNER, LOWER_LIP_INNER, CHIN = 2, 13, 14, 152
RIGHT_EYE_OUTER, LEFT_EYE_OUTER = 33, 263


def _clip_half_plane(poly: np.ndarray, origin: np.ndarray, normal: np.ndarray) -> np.ndarray:
    """Sutherland-Hodgman: the part of polygon [K, 2] where (p - origin) . normal >= 0."""
    d = (poly - origin) @ normal
    out = []
    for i in range(len(poly)):
        j = (i + 1) % len(poly)
        if d[i] >= 0:
            out.append(poly[i])
        if (d[i] >= 0) != (d[j] >= 0):
            out.append(poly[i] + (poly[j] - poly[i]) * (d[i] / (d[i] - d[j])))
    return np.array(out, np.float64).reshape(-1, 2)


def _fill_polygon(poly: np.ndarray, size: int) -> np.ndarray:
    """Binary float32 [size, size] mask of pixels whose centres lie inside `poly` (continuous coords)."""
    if _align._cv2 is not None:
        img = np.zeros((size, size), np.uint8)
        pts = np.rint((poly - 0.5) * 16).astype(np.int32)  # 4 fractional bits, centre-at-integer
        _align._cv2.fillPoly(img, [pts], 1, lineType=_align._cv2.LINE_8, shift=4)
        return img.astype(np.float32)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64) + 0.5
    inside = np.zeros((size, size), bool)
    for i in range(len(poly)):  # even-odd rule
        (x0, y0), (x1, y1) = poly[i], poly[(i + 1) % len(poly)]
        crosses = (y0 > yy) != (y1 > yy)
        with np.errstate(divide="ignore", invalid="ignore"):
            xc = x0 + (yy - y0) * (x1 - x0) / (y1 - y0)
        inside ^= crosses & (xx < xc)
    return inside.astype(np.float32)


def _gaussian_blur(mask: np.ndarray, sigma: float) -> np.ndarray:
    if sigma <= 0:
        return mask
    if _align._cv2 is not None:
        cv2 = _align._cv2
        return cv2.GaussianBlur(mask, (0, 0), sigmaX=sigma, sigmaY=sigma, borderType=cv2.BORDER_CONSTANT)
    r = int(math.ceil(3 * sigma))
    k = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma) ** 2)
    k /= k.sum()
    padded = np.pad(mask, r)
    rows = np.apply_along_axis(lambda v: np.convolve(v, k, mode="valid"), 1, padded)
    return np.apply_along_axis(lambda v: np.convolve(v, k, mode="valid"), 0, rows).astype(np.float32)


def lower_face_mask(crop_landmarks: np.ndarray, size: int, feather_px: float | None = None,
                    jaw_margin: float = 0.08) -> np.ndarray:
    """Feathered float32 [size, size] mask (0..1) of the lower face in crop pixels.

    The face silhouette is grown by `jaw_margin` (fraction, from the mouth centre) so an opened
    jaw stays inside, then cut by a line through the nose base parallel to the eye line; the
    edge is blurred with a Gaussian of sigma feather_px / 2 (default feather: size / 32)."""
    lm = np.asarray(crop_landmarks, np.float64)[:, :2]
    if lm.shape[0] < 468:
        raise ValueError(f"crop_landmarks must be the 468 face-mesh points [468, 2], got {lm.shape}")
    feather = size / 32.0 if feather_px is None else float(feather_px)
    mouth = (lm[UPPER_LIP_INNER] + lm[LOWER_LIP_INNER]) / 2
    oval = mouth + (lm[list(FACE_OVAL)] - mouth) * (1.0 + jaw_margin)
    eye_dir = lm[LEFT_EYE_OUTER] - lm[RIGHT_EYE_OUTER]
    normal = np.array([-eye_dir[1], eye_dir[0]])  # perpendicular; orient it towards the chin
    if (lm[CHIN] - lm[NOSE_BASE]) @ normal < 0:
        normal = -normal
    poly = _clip_half_plane(oval, lm[NOSE_BASE], normal / max(np.linalg.norm(normal), 1e-9))
    if len(poly) < 3:
        return np.zeros((size, size), np.float32)
    return np.clip(_gaussian_blur(_fill_polygon(poly, size), feather / 2.0), 0.0, 1.0)


def lower_face_masks(crop_landmarks: np.ndarray, size: int, feather_px: float | None = None) -> np.ndarray:
    """[N, size, size] masks for a track's `crop_landmarks()`."""
    return np.stack([lower_face_mask(lm, size, feather_px) for lm in crop_landmarks])


def _as_float255(crop: np.ndarray, name: str) -> np.ndarray:
    c = np.asarray(crop)
    if c.ndim != 3 or c.shape[2] != 3 or c.shape[0] != c.shape[1]:
        raise ValueError(f"{name} must be a square RGB crop [S, S, 3], got {c.shape}")
    if c.dtype == np.uint8:
        return c.astype(np.float32)
    if np.issubdtype(c.dtype, np.floating):
        return c.astype(np.float32) * 255.0  # ComfyUI IMAGE convention: float 0..1
    raise ValueError(f"{name} must be uint8 0..255 or float 0..1, got {c.dtype}")


def match_colors(generated: np.ndarray, reference: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per-channel mean/std of `generated` made equal to `reference`'s, measured where they meet:
    the mask's feathered band (weight 4m(1-m)), or the whole mask if the band is too thin. The
    std ratio is limited to 0.7..1.4 so a really different mouth (open, teeth) is not flattened."""
    w = 4.0 * mask * (1.0 - mask)
    if w.sum() < 0.05 * max(float(mask.sum()), 1e-6):
        w = mask
    total = float(w.sum())
    if total < 1e-6:
        return generated
    w = (w / total)[..., None]
    mu_g, mu_r = (generated * w).sum((0, 1)), (reference * w).sum((0, 1))
    sd_g = np.sqrt(((generated - mu_g) ** 2 * w).sum((0, 1)))
    sd_r = np.sqrt(((reference - mu_r) ** 2 * w).sum((0, 1)))
    ratio = np.clip(sd_r / np.maximum(sd_g, 1e-3), 0.7, 1.4)
    return (generated - mu_g) * ratio + mu_r


MASK_EPS = 1e-4  # mask values above this are pasted (the footprint)


def mask_bbox(mask: np.ndarray) -> tuple[int, int, int, int] | None:
    """(xmin, ymin, xmax, ymax), inclusive, of the mask's pixels above MASK_EPS; None if there are none.
    From the rows and columns that hold any (not every pixel's coordinates): ~8x faster, and a first video
    request's paste region takes one per reference frame."""
    on = np.asarray(mask, np.float32) > MASK_EPS
    rows = np.flatnonzero(on.any(axis=1))
    if not rows.size:
        return None
    cols = np.flatnonzero(on.any(axis=0))
    return int(cols[0]), int(rows[0]), int(cols[-1]), int(rows[-1])


def footprint_box(affine: np.ndarray, bbox: tuple[int, int, int, int], height: int, width: int
                  ) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1) of the frame pixels paste_back may write for a crop-space mask bbox: the bbox
    mapped into the frame through the inverse of `affine` (source -> crop), +2 px for the bilinear
    spread, clipped to the frame. Float64, shared with the GPU paste (paste_torch)."""
    xmin, ymin, xmax, ymax = bbox
    corners = np.array([[xmin, ymin], [xmax + 1, ymin], [xmin, ymax + 1], [xmax + 1, ymax + 1]], np.float64)
    fc = apply_affines(corners, invert_affines(np.asarray(affine, np.float64).reshape(2, 3)))
    x0, y0 = (int(np.clip(math.floor(v) - 2, 0, lim)) for v, lim in ((fc[:, 0].min(), width), (fc[:, 1].min(), height)))
    x1, y1 = (int(np.clip(math.ceil(v) + 2, 0, lim)) for v, lim in ((fc[:, 0].max(), width), (fc[:, 1].max(), height)))
    return x0, y0, x1, y1


def paste_back(frame: np.ndarray, crop: np.ndarray, affine: np.ndarray, mask: np.ndarray,
               color_match: bool = True, keep_detail: bool = False) -> np.ndarray:
    """Blend a (generated) crop into `frame` (uint8 [H, W, 3]) where `mask` [S, S] says, through
    the inverse of `affine` (source -> crop, as in DH_FACES). crop: uint8 0..255 or float 0..1.
    Returns a new uint8 frame; pixels outside the mask's footprint are untouched."""
    if not (isinstance(frame, np.ndarray) and frame.ndim == 3 and frame.shape[2] == 3 and frame.dtype == np.uint8):
        raise ValueError(f"frame must be uint8 [H, W, 3], got {getattr(frame, 'dtype', None)} "
                         f"{getattr(frame, 'shape', None)}")
    gen = _as_float255(crop, "crop")
    size = gen.shape[0]
    m = np.asarray(mask, np.float32)
    if m.shape != (size, size):
        raise ValueError(f"mask must be [{size}, {size}] like the crop, got {m.shape}")
    a = np.asarray(affine, np.float64).reshape(2, 3)
    out = frame.copy()
    bbox = mask_bbox(m)
    if bbox is None:
        return out
    x0, y0, x1, y1 = footprint_box(a, bbox, *frame.shape[:2])
    inv = invert_affines(a)
    if x1 <= x0 or y1 <= y0:
        return out
    if color_match or keep_detail:
        original = warp_image(frame, a, size, size)
        if color_match:
            gen = match_colors(gen, original, m)
        if keep_detail:
            gen = gen - original
    content = warp_image(gen, inv, x1 - x0, y1 - y0, border="replicate", origin=(x0, y0))
    alpha = np.clip(warp_image(m, inv, x1 - x0, y1 - y0, border="zero", origin=(x0, y0)), 0.0, 1.0)[..., None]
    roi = frame[y0:y1, x0:x1].astype(np.float32)
    blended = roi + alpha * content if keep_detail else roi + alpha * (content - roi)
    out[y0:y1, x0:x1] = np.clip(np.rint(blended), 0, 255).astype(np.uint8)
    return out


def paste_back_batch(frames: np.ndarray, crops: np.ndarray, affines: np.ndarray, masks: np.ndarray,
                     color_match: bool = True, keep_detail: bool = False,
                     progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """paste_back over [N] frames; `masks` is [N, S, S] or one [S, S] for all frames."""
    n = len(frames)
    if len(crops) != n or len(affines) != n:
        raise ValueError(f"paste_back_batch needs one crop and affine per frame: {n} frames, "
                         f"{len(crops)} crops, {len(affines)} affines")
    masks = np.asarray(masks, np.float32)
    if masks.ndim == 2:
        masks = np.broadcast_to(masks, (n, *masks.shape))
    out = np.empty_like(frames)

    def one(t: int) -> None:
        out[t] = paste_back(frames[t], crops[t], affines[t], masks[t], color_match, keep_detail)

    chunk = 32  # progress after each chunk; frames inside a chunk run on the worker threads
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        for_each_frame(one, start, stop)
        if progress is not None:
            progress(stop, n)
    return out


def frame_space_masks(crop_landmarks: np.ndarray, inverse_affines: np.ndarray, crop_size: int, height: int,
                      width: int) -> tuple[np.ndarray, tuple[slice, slice]]:
    """TemporalSmooth's lower-face masks (default jaw margin) warped from crop space into frame space,
    only over the frame box they can cover (a 512-px video's masks are mostly zeros; whole-frame
    float masks of a minute of video would cost gigabytes). Returns (masks, (rows, cols)): masks [h, w] when every frame shares one
    (a photo held for N frames), else [N, h, w]. Identical (landmarks, transform) pairs are warped once."""
    landmarks = np.ascontiguousarray(np.asarray(crop_landmarks)[..., :2], np.float32)
    inverse = np.ascontiguousarray(inverse_affines, np.float64)
    unique_id: dict[bytes, int] = {}
    firsts: list[int] = []  # unique id -> its first frame
    which = np.empty(len(landmarks), np.int64)
    for i in range(len(landmarks)):
        key = landmarks[i].tobytes() + inverse[i].tobytes()
        if key not in unique_id:
            unique_id[key] = len(firsts)
            firsts.append(i)
        which[i] = unique_id[key]
    crop_masks = lower_face_masks(landmarks[firsts], crop_size).astype(np.float32)
    # frame box: the union of each mask's support corners mapped into the frame (+1 px for bilinear spill)
    corners = []
    for crop_mask, inv in zip(crop_masks, inverse[firsts]):
        rows, cols = np.flatnonzero(crop_mask.any(axis=1)), np.flatnonzero(crop_mask.any(axis=0))
        if rows.size:
            box = np.array([[cols[0], rows[0]], [cols[-1] + 1, rows[0]], [cols[0], rows[-1] + 1],
                            [cols[-1] + 1, rows[-1] + 1]], np.float64)
            corners.append(box @ inv[:, :2].T + inv[:, 2])
    if not corners:
        return np.zeros((0, 0), np.float32), (slice(0, 0), slice(0, 0))
    pts = np.concatenate(corners)
    x0, y0 = (max(0, int(np.floor(v)) - 1) for v in pts.min(axis=0))
    x1, y1 = min(width, int(np.ceil(pts[:, 0].max())) + 2), min(height, int(np.ceil(pts[:, 1].max())) + 2)
    if x1 <= x0 or y1 <= y0:
        return np.zeros((0, 0), np.float32), (slice(0, 0), slice(0, 0))
    unique = np.empty((len(firsts), y1 - y0, x1 - x0), np.float32)
    for u, (crop_mask, inv) in enumerate(zip(crop_masks, inverse[firsts])):
        shifted = inv.copy()
        shifted[:, 2] -= (x0, y0)  # warp straight into the box
        unique[u] = warp_image(crop_mask, shifted, x1 - x0, y1 - y0, border="zero")
    masks = unique[0] if len(unique) == 1 else unique[which]
    return masks, (slice(y0, y1), slice(x0, x1))
