"""How FaceAlign's face-mesh landmarks give MuseTalk's face box (no DWPose / mmpose).

MuseTalk boxes the face with DWPose's 68 face points: x from the leftmost to the rightmost jaw point,
bottom at the lowest point (the chin), top as far above nose point 29 (two thirds down the nose
bridge) as the chin is below it; v1.5 fixes bbox_shift at 0 and adds 10 px (`extra_margin`) below.
With the 468-point mesh: the face-oval points give left, right and bottom, mesh point 5 (two thirds
from the bridge top 168 to the tip 1) stands for point 29. The margin is 10 source pixels, scaled
into whatever space the landmarks are in.
"""
from __future__ import annotations

import numpy as np

from ...vision.paste import FACE_OVAL

NOSE_29 = 5


def musetalk_box(landmarks: np.ndarray, height: int | None = None) -> tuple[int, int, int, int]:
    """(x1, y1, x2, y2) integer face box (before the extra margin) from [468, 2+] landmarks."""
    lm = np.asarray(landmarks, np.float64)[:, :2]
    if lm.shape[0] < 468:
        raise ValueError(f"landmarks must be the 468 face-mesh points, got {lm.shape}")
    oval = lm[list(FACE_OVAL)]
    x1, x2 = int(np.floor(oval[:, 0].min())), int(np.ceil(oval[:, 0].max()))
    y2 = int(np.ceil(oval[:, 1].max()))
    nose = float(lm[NOSE_29, 1])
    y1 = int(max(0.0, nose - (y2 - nose)))
    x1 = max(0, x1)
    if height is not None:
        y2 = min(y2, int(height))
    if x2 - x1 < 8 or y2 - y1 < 8:
        raise ValueError(f"face box {(x1, y1, x2, y2)} is too small for MuseTalk")
    return x1, y1, x2, y2
