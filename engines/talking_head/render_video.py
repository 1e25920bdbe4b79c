"""Headless talking-head video: generated crops -> smoothed, encoded MP4 with the frames on the GPU.

Why a second path next to the nodes: TRT_TalkingHead -> TemporalSmooth -> VideoMux hand each
other ComfyUI IMAGE tensors (float32 on the CPU). At 512x512 a minute of video is 4.5 GB of
float32 that is allocated, copied and converted three times, and ffmpeg turns RGB into YUV on
one thread; on a GPU machine that CPU work is most of the whole chain (benchmarks/RESULTS.md).
Here the same steps run over the face box only, on the GPU when there is one:
paste-back (vision.paste_torch) -> TemporalSmooth's filter (media.smoothing.smooth_frames_tensor,
with the node's own masks) -> per chunk of frames: compose, convert to YUV 4:2:0 (media.yuv; on a
GPU only) and stream to the encoder (media.mux.FrameStream) while the next chunk is prepared on a thread.
The frames equal the node path's to rounding (tests/test_render_video.py).
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...media.mux import FrameStream, MuxInterrupted, MuxReport, mux_video
from ...media.smoothing import smooth_frames_tensor
from ...media.yuv import rgb_to_yuv420p
from ...vision.faces import apply_affines, invert_affines
from ...vision.paste import frame_space_masks
from ...vision.paste_torch import paste_boxes, paste_footprint
from .driver import GeneratedCrops

CHUNK_FRAMES = 32  # frames per GPU step / encoder write: a few tens of MB of uint8 at 512 px
# the box of every frame stays on the device through smoothing; beyond this share of the free
# memory it is kept in host memory instead (slower, announced)
MAX_BOX_SHARE = 0.5


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


def _prefetched(chunks: Iterator, depth: int = 2) -> Iterator:
    """Run a chunk generator on a thread, `depth` chunks ahead, so preparing chunk k + 1 (GPU work,
    device -> host copy) overlaps writing chunk k to the encoder. Exceptions arrive in order."""
    box: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def put(item) -> bool:
        """Queue `item` unless the consumer has gone (then never block: nobody will take it)."""
        while not stop.is_set():
            try:
                box.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in chunks:
                if not put(item):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            put(exc)
            return
        put(done)

    thread = threading.Thread(target=work, name="dh-video-chunks", daemon=True)
    thread.start()
    try:
        while True:
            item = box.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:  # the consumer stopped early (error, interruption): let the worker finish
        stop.set()
        thread.join(timeout=10)


@dataclass
class FaceBoxes:
    """Every output frame's changed region, after paste-back and smoothing: float 0..1 [M, h, w, 3]
    at frame pixels (rows, cols), on `boxes.device`."""
    boxes: object  # torch.Tensor
    rows: slice
    cols: slice
    warnings: list[str] = field(default_factory=list)


def paste_and_smooth(gen: GeneratedCrops, *, smooth_method: str = "one_euro", smooth_strength: float = 0.5,
                     device=None, chunk_frames: int = CHUNK_FRAMES,
                     progress: Callable[[int, int], None] | None = None,
                     should_stop: Callable[[], bool] | None = None) -> FaceBoxes:
    """TRT_TalkingHead's paste-back and TemporalSmooth (`smooth_method` "none" or strength 0 = off),
    over the union of their regions only. progress(done, 2 x frames)."""
    import torch

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    track, idx, n = gen.track, np.asarray(gen.idx, np.int64), len(gen)
    if n == 0:
        raise ValueError("no frames to render: the generated crops are empty")
    height, width = track.frames.shape[1:3]
    chunk_frames = max(1, int(chunk_frames))
    warnings: list[str] = []

    def check_stop(done: int) -> None:
        if should_stop is not None and should_stop():
            raise InterruptedError(f"talking video interrupted after {done} of {n} frames; no file written")

    # where the pixels change: the paste footprint and TemporalSmooth's mask box, in frame pixels
    refs, ref_pos = np.unique(idx, return_inverse=True)
    paste_masks = np.stack([gen.masks[int(r)] for r in refs]).astype(np.float32)
    paste_region = paste_footprint(track.affines[refs], paste_masks, height, width)
    affines = track.affines[idx]
    smoothing = smooth_method != "none" and smooth_strength > 0 and n > 1
    smooth_region = (slice(0, 0), slice(0, 0))
    if smoothing:  # the masks TemporalSmooth derives from the talking head's output DH_FACES
        out_landmarks = track.landmarks[idx] if gen.landmarks is None else np.asarray(gen.landmarks)
        crop_lms = apply_affines(out_landmarks[..., :2], affines)
        smooth_masks, smooth_region = frame_space_masks(crop_lms, invert_affines(affines), track.crop_size,
                                                        height, width)
    rows, cols = _union(paste_region, smooth_region)
    y0, x0 = rows.start, cols.start
    bh, bw = max(0, rows.stop - rows.start), max(0, cols.stop - cols.start)

    box_dev = dev
    if dev.type == "cuda" and bh * bw:
        free, _ = torch.cuda.mem_get_info(dev)
        need = n * bh * bw * 3 * 4
        if need > MAX_BOX_SHARE * free:
            box_dev = torch.device("cpu")
            warnings.append(f"the face boxes of {n} frames ({need / 2**30:.1f} GiB) do not fit the GPU's free memory; "
                            "kept in host memory (slower)")
    boxes = torch.empty((n, bh, bw, 3), dtype=torch.float32, device=box_dev)
    if bh * bw:
        masks_dev = torch.from_numpy(paste_masks).to(dev)
        for start in range(0, n, chunk_frames):
            check_stop(start)
            stop = min(start + chunk_frames, n)
            base = torch.from_numpy(np.ascontiguousarray(track.frames[idx[start:stop], rows, cols])).to(dev)
            crops = torch.from_numpy(gen.crops[start:stop]).to(dev)
            pasted = paste_boxes(base.float(), crops, affines[start:stop],
                                 masks_dev[torch.from_numpy(ref_pos[start:stop]).to(dev)], (x0, y0))
            boxes[start:stop] = torch.div(pasted, 255.0).to(box_dev)  # as uint8_to_image divides
            if progress is not None:
                progress(stop, 2 * n)
    if smoothing and smooth_region[0].stop > smooth_region[0].start:
        check_stop(0)
        sy = slice(smooth_region[0].start - y0, smooth_region[0].stop - y0)
        sx = slice(smooth_region[1].start - x0, smooth_region[1].stop - x0)
        mask_t = torch.from_numpy(np.ascontiguousarray(smooth_masks, np.float32)).to(box_dev)
        smooth_frames_tensor(boxes[:, sy, sx], mask_t, method=smooth_method, strength=smooth_strength, fps=gen.fps,
                             progress=None if progress is None else
                             (lambda done, tot: progress(n + done * n // max(tot, 1), 2 * n)))
    if progress is not None:
        progress(2 * n, 2 * n)
    return FaceBoxes(boxes=boxes, rows=rows, cols=cols, warnings=warnings)


def compose_chunks(gen: GeneratedCrops, faces: FaceBoxes, device=None,
                   chunk_frames: int = CHUNK_FRAMES) -> Iterator:
    """uint8 RGB frames [k, H, W, 3] on `device`, chunk by chunk: the reference frames with the face
    boxes written in (rounded like image_to_uint8: clip(x * 255 + 0.5), truncated)."""
    import torch

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    track, idx, n = gen.track, np.asarray(gen.idx, np.int64), len(gen)
    refs = np.unique(idx)
    one_reference = len(refs) == 1  # a photo: one upload, then copies on the device
    base_frame = torch.from_numpy(np.ascontiguousarray(track.frames[refs[0]])).to(dev) if one_reference else None
    rows, cols = faces.rows, faces.cols
    has_box = rows.stop > rows.start and cols.stop > cols.start
    for start in range(0, n, max(1, int(chunk_frames))):
        stop = min(start + chunk_frames, n)
        if one_reference:
            frames = base_frame.expand(stop - start, -1, -1, -1).clone()
        else:
            frames = torch.from_numpy(np.ascontiguousarray(track.frames[idx[start:stop]])).to(dev)
        if has_box:
            frames[:, rows, cols] = (faces.boxes[start:stop].to(dev) * 255.0 + 0.5).clamp_(0, 255).to(torch.uint8)
        yield frames


def render_talking_video(gen: GeneratedCrops, audio: np.ndarray, sample_rate: int, out_path: str | Path, *,
                         smooth_method: str = "one_euro", smooth_strength: float = 0.5, device: str | None = None,
                         fmt: str = "mp4", crf: int | None = None, preset: str | None = None,
                         chunk_frames: int = CHUNK_FRAMES, yuv_on_device: bool | None = None,
                         progress: Callable[[int, int], None] | None = None,
                         should_stop: Callable[[], bool] | None = None) -> TalkingVideoResult:
    """Paste `gen`'s crops into their reference frames, smooth the lower face like TemporalSmooth,
    and encode with `audio` to `out_path` like VideoMux (length_mode pad_audio). device: torch
    device; None = CUDA when available, else CPU. yuv_on_device: convert RGB -> YUV 4:2:0 on `device`
    (None = on a GPU only; else ffmpeg converts). progress(done, total) runs over paste, smoothing
    and encoding; should_stop() -> True aborts (no file is left behind)."""
    import torch

    t0 = time.perf_counter()
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    n = len(gen)
    faces = paste_and_smooth(gen, smooth_method=smooth_method, smooth_strength=smooth_strength, device=dev,
                             chunk_frames=chunk_frames, should_stop=should_stop,
                             progress=None if progress is None else (lambda done, _t: progress(done, 3 * n)))
    timings = {"paste_smooth": time.perf_counter() - t0}

    t1 = time.perf_counter()
    height, width = gen.track.frames.shape[1:3]

    # On a GPU the YUV conversion costs ~0.1 ms a frame and halves the pipe bytes; on a CPU torch's integer
    # version is ~30x slower than ffmpeg's own (SIMD) conversion, so RGB goes to ffmpeg as the nodes send it.
    yuv_here = dev.type == "cuda" if yuv_on_device is None else bool(yuv_on_device)

    def encoder_chunks() -> Iterator[np.ndarray]:
        for frames in compose_chunks(gen, faces, dev, chunk_frames):
            yield rgb_to_yuv420p(frames, "edge").cpu().numpy() if yuv_here else frames.cpu().numpy()

    def encode_progress(done: int, _total: int) -> None:
        if progress is not None:
            progress(2 * n + done, 3 * n)

    prepared = _prefetched(encoder_chunks())
    if yuv_here:  # yuv420p needs even sizes: rgb_to_yuv420p pads odd ones by repeating the edge
        stream = FrameStream(count=n, width=width + width % 2, height=height + height % 2, pix_fmt="yuv420p",
                             chunks=prepared)
    else:  # mux pads odd RGB sizes the same way (pad_mode "edge")
        stream = FrameStream(count=n, width=width, height=height, pix_fmt="rgb24", chunks=prepared)
    try:
        mux = mux_video(stream, audio, int(sample_rate), gen.fps, out_path, fmt=fmt, crf=crf, preset=preset,
                        length_mode="pad_audio", progress=encode_progress, should_stop=should_stop)
    except MuxInterrupted as exc:  # one exception type for every interruption of this function
        raise InterruptedError(f"talking video interrupted while encoding: {exc}") from exc
    finally:
        prepared.close()  # stops the preparing thread if the encoder stopped early
    timings["encode"] = time.perf_counter() - t1
    timings["total"] = time.perf_counter() - t0
    return TalkingVideoResult(path=mux.path, mux=mux, device=str(dev), timings=timings,
                              warnings=list(gen.warnings) + faces.warnings)
