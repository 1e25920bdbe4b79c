"""The face models' input sampling (detect.warp_affine) on a torch device, for runners that take device tensors.

The face tracker's time went to the numpy sampler more than to the networks (profiled on a 2-core VM: 17 ms
a call for the 192x192 mesh crop or the 128x128 letterbox, their box pre-filter and four gathers, against 4.5 ms
for the ONNX mesh), so moving only the networks to a GPU would have left most of it (a 512x512 video's 267
frames: FaceAlign 4.3 s with the CPU face models on an H200 host, 0.54 s with this and the torch models there,
RESULTS.md). Here the same
region (detect.input_region: host float64, so the integer decisions - region, pre-filter block size
and grid - are the numpy path's) is uploaded as uint8, box-averaged with avg_pool2d and sampled with
one grid_sample; the output stays on the device for the network.

Equal to the numpy sampler up to float32 rounding of the sample positions (grid_sample rebuilds them
from normalised coordinates: ~1e-5 px on these sizes, ~1e-3 levels; tests/test_face_warp_torch.py):
align_corners=False with the region's own size puts pixel centres where the numpy path's pixel-index
space has them; "border" padding equals clamping each bilinear tap (both taps land on the edge pixel),
"zeros" is the numpy path's per-tap zero border.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def region_theta(m: np.ndarray, region_w: int, region_h: int, out_size: int) -> np.ndarray:
    """float64 [2, 3] affine_grid theta: normalised output -> normalised region coordinates, for a map
    `m` from continuous output coordinates to continuous region coordinates (pixel centres at +0.5)."""
    # output pixel-centre u = (g + 1) * S / 2 for affine_grid's normalised g (align_corners=False);
    # region coordinate x (continuous) -> normalised 2 x / W - 1 (grid_sample, align_corners=False)
    s = out_size / 2.0
    lin = np.asarray(m, np.float64)[:, :2] * s  # d(region continuous) / d(normalised output)
    off = np.asarray(m, np.float64)[:, :2] @ np.array([s, s]) + np.asarray(m, np.float64)[:, 2]
    scale = np.array([2.0 / region_w, 2.0 / region_h])
    theta = np.empty((2, 3), np.float64)
    theta[:, :2] = lin * scale[:, None]
    theta[:, 2] = off * scale - 1.0
    return theta


def warp_region(region: np.ndarray, m: np.ndarray, k: int, out_size: int, border: str, device) -> torch.Tensor:
    """float32 [S, S, 3] (0..255) on `device`: detect.warp_affine's output for an already cut uint8
    region, its map `m` (output -> region, before the pre-filter) and pre-filter block size k."""
    src = torch.from_numpy(np.ascontiguousarray(region)).to(device, non_blocking=False)
    src = src.permute(2, 0, 1)[None].to(torch.float32)  # [1, 3, h, w]
    m = np.asarray(m, np.float64)
    if k >= 2:
        # blocks from the region's corner, a partial last block dropped (floor mode), as the numpy path
        src = F.avg_pool2d(src, k, stride=k)
        m = m / k
    h, w = src.shape[2:]
    theta = torch.from_numpy(region_theta(m, w, h, out_size)[None].astype(np.float32)).to(device)
    grid = F.affine_grid(theta, [1, 3, out_size, out_size], align_corners=False)
    out = F.grid_sample(src, grid, mode="bilinear", padding_mode="border" if border == "replicate" else "zeros",
                        align_corners=False)
    return out[0].permute(1, 2, 0)
