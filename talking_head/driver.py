"""Output-frame driver shared by every talking-head model (`portrait`, `clone`).

The audio sets the clock: output frames = ceil(audio seconds x fps). Each output frame borrows a
reference frame (a photo: always frame 0; a video: mapped by time, then looped / ping-ponged /
held past its end), the model generates that frame's crop, and the crop is pasted back into the
reference frame through the inverse of its affine and a feathered lower-face mask.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol

import numpy as np

from ..vision.faces import FaceTrack, NoFaceError
from ..vision.paste import paste_back_batch

LOOP_MODES = ("loop", "ping-pong", "hold")
_EPS = 1e-6  # seconds x fps products like 3.0000000004 must not add a frame


class AudioInputError(ValueError):
    """The driving audio is missing, silent, or too long."""


@dataclass
class TalkingHeadResult:
    """What a talking-head model returns: full frames uint8 [M, H, W, 3] and the updated DH_FACES."""
    frames: np.ndarray
    track: FaceTrack
    model: str
    backend: str
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    frames_generated: int = 0

    def summary(self) -> str:
        t = ", ".join(f"{k} {v:.2f}s" for k, v in self.timings.items())
        lines = [f"{self.model} ({self.backend}): {self.frames_generated}/{len(self.frames)} frames generated; {t}"]
        return "\n".join(lines + [f"warning: {w}" for w in self.warnings])


class FrameMotion(Protocol):
    """A warp of the finished output frames (a photo's idle motion, head_warp.HeadMotion), the same code on
    the same uint8 pixels on both paths: the node path warps the pasted frames (TRT_TalkingHead's output;
    a TemporalSmooth node after it smooths the moved face with the moved landmarks' masks); the headless
    path pastes and smooths in the photo's own coordinates, exactly as without motion, and warps the
    finished frames (tests/test_idle_motion.py bounds the difference)."""
    region: tuple[slice, slice]  # (rows, cols) of the frame box it may change

    def apply(self, frames: np.ndarray, start: int, origin: tuple[int, int] = (0, 0)) -> np.ndarray: ...

    def move_landmarks(self, landmarks: np.ndarray, start: int) -> np.ndarray: ...


@dataclass
class GeneratedCrops:
    """A model's work before paste-back: one generated crop per output frame, plus what pasting it
    needs. The node path pastes on the CPU (`paste_generated`); the headless video path
    (render_video) pastes on the GPU straight into the encoder's frames."""
    track: FaceTrack                  # the reference faces (DH_FACES input)
    idx: np.ndarray                   # int64 [M] reference frame of each output frame
    fps: float                        # output clock
    crops: np.ndarray | None          # uint8 [M, S, S, 3] generated crops at track.crop_size (None: see render)
    masks: dict[int, np.ndarray]      # crop-space paste mask [S, S] per reference frame used (or see mask_of)
    model: str
    backend: str
    landmarks: np.ndarray | None = None  # [M, 468, 3] source-px landmarks of the output; None = the reference's
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # Streaming (bounded memory, DESIGN 5c): instead of `crops`/`landmarks`/`masks` for every frame,
    # render(start, stop) -> (crops [k, S, S, 3], landmarks [k, 468, 3] or None) makes output frames
    # start..stop-1 when they are needed, and mask_of(r) gives reference frame r's paste mask.
    render: Callable[[int, int], tuple[np.ndarray, np.ndarray | None]] | None = None
    mask_of: Callable[[int], np.ndarray] | None = None
    # applied to the pasted frames of output frames start.. (uint8, a box holding motion.region); `landmarks`
    # and render()'s stay the model's own (the photo's coordinates): output_track moves them. None: the pasted
    # frames are the output.
    motion: FrameMotion | None = None
    # what a model says about its run for the reports (portrait: whether its mouth bank ran, on how many frames)
    notes: dict[str, Any] = field(default_factory=dict)
    # False: render() never returns output landmarks (the reference's are used), so the headless path may make
    # the smoothing masks before the crops arrive (MuseTalk)
    renders_landmarks: bool = True
    # a content key of this reference's paste masks as a function of each reference frame's content and crop
    # transform (e.g. the video file's bytes and the mask source), or None: the headless path then keeps the
    # paste region and the reference smoothing masks between requests under it (with the frames' transforms
    # and landmarks added to the key); None keeps nothing
    avatar_key: str | None = None

    def __len__(self) -> int:
        return len(self.idx)

    @property
    def streaming(self) -> bool:
        return self.crops is None

    def chunk(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray | None]:
        """(crops, output landmarks or None = the reference's) of output frames start..stop-1."""
        if self.crops is not None:
            return self.crops[start:stop], None if self.landmarks is None else self.landmarks[start:stop]
        return self.render(start, stop)

    def mask(self, r: int) -> np.ndarray:
        return self.masks[int(r)] if self.mask_of is None else self.mask_of(int(r))

    def mask_stack(self, start: int, stop: int) -> np.ndarray:
        return np.stack([self.mask(int(r)) for r in self.idx[start:stop]])

    def materialized(self, progress: Callable[[int, int], None] | None = None,
                     should_stop: Callable[[], bool] | None = None, batch: int = 64) -> "GeneratedCrops":
        """The same result with every crop in memory (the ComfyUI node path's convention)."""
        if not self.streaming:
            return self
        n, size = len(self), self.track.crop_size
        crops = np.empty((n, size, size, 3), np.uint8)
        landmarks = None
        for start in range(0, n, batch):
            if should_stop is not None and should_stop():
                raise InterruptedError(f"{self.model} talking head interrupted after {start} of {n} frames")
            stop = min(start + batch, n)
            crops[start:stop], lms = self.render(start, stop)
            if lms is not None:
                if landmarks is None:
                    landmarks = np.asarray(self.track.landmarks[self.idx], np.float32).copy()
                landmarks[start:stop] = lms
            if progress is not None:
                progress(stop, n)
        masks = {int(r): self.mask(int(r)) for r in np.unique(self.idx)}
        return replace(self, crops=crops, landmarks=landmarks, masks=masks, render=None, mask_of=None)

    def finished(self, streaming: bool, progress: Callable[[int, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, batch: int = 64,
                 timing: str = "generate") -> "GeneratedCrops":
        """What a model returns: itself when `streaming` (crops made while the video renders), else every
        crop made now (materialized), the time that took recorded under timings[timing]."""
        if streaming:
            return self
        t0 = time.perf_counter()
        gen = self.materialized(progress=progress, should_stop=should_stop, batch=batch)
        return replace(gen, timings={**gen.timings, timing: time.perf_counter() - t0})

    def output_track(self, frames: np.ndarray) -> FaceTrack:
        """The DH_FACES of the output: the scheduled reference arrays with `frames` (the pasted output),
        the generated crops and the output landmarks (moved by the frames' motion, if any)."""
        lms = None if self.landmarks is None else np.asarray(self.landmarks, np.float32)
        if self.motion is not None:
            base = np.asarray(self.track.landmarks[self.idx], np.float32) if lms is None else lms
            lms = self.motion.move_landmarks(base, 0)
        sched = schedule_track(self.track, self.idx, self.fps, frames=frames, crops=self.crops, landmarks=lms)
        return replace(sched, warnings=list(sched.warnings) + self.warnings)


@dataclass
class GeneratedFrames:
    """A whole-frame model's work (contract kind "whole-frame"): whole output frames on the output clock, made on
    demand by render(start, stop) -> uint8 [k, H, W, 3]. `to_output`: the affine [2, 3] from the reference's
    pixels to the output's (identity when the model pasted its frames back into the photo), so the output's
    DH_FACES carries the reference's landmarks in output coordinates (held still: the head moves)."""
    track: FaceTrack
    fps: float
    count: int
    size: tuple[int, int]               # (height, width) of every output frame
    render: Callable[[int, int], np.ndarray]
    model: str
    backend: str
    to_output: np.ndarray = field(default_factory=lambda: np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    kind: str = "whole-frame"

    def __len__(self) -> int:
        return self.count

    def chunk(self, start: int, stop: int) -> np.ndarray:
        return self.render(start, stop)

    def output_track(self, frames: np.ndarray) -> FaceTrack:
        """The output's DH_FACES: the reference face's landmarks, boxes and crop transforms moved into the output
        frames' coordinates (run FaceAlign on the output for tracked ones)."""
        idx = np.zeros(len(frames), np.int64)
        a = np.vstack([np.asarray(self.to_output, np.float64), [0.0, 0.0, 1.0]])
        lms = np.asarray(self.track.landmarks[idx], np.float32).copy()
        lms[..., :2] = lms[..., :2] @ a[:2, :2].T.astype(np.float32) + a[:2, 2].astype(np.float32)
        lms[..., 2] *= float(np.sqrt(abs(np.linalg.det(a[:2, :2]))))
        inv = np.linalg.inv(a)
        affines = np.asarray(self.track.affines[idx], np.float64) @ inv  # [k, 2, 3] @ [3, 3]
        boxes = np.concatenate([lms[:, :, :2].min(1), lms[:, :, :2].max(1)], 1)
        sched = schedule_track(self.track, idx, self.fps, frames=frames, landmarks=lms)
        warnings = list(sched.warnings) + self.warnings + [
            f"{self.model} moves the whole head: the output's landmarks are the reference's, held still (run "
            "FaceAlign on the output for tracked ones)"]
        return replace(sched, affines=affines.astype(sched.affines.dtype), boxes=boxes.astype(sched.boxes.dtype),
                       warnings=warnings)


def paste_whole_frames(photo: np.ndarray, frames: np.ndarray, box: tuple[int, int, int, int],
                       feather: float = 0.06) -> np.ndarray:
    """A whole-frame model's crops [k, h, w, 3] resized into `box` (x0, y0, x1, y1, inside the photo) of copies
    of `photo`, their border blended over `feather` of the box's side (seamless where that border is background
    the model kept still; sides on the photo's own edge need no blend)."""
    import cv2

    x0, y0, x1, y1 = box
    bw, bh = x1 - x0, y1 - y0
    height, width = photo.shape[:2]
    ramp = max(1.0, feather * min(bw, bh))
    big = float(max(bw, bh))
    yy, xx = np.mgrid[0:bh, 0:bw].astype(np.float32)
    left = xx + 0.5 if x0 > 0 else np.full_like(xx, big)
    right = bw - xx - 0.5 if x1 < width else np.full_like(xx, big)
    top = yy + 0.5 if y0 > 0 else np.full_like(yy, big)
    bottom = bh - yy - 0.5 if y1 < height else np.full_like(yy, big)
    alpha = np.clip(np.minimum(np.minimum(left, right), np.minimum(top, bottom)) / ramp, 0.0, 1.0)[..., None]
    out = np.repeat(photo[None], len(frames), axis=0)
    for k, f in enumerate(frames):
        interp = cv2.INTER_AREA if bw < f.shape[1] else cv2.INTER_CUBIC
        resized = cv2.resize(np.ascontiguousarray(f), (bw, bh), interpolation=interp).astype(np.float32)
        region = out[k, y0:y1, x0:x1].astype(np.float32)
        out[k, y0:y1, x0:x1] = np.clip(region + alpha * (resized - region) + 0.5, 0, 255).astype(np.uint8)
    return out


def _whole_frames_result(gen: GeneratedFrames, batch_size: int, progress, should_stop, t0: float) -> TalkingHeadResult:
    """TalkingHeadResult of a whole-frame model: its frames as they are, made batch by batch."""
    n = len(gen)
    frames = np.empty((n, *gen.size, 3), np.uint8)
    for start in range(0, n, max(1, batch_size)):
        if should_stop is not None and should_stop():
            raise InterruptedError(f"{gen.model} talking head interrupted after {start} of {n} frames")
        stop = min(start + batch_size, n)
        frames[start:stop] = gen.chunk(start, stop)
        if progress is not None:
            progress(stop, n)
    timings = dict(gen.timings, frames=time.perf_counter() - t0)
    timings["total"] = sum(v for k, v in timings.items() if k != "total")
    return TalkingHeadResult(frames=frames, track=gen.output_track(frames), model=gen.model, backend=gen.backend,
                             timings=timings, warnings=list(gen.warnings), frames_generated=n)


def paste_generated(gen: "GeneratedCrops | GeneratedFrames", batch_size: int = 32, progress: Callable[[int, int], None] | None = None,
                    should_stop: Callable[[], bool] | None = None) -> TalkingHeadResult:
    """Paste every generated crop into a copy of its reference frame on the CPU (frames on threads); a
    whole-frame model's frames (GeneratedFrames) are taken as they are."""
    t0 = time.perf_counter()
    if isinstance(gen, GeneratedFrames):
        return _whole_frames_result(gen, batch_size, progress, should_stop, t0)
    gen = gen.materialized(should_stop=should_stop)
    n = len(gen)
    frames = gen.track.frames[gen.idx]  # the output, pasted in place batch by batch
    affines = gen.track.affines[gen.idx]
    for start in range(0, n, max(1, batch_size)):
        if should_stop is not None and should_stop():
            raise InterruptedError(f"{gen.model} talking head interrupted after {start} of {n} frames (pasting)")
        stop = min(start + batch_size, n)
        # no colour matching: the models keep the reference's colours themselves (and the headless
        # path's GPU paste-back does the same blend)
        frames[start:stop] = paste_back_batch(frames[start:stop], gen.crops[start:stop], affines[start:stop],
                                              gen.mask_stack(start, stop), color_match=False, keep_detail=False)
        if gen.motion is not None:
            frames[start:stop] = gen.motion.apply(frames[start:stop], start)
        if progress is not None:
            progress(stop, n)
    timings = dict(gen.timings, paste=time.perf_counter() - t0)
    timings["total"] = sum(v for k, v in timings.items() if k != "total")
    return TalkingHeadResult(frames=frames, track=gen.output_track(frames), model=gen.model, backend=gen.backend,
                             timings=timings, warnings=list(gen.warnings), frames_generated=n)


def phase_progress(progress: Callable[[int, int], None] | None, phase: int, phases: int = 2):
    """progress(done, n) of one phase of `phases` equal phases -> the caller's progress over all of them."""
    if progress is None:
        return None
    return lambda done, n: progress(phase * n + done, phases * n)


# --- clock ---------------------------------------------------------------------------------------
def output_frame_count(audio_seconds: float, fps: float) -> int:
    """ceil(audio_seconds x fps), tolerant of float error (10 s at 30 fps is 300 frames, not 301)."""
    if not fps > 0:
        raise ValueError(f"fps must be > 0, got {fps}")
    if not audio_seconds >= 0:
        raise ValueError(f"audio_seconds must be >= 0, got {audio_seconds}")
    return int(math.ceil(audio_seconds * fps - _EPS))


def frame_schedule(n_ref: int, n_out: int, mode: str = "ping-pong", src_fps: float | None = None,
                   out_fps: float | None = None) -> np.ndarray:
    """int64 [n_out] reference-frame index for each output frame.

    Output frame i (time i / out_fps) takes the reference frame shown at that time
    (floor(t x src_fps)); past the end of the reference: "loop" starts again, "ping-pong" plays
    backwards and forwards (no repeated end frame, so no stall), "hold" freezes the last frame.
    A photo (n_ref = 1) is always frame 0."""
    if mode not in LOOP_MODES:
        raise ValueError(f"loop mode must be one of {', '.join(LOOP_MODES)}, got {mode!r}")
    if n_ref < 1:
        raise ValueError(f"the reference needs at least one frame, got n_ref={n_ref}")
    if n_out < 0:
        raise ValueError(f"n_out must be >= 0, got {n_out}")
    if n_ref == 1:
        return np.zeros(n_out, np.int64)
    i = np.arange(n_out, dtype=np.float64)
    if src_fps and out_fps and src_fps > 0 and out_fps > 0:
        pos = np.floor(i * (float(src_fps) / float(out_fps)) + 1e-6).astype(np.int64)
    else:
        pos = i.astype(np.int64)
    if mode == "loop":
        return pos % n_ref
    if mode == "hold":
        return np.minimum(pos, n_ref - 1)
    period = 2 * n_ref - 2
    q = pos % period
    return np.where(q < n_ref, q, period - q).astype(np.int64)


def schedule_track(track: FaceTrack, indices: np.ndarray, fps: float | None = None,
                   frames: np.ndarray | None = None, crops: np.ndarray | None = None,
                   landmarks: np.ndarray | None = None) -> FaceTrack:
    """A FaceTrack whose per-frame arrays follow `indices` (frames are views-by-copy of the
    reference frames; memory grows with the output length). `fps`: the output clock. `frames`,
    `crops`, `landmarks`: use these (already per output frame) instead of copying the reference's."""
    idx = np.asarray(indices, np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= len(track)):
        raise ValueError(f"schedule indices must be in 0..{len(track) - 1}, got {idx.min()}..{idx.max()}")
    return replace(track, frames=track.frames[idx] if frames is None else frames, fps=float(fps or track.fps),
                   found=track.found[idx], boxes=track.boxes[idx],
                   landmarks=track.landmarks[idx] if landmarks is None else landmarks, affines=track.affines[idx],
                   presence=track.presence[idx], crops=track.crops[idx] if crops is None else crops,
                   warnings=list(track.warnings), scene_cuts=[],
                   interpolated_count=int(np.count_nonzero(~track.found[idx])))


def render_frames(track_sched: FaceTrack, generated_crops: np.ndarray, masks: np.ndarray, *,
                  color_match: bool = False, keep_detail: bool = False,
                  progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """Paste generated crops [M, S, S, 3] into the scheduled frames through their inverse affines
    and `masks` ([M, S, S] or one [S, S]); uint8 [M, H, W, 3]."""
    if len(generated_crops) != len(track_sched):
        raise ValueError(f"{len(generated_crops)} generated crops for {len(track_sched)} scheduled frames")
    s = track_sched.crop_size
    if generated_crops.shape[1:] != (s, s, 3):
        raise ValueError(f"generated crops must be [M, {s}, {s}, 3] like the track's crops, "
                         f"got {generated_crops.shape}")
    return paste_back_batch(track_sched.frames, generated_crops, track_sched.affines, masks,
                            color_match=color_match, keep_detail=keep_detail, progress=progress)


def reference_warnings(track: FaceTrack, idx: np.ndarray, n_out: int, fps: float, loop_mode: str,
                       lost_detail: str | None = "") -> list[str]:
    """What every model says about its schedule: reference frames used that had no detected face
    (lost_detail: appended to that warning; None = the model does not warn about it) and audio longer
    than the reference video (frames looped / ping-ponged / held)."""
    warnings: list[str] = []
    lost = int(np.count_nonzero(~track.found[np.unique(idx)]))
    if lost and lost_detail is not None:
        warnings.append(f"{lost} reference frame(s) used have no detected face (interpolated landmarks){lost_detail}")
    if len(track) > 1 and n_out > len(track) * fps / max(track.fps, 1e-6) + 1:
        warnings.append(f"audio ({n_out / fps:.1f} s) is longer than the reference video "
                        f"({len(track) / track.fps:.1f} s); reference frames are {loop_mode}ed")
    return warnings


# --- input checks ----------------------------------------------------------------------------------
def validate_audio(audio: np.ndarray, sample_rate: int, max_seconds: float = 600.0,
                   name: str = "audio") -> np.ndarray:
    """Mono float32 [T] from [T], [C, T] or [B, C, T]; raises AudioInputError when empty, silent or
    longer than max_seconds."""
    if audio is None:
        raise AudioInputError(f"no {name} given; connect the speech AUDIO (e.g. TRT_TTS output)")
    a = np.asarray(audio, np.float32)
    while a.ndim > 1:  # [B, C, T] / [C, T] -> mono (first batch item, channel mean)
        a = a[0] if a.ndim == 3 else a.mean(0)
    if not sample_rate or sample_rate <= 0:
        raise AudioInputError(f"{name} has no valid sample rate ({sample_rate})")
    if a.size == 0:
        raise AudioInputError(f"{name} is empty (0 samples); give speech audio to drive the mouth")
    if not np.isfinite(a).all():
        raise AudioInputError(f"{name} contains NaN/inf samples; re-decode or regenerate it")
    seconds = a.size / float(sample_rate)
    if seconds > max_seconds:
        raise AudioInputError(f"{name} is {seconds:.0f} s; the maximum is {max_seconds:g} s: raise "
                              "max_audio_seconds or split the text")
    if float(np.abs(a).max()) < 1e-4 or float(np.sqrt(np.mean(a.astype(np.float64) ** 2))) < 1e-5:
        raise AudioInputError(f"{name} is silent (peak {float(np.abs(a).max()):.1e}); give speech audio, "
                              "check the TTS output or the input file's volume")
    return a


def validate_track(track: FaceTrack, name: str = "faces") -> None:
    """Raise NoFaceError when the DH_FACES input has no frame with a found face."""
    if track is None or len(track) == 0:
        raise NoFaceError(f"{name} is empty; run FaceAlign on a photo or video first")
    if not np.asarray(track.found).any():
        raise NoFaceError(f"{name} has no frame with a found face; use FaceAlign on a photo/video with a "
                          "visible frontal face")
