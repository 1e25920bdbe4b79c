"""Sonic's framing of the photo, from FaceAlign's face box instead of the reference's YOLO detector:
the expanded, squared face crop (expand 0.5, the reference demo's), the face mask (the box grown 1.1x,
in the crop) and the resize to the model's resolution (short side 512, each side a multiple of 64)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def expanded_square(box: tuple[float, float, float, float], expand: float, height: int,
                    width: int) -> tuple[int, int, int, int]:
    """The reference's crop box (x0, y0, x1, y1) of a face box: grown by `expand` of its size on each side
    (clipped to the image), then squared on the shorter side, shifted toward the face's centre."""
    x0, y0, x1, y1 = box
    bw, bh = x1 - x0, y1 - y0
    ex = [max(x0 - expand * bw, 0), max(y0 - expand * bh, 0), min(x1 + expand * bw, width), min(y1 + expand * bh, height)]
    h, w = ex[3] - ex[1], ex[2] - ex[0]
    c_h, c_w = (ex[1] + ex[3]) / 2, (ex[0] + ex[2]) / 2
    half = min(h, w) / 2
    src_h, src_w = (y0 + y1) / 2, (x0 + x1) / 2
    s_h = s_w = 0.0
    d = abs((h - w) / 2)
    if w < h:
        s_h = min(d, abs(src_h - c_h)) * (1 if src_h > c_h else -1)
    else:
        s_w = min(d, abs(src_w - c_w)) * (1 if src_w > c_w else -1)
    c_h, c_w = c_h + s_h, c_w + s_w
    sx0, sy0, sx1, sy1 = c_w - half, c_h - half, c_w + half, c_h + half
    side = min(sx1 - sx0, sy1 - sy0)
    cx, cy = (sx0 + sx1) / 2, (sy0 + sy1) / 2
    return (int(round(cx - side / 2)), int(round(cy - side / 2)), int(round(cx + side / 2)), int(round(cy + side / 2)))


def face_mask(box: tuple[float, float, float, float], height: int, width: int, area: float = 1.1) -> np.ndarray:
    """uint8 [H, W] 255 inside the face box grown `area` times about its centre (the audio attention's region)."""
    x0, y0, x1, y1 = box
    ww, hh = (x1 - x0) * area, (y1 - y0) * area
    cx, cy = (x1 + x0) // 2, (y1 + y0) // 2
    mx0, my0 = max(cx - ww // 2, 0), max(cy - hh // 2, 0)
    mx1, my1 = min(cx + ww // 2, width), min(cy + hh // 2, height)
    mask = np.zeros((height, width), np.uint8)
    mask[int(my0):int(my1), int(mx0):int(mx1)] = 255
    return mask


def model_size(width: int, height: int, short_side: int = 512) -> tuple[int, int]:
    """(width, height) at `short_side` on the shorter side, each rounded to a multiple of 64."""
    scale = short_side / min(width, height)
    return max(64, round(width * scale / 64) * 64), max(64, round(height * scale / 64) * 64)


@dataclass
class SonicFraming:
    crop_box: tuple[int, int, int, int]   # in the photo (may reach outside it: padded with the edge)
    image: np.ndarray                     # uint8 [h, w, 3] the crop at the model's size
    mask: np.ndarray                      # float32 [h, w] 0..1 face mask at the model's size
    clip_image: np.ndarray                # uint8 [224, 224, 3]


def frame_photo(photo: np.ndarray, face_box: tuple[float, float, float, float], short_side: int = 512,
                expand: float = 0.5, crop: bool = True) -> SonicFraming:
    """The reference's inputs from an RGB photo and its face box (x0, y0, x1, y1): the squared crop (or the
    whole photo when crop=False), resized with Lanczos; its face mask resized the same way."""
    from PIL import Image

    h, w = photo.shape[:2]
    if crop:
        x0, y0, x1, y1 = expanded_square(face_box, expand, h, w)
        # the reference slices the array (numpy clips negative starts oddly); clip the box into the photo
        x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, w), min(y1, h)
        image = photo[y0:y1, x0:x1]
        box = (face_box[0] - x0, face_box[1] - y0, face_box[2] - x0, face_box[3] - y0)
    else:
        x0, y0, x1, y1 = 0, 0, w, h
        image, box = photo, face_box
    ih, iw = image.shape[:2]
    mask = face_mask(box, ih, iw)
    nw, nh = model_size(iw, ih, short_side)
    pil = Image.fromarray(np.ascontiguousarray(image))
    pil_mask = Image.fromarray(np.repeat(mask[:, :, None], 3, axis=2))
    if (nw, nh) != (iw, ih):
        pil = pil.resize((nw, nh), Image.LANCZOS)
        pil_mask = pil_mask.resize((nw, nh), Image.LANCZOS)
    clip_image = np.asarray(pil.resize((224, 224), Image.LANCZOS))
    return SonicFraming(crop_box=(x0, y0, x1, y1), image=np.asarray(pil),
                        mask=np.asarray(pil_mask)[:, :, 0].astype(np.float32) / 255.0, clip_image=clip_image)
