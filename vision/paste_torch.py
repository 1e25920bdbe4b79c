"""Paste-back of a batch of generated face crops on the GPU (torch), matching vision/paste.py.

`paste_back_batch` warps and blends one frame at a time on the CPU (OpenCV on a few threads); for
a talking head whose crops were just generated on the GPU that means copying every crop and mask
to the host and warping frame by frame there. Here the whole batch is pasted with one
`grid_sample` per shrink factor, on whatever device the tensors live on, and only the pixels inside
one box that holds every frame's pasted region (`paste_footprint`) need to travel. On a CPU this
is slower than OpenCV (about 3x on 2 cores): use it where the crops already are on a GPU.

The result is what `paste_back(frame, crop, affine, mask, color_match=False, keep_detail=False)`
writes, up to OpenCV's sub-pixel quantisation: cv2.warpAffine rounds sample positions to 1/32 px,
grid_sample does not, so edges in the crop can differ by a level or two (tests/test_paste_torch.py
measures it). Everything that decides *which* pixels are touched and how the crop is pre-filtered
(footprint boxes, shrink factor k, the pre-filter's block grid) is computed on the host in float64
with the same expressions as paste_back / warp_image, so those integer decisions agree exactly.
The device work is float32 only (no float64: slow on most GPUs, missing on some backends).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .align import source_window
from .faces import invert_affines
from .paste import MASK_EPS, footprint_box, mask_bbox

# --- host-side geometry (float64, the expressions paste.py / align.py use) ----------------------
def _prefilter_plan(affine: np.ndarray, box: tuple[int, int, int, int], size: int) -> tuple[int, int, int]:
    """(k, ax, ay): the box pre-filter warp_image applies when paste_back warps an [size, size]
    crop into `box` (x0, y0, x1, y1): k crop pixels per block (1 = none) and the block grid's
    anchor in the crop. warp_image filters only the crop region the output can reach
    (align.source_window), so its blocks start at that region's corner (k = 1 needs no anchor:
    sampling the whole crop equals sampling the region, whose 2k + 2 px margin keeps every bilinear
    tap inside it unless it ends at the crop's own edge)."""
    x0, y0, x1, y1 = box
    a = invert_affines(np.asarray(affine, np.float64).reshape(2, 3)).copy()  # crop -> frame
    a[:, 2] -= (x0, y0)
    k, rx0, ry0, rx1, ry1 = source_window(a, x1 - x0, y1 - y0, size, size)
    if k == 1:
        return 1, 0, 0
    if ry1 - ry0 < 2 * k or rx1 - rx0 < 2 * k:  # warp_image skips the filter for tiny regions
        return 1, 0, 0
    # a block grid over the whole crop starting at (rx0 % k, ry0 % k) contains the region's blocks
    # (shifted by whole blocks), and where the region ends at the crop's edge both end on the same
    # last whole block, so replicate-border sampling sees the same pixels
    return k, rx0 % k, ry0 % k


def paste_footprint(affines: np.ndarray, masks: np.ndarray, height: int, width: int) -> tuple[slice, slice]:
    """(rows, cols) slices of the smallest frame box holding every pixel paste_back may write for
    any of the frames (union of their +2 px footprints, clipped to the frame), so `frames[:, rows,
    cols]` is the `box` for paste_boxes with origin (cols.start, rows.start). affines: [N, 2, 3]
    source -> crop; masks: [N, S, S] or one [S, S] for all. Frames with an empty mask add nothing;
    if all are empty: (slice(0, 0), slice(0, 0))."""
    a = np.asarray(affines, np.float64).reshape(-1, 2, 3)
    m = np.asarray(masks, np.float32)
    if m.ndim == 2:  # one mask for all frames: one bbox
        bboxes = [mask_bbox(m)] * len(a)
    elif m.ndim == 3 and len(m) == len(a):
        bboxes = [mask_bbox(mt) for mt in m]
    else:
        raise ValueError(f"masks must be [N, S, S] (one per affine) or [S, S], got {m.shape} for {len(a)} affines")
    x0 = y0 = None
    x1 = y1 = 0
    for t, bbox in enumerate(bboxes):
        if bbox is None:
            continue
        bx0, by0, bx1, by1 = footprint_box(a[t], bbox, height, width)
        if bx1 <= bx0 or by1 <= by0:  # paste_back writes nothing for this frame
            continue
        x0, y0 = (bx0, by0) if x0 is None else (min(x0, bx0), min(y0, by0))
        x1, y1 = max(x1, bx1), max(y1, by1)
    if x0 is None:
        return slice(0, 0), slice(0, 0)
    return slice(y0, y1), slice(x0, x1)


# --- device side ----------------------------------------------------------------------------------
def _torch_mask_bboxes(masks: torch.Tensor) -> list[tuple[int, int, int, int] | None]:
    """Per-frame inclusive (xmin, ymin, xmax, ymax) of mask > MASK_EPS, None if empty: reduced on
    the masks' device, then one [B, 5] transfer, since the box geometry is host work."""
    on = masks > MASK_EPS
    rows, cols = on.any(dim=2), on.any(dim=1)  # [B, S] each
    s = masks.shape[-1]
    idx = torch.arange(s, device=masks.device)
    big = torch.full_like(idx, s)
    # first / last True per row of `rows` / `cols` via min / max over masked indices
    stats = torch.stack([torch.where(cols, idx, big).amin(1), torch.where(rows, idx, big).amin(1),
                         torch.where(cols, idx, -1).amax(1), torch.where(rows, idx, -1).amax(1),
                         rows.any(1).long()], dim=1).cpu().numpy()
    return [tuple(int(v) for v in r[:4]) if r[4] else None for r in stats]


def _as_host_affines(affines: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(affines, torch.Tensor):
        # to numpy first: the float64 cast then happens in numpy, never as a torch op on a device
        return np.asarray(affines.detach().cpu().numpy(), np.float64).reshape(-1, 2, 3)
    return np.asarray(affines, np.float64).reshape(-1, 2, 3)


def _sources(crops: torch.Tensor, masks: torch.Tensor, plans: list[tuple[int, int, int]]) -> torch.Tensor:
    """[G, 4, H + 2, W + 2] sampling sources for frames sharing one k (sorted by anchor): RGB +
    mask, box pre-filtered on each frame's block grid, inside a 1-px ring, smaller ones padded to
    the largest. Ring and padding hold replicated RGB and a zero mask, so one border-mode
    grid_sample gives both of OpenCV's borders: replicate for the crop, zero for the mask
    (bilinear towards a 0 ring is zero padding)."""
    k = plans[0][0]
    n = len(plans)
    runs: list[tuple[int, int, torch.Tensor, torch.Tensor]] = []  # (start, stop, rgb, mask)
    if k == 1:
        runs.append((0, n, crops.permute(0, 3, 1, 2), masks[:, None]))
    else:
        start = 0
        while start < n:  # frames with the same anchor are adjacent: one avg_pool per anchor
            stop = start
            while stop < n and plans[stop][1:] == plans[start][1:]:
                stop += 1
            ax, ay = plans[start][1:]
            rgb = crops[start:stop, ay:, ax:].permute(0, 3, 1, 2).to(torch.float32)
            # floor mode drops partial blocks, like warp_image's crop to whole blocks
            runs.append((start, stop, F.avg_pool2d(rgb, k, stride=k),
                         F.avg_pool2d(masks[start:stop, None, ay:, ax:], k, stride=k)))
            start = stop
    h = max(r[2].shape[2] for r in runs)
    w = max(r[2].shape[3] for r in runs)
    src = torch.empty((n, 4, h + 2, w + 2), dtype=torch.float32, device=crops.device)
    src[:, 3].zero_()
    for start, stop, rgb, mask in runs:
        ph, pw = rgb.shape[2:]
        src[start:stop, :3, 1:ph + 1, 1:pw + 1] = rgb  # uint8 -> float32 in the copy
        src[start:stop, 3:, 1:ph + 1, 1:pw + 1] = mask
        ring = src[start:stop, :3]  # replicate the edge rows, then the edge columns (and corners)
        ring[:, :, 0] = ring[:, :, 1]
        ring[:, :, ph + 1:] = ring[:, :, ph:ph + 1]
        ring[:, :, :, 0] = ring[:, :, :, 1]
        ring[:, :, :, pw + 1:] = ring[:, :, :, pw:pw + 1]
    return src


def paste_boxes(box: torch.Tensor, crops: torch.Tensor, affines: np.ndarray | torch.Tensor,
                masks: torch.Tensor, origin: tuple[int, int]) -> torch.Tensor:
    """What paste_back(frame, crop, affine, mask, color_match=False, keep_detail=False) writes
    into the pixels of `box`, for a batch, on the tensors' device.

    box: float32 [B, bh, bw, 3], 0..255, the frames' pixels inside a box whose top-left corner is
    `origin` (x0, y0) in frame pixels (use paste_footprint to get one that holds every frame's
    paste). crops: generated crops [B, S, S, 3], uint8 or float32 in 0..255 (not ComfyUI's 0..1).
    affines: [B, 2, 3] source -> crop (host array or tensor; geometry is host work either way).
    masks: float32 [B, S, S] (or [S, S] for all) in 0..1, crop space.

    Returns a new float32 [B, bh, bw, 3] with integral values: content = crop warped into the frame
    (bilinear, replicated border, box pre-filter when shrinking k >= 2 as warp_image), alpha = mask
    warped (zero border) clipped to 0..1, roi + alpha * (content - roi), rounded and clipped to
    0..255. Pixels outside a frame's own paste_back footprint or where its alpha is 0 are returned
    unchanged, bit for bit. A box that does not hold a frame's whole footprint gets the part inside
    it (the footprint is then clipped to the box's right / bottom edge, not the frame's)."""
    if box.ndim != 4 or box.shape[-1] != 3 or box.dtype != torch.float32:
        raise ValueError(f"box must be float32 [B, bh, bw, 3], got {box.dtype} {tuple(box.shape)}")
    n, bh, bw = box.shape[:3]
    if crops.ndim != 4 or crops.shape[-1] != 3 or crops.shape[1] != crops.shape[2] or len(crops) != n:
        raise ValueError(f"crops must be [B, S, S, 3] with B = {n}, got {tuple(crops.shape)}")
    if crops.dtype not in (torch.uint8, torch.float32):
        raise ValueError(f"crops must be uint8 or float32 0..255, got {crops.dtype}")
    size = crops.shape[1]
    if masks.ndim == 2:
        masks = masks.expand(n, *masks.shape)
    if tuple(masks.shape) != (n, size, size):
        raise ValueError(f"masks must be [{n}, {size}, {size}] like the crops, got {tuple(masks.shape)}")
    a = _as_host_affines(affines)
    if len(a) != n:
        raise ValueError(f"paste_boxes needs one affine per frame: {n} frames, {len(a)} affines")
    ox, oy = int(origin[0]), int(origin[1])
    device = box.device
    masks = masks.to(device=device, dtype=torch.float32)
    crops = crops.to(device)

    # each frame's own footprint, clipped to the frame's left/top (0) and the box's right/bottom:
    # for a box from paste_footprint that is exactly paste_back's clipping to the frame
    frames_boxes: dict[int, tuple[int, int, int, int]] = {}
    for t, bbox in enumerate(_torch_mask_bboxes(masks)):
        if bbox is None:
            continue
        fb = footprint_box(a[t], bbox, oy + bh, ox + bw)
        if fb[2] > max(fb[0], ox) and fb[3] > max(fb[1], oy):  # writes something inside the box
            frames_boxes[t] = fb
    if not frames_boxes:
        return box.clone()
    out = None  # the copy of `box` that groups scatter into; not needed when one group has all frames

    # group frames by shrink factor (one pre-filter and one grid_sample per k), by anchor inside
    groups: dict[int, list[int]] = {}
    plans = {t: _prefilter_plan(a[t], fb, size) for t, fb in frames_boxes.items()}
    for t in sorted(frames_boxes, key=lambda t: (plans[t], t)):
        groups.setdefault(plans[t][0], []).append(t)
    rows = torch.arange(bh, device=device)
    cols = torch.arange(bw, device=device)
    for k, frames in groups.items():
        whole = frames == list(range(n))  # the usual case: no gather / scatter copies
        idx = None if whole else torch.tensor(frames, device=device)
        src = _sources(crops if whole else crops[idx], masks if whole else masks[idx], [plans[t] for t in frames])
        sh, sw = src.shape[2:]
        theta = np.empty((len(frames), 2, 3), np.float64)
        for j, t in enumerate(frames):
            _, ax, ay = plans[t]
            # box normalised coords (align_corners=False) -> box pixels -> frame pixels (continuous:
            # pixel i covers [i, i+1]) -> crop through the affine -> pre-filter blocks (anchor,
            # / k) -> +1 for the ring -> source normalised coords
            out_px = np.array([[bw / 2, 0, bw / 2 + ox], [0, bh / 2, bh / 2 + oy], [0, 0, 1]])
            to_crop = np.vstack([a[t], [0, 0, 1]])
            to_blocks = np.array([[1 / k, 0, 1 - ax / k], [0, 1 / k, 1 - ay / k], [0, 0, 1]])
            to_norm = np.array([[2 / sw, 0, -1], [0, 2 / sh, -1], [0, 0, 1]])
            theta[j] = (to_norm @ to_blocks @ to_crop @ out_px)[:2]
        th = torch.from_numpy(theta.astype(np.float32)).to(device)
        grid = F.affine_grid(th, [len(frames), 4, bh, bw], align_corners=False)
        sampled = F.grid_sample(src, grid, mode="bilinear", padding_mode="border", align_corners=False)
        del src, grid
        # alpha = 0 outside each frame's own footprint (paste_back never writes there), built from
        # per-frame bounds by broadcasting rather than one small fill per frame
        lim = torch.tensor([[fb[0] - ox, fb[1] - oy, fb[2] - ox, fb[3] - oy] for fb in
                            (frames_boxes[t] for t in frames)], device=device)
        inside = (((rows >= lim[:, 1:2]) & (rows < lim[:, 3:4]))[:, :, None]
                  & ((cols >= lim[:, 0:1]) & (cols < lim[:, 2:3]))[:, None, :])
        alpha = (sampled[:, 3].clamp(0.0, 1.0) * inside)[..., None]
        roi = box if whole else box[idx]
        blended = sampled[:, :3].permute(0, 2, 3, 1).sub_(roi).mul_(alpha).add_(roi).round_().clamp_(0.0, 255.0)
        # where alpha is 0 keep the input bit for bit (rounding would alter a non-integral box)
        result = torch.where(alpha > 0, blended, roi)
        if whole:
            return result
        if out is None:
            out = box.clone()
        out[idx] = result
    return out
