"""Optional face detector from a user-supplied insightface model pack (SCRFD), without the insightface package.

The `insightface` pip package compiles C++ on install and downloads packs on its own, so this module
reads the pack's detector ONNX directly and runs it through the engine loader, with SCRFD's
pre/post-processing re-implemented here: letterbox to 640x640 (pad bottom/right), (RGB - 127.5) / 128
NCHW; per stride 8/16/32 two anchors per grid location, boxes = distance2bbox(centre, pred * stride),
keypoints = centre + pred * stride; score threshold 0.5, NMS IoU 0.4.

Packs are never downloaded here: the user puts them in ComfyUI's `models/insightface/models/<pack>/`.
LICENCE: insightface's pretrained packs (buffalo_l, antelopev2) are for non-commercial research only.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from .detect import FaceBox, _check_image, engine_runner, warp_affine

if TYPE_CHECKING:
    from ..spec import ModelSpec

# pack name -> its detector file (SCRFD-10G with box + 5-keypoint heads in both packs)
PACKS: dict[str, str] = {"buffalo_l": "det_10g.onnx", "antelopev2": "scrfd_10g_bnkps.onnx"}
LICENCE_NOTE = "its licence is non-commercial research only"
INPUT_SIZE = 640
STRIDES = (8, 16, 32)
ANCHORS_PER_LOCATION = 2
NUM_KPS = 5
SCORE_THRESHOLD = 0.5
NMS_IOU = 0.4
ENV_DIR = "DIGITAL_HUMAN_INSIGHTFACE_DIR"

Detector = Callable[[np.ndarray], list[FaceBox]]


class InsightfaceModelError(ValueError):
    """The detector file exists but is not an SCRFD graph this module can decode."""


# --- where the packs live ----------------------------------------------------------------------
def insightface_pack_dir() -> Path:
    """The folder holding insightface packs (`<pack>/det_10g.onnx`): env DIGITAL_HUMAN_INSIGHTFACE_DIR,
    else ComfyUI's models/insightface/models, else next to this pack's models root (not created)."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env).expanduser()
    try:
        import folder_paths  # type: ignore[import-not-found]  # only exists inside ComfyUI

        return Path(folder_paths.models_dir) / "insightface" / "models"
    except ImportError:
        from ...paths import models_root

        return models_root().parent / "insightface" / "models"


def _check_pack(pack: str) -> str:
    if pack not in PACKS:
        # a fixed list, never a path: the name comes from a node widget
        raise ValueError(f"unknown insightface pack '{pack}'; supported: {', '.join(PACKS)}")
    return pack


def _find_detector_file(pack: str) -> Path | None:
    folder = insightface_pack_dir() / pack
    # antelopev2.zip unpacks into antelopev2/antelopev2/ - accept that common mistake too
    for candidate in (folder / PACKS[pack], folder / pack / PACKS[pack]):
        if candidate.is_file():
            return candidate
    return None


def available_packs() -> list[str]:
    """Supported packs whose detector file is present, in PACKS order."""
    return [pack for pack in PACKS if _find_detector_file(pack) is not None]


def detector_path(pack: str) -> Path:
    """The pack's detector ONNX; FileNotFoundError naming the file and folder when absent."""
    path = _find_detector_file(_check_pack(pack))
    if path is None:
        folder = insightface_pack_dir() / pack
        raise FileNotFoundError(
            f"insightface model pack '{pack}' not found: put {PACKS[pack]} in {folder} "
            f"(download {pack} yourself; {LICENCE_NOTE})")
    return path


# --- strict graph check ------------------------------------------------------------------------
def expected_anchor_counts(size: int = INPUT_SIZE) -> dict[int, int]:
    """Stride -> anchors per image: (size / stride)^2 locations x 2 anchors (12800/3200/800 at 640)."""
    return {s: (size // s) ** 2 * ANCHORS_PER_LOCATION for s in STRIDES}


def check_graph(path: Path) -> tuple[str, list[str]]:
    """Refuse anything but one [N,3,H,W] input and 9 outputs; returns (input name, output names)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    outputs = [o.name for o in model.graph.output]
    hint = "it is not an SCRFD detector with 5 keypoints (use the pack's original file)"
    if len(inputs) != 1:
        raise InsightfaceModelError(f"{path}: expected 1 input, found {len(inputs)}; {hint}")
    dims = [d.dim_value if d.HasField("dim_value") else None for d in inputs[0].type.tensor_type.shape.dim]
    if len(dims) != 4 or dims[1] not in (3, None) or any(d not in (INPUT_SIZE, None) for d in dims[2:]):
        raise InsightfaceModelError(f"{path}: input '{inputs[0].name}' has shape {dims}, expected "
                                    f"[N, 3, H, W] (H = W = {INPUT_SIZE} or dynamic); {hint}")
    if len(outputs) != 3 * len(STRIDES):
        raise InsightfaceModelError(f"{path}: expected {3 * len(STRIDES)} outputs (scores/boxes/keypoints for "
                                    f"strides {STRIDES}), found {len(outputs)}; {hint}")
    return inputs[0].name, outputs


def sort_outputs(outputs: dict[str, np.ndarray], size: int = INPUT_SIZE) -> dict[int, tuple[np.ndarray, ...]]:
    """Stride -> (scores [K], boxes [K,4], kps [K,10]) for one image, identified by shape (not by the
    exporter's numeric output names). Accepts [K,C] (insightface's export) or [1,K,C]."""
    counts = expected_anchor_counts(size)
    by_key: dict[tuple[int, int], np.ndarray] = {}
    for name, value in outputs.items():
        arr = np.asarray(value)
        if arr.ndim == 3 and arr.shape[0] == 1:
            arr = arr[0]
        if arr.ndim != 2 or (arr.shape[0], arr.shape[1]) in by_key:
            raise InsightfaceModelError(f"SCRFD output '{name}' has unexpected shape {np.shape(value)}")
        by_key[(arr.shape[0], arr.shape[1])] = arr
    want = {(k, c) for k in counts.values() for c in (1, 4, 2 * NUM_KPS)}
    if set(by_key) != want:
        got = sorted(by_key)
        raise InsightfaceModelError(f"SCRFD outputs for a {size}x{size} input have shapes {got}; expected "
                                    f"[K,1]/[K,4]/[K,10] with K = {sorted(counts.values())}")
    return {s: (by_key[(k, 1)][:, 0], by_key[(k, 4)], by_key[(k, 2 * NUM_KPS)]) for s, k in counts.items()}


# --- decoding (pure numpy, tested on crafted outputs) ------------------------------------------
@lru_cache(maxsize=8)
def anchor_centres(stride: int, size: int = INPUT_SIZE) -> np.ndarray:
    """[(size/stride)^2 * 2, 2] (x, y) centres in input pixels, row-major, each location twice
    (SCRFD's centres sit on the grid corners x*stride, not cell middles)."""
    cells = size // stride
    ys, xs = np.mgrid[:cells, :cells]
    centres = np.stack([xs, ys], axis=-1).reshape(-1, 2).astype(np.float64) * stride
    return np.repeat(centres, ANCHORS_PER_LOCATION, axis=0)


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float = NMS_IOU) -> np.ndarray:
    """Indices kept by hard NMS, best score first."""
    order = np.argsort(-scores, kind="stable")
    area = np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(boxes[:, 3] - boxes[:, 1], 0, None)
    keep = []
    while order.size:
        i, rest = order[0], order[1:]
        keep.append(i)
        iw = np.clip(np.minimum(boxes[i, 2], boxes[rest, 2]) - np.maximum(boxes[i, 0], boxes[rest, 0]), 0, None)
        ih = np.clip(np.minimum(boxes[i, 3], boxes[rest, 3]) - np.maximum(boxes[i, 1], boxes[rest, 1]), 0, None)
        inter = iw * ih
        iou = inter / np.maximum(area[i] + area[rest] - inter, 1e-12)
        order = rest[iou <= iou_threshold]
    return np.asarray(keep, dtype=np.int64)


def decode(per_stride: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]], size: int = INPUT_SIZE,
           score_threshold: float = SCORE_THRESHOLD, iou_threshold: float = NMS_IOU
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SCRFD head outputs -> (boxes [M,4], scores [M], kps [M,5,2]) in input pixels after NMS.

    Scores are probabilities already (the exported graph ends in a sigmoid)."""
    boxes, scores, kps = [], [], []
    for stride, (score, box, kp) in per_stride.items():
        score = np.asarray(score, np.float64).reshape(-1)
        keep = score >= score_threshold
        if not keep.any():
            continue
        centres = anchor_centres(stride, size)[keep]
        dist = np.asarray(box, np.float64)[keep] * stride
        boxes.append(np.concatenate([centres - dist[:, :2], centres + dist[:, 2:]], axis=1))
        kps.append(centres[:, None, :] + np.asarray(kp, np.float64)[keep].reshape(-1, NUM_KPS, 2) * stride)
        scores.append(score[keep])
    if not boxes:
        return np.zeros((0, 4)), np.zeros(0), np.zeros((0, NUM_KPS, 2))
    b, s, k = np.concatenate(boxes), np.concatenate(scores), np.concatenate(kps)
    idx = nms(b, s, iou_threshold)
    return b[idx], s[idx], k[idx]


def to_facebox(box: np.ndarray, score: float, kps5: np.ndarray) -> FaceBox:
    """SCRFD's 5 points -> detect.py's 6 keypoints (right eye, left eye, nose, mouth, right ear, left ear).

    SCRFD orders points by IMAGE side (its alignment template puts point 0 at the smaller x): on a
    frontal face the image-left eye is the subject's RIGHT eye, which is detect.py's keypoint 0 - the
    same convention as MediaPipe's detector. SCRFD has no ears: they are put on the box sides along
    the eye line, a little below it (tragion sits about a quarter of the eye-to-mouth distance
    lower), which is all the mesh-crop code needs (it uses the eyes for rotation, the box for size).
    """
    kps5 = np.asarray(kps5, np.float64)
    r_eye, l_eye, nose = kps5[0], kps5[1], kps5[2]
    mouth = (kps5[3] + kps5[4]) / 2
    eye_mid = (r_eye + l_eye) / 2
    axis = l_eye - r_eye
    norm = float(np.hypot(*axis))
    u = axis / norm if norm > 1e-6 else np.array([1.0, 0.0])
    down = np.array([-u[1], u[0]])  # image y grows downwards: +90 deg from the eye axis points to the chin
    centre = np.array([(box[0] + box[2]) / 2, (box[1] + box[3]) / 2])
    # half the box's extent along the eye axis
    half = 0.5 * (abs(u[0]) * (box[2] - box[0]) + abs(u[1]) * (box[3] - box[1]))
    along_mid = float((eye_mid - centre) @ u)
    drop = 0.25 * float((mouth - eye_mid) @ down)
    base = eye_mid - along_mid * u + drop * down
    r_ear, l_ear = base - half * u, base + half * u
    pts = np.stack([r_eye, l_eye, nose, mouth, r_ear, l_ear]).astype(np.float32)
    return FaceBox(float(box[0]), float(box[1]), float(box[2]), float(box[3]), float(score), pts)


def detector_input(image: np.ndarray, size: int = INPUT_SIZE) -> tuple[np.ndarray, float]:
    """[1,3,size,size] float32 ((RGB - 127.5) / 128), image at top-left, black pad; and the scale."""
    image = _check_image(image)
    h, w = image.shape[:2]
    scale = size / max(h, w)
    out_to_in = np.array([[1 / scale, 0, 0], [0, 1 / scale, 0]])
    # anti-aliased resize; "replicate" keeps the image's own top/left edge undarkened, then the pad
    # (bottom/right) is zeroed like insightface's resize-then-paste into a black canvas
    rgb = warp_affine(image, out_to_in, size, border="replicate")
    rgb[int(round(h * scale)):] = 0
    rgb[:, int(round(w * scale)):] = 0
    return ((rgb - 127.5) / 128.0).transpose(2, 0, 1)[None].astype(np.float32), scale


def faces_from_outputs(outputs: dict[str, np.ndarray], scale: float, image_shape: tuple[int, ...],
                       score_threshold: float = SCORE_THRESHOLD, iou_threshold: float = NMS_IOU) -> list[FaceBox]:
    """Raw graph outputs for one letterboxed image -> FaceBoxes in image pixels, best first."""
    boxes, scores, kps = decode(sort_outputs(outputs), INPUT_SIZE, score_threshold, iou_threshold)
    h, w = image_shape[:2]
    boxes = boxes / scale
    kps = kps / scale
    # clip to the image: a box reaching into the pad must not make crops outside the photo
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, w)
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, h)
    faces = []
    for b, s, k in zip(boxes, scores, kps):
        if b[2] - b[0] > 1 and b[3] - b[1] > 1:  # a box clipped to nothing is no face
            faces.append(to_facebox(b, float(s), k))
    return faces


# --- runtime -----------------------------------------------------------------------------------
def detector_spec(pack: str) -> ModelSpec:
    from ..spec import ModelSpec, TensorProfile

    path = detector_path(pack)
    input_name, output_names = check_graph(path)
    shape = (1, 3, INPUT_SIZE, INPUT_SIZE)
    return ModelSpec(name=f"insightface_{pack}_detector", onnx_path=path,
                     profiles={input_name: TensorProfile(shape, shape, shape)},
                     input_names=(input_name,), output_names=tuple(output_names))


@lru_cache(maxsize=4)
def insightface_detector(pack: str, backend: str = "auto") -> Detector:
    """A detector `image (H, W, 3) uint8 RGB -> list[FaceBox]` (best score first, image pixels) from
    the user's insightface pack. The graph is checked twice: its I/O signature from the file, then
    the output shapes of one blank 640x640 run, so a wrong file fails here and not mid-video."""
    run = engine_runner(detector_spec(pack), backend)  # the loader's bound runner: survives release("face")
    sort_outputs(run(np.zeros((1, 3, INPUT_SIZE, INPUT_SIZE), np.float32)))  # raises on a wrong head layout

    def detect(image: np.ndarray) -> list[FaceBox]:
        tensor, scale = detector_input(image)
        return faces_from_outputs(run(tensor), scale, image.shape)

    detect.pack = pack  # type: ignore[attr-defined]
    return detect

