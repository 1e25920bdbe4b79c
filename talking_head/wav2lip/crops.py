"""`wav2lip`: Wav2Lip as a talking-head model of the shared driver (same contract as musetalk).

Per output frame: its scheduled reference frame's Wav2Lip box (geometry.py: the mesh's stand-in for S3FD's box,
padded, clipped and smoothed as inference.py does) is cut from the frame and resized to 96x96 (BGR, as the
release was trained); the bottom half is zeroed and the pair [masked, reference] / 255 goes with the frame's
16-step mel window (engines/wav2lip/audio.py) through the generator in batches; the output x 255 is truncated
to uint8 as the reference does and warped straight into the aligned crop with the map the reference's
cv2.resize back into the box uses. The paste mask is the box rectangle in crop space, so the shared driver (node
path) or render_video (headless) pastes it like the other models' crops.

Kept between requests ("avatar preparation", as MuseTalk's): what does not depend on the speech. Each reference
frame's 96x96 input, for a video read from a file, under a content key (vision.content_key: the file's bytes, the
frame index and its box); each paste mask under its box, crop transform and crop size (all it is made from); and,
on the headless path, the paste region and smoothing masks (render_video, under GeneratedCrops.avatar_key: the
video's key and every box). So a repeat request on the same video decodes, cuts and masks nothing, and gives the
same frames (tests/test_wav2lip_avatar_cache.py). Both caches are bounded in bytes; clear_avatar_caches()
forgets them.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from ...engines.wav2lip.files import LICENCE_NOTE
from ...media.kept_arrays import KeptArrays
from ..driver import (GeneratedCrops, frame_schedule, output_frame_count, reference_warnings, validate_audio,
                      validate_track)
from .geometry import FACE_SIZE, PADS, box_mask, face_input, out_to_crop, wav2lip_boxes

log = logging.getLogger("digital_human.wav2lip")
MODEL_NAME = "wav2lip"
BACKENDS = ("auto", "torch", "onnxruntime", "tensorrt")
PRECISIONS = ("auto", "fp32", "fp16", "bf16")
POOL_THREADS = max(1, min(8, os.cpu_count() or 1))
# kept between requests, least recently used first out: inputs are 27 KB a frame (256 MiB: ~9,700 frames),
# masks 4 * crop_size^2 bytes (1 MiB at a 512-px crop)
AVATAR_FACE_BYTES = 256 * 2**20
AVATAR_MASK_BYTES = 256 * 2**20
GRAPHS_ENV = "DIGITAL_HUMAN_WAV2LIP_GRAPHS"  # "0": no CUDA graphs (eager FP16 calls)
_POOL: Any = None
_POOL_LOCK = threading.Lock()


_KEPT_FACES = KeptArrays(AVATAR_FACE_BYTES)
_KEPT_MASKS = KeptArrays(AVATAR_MASK_BYTES)


def clear_avatar_caches() -> None:
    """Forget everything kept between requests for reference videos: face tracks, 96x96 inputs, paste masks,
    the headless path's paste regions and smoothing masks (benchmarks measure a first request after this)."""
    from ...vision.track import clear_track_cache
    from ..render_video import clear_video_caches

    clear_track_cache()
    clear_video_caches()
    _KEPT_FACES.clear()
    _KEPT_MASKS.clear()


def _pool():
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            from concurrent.futures import ThreadPoolExecutor

            _POOL = ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix="dh-wav2lip")
        return _POOL


def resolve_runtime(backend: str, precision: str) -> tuple[str, str, list[str]]:
    """(device, precision, notes): torch on CUDA when there is one (FP16 by default), else the CPU: bf16 by
    default where the processor has bf16 instructions, else FP32 (precision="fp32": the reference's arithmetic)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    from ...engines.devices import torch_cuda_usable

    notes = []
    if backend in ("onnxruntime", "tensorrt"):
        notes.append(f"Wav2Lip runs on torch here; backend {backend!r} is not wired into the pipeline (its "
                     "generator exports to ONNX with parity: engines/wav2lip/export.py)")
    device = "cuda" if torch_cuda_usable() else "cpu"
    if device == "cuda":
        precision = "fp16" if precision == "auto" else precision
    elif precision in ("auto", "bf16"):
        if cpu_bf16_fast():
            precision = "bf16"
            notes.append("CPU: bf16 (this processor has bf16 instructions: ~3.5x FP32's frames/s; outputs within "
                         "a few uint8 levels of FP32, RESULTS.md); precision=fp32 keeps the reference's arithmetic")
        else:
            if precision == "bf16":
                notes.append("bf16 on this CPU (no bf16 instructions) is slower than FP32; running FP32")
            precision = "fp32"
    elif precision != "fp32":
        notes.append(f"{precision} on the CPU is slower than FP32; running FP32")
        precision = "fp32"
    for note in notes:
        log.warning("[digital_human] %s", note)
    return device, precision, notes


def cpu_bf16_fast() -> bool:
    """oneDNN has a native bf16 path on this CPU (AVX512-BF16 / AMX): bf16 convolutions run ~3.5x faster than
    FP32 there (benchmarks/results/wav2lip_speed_*); without those instructions bf16 is emulated and slower."""
    import torch

    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def network_inputs(faces_bgr: np.ndarray) -> np.ndarray:
    """float32 [B, 6, 96, 96]: [bottom half zeroed, reference] / 255, channels first (datagen's arrays)."""
    masked = faces_bgr.copy()
    masked[:, FACE_SIZE // 2:] = 0
    # float32 / 255 equals the reference's float64 / 255 rounded to float32 for every uint8 value (checked for
    # all 256 in tests/test_wav2lip.py), at half the memory traffic of a float64 temporary
    both = np.concatenate((masked, faces_bgr), axis=3).astype(np.float32) / np.float32(255.0)
    return np.ascontiguousarray(both.transpose(0, 3, 1, 2))


def output_uint8(pred) -> np.ndarray:
    """uint8 [B, 96, 96, 3] (channel order of the input) from the network's [B, 3, 96, 96] in 0..1: x 255,
    truncated as the reference's astype(np.uint8)."""
    import torch

    return (pred.float() * 255.0).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


class Wav2LipRenderer:
    """Generated crops of output frames start..stop-1 on demand, in generator batches of `batch_size`."""

    def __init__(self, net, device: str, dtype, track, idx: np.ndarray, mel: np.ndarray, starts: np.ndarray,
                 batch_size: int, should_stop: Callable[[], bool] | None, timings: dict[str, float],
                 keep: int = 512, smooth_boxes: bool = True, composite: bool = True) -> None:
        self.net, self.device, self.dtype = net, device, dtype
        self.track, self.idx, self.mel, self.starts = track, idx, mel, starts
        self.batch_size, self.should_stop, self.timings = batch_size, should_stop, timings
        self.size = track.crop_size
        height, width = track.frames.shape[1:3]
        t0 = time.perf_counter()
        # the reference smooths the boxes of every frame it read; here: of every reference frame
        self.boxes = wav2lip_boxes(track.landmarks, len(track), height, width, PADS, smooth_boxes)
        self.timings["boxes"] = time.perf_counter() - t0
        from ...vision.content_key import digest, frames_key

        # a video read from a file: its inputs are kept between requests under the file's content key; frames
        # in memory (None) keep them in this renderer only
        self._video_key = frames_key(track.frames)
        self._digest = digest
        self._faces: OrderedDict[int, np.ndarray] = OrderedDict()  # r -> BGR 96x96 input
        self._keep = keep
        self._lock = threading.Lock()
        # composite: the crops outside the box are the reference crop's (the node path hands the crops on in
        # DH_FACES); off when streaming to the headless renderer, which pastes through the mask only
        self.composite = composite

    def face_key(self, r: int) -> str | None:
        """The kept-input key of reference frame r (None: frames in memory, kept in this renderer only): the
        video's content, the frame and its box are all its input is made from."""
        if self._video_key is None:
            return None
        return self._digest("wav2lip:face", self._video_key, int(r), np.asarray(self.boxes[r], np.int64))

    def mask_key(self, r: int) -> str:
        """The kept-mask key of reference frame r: its box, crop transform and the crop size (box_mask's inputs)."""
        return self._digest("wav2lip:mask", np.asarray(self.boxes[r], np.int64),
                            np.asarray(self.track.affines[r], np.float64), int(self.size))

    def avatar_key(self) -> str | None:
        """GeneratedCrops.avatar_key: the paste masks are functions of the boxes and the crop transforms (which
        render_video's key adds), so a content-keyed video's region and smoothing masks can be kept."""
        if self._video_key is None:
            return None
        return self._digest("wav2lip", self._video_key, np.asarray(self.boxes, np.int64))

    def _face_batch(self, refs: list[int]) -> np.ndarray:
        """uint8 [k, 96, 96, 3] BGR inputs of reference frames `refs`: kept ones (this request's, or a previous
        request's on the same video) are reused; the frames of the others are read in one call (a video decoded
        on demand reads them in order under one lock, not frame by frame from the pool's threads) and cut and
        resized on the pool."""
        have: dict[int, np.ndarray] = {}
        with self._lock:
            for r in dict.fromkeys(refs):
                if r in self._faces:
                    have[r] = self._faces[r]
        for r in dict.fromkeys(refs):
            if r not in have and (key := self.face_key(r)) is not None and (hit := _KEPT_FACES.get(key)) is not None:
                have[r] = hit
        missing = [r for r in dict.fromkeys(refs) if r not in have]
        if missing:
            frames = self.track.frames[np.asarray(missing, np.int64)]
            made = self._map(lambda i: face_input(frames[i], self.boxes[missing[i]])[..., ::-1],
                             list(range(len(missing))))
            for r, face in zip(missing, made):
                key = self.face_key(r)
                have[r] = face if key is None else _KEPT_FACES.put(key, face)
        with self._lock:
            for r in missing:
                if self.face_key(r) is None:
                    self._faces[r] = have[r]
            while len(self._faces) > self._keep:
                self._faces.popitem(last=False)
        return np.stack([have[r] for r in refs])

    def mask(self, r: int) -> np.ndarray:
        """float32 [S, S] paste mask of reference frame r, kept between requests (AVATAR_MASK_BYTES); read-only."""
        r = int(r)
        key = self.mask_key(r)
        hit = _KEPT_MASKS.get(key)
        if hit is None:
            hit = _KEPT_MASKS.put(key, box_mask(self.boxes[r], self.track.affines[r], self.size))
        return hit

    def _map(self, fn: Callable[[int], Any], items: list[int]) -> list:
        if len(items) < 4 or POOL_THREADS == 1:
            return [fn(i) for i in items]
        return list(_pool().map(fn, items))

    def generate(self, s: int, e: int) -> np.ndarray:
        """uint8 [k, 96, 96, 3] RGB generator outputs of output frames s..e-1."""
        import torch

        t0 = time.perf_counter()
        refs = [int(r) for r in self.idx[s:e]]
        faces = self._face_batch(refs)
        x = torch.from_numpy(network_inputs(faces))
        mel = torch.from_numpy(self._mel(s, e))
        t1 = time.perf_counter()
        with torch.inference_mode():
            x = x.to(self.device, self.dtype, non_blocking=True).contiguous(memory_format=torch.channels_last)
            pred = self.net(mel.to(self.device, self.dtype, non_blocking=True), x)
            out = output_uint8(pred)[..., ::-1]  # BGR -> RGB
        t2 = time.perf_counter()
        self._add(faces=t1 - t0, networks=t2 - t1)
        return out

    def _mel(self, s: int, e: int) -> np.ndarray:
        from ...engines.wav2lip.audio import mel_windows

        return mel_windows(self.mel, self.starts[s:e])

    def render(self, start: int, stop: int) -> tuple[np.ndarray, None]:
        import cv2

        out = np.empty((stop - start, self.size, self.size, 3), np.uint8)
        n = len(self.idx)
        for s in range(start, stop, self.batch_size):
            if self.should_stop is not None and self.should_stop():
                raise InterruptedError(f"wav2lip talking head interrupted after {s} of {n} frames")
            e = min(s + self.batch_size, stop)
            made = self.generate(s, e)
            t0 = time.perf_counter()
            refs = [int(r) for r in self.idx[s:e]]
            base = None
            if self.composite:
                crops = self.track.crops
                base = (crops.many(refs, None) if hasattr(crops, "many")
                        else np.stack([np.asarray(crops[r]) for r in refs]))

            def put(i: int) -> None:  # disjoint rows of `out`; OpenCV releases the GIL
                r = refs[i]
                warp = out_to_crop(self.boxes[r], self.track.affines[r])
                gen = cv2.warpAffine(np.ascontiguousarray(made[i]), warp, (self.size, self.size),
                                     flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_REPLICATE)
                if base is None:
                    out[s - start + i] = gen
                else:
                    out[s - start + i] = np.where((self.mask(r) > 0)[..., None], gen, base[i])

            self._map(put, list(range(e - s)))
            self._add(paste_crop=time.perf_counter() - t0)
        return out, None

    def _add(self, **seconds: float) -> None:
        for name, dt in seconds.items():
            self.timings[name] = self.timings.get(name, 0.0) + dt


def wav2lip_crops(track, audio: np.ndarray, sample_rate: int, fps: float | None = None, *,
                  loop_mode: str = "ping-pong", batch_size: int = 0, backend: str = "auto", precision: str = "auto",
                  max_audio_seconds: float = 600.0, progress: Callable[[int, int], None] | None = None,
                  should_stop: Callable[[], bool] | None = None, streaming: bool = False,
                  models_root: Any = None, checkpoint: str | None = None,
                  smooth_boxes: bool = True) -> GeneratedCrops:
    """Wav2Lip's crop for every output frame (no paste-back yet); arguments as musetalk_crops.

    batch_size: frames per generator batch (0 = 128 on CUDA as the reference's default, 16 on the CPU).
    checkpoint: "auto" (wav2lip_gan.pth when present, else wav2lip.pth), "wav2lip" or "wav2lip_gan"; None = the
    DIGITAL_HUMAN_WAV2LIP_CHECKPOINT variable, else auto. The one used is said in the warnings.
    smooth_boxes: average each box with the next four (the reference's default; its --nosmooth is False).
    Raises Wav2LipFilesError (both checkpoint names and where they go) before any work."""
    from ...engines.wav2lip.audio import melspectrogram, to_16k, window_starts
    from ...engines.wav2lip.files import locate
    from ...engines.wav2lip.networks import cached_generator

    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    files = locate(models_root, checkpoint)  # the files first: the clearest error
    validate_track(track)
    wave = validate_audio(audio, sample_rate, max_audio_seconds)
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 1, or 0 for automatic, got {batch_size}")
    device, prec, notes = resolve_runtime(backend, precision)
    net = cached_generator(files.checkpoint, device, prec)
    timings["load"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    fps = float(fps) if fps and fps > 0 else float(track.fps)
    n_out = output_frame_count(len(wave) / float(sample_rate), fps)
    idx = frame_schedule(len(track), n_out, loop_mode, track.fps, fps)
    mel = melspectrogram(to_16k(wave, int(sample_rate)))
    starts = window_starts(n_out, fps, mel.shape[1])
    timings["audio"] = time.perf_counter() - t1
    batch_size = int(batch_size) or (128 if device == "cuda" else 16)
    import torch

    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[prec]
    warnings = list(notes) + [f"checkpoint: {files.why}"] + reference_warnings(track, idx, n_out, fps, loop_mode)
    graphs = device == "cuda" and os.environ.get(GRAPHS_ENV, "1").strip() != "0"
    if graphs:  # one graph per batch size, captured on the first batch (benchmarks/wav2lip_speed.py: fp16:graphs)
        from ...engines.wav2lip.networks import graphed

        net = graphed(net, batch_size)
    renderer = Wav2LipRenderer(net, device, dtype, track, idx, mel, starts, batch_size, should_stop, timings,
                               smooth_boxes=smooth_boxes, composite=not streaming)
    gen = GeneratedCrops(track=track, idx=idx, fps=fps, crops=None, masks={}, model=MODEL_NAME,
                         backend=f"torch-{device} {prec}{' graphs' if graphs else ''} ({files.kind}.pth)",
                         timings=timings, warnings=warnings,
                         render=renderer.render, mask_of=renderer.mask, renders_landmarks=False,
                         avatar_key=renderer.avatar_key(),
                         notes={"checkpoint": str(files.checkpoint)})
    return gen.finished(streaming, progress, should_stop, batch=max(batch_size, 16))


DESCRIPTION = f"Wav2Lip lip-sync: {LICENCE_NOTE}."
