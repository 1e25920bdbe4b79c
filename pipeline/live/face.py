"""The reference face of a live server, shared by every session: aligned once; idle frames and the frames of
speech pieces, all indexed by the session's media clock (frame k is shown at k / fps).

Why the head motion is applied by the clock (`finish`), not where a speech frame is made: a frame's place on
the clock is known only when it is sent, and the sway and blinks must continue across the border between
idle and speech, so neither the head nor the eyes jump when speech starts or stops. A photo idles with
blinks and sway (idle_motion's figures over a long horizon, read back and forth); a video idles on its own
frames (played back and forth) and speaks over the frames it would have shown.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("digital_human.live")
MOTION_HORIZON_S = 600.0  # idle-motion figures made for this long, then read backwards, then forwards again
SPEECH_CHUNK_FRAMES = 4   # frames per model step: the first frame waits for no more than this many


def _silent(wave: np.ndarray) -> bool:
    """Whether the talking-head models would refuse `wave` as silent (talking_head.driver.validate_audio's test)."""
    a = np.asarray(wave, np.float64)
    return a.size == 0 or float(np.abs(a).max()) < 1e-4 or float(np.sqrt(np.mean(a ** 2))) < 1e-5


def _steps(n: int, first: int, size: int = SPEECH_CHUNK_FRAMES) -> list[tuple[int, int]]:
    """(start, stop) of the model steps over n frames: a first step of `first` frames (1 for a per-frame model:
    the first frame waits for no other), then `size` frames a step (a batched model keeps whole steps)."""
    bounds = [0] + list(range(min(first, n), n, size)) + [n]
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _bounce(k: int, n: int) -> int:
    """Index k of 0,1,..,n-1,n-2,..,1,0,1,.. (a seamless back-and-forth over n items)."""
    if n <= 1:
        return 0
    period = 2 * (n - 1)
    k %= period
    return k if k < n else period - k


def session_motion(fps: float, seed: int = 0, seconds: float = MOTION_HORIZON_S) -> Any:
    """A photo's idle motion (blinks, sway) for `seconds`, made from idle_motion's own building blocks
    with the quiet amplitude (speech-timed nods need the whole utterance's loudness in advance: not live)."""
    from ...talking_head import idle_motion as im

    n = int(round(seconds * fps))
    blink_rng, sway_rng = (np.random.default_rng([int(seed), part]) for part in (1, 2))
    times = np.arange(n) / float(fps)
    shut, lengths = im.blink_schedule(n / float(fps), fps, blink_rng)
    blink = im.blink_curve(times, shut, lengths)
    amp = 0.5 * (1 + im.QUIET_SHARE) * im._smoothstep(times / im.EASE_IN_S)
    tx, ty, roll, scale = (im.smooth_noise(n, im.SWAY_SIGMA_S * fps, sway_rng) for _ in range(4))
    return im.IdleMotion(fps=float(fps), blink=blink.astype(np.float32),
                         roll=np.clip(roll * im.ROLL_STD * amp, -im.ROLL_MAX, im.ROLL_MAX).astype(np.float32),
                         tx=(tx * im.SWAY_TX * amp).astype(np.float32), ty=(ty * im.SWAY_TY * amp).astype(np.float32),
                         scale=(1.0 + scale * im.SCALE_STD * amp).astype(np.float32),
                         blink_times=shut, nod_times=np.zeros(0))


class LiveFace:
    """face file -> aligned once; `idle(k)` and `speech(wave, k0, ...)` frames, `finish(frame, k)` at send time."""

    def __init__(self, face: Path, *, model: str = "portrait", fps: float = 25.0, backend: str = "auto",
                 max_side: int = 512, crop_size: str = "auto", smooth: float = 0.0, idle_motion: bool = True,
                 max_seconds: float = 30.0, seed: int = 0, device: str | None = None,
                 batch_sessions: bool = True, fast_path: bool | None = None) -> None:
        """batch_sessions: the talking-head steps of concurrent sessions run as one batched model call, for the
        models whose generator takes a batch (MuseTalk: engines/call_batcher.py). `portrait` is a per-frame
        warp with no network to batch; its frames are made on each session's own thread. fast_path: the
        model's compiled path where it has one (MuseTalk: its step compiled and replayed from CUDA graphs;
        None = the model's default or its variable)."""
        from ..main_job import StageTimer, _faces_from_file
        from ...talking_head.registry import model_problem

        problem = model_problem(model)
        if problem:
            raise ValueError(f"--model {model}: {problem}")
        self.model, self.fps, self.backend, self.smooth, self.device = model, float(fps), backend, smooth, device
        self.fast_path = fast_path
        self.track, _, self.report = _faces_from_file(StageTimer(), Path(face), self.fps, backend, max_seconds,
                                                      max_side or None, None, 0, model, crop_size)
        self.photo = len(self.track) == 1
        self.height, self.width = (int(v) for v in self.track.frames.shape[1:3])
        self._first = np.ascontiguousarray(np.asarray(self.track.frames[0]))
        self.motion = None
        if self.photo and idle_motion:
            from ...talking_head.head_warp import HeadMotion

            self._motion_track = session_motion(self.fps, seed)
            self.motion = HeadMotion(self.track.landmarks[0], self._first, self._motion_track)
        self._frames_lock = threading.Lock()  # a video's frames are decoded on demand by one reader
        self.batched = False
        if batch_sessions and model.partition(":")[0] == "musetalk":
            from ...engines.musetalk.pipeline import share_batches_in_process

            share_batches_in_process()
            self.batched = True
        # MuseTalk on a photo: its box, paste mask and reference latents made once here, not for every piece
        self._stream = self._paste = None
        if model == "musetalk" and self.photo and smooth <= 0:
            from ...talking_head.musetalk.stream import PhotoStream

            self._stream = PhotoStream(self.track, self.fps, backend=backend, compile=fast_path)
            self._paste = self._photo_paste(self._stream.mask)

    @property
    def cuda_device(self) -> str | None:
        """The CUDA device the talking head's work runs on ("cuda", "cuda:1"), or None on the CPU: a session's face
        stage queues its work on a stream of its own there (session.Session._stage_stream). MuseTalk on a photo:
        its pipeline's device; other models pick their device when they run (CUDA when torch can use it), and
        the portrait warp without smoothing runs on the host. Loads nothing."""
        from ...engines.cuda_streams import cuda_device_name

        if self._stream is not None:
            return cuda_device_name(self._stream.pipe.device)
        if self.model == "portrait" and self.smooth <= 0:
            return None
        if self.device is not None:
            return cuda_device_name(self.device)
        from ...engines.devices import torch_cuda_usable

        return "cuda" if torch_cuda_usable() else None

    def warm(self, wave: np.ndarray, rate: int) -> None:
        """Make the frames of one piece once: the model's first call sets itself up (seconds on a CPU)."""
        wave = np.concatenate([wave, np.zeros(-len(wave) % int(round(rate / self.fps)), np.float32)])
        for _ in self.speech(wave, rate, 0):
            pass

    def reference_index(self, k: int) -> int:
        return _bounce(k, len(self.track))

    def idle(self, k: int) -> np.ndarray:
        """Frame k of the idle avatar before `finish` (the photo, or the video's own frame)."""
        if self.photo:
            return self._first.copy()
        with self._frames_lock:
            return np.array(self.track.frames[self.reference_index(k)], np.uint8, copy=True)

    def finish(self, frame: np.ndarray, k: int) -> np.ndarray:
        """Frame k as shown: the photo's head motion at clock frame k (in place)."""
        if self.motion is not None:
            self.motion.apply(frame[None], _bounce(k, len(self._motion_track)))
        return frame

    def _photo_paste(self, crop_mask: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        """crop -> pasted photo frame, for a photo: the paste mask's frame-space alpha and box are made once per
        piece (once per server for MuseTalk's PhotoStream), each frame costs one small warp and a blend
        (paste_back without its per-frame colour match: the model draws on the photo's own crop, so the colours
        are the photo's)."""
        from ...vision.align import warp_image
        from ...vision.faces import invert_affines
        from ...vision.paste import footprint_box, mask_bbox

        affine = np.asarray(self.track.affines[0], np.float64).reshape(2, 3)
        mask = np.asarray(crop_mask, np.float32)
        bbox = mask_bbox(mask)
        photo = self._first
        if bbox is None:
            return lambda crop: photo.copy()
        x0, y0, x1, y1 = footprint_box(affine, bbox, self.height, self.width)
        inv = invert_affines(affine)
        alpha = np.clip(warp_image(mask, inv, x1 - x0, y1 - y0, border="zero", origin=(x0, y0)), 0, 1)[..., None]
        roi = photo[y0:y1, x0:x1].astype(np.float32)

        def paste(crop: np.ndarray) -> np.ndarray:
            content = warp_image(np.asarray(crop, np.float32), inv, x1 - x0, y1 - y0, border="replicate",
                                 origin=(x0, y0))
            out = photo.copy()
            out[y0:y1, x0:x1] = np.clip(np.rint(roi + alpha * (content - roi)), 0, 255).astype(np.uint8)
            return out
        return paste

    def speech(self, wave: np.ndarray, rate: int, k0: int, *, phones: Any = None,
               should_stop: Callable[[], bool] | None = None) -> Iterator[np.ndarray]:
        """uint8 [H, W, 3] frames of `wave` (a whole number of frames long), one per clock frame from k0 (an
        estimate of where it will be shown: a video's frames are taken from there), made a few at a time."""
        from ...talking_head.registry import generate_crops
        from ...talking_head.render_video import iter_video_frames

        n = int(round(len(wave) * self.fps / rate))
        if _silent(wave):  # a pause between sentences: the models refuse silent audio; the idle face, mouth closed
            for j in range(n):
                if should_stop is not None and should_stop():
                    return
                yield self.idle(k0 + j)
            return
        if self._stream is not None:  # MuseTalk on the photo, prepared once
            for crops in self._stream.crops(wave, rate, first=SPEECH_CHUNK_FRAMES, step=SPEECH_CHUNK_FRAMES,
                                            max_audio_seconds=max(600.0, math.ceil(len(wave) / rate) + 1),
                                            should_stop=should_stop):
                if should_stop is not None and should_stop():
                    return
                for crop in crops:
                    yield self._paste(crop)
            return
        track = self.track
        if not self.photo:  # the reference frames the idle video would have shown, in order
            with self._frames_lock:
                track = dataclasses.replace(self.track.subset([self.reference_index(k0 + j) for j in range(n)]),
                                            fps=self.fps)
        gen = generate_crops(track, wave, rate, self.model, self.fps, loop_mode="hold", streaming=True,
                             backend=self.backend, max_audio_seconds=max(600.0, math.ceil(len(wave) / rate) + 1),
                             phones=phones, should_stop=should_stop, fast_path=self.fast_path)
        if self.photo and self.smooth <= 0:  # the fast path: no smoothing window, one reference frame
            paste = self._photo_paste(gen.mask(0))
            for start, stop in _steps(len(gen), first=SPEECH_CHUNK_FRAMES if self.batched else 1):
                if should_stop is not None and should_stop():
                    return
                crops, _ = gen.chunk(start, stop)
                for crop in crops:
                    yield paste(crop)
            return
        chunks = iter_video_frames(gen, smooth_strength=self.smooth, device=self.device,
                                   chunk_frames=SPEECH_CHUNK_FRAMES, should_stop=should_stop)
        try:
            for chunk in chunks:
                for frame in np.asarray(chunk.cpu() if hasattr(chunk, "cpu") else chunk, np.uint8):
                    yield frame
        except InterruptedError:
            return
        finally:
            chunks.close()
