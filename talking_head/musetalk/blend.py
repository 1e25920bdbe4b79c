"""MuseTalk 1.5's crop and blending conventions, in numpy.

Crop: the face box (x1, y1, x2, y2) with y2 moved down by `extra_margin` pixels (10 in v1.5; clipped
to the image), resized to 256x256 with Lanczos. Paste: the generated 256 crop is resized back to the
box (bilinear) and blended over a square 1.5x the box's longer side around its centre, through a mask
that is the face-parsing mask inside the box, zero above half of that square, blurred with a Gaussian
of kernel 5% of its side. The mask source is the caller's (face mesh, or the BiSeNet face parsing of
that square as the reference runs it: `parsing_face_mask`).
"""
from __future__ import annotations

import numpy as np

CROP = 256
EXTRA_MARGIN = 10
EXPAND = 1.5
UPPER_BOUNDARY = 0.5


def _cv2():
    import cv2

    return cv2


def extend_box(box, height: int, extra_margin: int = EXTRA_MARGIN) -> tuple[int, int, int, int]:
    x1, y1, x2, y2 = (int(v) for v in box)
    return x1, y1, x2, min(y2 + int(extra_margin), int(height))


def crop_face(image: np.ndarray, box) -> np.ndarray:
    """uint8 [256, 256, 3]: image[y1:y2, x1:x2] (an already extended box) resized with Lanczos."""
    x1, y1, x2, y2 = (int(v) for v in box)
    region = image[y1:y2, x1:x2]
    if region.size == 0:
        raise ValueError(f"face box {box} is empty inside the {image.shape[1]}x{image.shape[0]} image")
    return _cv2().resize(region, (CROP, CROP), interpolation=_cv2().INTER_LANCZOS4)


def square_box(box, expand: float = EXPAND) -> tuple[int, int, int, int]:
    """The blending square around a face box (integer arithmetic as the reference)."""
    x, y, x1, y1 = (int(v) for v in box)
    xc, yc = (x + x1) // 2, (y + y1) // 2
    s = int(max(x1 - x, y1 - y) // 2 * expand)
    return xc - s, yc - s, xc + s, yc + s


def cut_square(image: np.ndarray, square) -> np.ndarray:
    """uint8 [2s, 2s, C]: the blending square cut from the image, black where it leaves the image
    (what PIL's Image.crop gives the reference for a box past the border)."""
    xs, ys, xe, ye = (int(v) for v in square)
    side = xe - xs
    h, w = image.shape[:2]
    out = np.zeros((side, side) + image.shape[2:], np.uint8)
    sx0, sy0, sx1, sy1 = max(xs, 0), max(ys, 0), min(xe, w), min(ye, h)
    if sx1 > sx0 and sy1 > sy0:
        out[sy0 - ys:sy1 - ys, sx0 - xs:sx1 - xs] = image[sy0:sy1, sx0:sx1]
    return out


def parsing_face_mask(image: np.ndarray, box, parser, mode: str = "jaw") -> np.ndarray:
    """uint8 [2s, 2s]: the face-parsing mask of the blending square around `box` (an extended box), as
    get_image computes it before the paste: the square is cut from the original image (before the
    generated face goes in) and parsed; `parser.mask(rgb, mode)` returns it at the square's size."""
    return parser.mask(cut_square(image, square_box(box)), mode)


def blend_mask(face_mask: np.ndarray, box, square) -> np.ndarray:
    """uint8 [2s, 2s]: `face_mask` (uint8, the square's size) kept inside the box and below the
    square's upper half, then blurred."""
    xs, ys, xe, ye = square
    side = xe - xs
    x, y, x1, y1 = (int(v) for v in box)
    if face_mask.shape != (side, side):
        raise ValueError(f"face mask must be [{side}, {side}] (the blending square), got {face_mask.shape}")
    m = np.zeros((side, side), np.uint8)
    bx0, by0, bx1, by1 = x - xs, y - ys, x1 - xs, y1 - ys
    cx0, cy0, cx1, cy1 = max(bx0, 0), max(by0, 0), min(bx1, side), min(by1, side)
    m[cy0:cy1, cx0:cx1] = face_mask[cy0:cy1, cx0:cx1]
    m[:int(side * UPPER_BOUNDARY)] = 0
    k = int(0.05 * side // 2 * 2) + 1
    return _cv2().GaussianBlur(m, (k, k), 0)


def _div255(v: np.ndarray) -> np.ndarray:
    t = v + 128
    return ((t >> 8) + t) >> 8


def paste_face(image: np.ndarray, face: np.ndarray, box, face_mask: np.ndarray) -> np.ndarray:
    """The image with `face` (uint8, already the box's size) blended in; a new array."""
    x, y, x1, y1 = (int(v) for v in box)
    if face.shape[:2] != (y1 - y, x1 - x):
        raise ValueError(f"face must be the box's size {(y1 - y, x1 - x)}, got {face.shape[:2]}")
    square = square_box(box)
    xs, ys, xe, ye = square
    side = xe - xs
    h, w = image.shape[:2]
    large = cut_square(image, square)
    sx0, sy0, sx1, sy1 = max(xs, 0), max(ys, 0), min(xe, w), min(ye, h)
    fx0, fy0 = x - xs, y - ys
    tx0, ty0, tx1, ty1 = max(fx0, 0), max(fy0, 0), min(fx0 + face.shape[1], side), min(fy0 + face.shape[0], side)
    large[ty0:ty1, tx0:tx1] = face[ty0 - fy0:ty1 - fy0, tx0 - fx0:tx1 - fx0]
    mask = blend_mask(face_mask, box, square).astype(np.int32)[sy0 - ys:sy1 - ys, sx0 - xs:sx1 - xs, None]
    out = image.copy()
    dst = out[sy0:sy1, sx0:sx1].astype(np.int32)
    src = large[sy0 - ys:sy1 - ys, sx0 - xs:sx1 - xs].astype(np.int32)
    out[sy0:sy1, sx0:sx1] = _div255(dst * (255 - mask) + src * mask).astype(np.uint8)
    return out


def resize_to_box(face256: np.ndarray, box) -> np.ndarray:
    x1, y1, x2, y2 = (int(v) for v in box)
    return _cv2().resize(face256, (x2 - x1, y2 - y1))
