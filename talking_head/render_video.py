"""Headless talking-head video: generated crops -> smoothed, encoded MP4 with the frames on the GPU.

Why a second path next to the nodes: TRT_TalkingHead -> TemporalSmooth -> VideoMux hand each
other ComfyUI IMAGE tensors (float32 on the CPU). At 512x512 a minute of video is 4.5 GB of
float32 that is allocated, copied and converted three times, and ffmpeg turns RGB into YUV on
one thread; on a GPU machine that CPU work is most of the whole chain (benchmarks/RESULTS.md).
Here the same steps run over the face box only, on the GPU when there is one, one chunk of frames
at a time so memory does not grow with the video's length (DESIGN 5c): the model makes the chunk's
crops (GeneratedCrops.chunk) -> paste-back (vision.paste_torch) -> TemporalSmooth's filter over a
bounded window (media.stream_smooth, with the node's own masks) -> compose, convert to YUV 4:2:0
(media.yuv; on a GPU only) and stream to the encoder (media.mux.FrameStream) while the next chunk
is prepared on a thread. The frames equal the node path's to rounding (tests/test_render_video.py).
"""
from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..engines.devices import torch_cuda_usable
from ..media.mux import FrameStream, MuxInterrupted, MuxReport, mux_video
from ..media.yuv import rgb_to_yuv420p
from ..vision.content_key import digest
from ..vision.faces import apply_affines, invert_affines
from ..vision.paste import frame_space_masks
from ..vision.paste_torch import paste_boxes, paste_footprint
from .driver import GeneratedCrops, GeneratedFrames

CHUNK_FRAMES = 32  # frames per GPU step / encoder write: a few tens of MB of uint8 at 512 px
# at most this many bytes of float face boxes per chunk: a face that fills a 1920-px photo has a
# ~1000-px box (12 MB a frame in float32), and the paste's temporaries are several times a chunk
CHUNK_BOX_BYTES = 48 * 2**20
# TemporalSmooth's frame-space masks (_smooth_masks: a polygon fill, blur and warp per frame on the CPU, ~0.1 s
# a 32-frame chunk on an H200 host) are made on a few threads, chunks ahead of the paste-back, instead of on
# the thread that feeds the encoder: there they set its pace (RESULTS.md, MuseTalk section 8). The same calls
# with the same arguments, so the same masks.
SMOOTH_MASK_THREADS = max(1, min(4, (os.cpu_count() or 1) - 1))
SMOOTH_MASKS_AHEAD = 4  # chunks whose masks may be made or held ahead (each a few MB at 512 px)
# x264 preset of this path's MP4s when the caller names none (mux_video's own default is "medium"). 256 frames of
# 512x512 + the speech, encoder alone (benchmarks/wav2lip_speed.py --x264; RESULTS.md, Wav2Lip): on an H200 host's
# 16 cores veryfast 0.34 s vs medium 0.59 s, 2.0 vs 4.5 CPU-seconds; at CRF 18 its Y-PSNR against the frames
# given is 48.0 dB (medium 49.5), the file 8% smaller. The encoder was the repeat request's floor on a GPU and a
# fifth of its CPU time on 2 cores. crf 16 gives medium's quality within 0.6 dB (49.0 dB, +19% bytes);
# preset="medium" gives the old files exactly.
X264_PRESET = "veryfast"
# Kept between requests for a reference that its model keys by content (GeneratedCrops.avatar_key: MuseTalk on a
# video file, with face-mesh masks), as the avatar's track, latents and paste masks are: the paste region (0.12 s
# of a 10-s 512x512 clip on an H200 host, every request) and the smoothing masks made from the reference's
# landmarks (~0.1 s of CPU a 32-frame chunk, ~0.8 s a clip, on threads beside the renderer and the paste-back).
# Keyed by the model's key + the frame size, crop size, used reference frames' crop transforms and landmarks
# (+ the paste box and each chunk's reference frames for the masks); bounded (least recently used goes first).
REGION_CACHE_ENTRIES = 64
SMOOTH_MASK_CACHE_BYTES = 256 * 2**20
_REGIONS: OrderedDict[str, tuple[slice, slice]] = OrderedDict()
_SMOOTH: OrderedDict[str, object] = OrderedDict()  # key -> torch float32 CPU tensor [k, bh, bw]
_SMOOTH_BYTES = [0]
_CACHE_LOCK = threading.Lock()


def clear_video_caches() -> None:
    """Forget the paste regions, smoothing masks and decoded reference frames kept between requests."""
    from ..media.frame_source import clear_kept_frames

    clear_kept_frames()
    with _CACHE_LOCK:
        _REGIONS.clear()
        _SMOOTH.clear()
        _SMOOTH_BYTES[0] = 0


def video_key(gen: GeneratedCrops) -> str | None:
    """The key of `gen`'s paste region and reference smoothing masks (None: its model keys nothing, so nothing
    is kept): everything they are made from besides the model's masks, which its avatar_key stands for."""
    base = getattr(gen, "avatar_key", None)
    if base is None:
        return None
    track = gen.track
    refs = np.unique(np.asarray(gen.idx, np.int64))
    return digest(str(base), tuple(int(v) for v in track.frames.shape[1:3]), int(track.crop_size), refs,
                   np.asarray(track.affines[refs], np.float64), np.asarray(track.landmarks[refs], np.float32))


def _kept_region(key: str | None, gen: GeneratedCrops) -> tuple[slice, slice]:
    if key is None:
        return paste_region(gen)
    with _CACHE_LOCK:
        hit = _REGIONS.get(key)
        if hit is not None:
            _REGIONS.move_to_end(key)
            return hit
    region = paste_region(gen)
    with _CACHE_LOCK:
        _REGIONS[key] = region
        while len(_REGIONS) > REGION_CACHE_ENTRIES:
            _REGIONS.popitem(last=False)
    return region


def _kept_smooth_masks(key: str):
    with _CACHE_LOCK:
        hit = _SMOOTH.get(key)
        if hit is not None:
            _SMOOTH.move_to_end(key)
        return hit


def _keep_smooth_masks(key: str, masks) -> None:
    size = masks.numel() * masks.element_size()
    if size > SMOOTH_MASK_CACHE_BYTES:
        return
    with _CACHE_LOCK:
        old = _SMOOTH.pop(key, None)
        if old is not None:
            _SMOOTH_BYTES[0] -= old.numel() * old.element_size()
        _SMOOTH[key] = masks
        _SMOOTH_BYTES[0] += size
        while _SMOOTH_BYTES[0] > SMOOTH_MASK_CACHE_BYTES and _SMOOTH:
            gone = _SMOOTH.popitem(last=False)[1]
            _SMOOTH_BYTES[0] -= gone.numel() * gone.element_size()


@dataclass
class TalkingVideoResult:
    path: Path
    mux: MuxReport
    device: str
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        t = ", ".join(f"{k} {v:.2f}s" for k, v in self.timings.items())
        lines = [f"{self.path.name}: {self.mux.frames_written} frames on {self.device}; {t}"]
        return "\n".join(lines + [f"warning: {w}" for w in self.warnings])


def _union(a: tuple[slice, slice], b: tuple[slice, slice]) -> tuple[slice, slice]:
    def empty(s: tuple[slice, slice]) -> bool:
        return s[0].stop <= s[0].start or s[1].stop <= s[1].start

    if empty(a):
        return b
    if empty(b):
        return a
    return (slice(min(a[0].start, b[0].start), max(a[0].stop, b[0].stop)),
            slice(min(a[1].start, b[1].start), max(a[1].stop, b[1].stop)))


class _Prefetched:
    """Run a chunk generator on a thread started at once, `depth` chunks ahead, so preparing chunk k + 1 (GPU
    work, device -> host copy) overlaps writing chunk k to the encoder, and the first chunk is under way while
    the caller still sets up. Iterate it; exceptions arrive in order. close() (idempotent) stops the worker
    when the consumer stops early: every user calls it."""

    _END = object()

    def __init__(self, chunks: Iterator, depth: int = 2, name: str = "dh-video-chunks") -> None:
        self._box: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, args=(chunks,), name=name, daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        """Queue `item` unless the consumer has gone (then never block: nobody will take it)."""
        while not self._stop.is_set():
            try:
                self._box.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _work(self, chunks: Iterator) -> None:
        try:
            for item in chunks:
                if not self._put(item):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(exc)
            return
        self._put(self._END)

    def __iter__(self) -> "_Prefetched":
        return self

    def __next__(self):
        if self._stop.is_set():
            raise StopIteration
        item = self._box.get()
        if item is self._END:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        return item

    def close(self, wait: bool | None = None) -> None:
        """wait: for the worker to end; None = unless a KeyboardInterrupt (Ctrl-C, or SIGTERM raised by
        stop_signals.py) is being handled: the process is ending, the chunk in progress is not waited for
        (seconds on a CPU; Docker allows 10 s between SIGTERM and SIGKILL)."""
        if wait is None:
            wait = not isinstance(sys.exc_info()[1], KeyboardInterrupt)
        self._stop.set()
        if wait and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def __del__(self) -> None:  # a consumer that forgot close(): let the worker end
        self._stop.set()


def _prefetched(chunks: Iterator, depth: int = 2, name: str = "dh-video-chunks") -> _Prefetched:
    """_Prefetched(chunks, depth, name): the worker (thread `name`) starts now."""
    return _Prefetched(chunks, depth, name)


def paste_ranges(n: int, generated: int, paste: int) -> list[tuple[int, int]]:
    """[start, stop) output-frame ranges pasted and smoothed at a time: each chunk of `generated` frames that
    the model makes is split into equal parts of at most `paste` frames (the box's memory bound)."""
    parts = -(-generated // max(1, paste))
    size = -(-generated // parts)
    return [(s, min(s + size, g + generated, n)) for g in range(0, n, generated)
            for s in range(g, min(g + generated, n), size)]


def paste_region(gen: GeneratedCrops, batch: int = 256) -> tuple[slice, slice]:
    """(rows, cols) of the frame box that holds every pixel the paste-back may change, over all output
    frames (the union of each used reference frame's paste footprint; masks are made in batches and
    dropped, so a long video reference costs time, not memory)."""
    height, width = gen.track.frames.shape[1:3]
    refs = np.unique(np.asarray(gen.idx, np.int64))
    rows, cols = slice(0, 0), slice(0, 0)
    for start in range(0, len(refs), batch):
        part = refs[start:start + batch]
        affines = gen.track.affines[part]
        # one frame at a time: the same union of footprints without stacking (and copying) a batch of masks
        for j, r in enumerate(part):
            mask = np.asarray(gen.mask(int(r)), np.float32)
            rows, cols = _union((rows, cols), paste_footprint(affines[j:j + 1], mask, height, width))
    return rows, cols


def _smooth_masks(gen: GeneratedCrops, start: int, stop: int, landmarks: np.ndarray | None,
                  rows: slice, cols: slice) -> np.ndarray:
    """TemporalSmooth's frame-space lower-face masks of output frames start..stop-1 (from the output
    landmarks, as the node derives them from TRT_TalkingHead's DH_FACES), inside the box rows x cols."""
    track, idx = gen.track, np.asarray(gen.idx[start:stop], np.int64)
    height, width = track.frames.shape[1:3]
    lms = track.landmarks[idx] if landmarks is None else landmarks
    affines = track.affines[idx]
    crop_lms = apply_affines(np.asarray(lms)[..., :2], affines)
    masks, (my, mx) = frame_space_masks(crop_lms, invert_affines(affines), track.crop_size, height, width)
    out = np.zeros((stop - start, rows.stop - rows.start, cols.stop - cols.start), np.float32)
    # the part of the masks' own box that lies inside the paste box (the node smooths only there too:
    # outside the paste footprint the output is the reference frame, whose pixels the node leaves alone)
    y0, y1 = max(my.start, rows.start), min(my.stop, rows.stop)
    x0, x1 = max(mx.start, cols.start), min(mx.stop, cols.stop)
    if y1 > y0 and x1 > x0:
        src = masks[..., y0 - my.start:y1 - my.start, x0 - mx.start:x1 - mx.start]
        out[:, y0 - rows.start:y1 - rows.start, x0 - cols.start:x1 - cols.start] = src
    return out


def iter_video_frames(gen: GeneratedCrops, *, smooth_method: str = "one_euro", smooth_strength: float = 0.5,
                      device=None, chunk_frames: int = CHUNK_FRAMES,
                      should_stop: Callable[[], bool] | None = None) -> Iterator:
    """uint8 RGB output frames [k, H, W, 3] on `device`, chunk by chunk, in order: each chunk's crops
    are made (GeneratedCrops.chunk), pasted into their reference frames' face box (paste_torch), run
    through TemporalSmooth's filter (media.stream_smooth: a bounded window) and written into the full
    frames (rounded like image_to_uint8). Only a few chunks are ever held, whatever the length."""
    dev = _device(device)
    n = len(gen)
    if n == 0:
        raise ValueError("no frames to render: the generated crops are empty")
    generated = max(1, int(chunk_frames))

    def crop_chunks():
        """(start, stop, crops, landmarks) per chunk of `generated` frames: the talking-head model's part."""
        for start in range(0, n, generated):
            if should_stop is not None and should_stop():
                raise InterruptedError(f"talking video interrupted after {start} of {n} frames; no file written")
            stop = min(start + generated, n)
            yield (start, stop, *gen.chunk(start, stop))

    # The model starts on chunk 0 now, on its own thread, while the paste region is found: a first request's
    # region waits for every reference frame's paste mask (~0.3 s of a 10-s clip on an H200 host). The region
    # decides only where the crops go and how many frames are pasted at a time (paste_ranges), never what the
    # model makes, and frames do not depend on the chunking (tests/test_render_video.py).
    # On a GPU the model may run up to 3 chunks ahead of the paste-back (a few MB of crops each): the paste
    # thread's small kernels crawl while the model's batches fill the GPU (a chunk every ~0.13 s beside them,
    # ~0.06 s after them, H200 MuseTalk), so the batches are best over early; on a CPU both share the cores.
    made = _prefetched(crop_chunks(), depth=3 if dev.type == "cuda" else 1, name="dh-video-model")
    try:
        yield from _paste_frames(gen, made, dev, generated, smooth_method, smooth_strength)
    finally:  # stopped early (error, interruption) or done: stop the model's thread too
        made.close()


def _device(device):
    import torch

    return torch.device(device or ("cuda" if torch_cuda_usable() else "cpu"))  # ComfyUI's --cpu respected


def _paste_frames(gen: GeneratedCrops, made: _Prefetched, dev, generated: int, smooth_method: str,
                  smooth_strength: float) -> Iterator:
    """iter_video_frames after the model's thread has started: the paste region, then paste-back, smoothing and
    composition of the chunks `made` brings."""
    import torch

    from ..media.stream_smooth import StreamingSmoother

    track, idx, n = gen.track, np.asarray(gen.idx, np.int64), len(gen)
    key = video_key(gen)
    rows, cols = _kept_region(key, gen)
    motion = gen.motion
    # a photo's idle motion (FrameMotion): the mouth is pasted and smoothed in the photo's own coordinates,
    # exactly as without motion (the same box, the model's own landmarks' masks), and the head warp moves the
    # finished frames on the CPU (`moved`). The node path warps before its TemporalSmooth node instead: the
    # two differ by the smoothing of a moving face (bounded in tests/test_idle_motion.py)

    def moved(start: int, frames):
        return frames if motion is None else warp_frames(motion, frames, start)

    has_box = rows.stop > rows.start and cols.stop > cols.start
    box_bytes = (rows.stop - rows.start) * (cols.stop - cols.start) * 3 * 4
    chunk_frames = generated
    if has_box:
        chunk_frames = max(1, min(chunk_frames, CHUNK_BOX_BYTES // box_bytes))
    ranges = paste_ranges(n, generated, chunk_frames)
    chunk_frames = max(e - s for s, e in ranges)
    next_range = {s: (s, e) for s, e in ranges}
    y0, x0 = rows.start, cols.start
    smoothing = smooth_method != "none" and smooth_strength > 0 and n > 1 and has_box
    # backward blocks as long as a chunk may be for this box (8..32 frames): fewer restarts of the
    # backward pass for small faces, less held for large ones; never dependent on chunk_frames
    block = int(np.clip(CHUNK_BOX_BYTES // max(box_bytes, 1), 8, 32))
    smoother = StreamingSmoother(smooth_method, smooth_strength, gen.fps, block=block) if smoothing else None
    one_reference = len(np.unique(idx)) == 1  # a photo: one upload, then copies on the device
    # a copy: a photo track's frame may be a read-only view (torch warns on every run about those)
    base_frame = torch.from_numpy(np.array(track.frames[int(idx[0])])).to(dev) if one_reference else None

    def full_frames(start: int, stop: int):
        if one_reference:
            return base_frame.expand(stop - start, -1, -1, -1).clone()
        return torch.from_numpy(np.ascontiguousarray(track.frames[idx[start:stop]])).to(dev)

    if not has_box:  # nothing is pasted: the model's crops are not needed
        made.close()
        for start in range(0, n, chunk_frames):
            yield moved(start, full_frames(start, min(start + chunk_frames, n)))
        return

    mask_pool = None
    if smoothing and SMOOTH_MASK_THREADS > 1:
        from concurrent.futures import ThreadPoolExecutor

        mask_pool = ThreadPoolExecutor(max_workers=SMOOTH_MASK_THREADS, thread_name_prefix="dh-smooth-masks")
    mask_jobs: dict = {}  # (start, landmarks given) -> future of _smooth_masks

    def mask_key(start: int, stop: int) -> str | None:
        """The kept-masks key of chunk start..stop's smoothing masks from the reference landmarks."""
        if key is None:
            return None
        return digest(key, (rows.start, rows.stop, cols.start, cols.stop), idx[start:stop])

    def smooth_masks_ahead(start: int, landmarks) -> None:
        """Start this chunk's smoothing masks on the pool; when they come from the reference landmarks (the
        model returned none with this chunk), the next chunks' too (they do not depend on the crops; a later
        chunk that brings landmarks after all has its own made then). Kept masks are not made again. One free
        core or fewer: no pool, the masks are made where they are used, as before."""
        if mask_pool is None:
            return
        if landmarks is not None:
            mask_jobs[(start, True)] = mask_pool.submit(_smooth_masks, gen, *next_range[start], landmarks, rows, cols)
            return
        at = ranges.index(next_range[start])
        for s, e in ranges[at:at + SMOOTH_MASKS_AHEAD]:
            if (s, False) not in mask_jobs and not (key is not None and _kept_smooth_masks(mask_key(s, e))
                                                    is not None):
                mask_jobs[(s, False)] = mask_pool.submit(_smooth_masks, gen, s, e, None, rows, cols)

    def smooth_masks_of(start: int, stop: int, landmarks):
        """torch float32 CPU [k, bh, bw]: chunk start..stop's smoothing masks (kept ones for the reference's
        landmarks when the model keys its reference by content)."""
        mkey = mask_key(start, stop) if landmarks is None else None
        if mkey is not None:
            hit = _kept_smooth_masks(mkey)
            if hit is not None:
                mask_jobs.pop((start, False), None)
                return hit if dev.type != "cpu" else hit.clone()  # never shared with an in-place user
        job = mask_jobs.pop((start, landmarks is not None), None)
        out = torch.from_numpy(job.result() if job is not None else
                               _smooth_masks(gen, start, stop, landmarks, rows, cols))
        if mkey is not None:
            _keep_smooth_masks(mkey, out if dev.type != "cpu" else out.clone())
        return out

    if mask_pool is not None and (not gen.renders_landmarks if gen.streaming else gen.landmarks is None):
        # the model returns no output landmarks: the first chunks' masks start now, beside the first render,
        # not when its crops arrive
        smooth_masks_ahead(0, None)

    def pasted_chunks():
        """(start, stop, boxes float 0..1 [k, bh, bw, 3], smoothing masks or None) per paste range."""
        # the model makes chunk k + 1 on its own thread while chunk k is pasted and smoothed here: on a
        # CPU the two overlap (both mostly release the GIL), one chunk of crops more is held
        try:
            for g_start, g_stop, g_crops, g_landmarks in made:
                for start, stop in ranges[ranges.index(next_range[g_start]):]:
                    if start >= g_stop:
                        break
                    crops = g_crops[start - g_start:stop - g_start]
                    landmarks = None if g_landmarks is None else g_landmarks[start - g_start:stop - g_start]
                    yield (start, stop, *_pasted(start, stop, crops, landmarks))
        finally:  # stopped early (error, interruption): stop the model's thread too
            made.close()
            if mask_pool is not None:
                mask_pool.shutdown(wait=False, cancel_futures=True)

    def _pasted(start: int, stop: int, crops, landmarks):
        if smoothing:
            smooth_masks_ahead(start, landmarks)
        base = torch.from_numpy(np.ascontiguousarray(track.frames[idx[start:stop], rows, cols])).to(dev)
        masks = torch.from_numpy(np.asarray(gen.mask_stack(start, stop), np.float32)).to(dev)  # stacked: a copy already
        pasted = paste_boxes(base.float(), torch.from_numpy(np.ascontiguousarray(crops)).to(dev),
                             track.affines[idx[start:stop]], masks, (x0, y0))
        smooth_mask = None
        if smoothing:
            smooth_mask = smooth_masks_of(start, stop, landmarks).to(dev)
        return torch.div(pasted, 255.0), smooth_mask  # as uint8_to_image divides

    def to_uint8(box):  # in place: every caller hands over a fresh tensor (stacked or divided) it drops after
        return box.mul_(255.0).add_(0.5).clamp_(0, 255).to(torch.uint8)

    def composed(start: int, boxes):
        """The full frames of output frames start..start+len(boxes)-1 with their boxes in (and moved)."""
        frames = full_frames(start, start + len(boxes))
        frames[:, rows, cols] = to_uint8(boxes)
        return moved(start, frames)

    if smoother is None:
        for start, stop, boxes, _ in pasted_chunks():
            yield composed(start, boxes)
        return
    ready: list = []  # smoothed boxes waiting to fill a chunk

    def emit(done: list, final: bool):
        while len(done) >= chunk_frames or (final and done):
            take = done[:chunk_frames]
            del done[:chunk_frames]
            yield composed(take[0][0], torch.stack([b for _, b in take]))

    for _, _, boxes, smooth_mask in pasted_chunks():
        ready += smoother.push(boxes, smooth_mask)
        yield from emit(ready, False)
    ready += smoother.flush()
    yield from emit(ready, True)


def warp_frames(motion, frames, start: int, in_place: bool | None = None):
    """Full frames (torch uint8 [k, H, W, 3], output frames start..) moved by `motion` (FrameMotion, on the
    CPU) and returned. in_place (default: the frames are on the CPU): warp their own memory (full_frames
    makes fresh tensors); else the head's box goes to the CPU and back."""
    import torch

    if in_place if in_place is not None else frames.device.type == "cpu":
        motion.apply(frames.numpy(), start)
        return frames
    rows, cols = motion.region
    box = frames[:, rows, cols].cpu().numpy()
    frames[:, rows, cols] = torch.from_numpy(motion.apply(box, start, (cols.start, rows.start))).to(frames.device)
    return frames


_PASTE_STREAMS: dict = {}  # CUDA device index -> the high-priority stream the paste and YUV work runs on
_PASTE_STREAMS_LOCK = threading.Lock()


def _priority_stream(dev):
    """The high-priority CUDA stream of `dev` for the paste-back, smoothing and YUV work (None on the CPU); one
    per device for the process. The same kernels in the same order, so the same frames; only their scheduling
    against other streams changes. One stream, not a new one per request: torch hands out a pool of 32
    priority streams round-robin and cuBLAS keeps a workspace per stream it ran on (the paste's affine_grid is a
    batched matmul): the likely cause of the ~32 MB more peak GPU memory with every Wav2Lip request in the H200
    run of 2026-12-02 (59648fa; this change not measured there). Concurrent renders share the stream: their paste
    work queues in issue order."""
    import torch

    if dev.type != "cuda":
        return None
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    with _PASTE_STREAMS_LOCK:
        stream = _PASTE_STREAMS.get(index)
        if stream is None:
            # a lower number is a higher priority; out-of-range values map to the highest the device has
            stream = _PASTE_STREAMS[index] = torch.cuda.Stream(device=index, priority=-8)
        return stream


def _stream_context(stream):
    """A context that makes `stream` current in this thread (a no-op for None). A fresh context per thread:
    torch's StreamContext keeps the stream it replaces in itself."""
    import contextlib

    import torch

    return contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)


def render_talking_video(gen: GeneratedCrops, audio: np.ndarray, sample_rate: int, out_path: str | Path, *,
                         smooth_method: str = "one_euro", smooth_strength: float = 0.5, device: str | None = None,
                         fmt: str = "mp4", crf: int | None = None, preset: str | None = None,
                         chunk_frames: int = CHUNK_FRAMES, yuv_on_device: bool | None = None,
                         progress: Callable[[int, int], None] | None = None,
                         should_stop: Callable[[], bool] | None = None) -> TalkingVideoResult:
    """Paste `gen`'s crops into their reference frames, smooth the lower face like TemporalSmooth,
    and encode with `audio` to `out_path` like VideoMux (length_mode pad_audio). device: torch
    device; None = CUDA when available, else CPU. preset: x264's (mp4; None = X264_PRESET) or VP9's cpu-used
    (webm; None = mux_video's). yuv_on_device: convert RGB -> YUV 4:2:0 on `device`
    (None = on a GPU only; else ffmpeg converts). progress(done, total) counts encoded frames (every
    stage runs ahead of the encoder by a few chunks); should_stop() -> True aborts (no file is left).
    A streaming `gen` (crops made on demand) keeps memory flat in the video's length."""
    import torch

    t0 = time.perf_counter()
    if preset is None and fmt == "mp4":
        preset = X264_PRESET
    if isinstance(gen, GeneratedFrames):  # a whole-frame model: its frames are the video (nothing to paste)
        return _render_whole_frames(gen, audio, sample_rate, out_path, fmt, crf, preset, chunk_frames, progress,
                                    should_stop, t0)
    dev = torch.device(device or ("cuda" if torch_cuda_usable() else "cpu"))  # ComfyUI's --cpu respected
    n = len(gen)
    height, width = gen.track.frames.shape[1:3]

    # On a GPU the YUV conversion costs ~0.1 ms a frame and halves the pipe bytes; on a CPU torch's integer
    # version is ~30x slower than ffmpeg's own (SIMD) conversion, so RGB goes to ffmpeg as the nodes send it.
    yuv_here = dev.type == "cuda" if yuv_on_device is None else bool(yuv_on_device)

    # on a GPU the paste-back, smoothing and YUV work (small kernels the encoder waits for) runs on a
    # high-priority stream: queued behind a model's batches it held the encoder back
    paste_stream = _priority_stream(dev)  # (not `stream`: that name is the encoder's FrameStream below)

    def composed_frames() -> Iterator:
        with _stream_context(paste_stream):
            yield from iter_video_frames(gen, smooth_method=smooth_method, smooth_strength=smooth_strength,
                                         device=dev, chunk_frames=chunk_frames, should_stop=should_stop)

    def encoder_chunks() -> Iterator[np.ndarray]:
        # on a GPU two threads: one pastes, smooths and composes chunk k + 1 while this one converts chunk k to
        # YUV and waits for its copy to the host. Both issue their kernels to the one stream, so they run in
        # the order they were issued (the same work in the same order: the same frames), and no tensor crosses
        # streams. On a CPU there is nothing to convert (ffmpeg does it): one thread, as before.
        frames_iter = _prefetched(composed_frames(), depth=2, name="dh-video-paste") if yuv_here else None
        try:
            with _stream_context(paste_stream):
                for frames in (frames_iter if frames_iter is not None else composed_frames()):
                    yield rgb_to_yuv420p(frames, "edge").cpu().numpy() if yuv_here else frames.cpu().numpy()
        finally:
            if frames_iter is not None:
                frames_iter.close()

    def encode_progress(done: int, _total: int) -> None:
        if progress is not None:
            progress(done, n)

    prepared = _prefetched(encoder_chunks(), name="dh-video-frames")
    if yuv_here:  # yuv420p needs even sizes: rgb_to_yuv420p pads odd ones by repeating the edge
        stream = FrameStream(count=n, width=width + width % 2, height=height + height % 2, pix_fmt="yuv420p",
                             chunks=prepared)
    else:  # mux pads odd RGB sizes the same way (pad_mode "edge")
        stream = FrameStream(count=n, width=width, height=height, pix_fmt="rgb24", chunks=prepared)
    timings: dict[str, float] = {}
    ending = False
    try:
        mux = mux_video(stream, audio, int(sample_rate), gen.fps, out_path, fmt=fmt, crf=crf, preset=preset,
                        length_mode="pad_audio", progress=encode_progress, should_stop=should_stop)
    except MuxInterrupted as exc:  # one exception type for every interruption of this function
        raise InterruptedError(f"talking video interrupted while encoding: {exc}") from exc
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (stop_signals.py): the partial files are gone, the process ends
        ending = True
        raise
    finally:
        prepared.close(wait=False if ending else None)  # stops the preparing thread if the encoder stopped early
    # generation, paste-back, smoothing and encoding overlap (one stream), so one time covers them
    timings["total"] = time.perf_counter() - t0
    return TalkingVideoResult(path=mux.path, mux=mux, device=str(dev), timings=timings, warnings=list(gen.warnings))


def _render_whole_frames(gen: GeneratedFrames, audio: np.ndarray, sample_rate: int, out_path: str | Path, fmt: str,
                         crf: int | None, preset: str | None, chunk_frames: int,
                         progress: Callable[[int, int], None] | None, should_stop: Callable[[], bool] | None,
                         t0: float) -> TalkingVideoResult:
    """A whole-frame model's frames streamed to the encoder chunk by chunk (made on a thread ahead of it)."""
    n = len(gen)
    height, width = gen.size

    def chunks() -> Iterator[np.ndarray]:
        for start in range(0, n, max(1, chunk_frames)):
            if should_stop is not None and should_stop():
                raise InterruptedError(f"talking video interrupted after {start} of {n} frames; no file written")
            yield gen.chunk(start, min(start + chunk_frames, n))

    prepared = _prefetched(chunks())
    stream = FrameStream(count=n, width=width, height=height, pix_fmt="rgb24", chunks=prepared)
    try:
        mux = mux_video(stream, audio, int(sample_rate), gen.fps, out_path, fmt=fmt, crf=crf, preset=preset,
                        length_mode="pad_audio", progress=(lambda done, _t: progress(done, n)) if progress else None,
                        should_stop=should_stop)
    except MuxInterrupted as exc:
        raise InterruptedError(f"talking video interrupted while encoding: {exc}") from exc
    finally:
        prepared.close()
    return TalkingVideoResult(path=mux.path, mux=mux, device=gen.backend,
                              timings={"total": time.perf_counter() - t0}, warnings=list(gen.warnings))
