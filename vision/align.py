"""FaceAlign core: main face -> similarity-aligned, expanded, stable crops (DH_FACES).

The crop transform is a least-squares similarity fit of rigid mesh points (eye corners, nose
bridge and base, nostrils, cheekbones, forehead; no lips or jaw, so talking does not move the
crop) to a frontal template. Template units are face heights (mesh forehead point 10 to chin 152
= 1, origin at the centre of the mesh's bounding box, about the nose tip); the crop is a square of
side (1 + 2 * expand) face heights around that centre, so with expand 0.35 the chin has 0.35 face
heights of room below it when the mouth opens.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Callable

import numpy as np

from .faces import FaceTrack, NoFaceError
from .track import Progress, Runner, fill_gaps, landmark_box, smooth_params, track_faces

try:  # opencv-python(-headless) is a pack dependency; a numpy path keeps this importable without it
    import cv2
except ImportError:  # pragma: no cover - exercised by forcing _cv2 = None in tests
    cv2 = None
_cv2 = cv2

# Frontal template (face-height units, y down, subject's right eye on the image left), measured
# here: generalised Procrustes mean of the mesh on 12 frontal faces from the sample data
# (photos + first video frames), levelled and mirrored to be symmetric.
TEMPLATE = {
    33: (-0.2731, -0.1829), 263: (0.2731, -0.1829),   # outer eye corners
    133: (-0.1051, -0.1749), 362: (0.1051, -0.1749),  # inner eye corners
    168: (0.0, -0.2148), 6: (0.0, -0.1692), 197: (0.0, -0.1283), 195: (0.0, -0.0904),  # nose bridge
    5: (0.0, -0.0497), 4: (0.0, 0.0005), 1: (0.0, 0.0406), 2: (0.0, 0.0830),  # nose tip and base
    98: (-0.0993, 0.0745), 327: (0.0993, 0.0745),     # nostril wings
    116: (-0.3807, -0.0763), 345: (0.3807, -0.0763),  # cheekbones
    9: (0.0, -0.3116), 151: (0.0, -0.4081),           # brow centre, forehead
}
TEMPLATE_INDEX = np.array(list(TEMPLATE), dtype=np.int64)
TEMPLATE_XY = np.array(list(TEMPLATE.values()), dtype=np.float64)
CROP_SIZES = (256, 512)
TINY_FACE_PX = 40


# --- geometry --------------------------------------------------------------------------------
def fit_similarity(src: np.ndarray, dst: np.ndarray) -> tuple[float, float, float, float]:
    """Least-squares dst ~ s * R(theta) @ src + c for [K, 2] point sets; returns (cx, cy, log s, theta)."""
    ms, md = src.mean(0), dst.mean(0)
    a, b = src - ms, dst - md
    den = float((a ** 2).sum())
    p = float((a[:, 0] * b[:, 0] + a[:, 1] * b[:, 1]).sum()) / den
    q = float((a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]).sum()) / den
    c = md - np.array([[p, -q], [q, p]]) @ ms
    return float(c[0]), float(c[1]), math.log(math.hypot(p, q)), math.atan2(q, p)


def params_from_landmarks(landmarks: np.ndarray) -> np.ndarray:
    """[N, 468, >=2] source landmarks -> [N, 4] (cx, cy, log face height px, angle): the
    template's origin, size and roll in the source image."""
    return params_from_template_points(np.asarray(landmarks)[:, TEMPLATE_INDEX])


def params_from_template_points(points: np.ndarray) -> np.ndarray:
    """params_from_landmarks from the template's points alone ([N, len(TEMPLATE), >=2])."""
    return np.array([fit_similarity(TEMPLATE_XY, p[:, :2].astype(np.float64)) for p in points]).reshape(-1, 4)


def affines_from_params(params: np.ndarray, crop_size: int, expand: float) -> np.ndarray:
    """[N, 4] parameters -> [N, 2, 3] source -> crop maps (continuous pixel coordinates)."""
    p = np.asarray(params, np.float64)
    k = crop_size / ((1.0 + 2.0 * expand) * np.exp(p[:, 2]))  # crop px per source px
    c, s = np.cos(p[:, 3]), np.sin(p[:, 3])
    lin = np.stack([np.stack([c, s], -1), np.stack([-s, c], -1)], -2) * k[:, None, None]
    t = crop_size / 2.0 - np.einsum("nij,nj->ni", lin, p[:, :2])
    return np.concatenate([lin, t[..., None]], axis=-1)


# --- warping -----------------------------------------------------------------------------------
def _bilinear(src: np.ndarray, out_to_in: np.ndarray, out_h: int, out_w: int, border: str) -> np.ndarray:
    """numpy bilinear sampling (continuous coordinates), for machines without OpenCV."""
    h, w = src.shape[:2]
    u, v = np.meshgrid(np.arange(out_w, dtype=np.float64) + 0.5, np.arange(out_h, dtype=np.float64) + 0.5)
    x = out_to_in[0, 0] * u + out_to_in[0, 1] * v + out_to_in[0, 2] - 0.5
    y = out_to_in[1, 0] * u + out_to_in[1, 1] * v + out_to_in[1, 2] - 0.5
    x0, y0 = np.floor(x).astype(np.int64), np.floor(y).astype(np.int64)
    fx, fy = (x - x0)[..., None].astype(np.float32), (y - y0)[..., None].astype(np.float32)
    out = np.zeros((out_h, out_w, src.shape[2]), np.float32)
    for dy, wy in ((0, 1 - fy), (1, fy)):
        for dx, wx in ((0, 1 - fx), (1, fx)):
            xi, yi = x0 + dx, y0 + dy
            pix = src[np.clip(yi, 0, h - 1), np.clip(xi, 0, w - 1)]
            if border == "zero":
                pix = pix * ((xi >= 0) & (xi < w) & (yi >= 0) & (yi < h))[..., None]
            out += wx * wy * pix
    return out


def source_window(src_to_dst: np.ndarray, out_w: int, out_h: int, src_h: int, src_w: int
                  ) -> tuple[int, int, int, int, int]:
    """(k, x0, y0, x1, y1) for warp_image: k = source pixels per output pixel of the box pre-filter
    (1 = none; from 2x shrinking on), and the source window [y0:y1, x0:x1] the [out_h, out_w] output
    can reach through `src_to_dst` (2k + 2 px of margin for the filters). Float64, so the GPU
    paste-back (paste_torch) takes the same integer decisions from it."""
    a = np.asarray(src_to_dst, np.float64)
    inv = np.linalg.inv(np.vstack([a, [0, 0, 1]]))[:2]  # dst -> src
    corners = inv @ np.array([[0, out_w, 0, out_w], [0, 0, out_h, out_h], [1, 1, 1, 1]], np.float64)
    k = int(1.0 / max(math.sqrt(abs(np.linalg.det(a[:, :2]))), 1e-12))  # src px per dst px
    k = k if k >= 2 else 1
    pad = 2 * k + 2
    x0 = int(np.clip(math.floor(corners[0].min()) - pad, 0, src_w - 1))
    y0 = int(np.clip(math.floor(corners[1].min()) - pad, 0, src_h - 1))
    x1 = int(np.clip(math.ceil(corners[0].max()) + pad, x0 + 1, src_w))
    y1 = int(np.clip(math.ceil(corners[1].max()) + pad, y0 + 1, src_h))
    return k, x0, y0, x1, y1


def warp_image(src: np.ndarray, src_to_dst: np.ndarray, out_w: int, out_h: int, border: str = "replicate",
               origin: tuple[int, int] = (0, 0)) -> np.ndarray:
    """Resample `src` ([H, W] or [H, W, C]) through a 2x3 src -> dst affine into float32
    [out_h, out_w(, C)], bilinear, with box pre-filtering when shrinking 2x or more (no aliasing).

    `origin` (x, y) offsets the output window inside dst coordinates (paste into a frame region).
    `border`: "replicate" (edge pixels) or "zero"."""
    squeeze = src.ndim == 2
    img = src[..., None] if squeeze else src
    a = np.asarray(src_to_dst, np.float64).copy()
    a[:, 2] -= origin
    h, w = img.shape[:2]
    k, x0, y0, x1, y1 = source_window(a, out_w, out_h, h, w)
    region = img[y0:y1, x0:x1]
    a[:, 2] += a[:, :2] @ np.array([x0, y0], np.float64)  # region coords -> dst
    if k >= 2 and region.shape[0] >= 2 * k and region.shape[1] >= 2 * k:
        region = _box_mean(region, k)
        a[:, :2] *= k
    region = np.ascontiguousarray(region, dtype=np.float32)
    if _cv2 is not None:
        m = a.copy()
        m[:, 2] += m[:, :2] @ np.array([0.5, 0.5]) - 0.5  # continuous -> OpenCV's centre-at-integer
        mode = _cv2.BORDER_REPLICATE if border == "replicate" else _cv2.BORDER_CONSTANT
        out = _cv2.warpAffine(region, m, (out_w, out_h), flags=_cv2.INTER_LINEAR, borderMode=mode, borderValue=0)
        out = out.reshape(out_h, out_w, -1)
    else:
        inv = np.linalg.inv(np.vstack([a, [0, 0, 1]]))[:2]
        out = _bilinear(region, inv, out_h, out_w, border)
    return out[..., 0] if squeeze else out


def _box_mean(region: np.ndarray, k: int) -> np.ndarray:
    """float32 means of the k x k blocks of `region` [H, W, C] (rows/columns past a whole block dropped).
    uint8 pixels are summed exactly in uint16 one block row/column at a time, then divided once: the same
    float32 values as numpy's mean over the blocks' axes, ~4x faster on a 1080p face (numpy reduces two
    strided axes slowly). Other dtypes take numpy's mean."""
    rh, rw = region.shape[0] // k * k, region.shape[1] // k * k
    blocks = region[:rh, :rw].reshape(rh // k, k, rw // k, k, -1)
    if region.dtype != np.uint8 or k > 16:  # 255 x 16 x 16 is the most a uint16 sum holds
        return blocks.astype(np.float32).mean(axis=(1, 3))
    rows = blocks[:, 0].astype(np.uint16)
    for i in range(1, k):
        rows += blocks[:, i]
    total = rows[:, :, 0].copy()
    for j in range(1, k):
        total += rows[:, :, j]
    return total.astype(np.float32) / np.float32(k * k)


def crop_frame(frame: np.ndarray, affine: np.ndarray, crop_size: int) -> np.ndarray:
    return np.clip(np.rint(warp_image(frame, affine, crop_size, crop_size)), 0, 255).astype(np.uint8)


def crop_frames(frames: np.ndarray, affines: np.ndarray, crop_size: int) -> np.ndarray:
    out = np.empty((len(frames), crop_size, crop_size, 3), np.uint8)
    for t in range(len(frames)):
        out[t] = crop_frame(frames[t], affines[t], crop_size)
    return out


class LazyCrops:
    """The aligned crops of frames that are decoded on demand (media.frame_source.VideoFrames): a
    uint8 [N, S, S, 3] array-like that warps a crop when it is read and keeps the last few, so a
    long video's crops are never all in memory (a 5-minute clip's would be 1.7 GB at 256 px)."""

    def __init__(self, frames, affines: np.ndarray, crop_size: int, keep: int = 256):
        self.frames, self.affines, self.crop_size = frames, np.asarray(affines, np.float64), int(crop_size)
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._keep = keep

    def __len__(self) -> int:
        return len(self.frames)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self.frames), self.crop_size, self.crop_size, 3)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint8)

    def crop(self, t: int) -> np.ndarray:
        t = int(t) + (len(self) if t < 0 else 0)
        hit = self._cache.get(t)
        if hit is None:
            hit = crop_frame(self.frames[t], self.affines[t], self.crop_size)
            hit.flags.writeable = False
            self._cache[t] = hit
            while len(self._cache) > self._keep:
                self._cache.popitem(last=False)
        self._cache.move_to_end(t)
        return hit

    def many(self, idx, device=None) -> np.ndarray:
        """uint8 [B, S, S, 3]: the crops of frames `idx`, the ones not kept yet made together on a torch
        `device` when one is given (warp_torch.crop_frames_torch: one upload, no per-frame CPU warp),
        else one at a time as crop()."""
        idx = [int(t) + (len(self) if t < 0 else 0) for t in np.asarray(idx, np.int64).reshape(-1)]
        if device is not None:
            misses = [t for t in dict.fromkeys(idx) if t not in self._cache]
            if misses:
                from .warp_torch import crop_frames_torch

                made = crop_frames_torch(self.frames[misses], self.affines[misses], self.crop_size, device)
                for t, crop in zip(misses, made.cpu().numpy()):
                    crop.flags.writeable = False
                    self._cache[t] = crop
        out = np.empty((len(idx), self.crop_size, self.crop_size, 3), np.uint8)
        for i, t in enumerate(idx):
            out[i] = self.crop(t)
        while len(self._cache) > self._keep:
            self._cache.popitem(last=False)
        return out

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            return self.crop(int(key))
        idx = np.arange(len(self))[key] if isinstance(key, slice) else np.asarray(key, np.int64).reshape(-1)
        return np.stack([self.crop(int(t)) for t in idx]) if len(idx) else np.empty((0, *self.shape[1:]), np.uint8)

    def __array__(self, dtype=None, copy=None):
        arr = self[:]
        return arr if dtype is None else arr.astype(dtype)


def is_lazy(frames) -> bool:
    """Frames decoded on demand (VideoFrames), as opposed to an in-memory array."""
    return not isinstance(frames, np.ndarray) and hasattr(frames, "shape") and hasattr(frames, "frame")


def _by_blocks(landmarks, fn: Callable[[np.ndarray], np.ndarray], rows: int = 1024) -> np.ndarray:
    """fn over [N, 468, 3] landmarks, concatenated over frames: an in-memory array in one call, a
    RowSpool (a long video's landmarks in a file) a block of frames at a time, never read whole."""
    if isinstance(landmarks, np.ndarray):
        return fn(landmarks)
    return np.concatenate([fn(landmarks[a:b]) for a, b in landmarks.blocks(rows)])


# --- input checks --------------------------------------------------------------------------------
def _check_frames(frames: np.ndarray, name: str) -> np.ndarray:
    arr = np.asarray(frames)
    if arr.ndim == 3:
        arr = arr[None]
    if arr.ndim != 4 or arr.shape[-1] not in (3, 4) or arr.shape[0] == 0:
        raise ValueError(f"{name} must be RGB frames [N, H, W, 3], got shape {arr.shape}")
    if arr.shape[-1] == 4:
        arr = arr[..., :3]
    if arr.dtype != np.uint8:
        if not np.issubdtype(arr.dtype, np.floating):
            raise ValueError(f"{name} must be uint8 0..255 or float 0..1, got {arr.dtype}")
        arr = np.clip(np.rint(arr * 255.0), 0, 255).astype(np.uint8)  # ComfyUI IMAGE is float 0..1
    if min(arr.shape[1:3]) < 32:
        raise ValueError(f"{name} is {arr.shape[2]}x{arr.shape[1]} px; a face needs at least 32x32 px")
    return np.ascontiguousarray(arr)


def _ranges(idx: np.ndarray, limit: int = 6) -> str:
    parts, start = [], None
    for i, t in enumerate(idx):
        if start is None:
            start = t
        if i + 1 == len(idx) or idx[i + 1] != t + 1:
            parts.append(f"{start}" if start == t else f"{start}-{t}")
            start = None
    return ", ".join(parts[:limit]) + (f", ... ({len(parts)} runs)" if len(parts) > limit else "")


# --- entry point -------------------------------------------------------------------------------
def align_faces(frames: np.ndarray, fps: float, *, crop_size: int = 256, expand: float = 0.35,
                face_index: int = 0, stride: int | None = None, min_presence: float = 0.5,
                smoothing: float = 1.0, runners: tuple[Runner, Runner] | None = None,
                progress: Progress | None = None, input_name: str = "image",
                detector: Callable[[np.ndarray], list] | None = None) -> FaceTrack:
    """Find the main face on a photo (N = 1) or video frames and return aligned crops (DH_FACES).

    face_index: 0 = the largest face, 1 = the next largest, ... (at first sight and after each
    scene cut; the track then follows that person). stride: frames between detector runs (auto:
    1 for a photo, fps/6 for video; the mesh tracks in between). smoothing: 0 = raw per-frame
    transform, 1 = default zero-lag smoothing, higher = steadier."""
    lazy = is_lazy(frames)
    frames = frames if lazy else _check_frames(frames, input_name)
    n = len(frames)
    if int(crop_size) != crop_size or not 64 <= crop_size <= 2048:
        raise ValueError(f"crop_size must be a whole number of pixels in 64..2048 (256 or 512), got {crop_size}")
    crop_size = int(crop_size)
    if not 0.0 <= expand <= 2.0:
        raise ValueError(f"expand must be between 0 and 2 (0.35 leaves room for the chin), got {expand}")
    if face_index < 0:
        raise ValueError(f"face_index must be >= 0 (0 = largest face), got {face_index}")
    if not 0.0 < min_presence < 1.0:
        raise ValueError(f"min_presence must be in (0, 1), got {min_presence}")
    fps = float(fps) if fps and fps > 0 else 25.0
    if stride is None:
        stride = 1 if n == 1 else max(1, round(fps / 6.0))
    if stride < 1:
        raise ValueError(f"stride must be >= 1 frame, got {stride}")
    if runners is None:
        from ..engines.face.detect import default_runners

        runners = default_runners()

    raw = track_faces(frames, runners, stride=stride, face_index=face_index, min_presence=min_presence,
                      progress=progress, detector=detector)
    found = raw.found
    what = "the photo" if n == 1 else f"any of the {n} frames"
    if not found.any():
        max_seen = max(raw.faces_seen, default=0)
        if raw.index_too_high and max_seen:
            raise NoFaceError(f"face_index {face_index} asks for face #{face_index + 1} by size, but at most "
                              f"{max_seen} face(s) were seen in {what} of {input_name}; use face_index "
                              f"0..{max_seen - 1}")
        raise NoFaceError(f"no face found in {what} of {input_name}; use a photo/video with a visible "
                          "frontal face")

    warnings: list[str] = []
    params = np.zeros((n, 4))
    # the template's few points only: a copy of every found frame's mesh would double the landmarks' memory
    params[found] = params_from_template_points(_by_blocks(raw.landmarks, lambda b: b[:, TEMPLATE_INDEX])[found])
    # unwrap angles over the found frames so interpolation/smoothing never crosses +-pi
    params[found, 3] = np.unwrap(params[found, 3])
    missing = np.flatnonzero(~found)
    params = fill_gaps(params, found, raw.scene_cuts)
    # float32, no copy (a RowSpool for frames decoded on demand: filled in its file)
    landmarks = fill_gaps(raw.landmarks, found, raw.scene_cuts, in_place=True)
    if missing.size:
        warnings.append(f"no face in {missing.size} of {n} frames (frames {_ranges(missing)}); their crop "
                        "transform and landmarks were interpolated from the neighbouring frames")
    params = smooth_params(params, fps, raw.scene_cuts, smoothing)
    affines = affines_from_params(params, crop_size, expand)

    max_seen = max(raw.faces_seen, default=1)
    if max_seen > 1:
        multi = sum(1 for c in raw.faces_seen if c > 1)
        where = "" if n == 1 else f" (on {multi} of {raw.detections} detection frames)"
        warnings.append(f"{max_seen} faces seen{where}; using face_index {face_index} "
                        f"({'the largest' if face_index == 0 else f'#{face_index + 1} by size'}); "
                        "set face_index to pick another")
    boxes = _by_blocks(landmarks, landmark_box).astype(np.float32)
    heights = boxes[found, 3] - boxes[found, 1]
    if heights.size and float(np.median(heights)) < TINY_FACE_PX:
        warnings.append(f"the face is tiny (~{np.median(heights):.0f} px tall, under {TINY_FACE_PX} px): "
                        f"the {crop_size}px crop is heavily upscaled and landmarks are unreliable; use "
                        "closer or higher-resolution footage")
    crops = LazyCrops(frames, affines, crop_size) if lazy else crop_frames(frames, affines, crop_size)
    return FaceTrack(frames=frames, fps=fps, crop_size=crop_size, found=found.copy(), boxes=boxes,
                     landmarks=landmarks, affines=affines, presence=raw.presence, crops=crops,
                     interpolated_count=int(missing.size), warnings=warnings, face_index=face_index,
                     expand=float(expand), scene_cuts=list(raw.scene_cuts), max_faces_seen=int(max_seen))


def draw_preview(track: FaceTrack, landmarks: bool = True) -> np.ndarray:
    """uint8 [N, S, S, 3] crops with landmarks dotted (green; orange on interpolated frames)."""
    out = track.crops.copy()
    if not landmarks:
        return out
    s = track.crop_size
    r = max(1, s // 256)
    pts = np.rint(track.crop_landmarks() - 0.5).astype(np.int64)
    for t in range(len(out)):
        colour = (0, 255, 0) if track.found[t] else (255, 160, 0)
        for dy in range(-r + 1, r):
            for dx in range(-r + 1, r):
                x, y = pts[t, :, 0] + dx, pts[t, :, 1] + dy
                ok = (x >= 0) & (x < s) & (y >= 0) & (y < s)
                out[t, y[ok], x[ok]] = colour
    return out
