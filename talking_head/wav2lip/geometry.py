"""Wav2Lip's face box, from FaceAlign's mesh instead of its S3FD detector, and its crop / paste maps.

The reference (inference.py) takes S3FD's box (integer x1, y1, x2, y2), pads it (top, bottom, left, right) =
(0, 10, 0, 0) source pixels, clips it to the frame, averages each box with the next four in place on the
integer array (`get_smoothened_boxes`, T = 5; the last T boxes use the final window), cuts frame[y1:y2,
x1:x2], resizes it to 96x96 (cv2 INTER_LINEAR) for the network, and pastes the 96x96 output back with
cv2.resize to the box's size (a hard rectangle, no mask). All of that is re-implemented here exactly; only the
detector box is stood in for by the mesh: x from the face oval's leftmost to rightmost point, bottom at its
lowest point (the chin), top at the highest eyebrow point. S3FD's weights are not available to us, so how close
that stand-in is to S3FD's own boxes is not measured (docs/wav2lip.md says so).

The pack pastes every model's output in crop space (the aligned crop of FaceAlign, through its affine), so the
96x96 output is warped straight into the crop with the map cv2.resize would have used into the box
(`out_to_crop`), and the paste mask is the box rectangle in crop space (`box_mask`).
"""
from __future__ import annotations

import numpy as np

from ...vision.paste import FACE_OVAL

PADS = (0, 10, 0, 0)  # inference.py's --pads default: top, bottom, left, right (source px)
SMOOTH_T = 5          # inference.py's get_smoothened_boxes window (--nosmooth switches it off)
FACE_SIZE = 96
# both eyebrows' upper and lower contours in the 468-point mesh
BROWS = (70, 63, 105, 66, 107, 55, 65, 52, 53, 46, 336, 296, 334, 293, 300, 285, 295, 282, 283, 276)


def detector_box(landmarks: np.ndarray) -> np.ndarray:
    """int64 [4] x1, y1, x2, y2: the mesh's stand-in for S3FD's face box (truncated to int as the reference's
    detector API does, after clipping at 0)."""
    lm = np.asarray(landmarks, np.float64)[:, :2]
    if lm.shape[0] < 468:
        raise ValueError(f"landmarks must be the 468 face-mesh points, got {lm.shape}")
    oval = lm[list(FACE_OVAL)]
    box = np.array([oval[:, 0].min(), lm[list(BROWS), 1].min(), oval[:, 0].max(), oval[:, 1].max()])
    return np.clip(box, 0, None).astype(np.int64)


def padded_boxes(rects: np.ndarray, height: int, width: int, pads=PADS) -> np.ndarray:
    """int64 [N, 4] x1, y1, x2, y2: detector rects padded and clipped as face_detect() does."""
    r = np.asarray(rects, np.int64).reshape(-1, 4)
    top, bottom, left, right = (int(p) for p in pads)
    out = np.empty_like(r)
    out[:, 0] = np.maximum(0, r[:, 0] - left)
    out[:, 1] = np.maximum(0, r[:, 1] - top)
    out[:, 2] = np.minimum(width, r[:, 2] + right)
    out[:, 3] = np.minimum(height, r[:, 3] + bottom)
    return out


def smoothed_boxes(boxes: np.ndarray, t: int = SMOOTH_T) -> np.ndarray:
    """get_smoothened_boxes: box i = mean of boxes i..i+t-1 (boxes[n - t:] when that runs past the end), written
    in place into the integer array in order (so late windows see already-smoothed boxes), truncated. Python's
    slice is kept as the reference has it: with fewer than t boxes n - t is negative, so boxes[n - t:] is the
    last t - n of them (4 frames: every box becomes the last one)."""
    out = np.array(boxes, np.int64, copy=True)
    n = len(out)
    for i in range(n):
        window = out[n - t:] if i + t > n else out[i:i + t]
        out[i] = np.mean(window, axis=0)  # assignment into int64 truncates, as in the reference
    return out


def wav2lip_boxes(landmarks, n: int, height: int, width: int, pads=PADS, smooth: bool = True,
                  frames: np.ndarray | None = None) -> np.ndarray:
    """int64 [N, 4] final boxes of reference frames `frames` (default 0..n-1) from their landmarks."""
    idx = np.arange(n) if frames is None else np.asarray(frames, np.int64)
    rects = np.stack([detector_box(landmarks[int(i)]) for i in idx]) if len(idx) else np.zeros((0, 4), np.int64)
    return wav2lip_boxes_from_rects(rects, height, width, pads, smooth, idx)


def wav2lip_boxes_from_rects(rects: np.ndarray, height: int, width: int, pads=PADS, smooth: bool = True,
                             frames: np.ndarray | None = None) -> np.ndarray:
    """int64 [N, 4]: detector rects padded, clipped and (smooth) smoothed as inference.py's face_detect()."""
    boxes = padded_boxes(rects, height, width, pads)
    bad = (boxes[:, 2] - boxes[:, 0] < 8) | (boxes[:, 3] - boxes[:, 1] < 8)
    if bad.any():
        i = int(np.argmax(bad))
        at = i if frames is None else int(frames[i])
        raise ValueError(f"Wav2Lip's face box of reference frame {at} is {boxes[i].tolist()}: too small "
                         "(the face must be at least 8 px wide and tall)")
    return smoothed_boxes(boxes) if smooth else boxes


def face_input(frame: np.ndarray, box) -> np.ndarray:
    """uint8 [96, 96, 3]: frame[y1:y2, x1:x2] resized as the reference's datagen does."""
    import cv2

    x1, y1, x2, y2 = (int(v) for v in box)
    return cv2.resize(np.ascontiguousarray(frame[y1:y2, x1:x2]), (FACE_SIZE, FACE_SIZE))


def out_to_crop(box, affine: np.ndarray) -> np.ndarray:
    """float64 [2, 3]: crop pixel -> 96x96 output pixel (for cv2.warpAffine with WARP_INVERSE_MAP), the map
    cv2.resize(out, (w, h)) uses from the box back to the output, composed with the crop's inverse affine."""
    x1, y1, x2, y2 = (float(v) for v in box)
    sx, sy = FACE_SIZE / (x2 - x1), FACE_SIZE / (y2 - y1)
    # cv2.resize (INTER_LINEAR): source = (dest + 0.5) * scale - 0.5, with dest = frame px - box origin
    frame_to_out = np.array([[sx, 0.0, (0.5 - x1) * sx - 0.5], [0.0, sy, (0.5 - y1) * sy - 0.5], [0, 0, 1]])
    a = np.vstack([np.asarray(affine, np.float64), [0, 0, 1]])
    return (frame_to_out @ np.linalg.inv(a))[:2]


def box_mask(box, affine: np.ndarray, size: int) -> np.ndarray:
    """float32 [S, S]: the box rectangle (the reference's hard paste region) in crop space, bilinear edges."""
    import cv2

    x1, y1, x2, y2 = (int(v) for v in box)
    a = np.vstack([np.asarray(affine, np.float64), [0, 0, 1]])
    crop_to_box = (np.array([[1.0, 0, -x1], [0, 1.0, -y1], [0, 0, 1]]) @ np.linalg.inv(a))[:2]
    ones = np.ones((y2 - y1, x2 - x1), np.float32)
    return cv2.warpAffine(ones, crop_to_box, (size, size), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                          borderMode=cv2.BORDER_CONSTANT, borderValue=0.0)


def paste_reference(frame: np.ndarray, out96: np.ndarray, box) -> np.ndarray:
    """The reference's own paste (inference.py): out96 resized to the box and written over it; a copy."""
    import cv2

    x1, y1, x2, y2 = (int(v) for v in box)
    f = np.array(frame, copy=True)
    f[y1:y2, x1:x2] = cv2.resize(np.ascontiguousarray(out96), (x2 - x1, y2 - y1))
    return f
