"""Frames of a photo or video that are decoded when they are used, never all at once.

`VideoFrames` looks like a uint8 array [N, H, W, 3] (len, shape, indexing with an int, a slice
or an index array, optionally followed by row/column slices), so the face tracker, the
talking-head models and the video renderer read a 5-minute 1080p reference exactly as they read
a short in-memory clip, while at most `cache_bytes` of decoded frames are held. Frames come from
ffmpeg processes that read forward, up to MAX_DECODERS of them: the renderer's passes (the model's
crops, the paste-back, the composition after the smoother's lookahead) read the same frames tens of
frames apart, more than the cache holds at 1080p, and each keeps its own decoder moving forward
instead of restarting one with a seek (which decodes again from the key frame before) at every switch.
A jump backwards (a ping-pong schedule, a loop) starts a decoder with an accurate seek. `load_face_frames` is the single entry point for "a photo or a video
file, at most `max_side` px on its longest side".

Decoded frames are also kept between requests (KEPT_FRAMES_BYTES, process-wide, least recently used first out)
under the file's content (BLAKE2b of its bytes), the decoded size and the frame index: a service asked again and
again to lip-sync new speech onto the same reference video (MuseTalk's and Wav2Lip's "repeat request") then
decodes nothing - every request opens the file anew, and decoding 10 s of 512x512 H.264 to RGB is ~0.3 s of a
reader's time on an H200 host, in the renderer's paste thread. A replaced file has other bytes: a miss.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from .ffmpeg_tools import base_args, drain_stderr, passthrough_args, stderr_tail
from .kept_arrays import KeptArrays
from .probe import ProbeError, _read_exact, probe_media

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
DEFAULT_MAX_SIDE = 1920  # output at source size up to this (DESIGN 5c)
CACHE_BYTES = 192 * 2**20  # decoded frames kept for reuse (the renderer re-reads recent ones)
SEEK_AHEAD_FRAMES = 96  # a forward jump up to this many frames is read through, not sought
MAX_DECODERS = 3  # forward readers kept decoding at once (one ffmpeg process each, the least recently used stopped)
# decoded frames kept between VideoFrames objects of the same file (all of them together, at most this many bytes:
# 256 MiB holds 10.9 s of 512x512 at 25 fps, 4.3 s of 1280x720); DIGITAL_HUMAN_KEPT_FRAMES_MB=0 keeps none
KEPT_FRAMES_BYTES = int(float(os.environ.get("DIGITAL_HUMAN_KEPT_FRAMES_MB", "256")) * 2**20)
_DIGEST_BLOCK = 8 * 2**20


# the limit is read at every put (tests and DIGITAL_HUMAN_KEPT_FRAMES_MB change it)
_KEPT = KeptArrays(lambda: KEPT_FRAMES_BYTES)


def clear_kept_frames() -> None:
    """Forget the decoded frames kept between requests."""
    _KEPT.clear()


def kept_frames_bytes() -> int:
    """Bytes of decoded frames kept between requests now."""
    return _KEPT.bytes


def file_digest(path: str | Path) -> str:
    """BLAKE2b (20 bytes, hex) of a file's bytes: the content key of a video read from it."""
    h = hashlib.blake2b(digest_size=20)
    with open(path, "rb") as f:
        while block := f.read(_DIGEST_BLOCK):
            h.update(block)
    return h.hexdigest()


def capped_size(width: int, height: int, max_side: int | None) -> tuple[int, int]:
    """(width, height) scaled down so the longest side is at most max_side (None/0 = no cap)."""
    if not max_side or max(width, height) <= max_side:
        return int(width), int(height)
    k = max_side / float(max(width, height))
    return max(1, int(round(width * k))), max(1, int(round(height * k)))


def load_photo(path: str | Path, max_side: int | None = DEFAULT_MAX_SIDE) -> np.ndarray:
    """uint8 [1, H, W, 3] RGB, EXIF orientation applied, downscaled (area filter) to max_side."""
    from PIL import Image, ImageOps

    with Image.open(path) as img:
        img.draft("RGB", capped_size(img.width, img.height, max_side))  # JPEG: decode at 1/2, 1/4, 1/8 when it can
        rgb = ImageOps.exif_transpose(img).convert("RGB")
        size = capped_size(rgb.width, rgb.height, max_side)
        if size != rgb.size:
            rgb = rgb.resize(size, Image.Resampling.BOX if max(rgb.size) >= 2 * max(size) else Image.Resampling.LANCZOS)
        return np.asarray(rgb)[None]


class VideoFrames:
    """A video file's frames as a read-only uint8 array [N, H, W, 3] decoded on demand.

    max_frames: read at most this many; max_side: scale while decoding so the longest side is at
    most this. Reading is sequential-friendly: ascending access costs one decode pass."""

    def __init__(self, path: str | Path, max_frames: int | None = None, max_side: int | None = DEFAULT_MAX_SIDE,
                 cache_bytes: int = CACHE_BYTES):
        info = probe_media(path)
        if not info.has_video or not info.width or not info.height:
            raise ProbeError(f"'{info.path}' has no video stream to read frames from.")
        self.path = Path(info.path)
        self.fps = float(info.fps or 25.0)
        self.source_size = (int(info.width), int(info.height))
        self.width, self.height = capped_size(info.width, info.height, max_side)
        count = int(info.frame_count or 0)
        if max_frames is not None:
            count = min(count, int(max_frames)) if count else int(max_frames)
        if count <= 0:
            raise ProbeError(f"'{info.path}' has no video frames.")
        self._count = count
        self._frame_bytes = self.width * self.height * 3
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._cache_frames = max(4, int(cache_bytes // self._frame_bytes))
        self._decoders: list[_Decoder] = []
        self._reads = 0  # a clock for the decoders' last use
        # the renderer reads from a preparing thread; re-entrant: a decoder that ends early re-reads the last frame
        self._lock = threading.RLock()
        self.decoded = 0  # frames decoded so far (a cost measure for tests and benchmarks)
        self._digest: str | None = None

    def content_digest(self) -> str:
        """BLAKE2b of the file's bytes, computed once per object (vision.content_key uses it too)."""
        if self._digest is None:
            self._digest = file_digest(self.path)
        return self._digest

    def _kept_key(self, t: int) -> tuple | None:
        if KEPT_FRAMES_BYTES <= 0:
            return None
        try:
            return (self.content_digest(), self.width, self.height, t)
        except OSError:  # the file went away: decode as before (the decoder reports it)
            return None

    # --- array protocol --------------------------------------------------------------------
    def __len__(self) -> int:
        return self._count

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self._count, self.height, self.width, 3)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint8)

    @property
    def ndim(self) -> int:
        return 4

    @property
    def nbytes(self) -> int:
        return self._count * self._frame_bytes

    def __getitem__(self, key):
        rest: tuple = ()
        if isinstance(key, tuple):
            key, rest = key[0], key[1:]
        if isinstance(key, (int, np.integer)):
            out = self.frame(int(key))
        else:
            idx = np.arange(self._count)[key] if isinstance(key, slice) else np.asarray(key, np.int64).reshape(-1)
            if rest and all(isinstance(r, slice) for r in rest):
                # rows/columns of each frame (the renderer's face box): only that part is copied, not whole frames
                part = np.empty((self.height, self.width, 3), np.uint8)[rest].shape
                out = np.empty((len(idx), *part), np.uint8)
                for i, t in enumerate(idx):
                    out[i] = self.frame(int(t))[rest]
                return out
            out = np.empty((len(idx), self.height, self.width, 3), np.uint8)
            for i, t in enumerate(idx):
                out[i] = self.frame(int(t))
            rest = (slice(None), *rest)
        return out[rest] if rest else out

    def __array__(self, dtype=None, copy=None):  # np.asarray(frames): whole video, only when asked for
        arr = self[:]
        return arr if dtype is None else arr.astype(dtype)

    # --- decoding ----------------------------------------------------------------------------
    def frame(self, t: int) -> np.ndarray:
        """uint8 [H, W, 3] of frame t (negative counts from the end); a cached read-only array."""
        if t < 0:
            t += self._count
        if not 0 <= t < self._count:
            raise IndexError(f"frame {t} out of range for a video of {self._count} frames")
        with self._lock:
            hit = self._cache.get(t)
            if hit is not None:
                self._cache.move_to_end(t)
                return hit
            kept_key = self._kept_key(t)
            if kept_key is not None and (hit := _KEPT.get(kept_key)) is not None:
                return hit
            dec = self._decoder_for(t)
            while dec.pos <= t:
                buf = np.empty((self.height, self.width, 3), np.uint8)
                if not _read_exact(dec.proc.stdout, buf):
                    self._stop(dec)
                    if dec.pos == 0 or t == dec.pos:
                        raise ProbeError(f"decoding frame {t} of '{self.path}' failed:\n"
                                         f"{stderr_tail(b''.join(dec.err))}")
                    # the container promised more frames than the decoder gives: repeat the last one
                    self._count = dec.pos
                    return self.frame(min(t, self._count - 1))
                buf.flags.writeable = False
                self._remember(dec.pos, buf)
                if kept_key is not None:
                    _KEPT.put(kept_key[:3] + (dec.pos,), buf)
                dec.pos += 1
                self.decoded += 1
            return self._cache[t]

    def _decoder_for(self, t: int) -> "_Decoder":
        """The decoder closest behind frame t (within SEEK_AHEAD_FRAMES), else a new one (the least recently
        used stopped when MAX_DECODERS run)."""
        self._reads += 1
        behind = [d for d in self._decoders if d.pos <= t <= d.pos + SEEK_AHEAD_FRAMES]
        if behind:
            dec = max(behind, key=lambda d: d.pos)
        else:
            # going backwards (a ping-pong schedule) one frame at a time would seek for every
            # frame: seek to a run of frames before t instead and keep them all
            backwards = any(d.pos > t for d in self._decoders)
            if len(self._decoders) >= MAX_DECODERS:
                self._stop(min(self._decoders, key=lambda d: d.used))
            dec = self._start(max(0, t - self._cache_frames // 2) if backwards else t)
        dec.used = self._reads
        return dec

    def _remember(self, t: int, frame: np.ndarray) -> None:
        self._cache[t] = frame
        self._cache.move_to_end(t)
        while len(self._cache) > self._cache_frames:
            self._cache.popitem(last=False)

    def _start(self, t: int) -> "_Decoder":
        cmd = [*base_args(), "-loglevel", "error"]
        if t > 0:  # accurate seek (ffmpeg decodes from the key frame before, drops frames before the time)
            cmd += ["-ss", f"{max(0.0, (t - 0.5) / self.fps):.6f}"]
        cmd += ["-i", str(self.path), "-map", "0:v:0", "-an", "-sn"]
        if (self.width, self.height) != self.source_size:
            cmd += ["-vf", f"scale={self.width}:{self.height}:flags=area"]
        cmd += ["-frames:v", str(self._count - t), *passthrough_args(), "-f", "rawvideo",
                "-pix_fmt", "rgb24", "pipe:1"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=self._frame_bytes)
        dec = _Decoder(proc, t)
        threading.Thread(target=drain_stderr, args=(proc.stderr, dec.err), daemon=True).start()
        self._decoders.append(dec)
        return dec

    def _stop(self, dec: "_Decoder") -> None:
        self._decoders.remove(dec)
        proc = dec.proc
        try:
            proc.stdout.close()
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def _stop_all(self) -> None:
        for dec in list(self._decoders):
            self._stop(dec)

    def close(self) -> None:
        with self._lock:
            self._stop_all()
            self._cache.clear()

    def __del__(self) -> None:
        try:
            self._stop_all()
        except Exception:  # interpreter shutdown
            pass


class _Decoder:
    """One ffmpeg process of a VideoFrames, delivering frames pos, pos + 1, ... in order."""

    def __init__(self, proc: subprocess.Popen, pos: int) -> None:
        self.proc = proc
        self.pos = pos  # the next frame it will deliver
        self.err: list[bytes] = []
        self.used = 0


def is_photo(path: str | Path) -> bool:
    return Path(path).suffix.lower() in IMAGE_SUFFIXES


def load_face_frames(path: str | Path, max_seconds: float, max_side: int | None = DEFAULT_MAX_SIDE):
    """(frames, fps, source (width, height)) of a photo (an in-memory [1, H, W, 3] array, fps 25) or a
    video (VideoFrames over its first max_seconds, decoded on demand); both capped at max_side."""
    path = Path(path)
    if is_photo(path):
        from PIL import Image

        with Image.open(path) as img:
            source = img.size
        return load_photo(path, max_side), 25.0, source
    info = probe_media(path)
    fps = float(info.fps or 25.0)
    frames = VideoFrames(path, max_frames=max(1, int(max_seconds * fps)), max_side=max_side)
    return frames, fps, frames.source_size
