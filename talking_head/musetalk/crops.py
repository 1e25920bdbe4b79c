"""`musetalk`: MuseTalk 1.5 as a talking-head model of the shared driver (same contract as portrait/clone).

Per output frame: its scheduled reference frame's aligned crop (FaceAlign, at track.crop_size) gives
MuseTalk's face box (geometry.py) inside the crop; that box is resized to 256x256, its latents
(masked + reference) are computed once per reference frame and cached; the frame's whisper window
drives one UNet pass; the decoded 256 face is resized back into the box. The crop is returned with
a paste mask in crop space, so the shared driver pastes it like the other models' crops. Its face
region comes from one of two sources (`mask`), said in the warnings:
- face-parsing: the user's BiSeNet (musetalk/face-parse-bisent/79999_iter.pth) on MuseTalk's blending
  square cut from the crop, v1.5's "jaw" mode, then get_image's steps (inside the box, below the
  square's centre, Gaussian blur of 5% of its side) - the reference's mask, computed in crop space;
- mesh: the face mesh's lower-face mask inside the box and below the square's centre, blurred the same.
`auto` (default; or DIGITAL_HUMAN_MUSETALK_MASK) takes face parsing when its file is there, else the mesh.

Kept between requests ("avatar preparation", as MuseTalk's real-time mode prepares a reference video once):
for a reference video read from a file, the face track (vision.track), each reference frame's latents (the
process's kept pipeline) and its face-mesh paste mask, and on the headless path the paste region and the
smoothing masks (render_video, under GeneratedCrops.avatar_key), all under content keys (vision.content_key: the file's
bytes, the frame, its crop transform and landmarks), so a repeat request on the same video tracks, encodes and
masks nothing and gives the same crops. clear_avatar_caches() forgets them.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ...engines.musetalk.files import LICENCE_NOTE
from ...vision.faces import CropLandmarks
from ...vision.paste import lower_face_mask
from ..driver import (GeneratedCrops, frame_schedule, output_frame_count, reference_warnings, validate_audio,
                      validate_track)
from .blend import EXTRA_MARGIN, blend_mask, crop_face, parsing_face_mask, resize_to_box, square_box
from .geometry import musetalk_box

log = logging.getLogger("digital_human.musetalk")
MODEL_NAME = "musetalk"
MASK_JAW_MARGIN = 0.10
BACKENDS = ("auto", "torch", "onnxruntime", "tensorrt")
PRECISIONS = ("auto", "fp32", "fp16", "bf16")
MASKS = ("auto", "mesh", "face-parsing")
MASK_ENV = "DIGITAL_HUMAN_MUSETALK_MASK"
POOL_THREADS = max(1, min(8, os.cpu_count() or 1))  # masks and face crops made side by side (_map)


def resolve_runtime(backend: str, precision: str) -> tuple[str, str, list[str]]:
    """(device, precision, notes): torch on CUDA when there is one (FP16 by default), else CPU FP32."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    from ...engines.devices import torch_cuda_usable

    notes = []
    if backend in ("onnxruntime", "tensorrt"):
        notes.append(f"MuseTalk runs on torch; backend {backend!r} is not wired for it yet (its UNet exports to "
                     "ONNX with parity: engines/musetalk/export.py)")
    device = "cuda" if torch_cuda_usable() else "cpu"  # ComfyUI's --cpu respected
    if precision == "auto":
        precision = "fp16" if device == "cuda" else "fp32"
    if device == "cpu" and precision != "fp32":
        notes.append(f"{precision} on the CPU is slower than FP32; running FP32")
        precision = "fp32"
    for note in notes:
        log.warning("[digital_human] %s", note)
    return device, precision, notes


def resolve_mask(mask: str | None, parsing_file: Path | None, root: Path) -> str:
    """"face-parsing" or "mesh" for a `mask` choice (None: the environment variable, else "auto")."""
    choice = mask if mask is not None else (os.environ.get(MASK_ENV, "").strip() or "auto")
    if choice not in MASKS:
        raise ValueError(f"mask must be one of {MASKS}, got {choice!r}")
    if choice == "face-parsing" and parsing_file is None:
        from ...engines.musetalk.face_parsing import require_parsing_file

        require_parsing_file(root.parent)  # raises MuseTalkFilesError: where the file goes
    if choice == "auto":
        return "face-parsing" if parsing_file is not None else "mesh"
    return choice


def mask_note(source: str, parsing_file: Path | None, root: Path, asked: str | None) -> str:
    """One line for the report: which paste mask was used, and why when it is the fallback."""
    if source == "face-parsing":
        return f"paste mask: BiSeNet face parsing ({parsing_file}, v1.5 'jaw' mode), as MuseTalk's own blending"
    if parsing_file is None:
        return (f"paste mask: face mesh (fallback; MuseTalk's own mask needs the optional BiSeNet file "
                f"{root / 'face-parse-bisent' / '79999_iter.pth'})")
    return "paste mask: face mesh (chosen" + (" by " + MASK_ENV if asked is None else "") + \
        "; the BiSeNet file is present but not used)"


_POOL: Any = None
_MASK_POOL: Any = None
_POOL_LOCK = threading.Lock()

# face-mesh paste masks of reference frames kept between requests, by content key (ref_key): a repeat
# request on the same reference video makes none (0.18 s of a 10-s clip on an H200 host, before the first
# batch: the renderer's paste region needs them all)
MASK_CACHE_BYTES = 128 * 2**20
_MASKS: OrderedDict[str, np.ndarray] = OrderedDict()
_MASKS_BYTES = [0]
_MASKS_LOCK = threading.Lock()


def _kept_mask(key: str) -> np.ndarray | None:
    with _MASKS_LOCK:
        hit = _MASKS.get(key)
        if hit is not None:
            _MASKS.move_to_end(key)
        return hit


def _keep_mask(key: str, mask: np.ndarray) -> None:
    mask.flags.writeable = False  # handed to every later request: never changed in place
    with _MASKS_LOCK:
        if key not in _MASKS:
            _MASKS_BYTES[0] += mask.nbytes
        _MASKS[key] = mask
        while _MASKS_BYTES[0] > MASK_CACHE_BYTES and _MASKS:
            _MASKS_BYTES[0] -= _MASKS.popitem(last=False)[1].nbytes


def clear_avatar_caches() -> None:
    """Forget everything kept between requests for reference videos: face tracks, reference latents, paste
    masks (benchmarks measure a first request after this)."""
    from ...engines.musetalk.pipeline import clear_latent_caches
    from ...vision.track import clear_track_cache
    from ..render_video import clear_video_caches

    clear_track_cache()
    clear_latent_caches()
    clear_video_caches()
    with _MASKS_LOCK:
        _MASKS.clear()
        _MASKS_BYTES[0] = 0


def _pool():
    """The process's one ThreadPoolExecutor for renderers' face crops (threads start on first use and stay for
    the next video; the crop thread and the paste thread both submit to it)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            from concurrent.futures import ThreadPoolExecutor

            _POOL = ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix="dh-musetalk")
        return _POOL


def _mask_pool():
    """The paste masks' own pool: a first request's paste region asks for every reference frame's mask while
    the renderer already makes the first batches (render_video), and in one FIFO pool the renderer's crops
    would queue behind a hundred masks."""
    global _MASK_POOL
    with _POOL_LOCK:
        if _MASK_POOL is None:
            from concurrent.futures import ThreadPoolExecutor

            _MASK_POOL = ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix="dh-musetalk-masks")
        return _MASK_POOL


class _MuseTalkRenderer:
    """Generated crops of output frames start..stop-1 on demand, in UNet batches of `batch_size`."""

    def __init__(self, pipe, track, idx: np.ndarray, windows, batch_size: int,
                 should_stop: Callable[[], bool] | None, keep: int = 256, parser: Any = None,
                 timings: dict[str, float] | None = None):
        self.pipe, self.track, self.idx, self.windows = pipe, track, idx, windows
        self.batch_size, self.should_stop = batch_size, should_stop
        self.parser = parser  # FaceParser (BiSeNet) or None = face-mesh masks
        self.timings = timings if timings is not None else {}
        self.size = track.crop_size
        self.crop_lms = CropLandmarks(track)  # per frame on demand: flat in the video's length
        self._boxes: dict[int, tuple[int, int, int, int]] = {}
        self._masks: OrderedDict[int, np.ndarray] = OrderedDict()
        self._keep = keep
        # Reference frames of a video file are keyed by content (its bytes, the frame, its crop transform and
        # landmarks: everything its crop, box, mask and latents are made from), so the pipeline's kept latents
        # and the kept masks serve a later request on the same video; other frames (in memory) get a latent
        # cache of their own, keyed by frame index, that ends with this request.
        from ...vision.content_key import frames_key

        self._video_key = frames_key(track.frames)
        self._ref_keys: dict[int, Any] = {}
        self._ahead: tuple[int, int, Any] | None = None  # (start, stop, future) of the next batch's crops
        self._next: _Launched | None = None  # the next batch, already queued on the device (render)
        # on the CPU the networks run inside the launch: queueing ahead would only reorder the same work; on
        # CUDA it is on unless switched off (engines.devices.gpu_pipelining_enabled)
        from ...engines.devices import gpu_pipelining_enabled

        self.launch_ahead = (getattr(getattr(pipe, "device", None), "type", "cpu") == "cuda"
                             and gpu_pipelining_enabled())
        self.latents = None
        if self._video_key is None:
            from ...engines.musetalk.pipeline import LatentCache

            self.latents = LatentCache(2 * keep)

    def ref_key(self, r: int) -> Any:
        """The key of reference frame r's latents: a content key, or r itself (see __init__)."""
        hit = self._ref_keys.get(r)
        if hit is None:
            if self._video_key is None:
                hit = r
            else:
                from ...vision.content_key import frame_key

                hit = frame_key(self._video_key, r, np.asarray(self.track.affines[r], np.float64),
                                np.asarray(self.track.landmarks[r], np.float32), np.array([self.size]))
            self._ref_keys[r] = hit
        return hit

    def avatar_key(self) -> str | None:
        """GeneratedCrops.avatar_key: face-mesh masks of a content-keyed video are a function of each frame's
        ref_key (the headless path then keeps the paste region and smoothing masks); BiSeNet's, or frames in
        memory, are not kept."""
        if self.parser is not None or self._video_key is None:
            return None
        return f"musetalk:mesh:{MASK_JAW_MARGIN}:{EXTRA_MARGIN}:{self._video_key}"

    def box(self, r: int) -> tuple[int, int, int, int]:
        hit = self._boxes.get(r)
        if hit is None:
            a = np.asarray(self.track.affines[r], np.float64)[:2, :2]
            margin = int(round(EXTRA_MARGIN * np.sqrt(abs(np.linalg.det(a)))))  # 10 source px, in crop px
            x1, y1, x2, y2 = musetalk_box(self.crop_lms[r], self.size)
            hit = self._boxes[r] = (x1, y1, min(x2, self.size), min(y2 + margin, self.size))
        return hit

    def _parsing_mask(self, r: int) -> np.ndarray:
        """float32 [S, S]: get_image's mask for reference frame r, made in crop space: BiSeNet on the
        blending square of the crop (before any generated face), then box / lower half / blur on the
        square (uint8, as the reference), placed into the crop (the square may overhang it)."""
        t0 = time.perf_counter()
        box = self.box(r)
        square = square_box(box)
        crop = np.asarray(self.track.crops[r], np.uint8)
        m = blend_mask(parsing_face_mask(crop, box, self.parser), box, square)
        out = np.zeros((self.size, self.size), np.float32)
        xs, ys, xe, ye = square
        x0, y0, x1, y1 = max(xs, 0), max(ys, 0), min(xe, self.size), min(ye, self.size)
        if x1 > x0 and y1 > y0:
            out[y0:y1, x0:x1] = m[y0 - ys:y1 - ys, x0 - xs:x1 - xs].astype(np.float32) / 255.0
        self.timings["face_parsing"] = self.timings.get("face_parsing", 0.0) + time.perf_counter() - t0
        return out

    def _mesh_mask(self, r: int) -> np.ndarray:
        """float32 [S, S]: the face mesh's lower-face mask inside the box, below the blending square's
        centre, blurred (5% of the square's side) as MuseTalk 1.5's get_image does."""
        import cv2

        x1, y1, x2, y2 = self.box(r)
        m = np.zeros((self.size, self.size), np.float32)
        face = lower_face_mask(self.crop_lms[r], self.size, jaw_margin=MASK_JAW_MARGIN)
        m[y1:y2, x1:x2] = face[y1:y2, x1:x2]
        xs, ys, xe, ye = square_box((x1, y1, x2, y2))
        m[:max(0, min(self.size, ys + int((ye - ys) * 0.5)))] = 0.0  # v1.5 keeps the square's lower half
        k = int(0.05 * (xe - xs) // 2 * 2) + 1
        return np.clip(cv2.GaussianBlur(m, (k, k), 0), 0.0, 1.0)

    def _map(self, fn: Callable[[int], Any], items: list[int], pool: Any = None) -> list:
        """fn over items on the renderer's thread pool, or `pool` (OpenCV's resizes, fills and blurs release the
        GIL: a 10-s clip's 256 face crops took 0.38 s one at a time on an H200 host, 0.09 s here; the masks,
        mostly numpy, stayed at ~0.18 s)."""
        if len(items) < 4 or POOL_THREADS == 1:
            return [fn(r) for r in items]
        return list((pool or _pool()).map(fn, items))

    def _fill_masks(self, refs: list[int]) -> None:
        """Make the missing masks of `refs` (unique, in order) together, kept in the LRU (face-mesh masks of a
        content-keyed video also between requests)."""
        t0 = time.perf_counter()
        misses = [r for r in dict.fromkeys(refs) if r not in self._masks]
        shared = self.parser is None and self._video_key is not None
        if shared:
            kept = {r: _kept_mask("mesh:" + self.ref_key(r)) for r in misses}
            for r, m in kept.items():
                if m is not None:
                    self._masks[r] = m
            misses = [r for r, m in kept.items() if m is None]
        make = self._parsing_mask if self.parser is not None else self._mesh_mask
        # BiSeNet runs on the device: one at a time (its own batching is per call)
        made = [make(r) for r in misses] if self.parser is not None else self._map(make, misses, _mask_pool())
        for r, m in zip(misses, made):
            self._masks[r] = m
            if shared:
                _keep_mask("mesh:" + self.ref_key(r), m)
        while len(self._masks) > self._keep:
            self._masks.popitem(last=False)
        if self.parser is None:
            self.timings["masks"] = self.timings.get("masks", 0.0) + time.perf_counter() - t0

    def mask(self, r: int) -> np.ndarray:
        hit = self._masks.get(r)
        if hit is None:
            # a miss is the first of many (paste_region asks for every reference frame in turn, the
            # renderer for each chunk's): make the schedule's next reference frames' masks with it
            at = int(np.argmax(self.idx == r)) if (self.idx == r).any() else None
            ahead = [] if at is None else list(dict.fromkeys(int(v) for v in self.idx[at:at + 4 * self._keep]))
            self._fill_masks(([r] + [v for v in ahead if v != r])[:max(1, self._keep // 2)])
            hit = self._masks[r]
        self._masks.move_to_end(r)
        return hit

    def _make_crops(self, refs: list[int]) -> tuple[np.ndarray, float]:
        """(uint8 [B, S, S, 3], seconds): the aligned crops of reference frames `refs`; a video's (made on
        demand) on the pipeline's GPU in one batch when there is one."""
        t0 = time.perf_counter()
        crops = self.track.crops
        if hasattr(crops, "many"):
            device = self.pipe.device if getattr(self.pipe.device, "type", "cpu") == "cuda" else None
            out = crops.many(refs, device)
        else:
            out = np.stack([np.asarray(crops[r], np.uint8) for r in refs])
        return out, time.perf_counter() - t0

    def prefetch(self, start: int, stop: int) -> None:
        """Start making the crops of output frames start..stop-1 on the thread pool now (the first batch's,
        while the caller sets up the video: its paste region, the encoder), so the first render does not wait
        for their decode and warp. Only with face-mesh masks: BiSeNet's masks read the same crop source on the
        caller's thread, and it is not shared."""
        if POOL_THREADS > 1 and self.parser is None and self._ahead is None and stop > start:
            refs = [int(r) for r in self.idx[start:stop]]
            self._ahead = (start, stop, _pool().submit(self._make_crops, refs))

    def _crops(self, s: int, e: int) -> np.ndarray:
        """The crops of output frames s..e-1, and the next batch's started on the thread pool: a video's
        frames are decoded when read (ffmpeg through a pipe, about a millisecond a 512x512 frame, ~0.3 s of a
        10-s clip), so batch k + 1's decode and warp overlap batch k's networks instead of following them.
        timings: "crops" = the wait here (the render thread's time), "crops_made" = the work, wherever done."""
        t0 = time.perf_counter()
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[:2] == (s, e):
            out, made = ahead[2].result()
        else:
            if ahead is not None:  # another range (a seek): let it finish, the crop source is not shared
                try:
                    ahead[2].result()
                except Exception:  # its own range's error; this range is made (and raises) below
                    pass
            out, made = self._make_crops([int(r) for r in self.idx[s:e]])
        n = len(self.idx)
        if e < n and POOL_THREADS > 1:
            e2 = min(e + (e - s), n)
            refs = [int(r) for r in self.idx[e:e2]]
            self._ahead = (e, e2, _pool().submit(self._make_crops, refs))
        self.timings["crops"] = self.timings.get("crops", 0.0) + time.perf_counter() - t0
        self.timings["crops_made"] = self.timings.get("crops_made", 0.0) + made
        return out

    def _launch(self, s: int, e: int) -> _Launched:
        """Output frames s..e-1 queued on the device: their reference crops, the faces cut from the crops whose
        latents are not kept, the encoder and the step on the pipeline's stream, and the generated faces' copy
        back (into pinned memory on CUDA, so that queueing it waits for nothing). _finish waits for it."""
        refs = [int(r) for r in self.idx[s:e]]
        crops = self._crops(s, e)
        t0 = time.perf_counter()
        row = {r: i for i, r in enumerate(refs)}
        keys = [self.ref_key(r) for r in refs]
        frame_of = dict(zip(keys, refs))
        misses = self.pipe.uncached(keys, self.latents)

        def face(k: Any) -> np.ndarray:
            r = frame_of[k]
            return crop_face(crops[row[r]], self.box(r))

        faces_in = dict(zip(misses, self._map(face, misses)))
        t1 = time.perf_counter()
        done = None
        # on the pipeline's own CUDA stream when it has one (graphs): the paste-back's and the crop warps'
        # work on the default stream neither waits behind this batch nor holds up its copy back
        with self.pipe.stream_scope():
            # a key dropped from the shared cache since uncached() (another request's batch) is made here
            latents = self.pipe.reference_latents_batch(
                keys, lambda k: faces_in[k] if k in faces_in else face(k), self.latents)
            made = self.pipe.generate_device(latents, self.windows(s, e))
            if made.device.type == "cuda":
                import torch

                made = made.to("cpu", non_blocking=True)  # pinned: the copy is queued, not waited for
                done = torch.cuda.Event()
                done.record()
        t2 = time.perf_counter()
        self._add(crop_face=t1 - t0, networks=t2 - t1)
        return _Launched(s, e, refs, crops, made, done)

    def _finish(self, batch: _Launched, out: np.ndarray, at: int) -> None:
        """Wait for a launched batch and write its crops, with the generated faces resized into their boxes,
        to out[at:]."""
        t0 = time.perf_counter()
        if batch.done is not None:
            batch.done.synchronize()  # this batch's copy back; a batch queued after it may still run
        faces = batch.made.cpu().numpy()
        t1 = time.perf_counter()
        out[at:at + len(batch.refs)] = batch.crops

        def put(i: int) -> None:  # disjoint rows of `out`; OpenCV's resize releases the GIL
            box = self.box(batch.refs[i])
            out[at + i, box[1]:box[3], box[0]:box[2]] = resize_to_box(faces[i], box)

        self._map(put, list(range(len(batch.refs))))
        # networks = launch + wait; the wait apart says whether the device or the launching thread is slow
        self._add(networks=t1 - t0, networks_wait=t1 - t0, paste_crop=time.perf_counter() - t1)

    def _add(self, **seconds: float) -> None:
        for name, dt in seconds.items():
            self.timings[name] = self.timings.get(name, 0.0) + dt

    def _stopping(self) -> bool:
        return self.should_stop is not None and self.should_stop()

    def render(self, start: int, stop: int) -> tuple[np.ndarray, None]:
        """Crops of output frames start..stop-1, in batches. On CUDA the next batch (of this call, or the next
        call's first when calls step through the frames in equal ranges, as the headless path's do) is queued
        on the device before this one's result is read, so the device never idles while this thread waits
        for crops, cuts faces or resizes them into their crops (the same work in the same order on the
        pipeline's stream: the same crops). A next call that asks for another range gets its own batches."""
        out = np.empty((stop - start, self.size, self.size, 3), np.uint8)
        n = len(self.idx)
        for s in range(start, stop, self.batch_size):
            if self._stopping():
                raise InterruptedError(f"musetalk talking head interrupted after {s} of {n} frames")
            e = min(s + self.batch_size, stop)
            batch, self._next = self._next, None
            if batch is not None and (batch.s, batch.e) != (s, e):
                batch.wait()  # another range: its latents are kept, its faces are not this call's
                batch = None
            if batch is None:
                batch = self._launch(s, e)
            if self.launch_ahead and not self._stopping():
                s2 = e
                e2 = min(s2 + self.batch_size, stop) if s2 < stop else min(s2 + min(self.batch_size, stop - start), n)
                if s2 < e2:
                    self._next = self._launch(s2, e2)
            self._finish(batch, out, s - start)
        return out, None


@dataclass
class _Launched:
    """A batch of _MuseTalkRenderer queued on the device: output frames s..e-1, their reference frames and
    crops, the generated faces (a pinned host tensor filled once `done` has passed; on the CPU the faces)."""
    s: int
    e: int
    refs: list[int]
    crops: np.ndarray
    made: Any
    done: Any = None

    def wait(self) -> None:
        if self.done is not None:
            self.done.synchronize()


def musetalk_crops(track, audio: np.ndarray, sample_rate: int, fps: float | None = None, *,
                   loop_mode: str = "ping-pong", batch_size: int = 0, backend: str = "auto", precision: str = "auto",
                   max_audio_seconds: float = 600.0, progress: Callable[[int, int], None] | None = None,
                   should_stop: Callable[[], bool] | None = None, streaming: bool = False, seed: int = 0,
                   models_root: Any = None, compile: bool | None = None, mask: str | None = None) -> GeneratedCrops:
    """MuseTalk's crop for every output frame (no paste-back yet); arguments as portrait_crops.

    batch_size: frames per UNet batch (0 = 32 on CUDA, 4 on the CPU). backend/precision: torch on CUDA
    (auto = FP16) or the CPU (FP32). seed: the VAE posterior draw of each reference frame.
    streaming: return at once with crops made on demand (GeneratedCrops.render).
    compile: torch.compile the generation step on CUDA (a minute or more once, then faster batches; worth it
    for long clips; None = the DIGITAL_HUMAN_MUSETALK_COMPILE variable, "1" to compile).
    mask: the paste mask's source, "auto" (BiSeNet face parsing when face-parse-bisent/79999_iter.pth is
    there, else the face mesh), "mesh" or "face-parsing" (its file then required); None = the
    DIGITAL_HUMAN_MUSETALK_MASK variable, else "auto". The one used is said in the warnings.
    Raises MuseTalkFilesError (every missing file and where it goes) before any work."""
    from ...engines.musetalk.audio import audio_windows, feature_extractor
    from ...engines.musetalk.files import locate
    from ...engines.musetalk.networks import cached_networks
    from ...engines.musetalk.pipeline import cached_pipeline

    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    files = locate(models_root)  # the files first: the clearest error
    mask_source = resolve_mask(mask, files.face_parsing, files.root)
    validate_track(track)
    wave = validate_audio(audio, sample_rate, max_audio_seconds)
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 1, or 0 for automatic, got {batch_size}")
    device, prec, notes = resolve_runtime(backend, precision)
    net = cached_networks(device, prec, models_root)
    parser = None
    if mask_source == "face-parsing":  # a placed file that fails the strict checks is an error, not a fallback
        from ...engines.musetalk.face_parsing import cached_parser

        parser = cached_parser(device, models_root)
    timings["load"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    fps = float(fps) if fps and fps > 0 else float(track.fps)
    n_out = output_frame_count(len(wave) / float(sample_rate), fps)
    idx = frame_schedule(len(track), n_out, loop_mode, track.fps, fps)
    windows = audio_windows(net.whisper, feature_extractor(net.files.whisper_dir), wave, int(sample_rate), fps, n_out)
    timings["audio"] = time.perf_counter() - t1
    batch_size = int(batch_size) or (32 if device == "cuda" else 4)

    warnings = list(notes) + [mask_note(mask_source, files.face_parsing, files.root, mask)] \
        + reference_warnings(track, idx, n_out, fps, loop_mode)
    pipe = cached_pipeline(net, seed=seed, compile=compile)
    renderer = _MuseTalkRenderer(pipe, track, idx, windows, batch_size, should_stop, parser=parser, timings=timings)
    renderer.prefetch(0, min(batch_size, n_out))  # the first batch's crops while the caller sets up
    gen = GeneratedCrops(track=track, idx=idx, fps=fps, crops=None, masks={}, model=MODEL_NAME,
                         backend=f"torch-{device} {prec}", timings=timings, warnings=warnings,
                         render=renderer.render, mask_of=renderer.mask, renders_landmarks=False,
                         avatar_key=renderer.avatar_key())
    return gen.finished(streaming, progress, should_stop, batch=max(batch_size, 16))


def iter_musetalk_chunks(track, audio: np.ndarray, sample_rate: int, fps: float | None = None, *,
                         chunk: int = 64, **kwargs: Any) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """Yield (start, stop, crops uint8 [k, S, S, 3], paste masks float32 [k, S, S]) for output frames in
    chunks of `chunk`, generated only when asked for (bounded memory); kwargs as musetalk_crops."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    gen = musetalk_crops(track, audio, sample_rate, fps, streaming=True, **kwargs)
    for start in range(0, len(gen), chunk):
        stop = min(start + chunk, len(gen))
        crops, _ = gen.render(start, stop)
        yield start, stop, crops, gen.mask_stack(start, stop)


DESCRIPTION = f"MuseTalk 1.5 lip-sync: {LICENCE_NOTE}."
