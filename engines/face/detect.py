"""Face detection (BlazeFace short-range) and 468-point face mesh: numpy pre/post-processing.

Follows MediaPipe's face_detection_short_range + face_landmark graphs: letterbox to 128x128 in
[-1, 1], 896 SSD anchors, sigmoid scores, weighted NMS (IoU 0.3); then a square crop 1.5x the
box's long side, rotated so the eye line is level, 192x192 in [0, 1], and landmarks mapped back to
image pixels. The networks are plain callables `batch -> dict of outputs` so any engine backend can
run them; `default_runners()` gets them from the engine loader (ONNX Runtime on CPU).

One deliberate difference from MediaPipe: when a crop shrinks the image by 2x or more we
box-average first (MediaPipe samples bilinearly straight from full resolution, which aliases on
large photos).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np

Runner = Callable[[np.ndarray], dict]

DETECTOR_SIZE = 128
MESH_SIZE = 192
NUM_KEYPOINTS = 6
# Keypoint order of the detector (the subject's right/left): right eye, left eye, nose tip, mouth
# centre, right ear tragion, left ear tragion.
KEYPOINT_NAMES = ("right_eye", "left_eye", "nose_tip", "mouth_center", "right_ear", "left_ear")
MESH_SCALE = 1.5  # MediaPipe face_detection_front_detection_to_roi: square long side, x1.5


@dataclass
class FaceBox:
    """A detected face in image pixels; keypoints [6, 2] (x, y) in KEYPOINT_NAMES order."""
    x0: float
    y0: float
    x1: float
    y1: float
    score: float
    keypoints: np.ndarray

    @property
    def width(self) -> float:
        return self.x1 - self.x0

    @property
    def height(self) -> float:
        return self.y1 - self.y0


# --- image sampling ----------------------------------------------------------------------------
def _check_image(image: np.ndarray, name: str = "image") -> np.ndarray:
    if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3:
        shape = getattr(image, "shape", None)
        raise ValueError(f"{name} must be an RGB array of shape (H, W, 3), got {shape}; "
                         "drop an alpha channel with image[..., :3] and expand greyscale to 3 channels")
    if image.dtype != np.uint8:
        raise ValueError(f"{name} must be uint8 (0..255), got {image.dtype}; convert a 0..1 float image "
                         "with (image * 255).round().clip(0, 255).astype(np.uint8)")
    if image.shape[0] < 2 or image.shape[1] < 2:
        raise ValueError(f"{name} is too small ({image.shape[1]}x{image.shape[0]} px)")
    return image


def input_region(shape: tuple[int, ...], out_to_in: np.ndarray, out_size: int
                 ) -> tuple[tuple[int, int, int, int], int, np.ndarray]:
    """((rx0, ry0, rx1, ry1), k, m) for warp_affine: the part of an image of `shape` the crop can touch
    (+1 px for the bilinear neighbours), the box pre-filter's block size k (1 = none) and the map
    from output coordinates into that region (before any pre-filter). Host float64, shared by the
    numpy and the torch (warp_torch) samplers so both take the same integer decisions."""
    h, w = shape[:2]
    m = np.asarray(out_to_in, dtype=np.float64)
    corners = m @ np.array([[0, out_size, 0, out_size], [0, 0, out_size, out_size], [1, 1, 1, 1]], float)
    rx0 = int(np.clip(math.floor(corners[0].min()) - 1, 0, w - 1))
    ry0 = int(np.clip(math.floor(corners[1].min()) - 1, 0, h - 1))
    rx1 = int(np.clip(math.ceil(corners[0].max()) + 1, rx0 + 1, w))
    ry1 = int(np.clip(math.ceil(corners[1].max()) + 1, ry0 + 1, h))
    m = m.copy()
    m[:, 2] -= (rx0, ry0)
    k = int(math.sqrt(abs(np.linalg.det(m[:, :2]))))  # input px per output px
    if not (k >= 2 and ry1 - ry0 >= k and rx1 - rx0 >= k):
        k = 1
    return (rx0, ry0, rx1, ry1), k, m


def warp_affine(image: np.ndarray, out_to_in: np.ndarray, out_size: int, border: str, device=None):
    """Sample an out_size x out_size float32 image (0..255) through a 2x3 affine map.

    `out_to_in` maps continuous output coordinates (pixel centres at +0.5) to continuous input
    coordinates. `border`: "zero" (black, like MediaPipe's letterbox) or "replicate" (edge pixels,
    like its face crop). device: a torch CUDA device to sample there (warp_torch: the same float32
    arithmetic, a torch tensor back, for runners that take device tensors); None = numpy.
    """
    (rx0, ry0, rx1, ry1), k, m = input_region(image.shape, out_to_in, out_size)
    region = image[ry0:ry1, rx0:rx1]
    if device is not None:
        from .warp_torch import warp_region

        return warp_region(region, m, k, out_size, border, device)
    if k >= 2:
        # anti-alias: box-average k x k blocks; coordinates scale exactly by 1/k (remainder cut).
        # Rows first, then columns: contiguous sums, ~6x faster than one mean over both axes.
        rh, rw = region.shape[0] // k * k, region.shape[1] // k * k
        rows = region[:rh, :rw].reshape(rh // k, k, rw, 3).sum(axis=1, dtype=np.uint32)
        region = rows.reshape(rh // k, rw // k, k, 3).sum(axis=2).astype(np.float32) * (1.0 / (k * k))
        m /= k
    region = region.astype(np.float32, copy=False)
    rh, rw = region.shape[:2]
    x, y = _sample_grid(m, out_size)
    x0f, y0f = np.floor(x), np.floor(y)
    fx, fy = (x - x0f)[..., None], (y - y0f)[..., None]
    x0i, y0i = x0f.astype(np.int64), y0f.astype(np.int64)
    out = np.zeros((out_size, out_size, 3), np.float32)
    for dy, wy in ((0, 1 - fy), (1, fy)):
        for dx, wx in ((0, 1 - fx), (1, fx)):
            xi, yi = x0i + dx, y0i + dy
            pix = region[np.clip(yi, 0, rh - 1), np.clip(xi, 0, rw - 1)]
            if border == "zero":
                # the region reaches 1 px past the crop wherever the image does, so a sample
                # outside it lies outside the image: black, like MediaPipe's letterbox
                inside = (xi >= 0) & (xi < rw) & (yi >= 0) & (yi < rh)
                pix = pix * inside[..., None]
            out += wx * wy * pix
    return out


def _sample_grid(m: np.ndarray, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 [S, S] x and y of every output pixel centre in the region's pixel-index space."""
    grid = np.arange(out_size, dtype=np.float32) + 0.5
    u, v = np.meshgrid(grid, grid)
    m32 = m.astype(np.float32)
    x = m32[0, 0] * u + m32[0, 1] * v + (m32[0, 2] - 0.5)  # to pixel-index space
    y = m32[1, 0] * u + m32[1, 1] * v + (m32[1, 2] - 0.5)
    return x, y


# --- detector ----------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def blazeface_anchors() -> np.ndarray:
    """[896, 2] anchor centres in 0..1: 16x16 cells x 2 (stride 8) + 8x8 cells x 6 (stride 16).

    MediaPipe's SsdAnchorsCalculator with strides [8, 16, 16, 16], one aspect ratio plus the
    interpolated one, fixed anchor size: layers sharing a stride are merged into one grid.
    """
    centres = []
    for stride, per_cell in ((8, 2), (16, 6)):
        cells = math.ceil(DETECTOR_SIZE / stride)
        for y in range(cells):
            for x in range(cells):
                centres.extend([((x + 0.5) / cells, (y + 0.5) / cells)] * per_cell)
    return np.asarray(centres, dtype=np.float32)


def detector_input(image: np.ndarray, device=None) -> tuple[np.ndarray, tuple[float, float, float]]:
    """Letterboxed [1,128,128,3] float32 in [-1, 1] and (scale, pad_x, pad_y) to undo it (a torch
    tensor on `device` when one is given: warp_affine)."""
    image = _check_image(image)
    h, w = image.shape[:2]
    scale = DETECTOR_SIZE / max(w, h)
    pad_x, pad_y = (DETECTOR_SIZE - w * scale) / 2, (DETECTOR_SIZE - h * scale) / 2
    out_to_in = np.array([[1 / scale, 0, -pad_x / scale], [0, 1 / scale, -pad_y / scale]])
    tensor = warp_affine(image, out_to_in, DETECTOR_SIZE, border="zero", device=device)
    return (tensor / 127.5 - 1.0)[None], (scale, pad_x, pad_y)


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    ix0, iy0 = np.maximum(box[0], others[:, 0]), np.maximum(box[1], others[:, 1])
    ix1, iy1 = np.minimum(box[2], others[:, 2]), np.minimum(box[3], others[:, 3])
    inter = np.clip(ix1 - ix0, 0, None) * np.clip(iy1 - iy0, 0, None)
    area = lambda b: (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])  # noqa: E731
    return inter / np.maximum(area(box) + area(others) - inter, 1e-12)


def _weighted_nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> list[tuple[np.ndarray, float]]:
    """MediaPipe's WEIGHTED non-max suppression: overlapping detections are score-averaged.

    `boxes` rows are [x0, y0, x1, y1, kx0, ky0, ...]; returns (averaged row, best score) pairs.
    """
    order = np.argsort(-scores)
    boxes, scores = boxes[order], scores[order]
    kept = []
    remaining = np.arange(len(scores))
    while remaining.size:
        top = remaining[0]
        overlap = _iou(boxes[top], boxes[remaining]) > iou_threshold
        members = remaining[overlap]
        weights = scores[members]
        kept.append(((boxes[members] * weights[:, None]).sum(0) / weights.sum(), float(scores[top])))
        remaining = remaining[~overlap]
    return kept


def decode_detections(regressors: np.ndarray, classificators: np.ndarray, min_score: float = 0.5,
                      iou_threshold: float = 0.3) -> list[tuple[np.ndarray, float]]:
    """Raw outputs of one image ([896,16], [896,1]) -> NMS'd rows in 0..1 letterbox coordinates."""
    reg = np.asarray(regressors, np.float64).reshape(-1, 4 + 2 * NUM_KEYPOINTS)
    logits = np.clip(np.asarray(classificators, np.float64).reshape(-1), -100.0, 100.0)
    scores = 1.0 / (1.0 + np.exp(-logits))
    keep = scores >= min_score
    if not keep.any():
        return []
    reg, scores, anchors = reg[keep] / DETECTOR_SIZE, scores[keep], blazeface_anchors()[keep]
    cx, cy = reg[:, 0] + anchors[:, 0], reg[:, 1] + anchors[:, 1]
    half_w, half_h = reg[:, 2] / 2, reg[:, 3] / 2
    kps = reg[:, 4:].reshape(-1, NUM_KEYPOINTS, 2) + anchors[:, None, :]
    rows = np.concatenate([np.stack([cx - half_w, cy - half_h, cx + half_w, cy + half_h], 1),
                           kps.reshape(len(kps), -1)], axis=1)
    return _weighted_nms(rows, scores, iou_threshold)


def detect_faces(image: np.ndarray, run_detector: Runner | None = None, min_score: float = 0.5,
                 iou_threshold: float = 0.3) -> list[FaceBox]:
    """Faces in an RGB uint8 image (H, W, 3), best score first, in image pixels.

    A box is not proof of a face: confirm with face_landmarks()' presence score (the detector fires
    on some animals and face-like textures).
    """
    if run_detector is None:
        run_detector = default_runners()[0]
    tensor, (scale, pad_x, pad_y) = detector_input(image, runner_device(run_detector))
    out = run_detector(tensor)
    faces = []
    for row, score in decode_detections(out["regressors"][0], out["classificators"][0], min_score, iou_threshold):
        pts = row.reshape(-1, 2) * DETECTOR_SIZE
        pts = (pts - (pad_x, pad_y)) / scale  # un-letterbox to image pixels
        (x0, y0), (x1, y1) = pts[0], pts[1]
        faces.append(FaceBox(float(x0), float(y0), float(x1), float(y1), score, pts[2:].astype(np.float32)))
    return faces


# --- face mesh ---------------------------------------------------------------------------------
def mesh_crop_transform(box: FaceBox) -> np.ndarray:
    """2x3 map from 192x192 crop coordinates to image pixels: square 1.5x the box's long side,
    centred on the box, its x axis along the right-eye -> left-eye line (so the face is upright)."""
    kp = np.asarray(box.keypoints, np.float64)
    angle = math.atan2(kp[1, 1] - kp[0, 1], kp[1, 0] - kp[0, 0])
    side = MESH_SCALE * max(box.width, box.height)
    if not side > 0:
        raise ValueError(f"face box has no area ({box.x0:.1f},{box.y0:.1f})-({box.x1:.1f},{box.y1:.1f})")
    c, s = math.cos(angle), math.sin(angle)
    unit = side / MESH_SIZE
    cx, cy = (box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2
    # image = centre + R @ ((u, v) - 96) * unit
    return np.array([[c * unit, -s * unit, cx - (c - s) * side / 2],
                     [s * unit, c * unit, cy - (s + c) * side / 2]])


def mesh_input(image: np.ndarray, box: FaceBox, device=None) -> tuple[np.ndarray, np.ndarray]:
    """The mesh network's input [1,192,192,3] float32 in [0, 1] (a torch tensor on `device` when one
    is given) and the crop->image 2x3 map."""
    image = _check_image(image)
    crop_to_image = mesh_crop_transform(box)
    tensor = warp_affine(image, crop_to_image, MESH_SIZE, border="replicate", device=device)
    return (tensor / 255.0)[None], crop_to_image


def landmarks_to_image(landmarks: np.ndarray, crop_to_image: np.ndarray) -> np.ndarray:
    """[468,3] crop-space landmarks -> image pixels (z scaled like x/y, relative to the face)."""
    lm = np.asarray(landmarks, np.float64).reshape(-1, 3)
    xy = lm[:, :2] @ crop_to_image[:, :2].T + crop_to_image[:, 2]
    unit = math.sqrt(abs(np.linalg.det(crop_to_image[:, :2])))
    return np.concatenate([xy, lm[:, 2:3] * unit], axis=1).astype(np.float32)


def face_landmarks(image: np.ndarray, box: FaceBox, run_mesh: Runner | None = None) -> tuple[np.ndarray, float]:
    """468 landmarks [468, 3] in image pixels for one detected face, and the face-presence score
    (0..1; below 0.5 the crop is not a face and the landmarks are meaningless)."""
    if run_mesh is None:
        run_mesh = default_runners()[1]
    tensor, crop_to_image = mesh_input(image, box, runner_device(run_mesh))
    out = run_mesh(tensor)
    presence = 1.0 / (1.0 + math.exp(-float(np.clip(out["face_flag"].reshape(-1)[0], -100, 100))))
    return landmarks_to_image(out["landmarks"][0], crop_to_image), presence


# --- default backend ---------------------------------------------------------------------------
def runner_device(run: Runner):
    """The torch device a runner takes its input on (inputs are then sampled there: warp_torch), or
    None for runners that take numpy (ONNX Runtime, the CPU)."""
    return getattr(run, "device", None)


def engine_runner(spec: object, backend: str = "auto", precision: str = "auto") -> Runner:
    """Adapt an engine-layer runner (dict of named inputs) to this module's `batch -> outputs`. A torch
    runner on CUDA also takes device tensors (its `device` attribute says where), so the inputs are
    sampled on the GPU and only the outputs cross to the host."""
    from .. import loader

    # bound(): default_runners is cached per process, the runner behind it may be released (stage
    # unloading) or evicted; the bound callable reloads it instead of running a released one
    runner = loader.bound(spec, backend=backend, precision=precision, stage="face")  # type: ignore[arg-type]
    input_name = runner.input_names()[0]

    def run(batch) -> dict:
        if not isinstance(batch, np.ndarray) and hasattr(batch, "device"):  # a torch tensor (device runner)
            if getattr(run, "device", None) is not None:
                return runner({input_name: batch})
            batch = batch.detach().cpu().numpy()
        return runner({input_name: np.ascontiguousarray(batch, np.float32)})

    run.info = runner.info  # type: ignore[attr-defined]  # lets callers report the backend used
    if runner.info.device == "cuda" and runner.info.backend.startswith("torch"):  # TorchRunner: takes tensors
        import torch

        run.device = torch.device("cuda")  # type: ignore[attr-defined]
        # the runner loaded now (reloaded if it was released): the face tracker takes its module to replay
        # sampling + network as one CUDA graph per call (device_track.py)
        run.live = lambda: loader.get(spec, backend=backend, precision=precision,  # type: ignore[attr-defined]
                                      stage="face")
    return run


@lru_cache(maxsize=4)
def default_runners(backend: str = "auto", precision: str = "auto") -> tuple[Runner, Runner]:
    """(run_detector, run_mesh) on the installed models via the engine loader; raises with a setup
    hint if the models are absent."""
    from .specs import face_detector_spec, face_mesh_spec  # not via the torch ports: no torch import

    return (engine_runner(face_detector_spec(), backend, precision),
            engine_runner(face_mesh_spec(), backend, precision))
