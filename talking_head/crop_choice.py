"""The aligned crop size for a model whose crops follow the face (`TalkingHeadModel.adaptive_crop`).

Why: a generated crop is pasted back through the inverse of the alignment's affine, so a face larger
than its crop is upscaled and the lower face comes out softer than the eyes (issue 17: a 1691 px photo's
955 px face in a 256 px crop is upscaled 6.3x and its stubble disappears). 512 px crops halve that at
about 4x the portrait's per-frame cost, so they are taken only where 256 px would upscale more than
MAX_UPSCALE; the main job's 512 px photo (face 266 px, 1.8x) keeps 256.
"""
from __future__ import annotations

import numpy as np

CROP_SIZES = (256, 512)
MAX_UPSCALE = 2.0  # source pixels per crop pixel above which the larger crop is used


def paste_upscale(affines: np.ndarray) -> float:
    """Largest factor by which a crop is enlarged when pasted back: source px per crop px of the [N, 2, 3]
    source -> crop affines (their linear part is a rotation and a uniform scale)."""
    a = np.asarray(affines, np.float64).reshape(-1, 2, 3)
    if not len(a):
        return 1.0
    scale = np.sqrt(np.abs(np.linalg.det(a[:, :, :2])))
    return float(1.0 / max(float(scale.min()), 1e-9))


def choose_crop_size(affines_at_256: np.ndarray) -> tuple[int, str]:
    """(crop size, reason) from the affines of a 256 px alignment of the reference (or its first frame)."""
    up = paste_upscale(affines_at_256)
    if up > MAX_UPSCALE:
        return 512, f"crop 512 px: the face is {up:.1f}x the size of a 256 px crop (over {MAX_UPSCALE:g}x)"
    return 256, f"crop 256 px: the face is {up:.1f}x the size of the crop (512 px above {MAX_UPSCALE:g}x)"
