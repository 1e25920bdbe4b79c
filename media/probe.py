"""Probe and decode media files with the bundled ffmpeg (imageio-ffmpeg ships no ffprobe).

Stream facts come from one demux pass: `ffmpeg -i FILE -c copy -f framecrc -` lists every packet
of the first video and first audio stream with its pts and duration in the stream time base, so
frame counts and per-stream durations are exact (no decoding, no rounded header values). The
pixel format and rotation come from the input description that the same command prints on stderr.
"""
from __future__ import annotations

import re
import subprocess
import threading
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np

from .ffmpeg_tools import base_args, drain_stderr, passthrough_args, stderr_tail

_NOPTS = -(2**63)

# Decoded channel count for the layout names ffmpeg prints (others: "N channels").
_LAYOUT_CHANNELS = {
    "mono": 1, "stereo": 2, "2.1": 3, "3.0": 3, "3.0(back)": 3, "4.0": 4, "quad": 4, "quad(side)": 4,
    "3.1": 4, "5.0": 5, "5.0(side)": 5, "4.1": 5, "5.1": 6, "5.1(side)": 6, "6.0": 6, "6.1": 7,
    "7.0": 7, "7.1": 8, "7.1(wide)": 8, "downmix": 2,
}


class ProbeError(ValueError):
    """The file could not be read as media."""


@dataclass
class MediaProbe:
    """What a media file contains. Durations/starts are seconds; None where the stream is absent."""

    path: Path
    container: str = ""
    video_codec: str | None = None
    pix_fmt: str | None = None
    width: int | None = None  # as displayed (rotation applied), i.e. what decoding returns
    height: int | None = None
    rotation: int = 0  # degrees from the display matrix; decoding auto-rotates
    fps: float | None = None  # frames / video duration (exact for constant frame rate)
    frame_count: int | None = None
    video_start: float | None = None
    video_duration: float | None = None
    audio_codec: str | None = None
    sample_rate: int | None = None
    channels: int | None = None
    audio_start: float | None = None
    audio_duration: float | None = None
    header: str = field(default="", repr=False)  # ffmpeg's input description, for debugging

    @property
    def has_video(self) -> bool:
        return self.frame_count is not None and self.frame_count > 0

    @property
    def has_audio(self) -> bool:
        return self.audio_duration is not None

    @property
    def av_gap_seconds(self) -> float | None:
        """|video duration - audio duration|, or None without both streams."""
        if self.video_duration is None or self.audio_duration is None:
            return None
        return abs(self.video_duration - self.audio_duration)


@dataclass
class _StreamPackets:
    media_type: str = ""
    codec: str = ""
    time_base: Fraction = Fraction(1, 1)
    dimensions: tuple[int, int] | None = None
    sample_rate: int | None = None
    layout: str | None = None
    pts: list[int] = field(default_factory=list)
    durations: list[int] = field(default_factory=list)


def _require_file(path: str | Path) -> Path:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"media file '{p}' does not exist (check the path/filename input).")
    return p


def _split_top_level(text: str) -> list[str]:
    """Split an ffmpeg stream description on commas that are not inside parentheses."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


def _parse_framecrc(text: str) -> dict[int, _StreamPackets]:
    streams: dict[int, _StreamPackets] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            m = re.match(r"#(\w+) (\d+): (.*)$", line)
            if not m:
                continue
            key, idx, val = m.group(1), int(m.group(2)), m.group(3).strip()
            st = streams.setdefault(idx, _StreamPackets())
            if key == "tb":
                num, den = val.split("/")
                st.time_base = Fraction(int(num), int(den))
            elif key == "media_type":
                st.media_type = val
            elif key == "codec_id":
                st.codec = val
            elif key == "dimensions":
                w, h = val.split("x")
                st.dimensions = (int(w), int(h))
            elif key == "sample_rate":
                st.sample_rate = int(val)
            elif key == "channel_layout_name":
                st.layout = val
            continue
        fields = line.split(",", 5)
        if len(fields) < 5:
            continue
        try:
            idx, dts, pts, dur = (int(f) for f in fields[:4])
        except ValueError:
            continue
        st = streams.setdefault(idx, _StreamPackets())
        st.pts.append(pts if pts != _NOPTS else dts)
        st.durations.append(max(dur, 0))
    return streams


def _span_seconds(st: _StreamPackets, clamp_start_at_zero: bool) -> tuple[float, float]:
    """(start, duration) of a stream from its packets' presentation times."""
    pts = np.asarray([p for p in st.pts if p != _NOPTS], dtype=np.int64)
    durs = np.asarray(st.durations, dtype=np.int64)[: len(pts)]
    if len(pts) == 0:
        return 0.0, 0.0
    if np.any(durs == 0) and len(pts) > 1:
        # Some containers (e.g. Matroska video) store no per-packet duration: use the typical step.
        step = int(np.median(np.diff(np.sort(pts)))) or 1
        durs = np.where(durs == 0, step, durs)
    start = int(pts.min())
    if clamp_start_at_zero:
        # AAC/Opus priming packets sit before 0 and are discarded on decode (edit list / skip samples).
        start = max(start, 0)
    end = int((pts + durs).max())
    tb = st.time_base
    return float(start * tb), float(max(end - start, 0) * tb)


def _parse_input_header(stderr: str) -> tuple[str, str | None, str | None, int, str | None]:
    """(container, video stream line, audio stream line, rotation, input header) from `ffmpeg -i`."""
    header_lines = []
    for line in stderr.splitlines():
        if line.startswith(("Stream mapping:", "Output #")):
            break
        header_lines.append(line)
    header = "\n".join(header_lines)
    m = re.search(r"^Input #0, ([^\n]*?), from ", header, flags=re.M)
    container = m.group(1) if m else ""
    video = re.search(r"Stream #0:\d+[^:]*: Video: (.*)$", header, flags=re.M)
    audio = re.search(r"Stream #0:\d+[^:]*: Audio: (.*)$", header, flags=re.M)
    rotation = 0
    if video:
        # Side data of the first video stream follows its Stream line.
        after = header[video.end(): video.end() + 2000]
        nxt = re.search(r"Stream #0:", after)
        block = after[: nxt.start()] if nxt else after
        r = re.search(r"rotation of (-?[\d.]+) degrees", block)
        if r:
            rotation = int(round(float(r.group(1)))) % 360
    return container, video.group(1) if video else None, audio.group(1) if audio else None, rotation, header


def probe_media(path: str | Path, *, timeout: float = 120.0) -> MediaProbe:
    """Codecs, sizes, frame count and per-stream start/duration of the first video and audio stream."""
    p = _require_file(path)
    cmd = [*base_args(), "-copyts", "-i", str(p), "-map", "0:v:0?", "-map", "0:a:0?",
           "-c", "copy", "-f", "framecrc", "pipe:1"]
    proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
    stderr = proc.stderr.decode("utf-8", errors="replace")
    if proc.returncode != 0:
        raise ProbeError(f"could not read '{p}' as audio/video (is it a media file?):\n{stderr_tail(stderr)}")
    container, vline, aline, rotation, header = _parse_input_header(stderr)
    streams = _parse_framecrc(proc.stdout.decode("utf-8", errors="replace"))
    info = MediaProbe(path=p, container=container, rotation=rotation, header=header)

    for st in streams.values():
        if st.media_type == "video" and info.video_codec is None:
            info.video_codec = st.codec
            if st.dimensions:
                w, h = st.dimensions
                if rotation % 180 == 90:
                    w, h = h, w
                info.width, info.height = w, h
            info.frame_count = len(st.pts)
            info.video_start, info.video_duration = _span_seconds(st, clamp_start_at_zero=False)
            if info.video_duration and info.frame_count:
                info.fps = info.frame_count / info.video_duration
        elif st.media_type == "audio" and info.audio_codec is None:
            info.audio_codec = st.codec
            info.sample_rate = st.sample_rate
            if st.layout:
                info.channels = _LAYOUT_CHANNELS.get(st.layout)
            info.audio_start, info.audio_duration = _span_seconds(st, clamp_start_at_zero=True)

    if vline:
        parts = _split_top_level(vline)
        if len(parts) > 1:
            info.pix_fmt = re.split(r"[(\s]", parts[1], maxsplit=1)[0] or None
    if aline and info.channels is None:
        m = re.search(r"(\d+) channels", aline)
        if m:
            info.channels = int(m.group(1))
        else:
            parts = _split_top_level(aline)
            for part in parts[1:]:
                if part in _LAYOUT_CHANNELS:
                    info.channels = _LAYOUT_CHANNELS[part]
                    break
    if info.video_codec is None and info.audio_codec is None:
        raise ProbeError(f"'{p}' contains no audio or video stream.")
    return info


def _read_exact(stream, buf: np.ndarray) -> bool:
    """Fill `buf` from `stream`; False if the stream ended first."""
    view = memoryview(buf.reshape(-1))
    got, total = 0, view.nbytes
    while got < total:
        r = stream.readinto(view[got:])
        if not r:
            return False
        got += r
    return True


def read_video_frames(
    path: str | Path,
    max_frames: int | None = None,
    *,
    size: tuple[int, int] | None = None,
    timeout: float = 600.0,
) -> tuple[np.ndarray, float]:
    """Decode video frames to uint8 RGB `[N, H, W, 3]` (rotation applied) and return them with the fps.

    `size=(width, height)` resizes while decoding, which keeps memory small for HD references
    (1080x1920 is 6 MB per frame). Frames are read straight into one preallocated array.
    """
    info = probe_media(path)
    if not info.has_video or not info.width or not info.height:
        raise ProbeError(f"'{info.path}' has no video stream to read frames from.")
    if max_frames is not None and max_frames <= 0:
        raise ValueError(f"max_frames must be a positive number of frames or None, got {max_frames}.")
    w, h = (int(size[0]), int(size[1])) if size else (info.width, info.height)
    if w <= 0 or h <= 0:
        raise ValueError(f"size must be (width, height) with positive values, got {size}.")
    expected = info.frame_count or 0
    limit = min(expected, max_frames) if max_frames else expected

    cmd = [*base_args(), "-loglevel", "error", "-i", str(info.path), "-map", "0:v:0", "-an", "-sn"]
    if size:
        cmd += ["-vf", f"scale={w}:{h}:flags=area"]
    if max_frames:
        cmd += ["-frames:v", str(int(max_frames))]
    # passthrough: one output frame per decoded frame (no duplication/dropping to a frame rate).
    cmd += [*passthrough_args(), "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"]

    out = np.empty((limit, h, w, 3), dtype=np.uint8)
    err: list[bytes] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    t = threading.Thread(target=drain_stderr, args=(proc.stderr, err), daemon=True)
    t.start()
    n = 0
    extra: list[np.ndarray] = []  # only if the decoder yields more frames than packets (rare)
    try:
        while max_frames is None or n + len(extra) < max_frames:
            preallocated = n < limit
            buf = out[n] if preallocated else np.empty((h, w, 3), np.uint8)
            if not _read_exact(proc.stdout, buf):
                break
            if preallocated:
                n += 1
            else:
                extra.append(buf)
        proc.stdout.close()
        rc = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        t.join(timeout=5)
    if rc != 0 and (max_frames is None or n + len(extra) < max_frames):
        raise ProbeError(f"decoding frames of '{info.path}' failed:\n{stderr_tail(b''.join(err))}")
    frames = out[:n]
    if extra:
        frames = np.concatenate([frames, np.stack(extra)], axis=0)
    if len(frames) == 0:
        raise ProbeError(f"'{info.path}' decoded to zero frames:\n{stderr_tail(b''.join(err))}")
    return frames, float(info.fps or 0.0)


def read_video_audio(
    path: str | Path, *, sample_rate: int | None = None, timeout: float = 600.0
) -> tuple[np.ndarray, int]:
    """Decode the first audio stream to float32 `[C, T]` (optionally resampled) and its sample rate."""
    info = probe_media(path)
    if not info.has_audio or not info.sample_rate:
        raise ProbeError(f"'{info.path}' has no audio stream.")
    sr = int(sample_rate) if sample_rate else info.sample_rate
    if sr <= 0:
        raise ValueError(f"sample_rate must be positive or None, got {sample_rate}.")
    channels = info.channels or 1
    cmd = [*base_args(), "-loglevel", "error", "-i", str(info.path), "-map", "0:a:0", "-vn",
           "-ac", str(channels), "-ar", str(sr), "-f", "f32le", "-c:a", "pcm_f32le", "pipe:1"]
    proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise ProbeError(f"decoding audio of '{info.path}' failed:\n{stderr_tail(proc.stderr)}")
    data = np.frombuffer(proc.stdout, dtype="<f4")
    usable = len(data) - len(data) % channels
    wave = np.ascontiguousarray(data[:usable].reshape(-1, channels).T, dtype=np.float32)
    return wave, sr
