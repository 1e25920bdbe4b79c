"""FaceAlign's aligned crops (align.crop_frame) made on a torch device, a batch of frames at a time.

A talking video's crops are warped when they are used (align.LazyCrops): on the CPU that is a box
pre-filter and an OpenCV warp of every 512x512 frame (8.5 ms a crop on an H200 host, 11.5 ms on a 2-core VM),
and MuseTalk's renderer read one crop per output frame in its per-frame loop (much of its untimed ~2.6 s per 10 s
of video; on the GPU ~1 ms a crop with the upload). Here the frames of a batch go to the device in one copy; each frame's source window and
pre-filter block size come from align.source_window (host float64, the numpy path's integer
decisions), the window is box-averaged with avg_pool2d on the same block grid and sampled with one
grid_sample; rounding as crop_frame (clip, then round half to even).

Equal to crop_frame up to float32 rounding of the sample positions with OpenCV 5 (its float
warpAffine samples at exact positions; tests/test_align_warp_torch.py); OpenCV 4 rounds positions
to 1/32 px, so there an edge pixel can differ by a level or two (as vision/paste_torch.py notes).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..engines.face.warp_torch import region_theta
from .align import source_window


def crop_plan(affine: np.ndarray, crop_size: int, height: int, width: int
              ) -> tuple[int, tuple[int, int, int, int], np.ndarray]:
    """(k, (x0, y0, x1, y1), crop -> window map) for one frame, as warp_image computes them: the
    pre-filter block size (1 = none), the source window, and the map from continuous crop coordinates
    to continuous coordinates of the (pre-filtered) window."""
    a = np.asarray(affine, np.float64).copy()
    k, x0, y0, x1, y1 = source_window(a, crop_size, crop_size, height, width)
    a[:, 2] += a[:, :2] @ np.array([x0, y0], np.float64)  # window coords -> crop
    if not (k >= 2 and y1 - y0 >= 2 * k and x1 - x0 >= 2 * k):
        k = 1
    if k >= 2:
        a[:, :2] *= k
    inv = np.linalg.inv(np.vstack([a, [0.0, 0.0, 1.0]]))[:2]  # crop -> window
    return k, (x0, y0, x1, y1), inv


def crop_frames_torch(frames, affines: np.ndarray, crop_size: int, device) -> torch.Tensor:
    """uint8 [B, S, S, 3] on `device`: crop_frame of each frame [B, H, W, 3] (uint8: a numpy array, or a
    tensor, e.g. already on the device) and its affine."""
    if not isinstance(frames, torch.Tensor):
        frames = torch.from_numpy(np.ascontiguousarray(frames))
    affines = np.asarray(affines, np.float64).reshape(-1, 2, 3)
    n, height, width = frames.shape[:3]
    if n != len(affines):
        raise ValueError(f"{n} frames but {len(affines)} affines")
    src = frames.to(device)  # one copy for the batch (none when the frames are there already)
    out = torch.empty((n, crop_size, crop_size, 3), dtype=torch.uint8, device=device)
    plans, thetas = [], np.empty((n, 2, 3), np.float32)
    for t in range(n):  # host geometry first, so the device work below never waits on a small upload
        k, (x0, y0, x1, y1), inv = crop_plan(affines[t], crop_size, height, width)
        h, w = ((y1 - y0) // k, (x1 - x0) // k) if k >= 2 else (y1 - y0, x1 - x0)
        thetas[t] = region_theta(inv, w, h, crop_size)
        plans.append((k, x0, y0, x1, y1))
    theta_all = torch.from_numpy(thetas).to(device)
    for t, (k, x0, y0, x1, y1) in enumerate(plans):
        window = src[t, y0:y1, x0:x1].permute(2, 0, 1)[None].to(torch.float32)
        if k >= 2:  # blocks from the window's corner, a partial last block dropped (floor mode)
            window = F.avg_pool2d(window, k, stride=k)
        grid = F.affine_grid(theta_all[t:t + 1], [1, 3, crop_size, crop_size], align_corners=False)
        sampled = F.grid_sample(window, grid, mode="bilinear", padding_mode="border", align_corners=False)
        out[t] = sampled[0].clamp_(0, 255).round_().permute(1, 2, 0).to(torch.uint8)
    return out
