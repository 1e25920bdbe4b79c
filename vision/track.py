"""Follow one face through video frames, fill the frames where it is missing, smooth the crop.

Tracking follows MediaPipe's face_landmark_front graph: the detector runs on the first frame, every
`stride`-th frame, after a scene cut and whenever the tracked face is lost; in between, the mesh
runs on a region derived from the previous frame's landmarks (the mesh's presence score says
whether it still sees a face). On a detection frame, other faces are counted (multi-face warning)
and a lost face is re-acquired near where it was last seen, so the track does not jump to another
person while the shot lasts.

The crop transform is a similarity (centre, log scale, angle). Frames without a face get it by
linear interpolation of those parameters inside their shot; then the curves are smoothed with a
forward-backward One-Euro filter: the forward pass smooths, the backward pass cancels its delay,
so the crop neither jitters nor lags behind real head motion.
"""
from __future__ import annotations

import math
import queue
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import numpy as np

from ..engines.face.detect import FaceBox, detect_faces, face_landmarks
from .row_spool import RowSpool, runs

Runner = Callable[[np.ndarray], dict]
Progress = Callable[[int, int], None]

RIGHT_EYE_OUTER, LEFT_EYE_OUTER = 33, 263  # MediaPipe's own landmark -> ROI rotation points
MAX_FACES_CHECKED = 8  # the mesh (presence) runs on at most this many detections per frame
SCENE_CUT_THRESHOLD = 0.08  # mean |frame difference| (0..1); talking heads ~0.005-0.02, cuts > 0.1


@dataclass
class RawTrack:
    """Per-frame mesh results before any filling or smoothing (NaN where not found)."""
    found: np.ndarray                 # bool [N]
    landmarks: np.ndarray             # float32 [N, 468, 3]
    presence: np.ndarray              # float32 [N]
    scene_cuts: list[int] = field(default_factory=list)
    faces_seen: list[int] = field(default_factory=list)  # accepted faces per detection frame
    detections: int = 0               # detector runs
    index_too_high: int = 0           # detection frames with faces but fewer than face_index + 1


# --- scene cuts ------------------------------------------------------------------------------
class CutDetector:
    """Frames that start a new shot, one frame at a time: mean |frame[t] - frame[t-1]| > threshold
    (0..1 units), measured on a ~64-px-wide strided grid, so 1080x1920 frames cost the same as small
    ones and a video is never needed whole."""

    def __init__(self, width: int, threshold: float = SCENE_CUT_THRESHOLD):
        self.step = max(1, int(width) // 64)
        self.threshold = threshold
        self._prev: np.ndarray | None = None

    def is_cut(self, frame: np.ndarray) -> bool:
        cur = np.asarray(frame)[::self.step, ::self.step].astype(np.float32)
        cut = self._prev is not None and float(np.mean(np.abs(cur - self._prev))) / 255.0 > self.threshold
        self._prev = cur
        return cut


def scene_cuts(frames: np.ndarray, threshold: float = SCENE_CUT_THRESHOLD) -> list[int]:
    """Frames t that start a new shot (CutDetector over all frames)."""
    detector = CutDetector(frames.shape[2], threshold)
    return [t for t in range(len(frames)) if detector.is_cut(frames[t]) and t > 0]


def segments(n: int, cuts: list[int]) -> list[tuple[int, int]]:
    """[start, end) ranges between scene cuts."""
    edges = [0] + [c for c in cuts if 0 < c < n] + [n]
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


# --- one frame -------------------------------------------------------------------------------
def roi_from_landmarks(landmarks: np.ndarray) -> FaceBox:
    """A FaceBox whose mesh crop (engines.face.detect.mesh_crop_transform: square, 1.5x the long
    side, rotated by keypoints 0 -> 1) frames these landmarks, as MediaPipe's tracking does."""
    xy = np.asarray(landmarks, np.float64)[:, :2]
    r_eye, l_eye = xy[RIGHT_EYE_OUTER], xy[LEFT_EYE_OUTER]
    angle = math.atan2(l_eye[1] - r_eye[1], l_eye[0] - r_eye[0])
    c, s = math.cos(angle), math.sin(angle)
    # extent in the face's own (rotated) frame, centre mapped back to the image
    u = xy @ np.array([[c, -s], [s, c]])
    lo, hi = u.min(0), u.max(0)
    mid = (lo + hi) / 2
    centre = np.array([c * mid[0] - s * mid[1], s * mid[0] + c * mid[1]])
    half = (hi - lo) / 2
    keypoints = np.zeros((6, 2), np.float32)
    keypoints[0], keypoints[1] = r_eye, l_eye
    return FaceBox(float(centre[0] - half[0]), float(centre[1] - half[1]), float(centre[0] + half[0]),
                   float(centre[1] + half[1]), 1.0, keypoints)


def mesh_from_landmarks(frame: np.ndarray, landmarks: np.ndarray, run_mesh: Runner) -> tuple[np.ndarray, float]:
    return face_landmarks(frame, roi_from_landmarks(landmarks), run_mesh)


def landmark_box(landmarks: np.ndarray) -> np.ndarray:
    xy = landmarks[..., :2]
    return np.concatenate([xy.min(-2), xy.max(-2)], axis=-1)


class FaceOps:
    """The tracker's two model calls on one frame. This one calls the runners (any backend) through
    engines.face.detect; DeviceOps keeps the frame on the GPU (torch CUDA runners)."""

    def __init__(self, run_det: Runner, run_mesh: Runner,
                 detector: Callable[[np.ndarray], list[FaceBox]] | None = None):
        self.run_det, self.run_mesh, self.detector = run_det, run_mesh, detector

    def detect(self, frame: np.ndarray) -> list[FaceBox]:
        return self.detector(frame) if self.detector is not None else detect_faces(frame, self.run_det)

    def landmarks(self, frame: np.ndarray, box: FaceBox) -> tuple[np.ndarray, float]:
        return face_landmarks(frame, box, self.run_mesh)


class DeviceOps(FaceOps):
    """FaceOps with each frame uploaded once and each call one CUDA graph replay (engines.face.device_track:
    the same results up to float rounding); a custom detector still replaces the MediaPipe one."""

    def __init__(self, models, run_det: Runner, run_mesh: Runner,
                 detector: Callable[[np.ndarray], list[FaceBox]] | None = None):
        super().__init__(run_det, run_mesh, detector)
        self.models = models

    def detect(self, frame: np.ndarray) -> list[FaceBox]:
        return self.detector(frame) if self.detector is not None else self.models.detect(frame)

    def landmarks(self, frame: np.ndarray, box: FaceBox) -> tuple[np.ndarray, float]:
        return self.models.landmarks(frame, box, self.run_mesh)


def face_ops(frames, runners: tuple[Runner, Runner],
             detector: Callable[[np.ndarray], list[FaceBox]] | None = None) -> FaceOps:
    """DeviceOps where the runners are torch on CUDA, there is more than one frame to track (a photo's one
    detection is not worth capturing graphs for) unless DIGITAL_HUMAN_GPU_PIPELINING=0, else FaceOps."""
    from ..engines.devices import gpu_pipelining_enabled

    run_det, run_mesh = runners
    if len(frames) > 1 and getattr(run_mesh, "device", None) is not None and gpu_pipelining_enabled():
        from ..engines.face.device_track import device_face_models

        models = device_face_models(runners, *frames.shape[1:3])
        if models is not None:
            return DeviceOps(models, run_det, run_mesh, detector)
    return FaceOps(run_det, run_mesh, detector)


def _detect_verified(frame: np.ndarray, ops: FaceOps, min_presence: float, skip_near: np.ndarray | None = None,
                     ) -> list[tuple[FaceBox, np.ndarray, float]]:
    """Detections confirmed by the mesh presence score, largest (mesh extent) first. Boxes whose centre lies
    inside `skip_near` (the tracked face's box) are returned unverified (the track vouches). A custom
    detector in `ops` (e.g. insightface SCRFD) replaces the MediaPipe one; the mesh still verifies every box."""
    found = ops.detect(frame)
    boxes = sorted(found, key=lambda b: -b.width * b.height)[:MAX_FACES_CHECKED]
    out = []
    for box in boxes:
        cx, cy = (box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2
        if skip_near is not None and skip_near[0] < cx < skip_near[2] and skip_near[1] < cy < skip_near[3]:
            out.append((box, None, 1.0))
            continue
        lm, p = ops.landmarks(frame, box)
        if p >= min_presence:
            out.append((box, lm, p))

    def area(face: tuple) -> float:  # the mesh's extent is a truer face size than the detector box
        b = landmark_box(face[1]) if face[1] is not None else (face[0].x0, face[0].y0, face[0].x1, face[0].y1)
        return float((b[2] - b[0]) * (b[3] - b[1]))

    return sorted(out, key=lambda f: -area(f))


def _refined(frame: np.ndarray, faces: list, ops: FaceOps, min_presence: float) -> list:
    """Re-run the mesh on each face's region from its own landmarks (as on tracked frames, so a
    detection frame does not frame the face differently and twitch), then sort by that size."""
    out = []
    for box, lm0, p0 in faces:
        lm, p = ops.landmarks(frame, roi_from_landmarks(lm0))
        out.append((box, lm, p) if p >= min_presence else (box, lm0, p0))
    return sorted(out, key=lambda f: -float(np.prod(np.diff(landmark_box(f[1]).reshape(2, 2), axis=0))))


def _closest(faces: list, last: np.ndarray) -> int | None:
    """Index of the face whose centre is within one face height of the last known position."""
    box = landmark_box(last)
    centre, size = (box[:2] + box[2:]) / 2, box[3] - box[1]
    best, best_d = None, size
    for i, (b, _, _) in enumerate(faces):
        d = math.hypot((b.x0 + b.x1) / 2 - centre[0], (b.y0 + b.y1) / 2 - centre[1])
        if d < best_d:
            best, best_d = i, d
    return best


# --- tracks kept between requests ------------------------------------------------------------
TRACK_CACHE_ENTRIES = 8  # raw tracks kept (a 10-s 25 fps clip's is ~1.5 MB of landmarks)
# and at most this many bytes of them: a long video's track (5.6 KB a frame: 42 MB for 5 minutes) is not kept,
# so a one-shot `align`/`animate` of a long video holds one track, not two (memory flat in the length)
TRACK_CACHE_BYTES = 32 * 2**20
_TRACKS: OrderedDict[tuple, RawTrack] = OrderedDict()
_TRACKS_LOCK = threading.Lock()


def _runner_identity(runner: Runner) -> tuple | None:
    """What makes two runners give the same landmarks: the engine layer's model, backend, precision and
    cache key (None: an unknown callable, whose results are not cached)."""
    info = getattr(runner, "info", None)
    if info is None:
        return None
    return tuple(str(getattr(info, k, "")) for k in ("model", "backend", "precision", "cache_key"))


def _copy(raw: RawTrack) -> RawTrack:
    # align_faces fills the landmarks in place (fill_gaps in_place): the kept track must never be handed out
    return replace(raw, found=raw.found.copy(), landmarks=raw.landmarks.copy(), presence=raw.presence.copy(),
                   scene_cuts=list(raw.scene_cuts), faces_seen=list(raw.faces_seen))


def _track_bytes(raw: RawTrack) -> int:
    return int(raw.landmarks.nbytes + raw.found.nbytes + raw.presence.nbytes)


def clear_track_cache() -> None:
    """Forget the kept face tracks (benchmarks measure a first request with this)."""
    with _TRACKS_LOCK:
        _TRACKS.clear()


def track_faces(frames: np.ndarray, runners: tuple[Runner, Runner], *, stride: int, face_index: int,
                min_presence: float, progress: Progress | None = None,
                detector: Callable[[np.ndarray], list[FaceBox]] | None = None, cache: bool = True) -> RawTrack:
    """Mesh landmarks of one face on every frame where it can be found.

    cache: keep the result under the frames' content key (vision.content_key) and the tracking settings, and
    return a copy of it when the same frames are tracked again with them: the reference video of a
    talking-head service is tracked once, not per request (the face models' sequential pass over every frame
    was ~0.85 s of a 10-s clip on an H200). Frames without a content key, an unknown runner or a custom
    detector are never cached."""
    key = None
    if cache and detector is None and len(frames) > 1:  # a photo's track costs one detection: not worth a key
        from .content_key import frames_key

        ids = tuple(_runner_identity(r) for r in runners)
        content = frames_key(frames) if None not in ids else None
        if content is not None:
            key = (content, int(stride), int(face_index), float(min_presence), ids)
            with _TRACKS_LOCK:
                hit = _TRACKS.get(key)
                if hit is not None:
                    _TRACKS.move_to_end(key)
            if hit is not None:
                if progress is not None:
                    progress(len(frames), len(frames))
                return _copy(hit)
    raw = _track_faces(frames, runners, stride=stride, face_index=face_index, min_presence=min_presence,
                       progress=progress, detector=detector)
    if key is not None and _track_bytes(raw) <= TRACK_CACHE_BYTES:
        with _TRACKS_LOCK:
            _TRACKS[key] = _copy(raw)
            while len(_TRACKS) > TRACK_CACHE_ENTRIES or sum(map(_track_bytes, _TRACKS.values())) > TRACK_CACHE_BYTES:
                _TRACKS.popitem(last=False)
    return raw


def _track_faces(frames: np.ndarray, runners: tuple[Runner, Runner], *, stride: int, face_index: int,
                 min_presence: float, progress: Progress | None,
                 detector: Callable[[np.ndarray], list[FaceBox]] | None) -> RawTrack:
    run_det, run_mesh = runners
    n = len(frames)
    found = np.zeros(n, bool)
    landmarks = new_landmarks(frames, n)
    presence = np.zeros(n, np.float32)
    # cuts are found while tracking (one pass over the frames: a long video is decoded once)
    raw = RawTrack(found, landmarks, presence, scene_cuts=[])
    cut_detector = CutDetector(frames.shape[2])
    ops = face_ops(frames, (run_det, run_mesh), detector)
    read_ahead = ReadAhead(frames, n) if n > 1 and callable(getattr(frames, "frame", None)) else None
    try:
        _track(frames, n, raw, cut_detector, ops, stride, face_index, min_presence, progress, read_ahead)
    finally:
        if read_ahead is not None:
            read_ahead.close()
    return raw


def new_landmarks(frames, n: int) -> np.ndarray | RowSpool:
    """NaN landmarks [n, 468, 3] float32 to fill while tracking: in a temporary file (vision.row_spool) when
    the frames are decoded on demand (a long video's 5.6 KB a frame must not grow the process with its
    length), in memory for in-memory frames (a ComfyUI IMAGE batch is in memory anyway)."""
    if n > 1 and callable(getattr(frames, "frame", None)):
        return RowSpool(n, (468, 3), np.float32, fill=np.nan)
    return np.full((n, 468, 3), np.nan, np.float32)


def _track(frames, n: int, raw: RawTrack, cut_detector: CutDetector, ops: FaceOps, stride: int, face_index: int,
           min_presence: float, progress: Progress | None, read_ahead: ReadAhead | None) -> None:
    """track_faces' loop over the frames, filling `raw`."""
    found, landmarks, presence = raw.found, raw.landmarks, raw.presence
    prev: np.ndarray | None = None      # landmarks of the previous frame (tracking)
    last: np.ndarray | None = None      # last landmarks seen in this shot (re-acquisition)
    last_detect = -stride
    for t in range(n):
        frame = frames[t] if read_ahead is None else read_ahead.get(t)
        if n > 1 and cut_detector.is_cut(frame):
            raw.scene_cuts.append(t)
            prev = last = None
        lm, p = None, 0.0
        if prev is not None:
            lm, p = ops.landmarks(frame, roi_from_landmarks(prev))
            if p < min_presence:
                lm = None
        if lm is None or t - last_detect >= stride:
            last_detect = t
            raw.detections += 1
            faces = _detect_verified(frame, ops, min_presence, skip_near=landmark_box(lm) if lm is not None else None)
            raw.faces_seen.append(len(faces))
            if lm is None and faces:
                faces = _refined(frame, faces, ops, min_presence)
                pick = _closest(faces, last) if last is not None else None
                if pick is None and face_index < len(faces):
                    pick = face_index
                elif pick is None:
                    raw.index_too_high += 1
                if pick is not None:
                    _, lm, p = faces[pick]
        if lm is not None:
            found[t], landmarks[t], presence[t] = True, lm, p
            prev = last = lm
        else:
            prev = None
            presence[t] = p  # the rejected score (0 when nothing was even tried)
        if progress is not None:
            progress(t + 1, n)


# --- decoding ahead --------------------------------------------------------------------------
READ_AHEAD_BYTES = 48 * 2**20  # decoded frames a read-ahead thread may hold beyond the tracker's position


class ReadAhead:
    """The frames of a video decoded on demand (media.frame_source.VideoFrames), read in order on a
    thread a few frames ahead of the tracker and handed over through a bounded queue: the decoder then
    works while the face models run instead of in turn, and the tracker never waits on the video's
    lock while a later frame is decoded. In-memory frames need none."""

    def __init__(self, frames, n: int):
        frame_bytes = max(1, int(np.prod(frames.shape[1:])))
        self.ahead = int(np.clip(READ_AHEAD_BYTES // frame_bytes, 2, 32))
        self._frames, self._n = frames, n
        self._queue: queue.Queue = queue.Queue(maxsize=self.ahead)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dh-track-read-ahead", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        for t in range(self._n):
            try:
                item = (t, self._frames.frame(t))
            except Exception:  # the tracker reads this frame itself and meets the error there
                self._put((t, None))
                return
            if not self._put(item):
                return

    def get(self, t: int) -> np.ndarray:
        """Frame t (frames are asked for in order, 0, 1, ...); after a failed read, read directly."""
        if self._stop.is_set():
            return self._frames[t]
        got, frame = self._queue.get()
        if got != t or frame is None:
            self.close()
            return self._frames[t]
        return frame

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# --- transform parameters --------------------------------------------------------------------
def _gaps_per_shot(n: int, found: np.ndarray, cuts: list[int]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(found frames to interpolate from, missing frames) of each shot with a gap, for fill_gaps."""
    all_idx = np.flatnonzero(found)
    for a, b in segments(n, cuts):
        idx = np.flatnonzero(found[a:b]) + a
        missing = np.flatnonzero(~found[a:b]) + a
        if not missing.size:
            continue
        # no face in the whole shot (a cutaway, or one black/flash frame that the cut detector took for
        # two cuts): bridge it from the found frames on either side
        yield (idx if idx.size else all_idx), missing


def fill_gaps(values: np.ndarray, found: np.ndarray, cuts: list[int], in_place: bool = False) -> np.ndarray:
    """Linear interpolation over time of [N, ...] values at frames where `found` is False, inside
    each shot; a shot's leading/trailing gaps hold its nearest value; a shot with no face at all
    is interpolated between the nearest found frames of the clip. in_place: fill `values` itself
    (keeping its dtype) instead of a float64 copy - a long video's landmarks are ~6 KB a frame; a
    RowSpool is always filled in place, a run of missing frames at a time."""
    if isinstance(values, RowSpool):
        return _fill_rows(values, found, cuts)
    if not in_place:
        values = np.array(values, dtype=np.float64, copy=True)
    elif not values.flags.c_contiguous:  # the reshape below must be a view; the result is what counts
        values = np.ascontiguousarray(values)
    flat = values.reshape(len(values), -1)
    for idx, missing in _gaps_per_shot(len(values), found, cuts):
        for j in range(flat.shape[1]):
            flat[missing, j] = np.interp(missing, idx, flat[idx, j])
    return values


def _fill_rows(values: RowSpool, found: np.ndarray, cuts: list[int]) -> RowSpool:
    """fill_gaps on rows read and written a run of missing frames at a time (the whole array is never in
    memory). np.interp over a shot's found frames only uses the two that bracket a missing frame (or the
    nearest one at either end), so each run is interpolated from those two rows alone: the same values
    (same np.interp call per column) as fill_gaps on an ndarray."""
    for idx, missing in _gaps_per_shot(len(values), found, cuts):
        for start, stop in runs(missing):  # no found frame inside a run of missing ones
            k = int(np.searchsorted(idx, start))
            xp = idx[max(0, k - 1):k + 1]  # the found frames before and after (one at either end of a shot)
            fp = values[xp].reshape(len(xp), -1)
            run = np.arange(start, stop)
            out = np.empty((len(run), fp.shape[1]), values.dtype)
            for j in range(fp.shape[1]):
                out[:, j] = np.interp(run, xp, fp[:, j])
            values[start:stop] = out.reshape(len(run), *values.shape[1:])
    return values


def _alpha(cutoff: np.ndarray, fps: float) -> np.ndarray:
    r = 2.0 * math.pi * cutoff / fps
    return r / (r + 1.0)


def one_euro(x: np.ndarray, fps: float, min_cutoff: float, beta: float, d_cutoff: float = 1.0) -> np.ndarray:
    """Causal One-Euro filter (Casiez et al., CHI 2012) along axis 0 of [T, D], per channel."""
    out = np.empty_like(x)
    out[0] = prev = x[0]
    dprev = np.zeros_like(x[0])
    a_d = _alpha(np.asarray(d_cutoff), fps)
    for t in range(1, len(x)):
        dx = (x[t] - prev) * fps
        dprev = a_d * dx + (1 - a_d) * dprev
        a = _alpha(min_cutoff + beta * np.abs(dprev), fps)
        prev = a * x[t] + (1 - a) * prev
        out[t] = prev
    return out


def smooth_params(params: np.ndarray, fps: float, cuts: list[int], strength: float = 1.0) -> np.ndarray:
    """Zero-lag smoothing of [N, 4] (cx, cy, log_scale, angle) curves, reset at scene cuts.

    Centres are filtered in face heights (divided by the shot's median scale) so one set of
    cutoffs fits small and large faces. `strength` 0 = off; 1 = default (rest cutoff 1 Hz);
    higher = smoother at rest. Fast motion raises the cutoff (beta), so head turns pass."""
    if strength <= 0 or len(params) < 3:
        return np.array(params, np.float64)
    fps = float(fps) if fps and fps > 0 else 25.0
    out = np.array(params, np.float64)
    min_cutoff, beta = 1.0 / strength, 4.0 / strength
    for a, b in segments(len(params), cuts):
        if b - a < 3:
            continue
        seg = out[a:b].copy()
        unit = float(np.exp(np.median(seg[:, 2])))
        seg[:, :2] /= unit
        fwd = one_euro(seg, fps, min_cutoff, beta)
        both = one_euro(fwd[::-1], fps, min_cutoff, beta)[::-1]
        both[:, :2] *= unit
        out[a:b] = both
    return out


def crop_jitter(affines: np.ndarray, crop_size: int) -> float:
    """Shake of the crop window: mean |second difference| over time of the crop's corners and
    centre mapped into the source, expressed in crop pixels (0 = perfectly smooth motion)."""
    from .faces import apply_affines, invert_affines

    if len(affines) < 3:
        return 0.0
    s = float(crop_size)
    pts = np.array([[0, 0], [s, 0], [0, s], [s, s], [s / 2, s / 2]])
    inv = invert_affines(affines)
    src = apply_affines(np.broadcast_to(pts, (len(affines), 5, 2)), inv)
    scale = np.sqrt(np.abs(np.linalg.det(np.asarray(affines)[:, :, :2])))  # crop px per source px
    second = np.linalg.norm(np.diff(src, n=2, axis=0), axis=-1)  # source px
    return float(np.mean(second * scale[1:-1, None]))
