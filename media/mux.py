"""Frames + audio -> MP4 (H.264 yuv420p + AAC, faststart) or WebM (VP9 + Opus) via the bundled ffmpeg.

Why it is built this way:
- Frames are streamed to ffmpeg's stdin chunk by chunk as raw RGB, so at most one chunk is
  converted/copied at a time (a minute of 512x512 float frames is already 2.8 GB).
- A `FrameStream` instead hands over frames as they are produced (e.g. on a GPU while ffmpeg
  encodes), optionally already yuv420p (media/yuv.py): then ffmpeg's single-threaded RGB->YUV
  `scale` filter is skipped and half the bytes go through the pipe.
- `-framerate` is given before `-i` so the raw input gets the right clock; fps is a rational
  (29.97 -> 2997/100) so durations come out exact.
- Audio goes through a float WAV (media/wav_float.py; no lossy step before the encoder).
- The file is written to `<stem>.partial-<random><ext>` in the target folder, probed, and only
  then `os.replace`d onto the final name (atomic on one file system). On any failure or
  interruption ffmpeg is killed and every temporary file is deleted.
"""
from __future__ import annotations

import itertools
import math
import os
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np

from .ffmpeg_tools import base_args, drain_stderr, stderr_tail
from .probe import MediaProbe, ProbeError, probe_media
from .wav_float import write_float_wav

LENGTH_MODES = ("pad_audio", "hold_last_frame", "trim", "stretch_none")
FORMATS = ("mp4", "webm")
PAD_MODES = ("edge", "black")
X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")

# Sample rates the AAC encoder accepts; anything else is resampled to 48 kHz.
_AAC_RATES = {96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350}
_CHUNK_BYTES = 16 * 1024 * 1024  # raw RGB per write: large enough to keep ffmpeg busy, small in RAM


@dataclass(frozen=True)
class _Codec:
    ext: str
    muxer: str
    video_codec: str  # probe name
    audio_codec: str
    default_crf: int
    max_crf: int


_CODECS = {
    "mp4": _Codec(".mp4", "mp4", "h264", "aac", 18, 51),
    "webm": _Codec(".webm", "webm", "vp9", "opus", 31, 63),
}


STREAM_PIX_FMTS = ("rgb24", "yuv420p")


@dataclass(frozen=True)
class FrameStream:
    """`count` frames of width x height, delivered as `chunks` in ffmpeg's raw `pix_fmt` layout.

    Each chunk is a uint8 numpy array holding one or more whole frames ([k, ...] whose byte size
    is k x frame_bytes): rgb24 = H*W*3 bytes per frame, yuv420p = Y plane then U then V,
    H*W*3/2 bytes (media.yuv.rgb_to_yuv420p makes those). `chunks` may be a generator: mux_video
    pulls the next chunk only when the previous one is in ffmpeg's pipe, so producing and
    encoding overlap. yuv420p needs even width/height; odd rgb24 sizes are padded as for arrays.
    """
    count: int
    width: int
    height: int
    pix_fmt: str
    chunks: Iterable[np.ndarray]

    @property
    def frame_bytes(self) -> int:
        pixels = self.width * self.height
        return pixels * 3 if self.pix_fmt == "rgb24" else pixels * 3 // 2


class MuxError(RuntimeError):
    """Writing the video failed; no output file was left behind."""


class MuxInterrupted(MuxError):
    """`should_stop` asked to stop; no output file was left behind."""


@dataclass
class MuxReport:
    path: Path
    fmt: str
    frames_in: int
    frames_written: int
    fps: float
    fps_rational: str
    width: int  # input frame size
    height: int
    padded_width: int  # encoded size (even)
    padded_height: int
    padding: str  # e.g. "none" or "1 px right (edge), 1 px bottom (edge)"
    length_mode: str
    video_seconds: float  # intended, frames_written / fps
    audio_seconds: float | None  # intended audio length after padding/trimming; None without audio
    action: str  # what was done to make the lengths agree
    probe: MediaProbe
    encode_seconds: float
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """Human-readable lines for the node's text output."""
        p = self.probe
        lines = [
            f"{self.path.name}: {p.video_codec} {p.pix_fmt} {p.width}x{p.height} @ {self.fps:g} fps, "
            f"{p.frame_count} frames, video {p.video_duration:.3f} s"
            + (f", audio {p.audio_codec} {p.sample_rate} Hz {p.audio_duration:.3f} s" if p.has_audio else ", no audio"),
            f"length ({self.length_mode}): {self.action}",
        ]
        if self.padding != "none":
            lines.append(f"padded to even size: {self.padding}")
        lines += self.notes
        lines.append(f"encoded in {self.encode_seconds:.2f} s")
        return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# input validation


def _check_frames(frames: np.ndarray) -> np.ndarray:
    arr = np.asarray(frames)
    if arr.ndim == 3 and arr.shape[-1] == 3:
        arr = arr[None]  # a single frame
    if arr.ndim != 4 or arr.shape[-1] != 3:
        raise ValueError(
            f"frames must be an array [N, H, W, 3] (RGB), got shape {tuple(arr.shape)}. "
            "Convert grayscale/RGBA images to RGB first."
        )
    n, h, w, _ = arr.shape
    if n == 0:
        raise ValueError("frames is empty (0 frames): nothing to write. Check the node that produced the images.")
    if h == 0 or w == 0:
        raise ValueError(f"frames have zero size ({w}x{h}).")
    if arr.dtype != np.uint8 and not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"frames must be uint8 (0..255) or float (0..1), got dtype {arr.dtype}.")
    if np.issubdtype(arr.dtype, np.floating):
        step = max(1, _CHUNK_BYTES // max(1, h * w * 3 * arr.itemsize))
        for i in range(0, n, step):  # chunked: no full-size boolean temporary
            if not np.isfinite(arr[i: i + step]).all():
                raise ValueError(
                    f"frames contain NaN or infinite values (first bad chunk starts at frame {i}). "
                    "The upstream model produced invalid pixels; fix or clamp them before muxing."
                )
    return arr


def _check_stream(stream: FrameStream) -> None:
    if stream.pix_fmt not in STREAM_PIX_FMTS:
        raise ValueError(f"FrameStream.pix_fmt must be one of {STREAM_PIX_FMTS}, got {stream.pix_fmt!r}.")
    for name in ("count", "width", "height"):
        value = getattr(stream, name)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"FrameStream.{name} must be a non-negative integer, got {value!r}.")
    if stream.count == 0:
        raise ValueError("FrameStream.count is 0: nothing to write. Check the node that produced the frames.")
    if stream.width == 0 or stream.height == 0:
        raise ValueError(f"FrameStream frames have zero size ({stream.width}x{stream.height}).")
    if stream.pix_fmt == "yuv420p" and (stream.width % 2 or stream.height % 2):
        raise ValueError(
            f"yuv420p frames must have an even width and height, got {stream.width}x{stream.height}. "
            "Fix: convert with media.yuv.rgb_to_yuv420p, which pads odd sizes by one row/column, and give "
            "the FrameStream that padded size - or stream rgb24 frames and let mux_video pad them."
        )


def _check_audio(audio: np.ndarray | None, sample_rate: int) -> np.ndarray | None:
    if audio is None:
        return None
    wave = np.asarray(audio)
    if wave.ndim == 3 and wave.shape[0] == 1:  # ComfyUI AUDIO waveform [1, C, T]
        wave = wave[0]
    if wave.ndim == 1:
        wave = wave[None]
    if wave.ndim != 2:
        raise ValueError(f"audio must be mono [T] or [C, T], got shape {tuple(np.shape(audio))}.")
    if wave.shape[0] > 8:
        raise ValueError(
            f"audio has {wave.shape[0]} channels (shape {wave.shape}); it looks like [T, C]. "
            "Pass [C, T] (transpose it)."
        )
    if wave.shape[1] == 0:
        raise ValueError("audio is empty (0 samples). Pass None for a silent video.")
    if not np.issubdtype(wave.dtype, np.floating):
        raise ValueError(f"audio must be float in -1..1, got dtype {wave.dtype}.")
    if not np.isfinite(wave).all():
        raise ValueError("audio contains NaN or infinite samples; fix the upstream audio node.")
    if not isinstance(sample_rate, (int, np.integer)) or sample_rate <= 0:
        raise ValueError(f"sample_rate must be a positive integer (Hz), got {sample_rate!r}.")
    return wave.astype(np.float32, copy=False)


def fps_to_rational(fps: float) -> Fraction:
    """29.97 -> 2997/100, 30000/1001 (29.97003) -> 30000/1001; exact rationals keep timestamps exact."""
    if not isinstance(fps, (int, float, np.floating, np.integer, Fraction)) or not math.isfinite(float(fps)):
        raise ValueError(f"fps must be a finite number, got {fps!r}.")
    if float(fps) <= 0 or float(fps) > 1000:
        raise ValueError(f"fps must be > 0 and <= 1000, got {fps}. Use the frame rate of the source video.")
    return Fraction(fps).limit_denominator(1001)


# ----------------------------------------------------------------------------------------------
# length planning


def _plan_lengths(
    n_frames: int, n_samples: int, sr: int, fps: Fraction, mode: str
) -> tuple[int, int | None, str]:
    """(frames to write, audio samples to write or None = untouched, description).

    pad_audio: the video is the master: audio padded with silence (or trimmed) to the video length.
    hold_last_frame: the audio is the master: the last frame is repeated (or frames dropped) to cover
        the audio; the audio gets < 1 frame of silence so both end together.
    trim: both are cut to the shorter one (then to a whole number of frames).
    stretch_none: nothing is changed; the mismatch is only reported.
    """
    video_s = n_frames / fps
    audio_s = Fraction(n_samples, sr)
    diff = float(audio_s - video_s)

    def samples_for(frames: int) -> int:
        return int(round(frames / fps * sr))

    if mode == "stretch_none":
        if abs(diff) * fps <= 1:
            return n_frames, None, f"lengths agree within one frame (audio - video = {diff:+.3f} s); nothing changed"
        return n_frames, None, (
            f"nothing changed: audio {float(audio_s):.3f} s vs video {float(video_s):.3f} s "
            f"(audio - video = {diff:+.3f} s)"
        )
    if mode == "pad_audio":
        n_out = n_frames
    elif mode == "hold_last_frame":
        n_out = max(1, math.ceil(audio_s * fps - Fraction(1, 10**6)))
    elif mode == "trim":
        n_out = n_frames if video_s <= audio_s else max(1, math.floor(audio_s * fps + Fraction(1, 10**6)))
    else:
        raise ValueError(f"length_mode must be one of {LENGTH_MODES}, got {mode!r}.")

    target = samples_for(n_out)
    parts = []
    if n_out > n_frames:
        parts.append(f"last frame held for {n_out - n_frames} extra frames ({float((n_out - n_frames) / fps):.3f} s)")
    elif n_out < n_frames:
        parts.append(f"video trimmed by {n_frames - n_out} frames ({float((n_frames - n_out) / fps):.3f} s)")
    if target > n_samples:
        parts.append(f"audio padded with {(target - n_samples) / sr:.3f} s of silence")
    elif target < n_samples:
        parts.append(f"audio trimmed by {(n_samples - target) / sr:.3f} s")
    if not parts:
        parts.append("lengths already matched; nothing changed")
    return n_out, target, "; ".join(parts) + f" -> {n_out} frames, {float(n_out / fps):.3f} s"


# ----------------------------------------------------------------------------------------------
# ffmpeg command


def _audio_args(fmt: str, sr: int, channels: int, bitrate: str | None) -> list[str]:
    if fmt == "mp4":
        args = ["-c:a", "aac", "-b:a", bitrate or ("128k" if channels == 1 else "192k")]
        if sr not in _AAC_RATES:
            args += ["-ar", "48000"]
        return args
    # Opus only runs at 48/24/16/12/8 kHz; 48 kHz is what browsers expect.
    return ["-c:a", "libopus", "-b:a", bitrate or ("96k" if channels == 1 else "128k"), "-ar", "48000"]


# BT.709 limited range: the output is tagged with it so browsers/players convert back with the same matrix.
_COLOR_TAGS = ["-colorspace", "bt709", "-color_primaries", "bt709", "-color_trc", "bt709", "-color_range", "tv"]


def _video_args(fmt: str, crf: int, preset: str | None, convert: bool = True) -> list[str]:
    # convert: RGB input -> BT.709 limited-range YUV by ffmpeg; False when the input is yuv420p already.
    color = _COLOR_TAGS
    vf = ["-vf", "scale=out_color_matrix=bt709:out_range=tv,format=yuv420p"] if convert else []
    if fmt == "mp4":
        # imageio-ffmpeg's ffmpeg 9 drops -color_primaries/-color_trc as output options (the stream read
        # "bt709/unknown/unknown"); x264 writes all three into the H.264 VUI itself
        return [*vf, "-c:v", "libx264", "-preset", preset or "medium", "-crf", str(crf),
                "-x264-params", "colorprim=bt709:transfer=bt709:colormatrix=bt709",
                "-pix_fmt", "yuv420p", *color, "-movflags", "+faststart"]
    return [*vf, "-c:v", "libvpx-vp9", "-crf", str(crf), "-b:v", "0", "-deadline", "good",
            "-cpu-used", preset or "4", "-row-mt", "1", "-pix_fmt", "yuv420p", *color]


# ----------------------------------------------------------------------------------------------
# frame streaming


def _pad_spec(w: int, h: int, pad_mode: str) -> tuple[int, int, str]:
    pw, ph = w % 2, h % 2
    if not pw and not ph:
        return 0, 0, "none"
    desc = []
    if pw:
        desc.append(f"1 px right ({pad_mode})")
    if ph:
        desc.append(f"1 px bottom ({pad_mode})")
    return pw, ph, ", ".join(desc)



def _pad_frames(frames: np.ndarray, pad_h: int, pad_w: int, pad_mode: str) -> np.ndarray:
    """[N, H, W, 3] padded at the bottom/right to even sizes: repeated edge pixels or black."""
    widths = ((0, 0), (0, pad_h), (0, pad_w), (0, 0))
    return np.pad(frames, widths, mode="edge" if pad_mode == "edge" else "constant")


def _frame_chunks(
    frames: np.ndarray, n_out: int, pad_w: int, pad_h: int, pad_mode: str
):
    """Yield (frames_done, uint8 RGB chunk) covering n_out frames; holds the last frame if n_out > N."""
    n, h, w, _ = frames.shape
    step = max(1, _CHUNK_BYTES // ((h + pad_h) * (w + pad_w) * 3))
    direct = frames.dtype == np.uint8 and not (pad_w or pad_h) and frames.flags.c_contiguous
    for start in range(0, n_out, step):
        end = min(n_out, start + step)
        if end <= n:
            chunk = frames[start:end]
        else:  # past the end: repeat the last frame (hold_last_frame)
            chunk = frames[np.minimum(np.arange(start, end), n - 1)]
        if not direct:
            if chunk.dtype != np.uint8:
                chunk = (np.clip(chunk, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
            if pad_w or pad_h:
                chunk = _pad_frames(chunk, pad_h, pad_w, pad_mode)
        yield end, np.ascontiguousarray(chunk)


def _stream_chunks(
    stream: FrameStream, n_out: int, pad_w: int, pad_h: int, pad_mode: str,
    raised_by_stream: list[BaseException],
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (frames_done, uint8 chunk) covering n_out frames of `stream`.

    Frames past n_out (trimmed) are never requested from the stream, so they are never produced
    (nor counted); otherwise the stream must end after exactly `count` frames, and past its end
    (hold_last_frame) its last frame is repeated. Exceptions the stream raises are recorded in
    `raised_by_stream` (so mux_video re-raises them unchanged, even OSErrors) and propagate; a
    wrong frame count or a partial frame is a MuxError.
    """
    n, w, h = stream.count, stream.width, stream.height
    frame_bytes = stream.frame_bytes
    it = iter(stream.chunks)
    received = written = 0
    last: np.ndarray | None = None
    try:
        for index in itertools.count():
            if n_out < n and written >= n_out:  # trimmed: the rest of the stream is never produced
                break
            try:
                chunk = next(it)
            except StopIteration:
                break
            except BaseException as exc:
                raised_by_stream.append(exc)
                raise
            try:
                arr = np.asarray(chunk)
            except Exception as exc:  # e.g. a CUDA tensor
                raise MuxError(f"FrameStream chunk {index} is a {type(chunk).__name__}, not a numpy array; "
                               "move it to the CPU first (tensor.cpu().numpy()).") from exc
            if arr.dtype != np.uint8:
                raise MuxError(f"FrameStream chunk {index} has dtype {arr.dtype}; {stream.pix_fmt} frames are uint8.")
            k, rest = divmod(arr.nbytes, frame_bytes)
            if rest:
                raise MuxError(
                    f"FrameStream chunk {index} holds {arr.nbytes} bytes, not a whole number of "
                    f"{w}x{h} {stream.pix_fmt} frames ({frame_bytes} bytes each)."
                )
            if received + k > n:
                raise MuxError(f"the FrameStream yielded more frames than its count of {n} "
                               f"({received + k} by chunk {index}); fix FrameStream.count.")
            received += k
            if k == 0:
                continue
            frames = np.ascontiguousarray(arr).reshape(k, frame_bytes)
            if pad_w or pad_h:  # rgb24 only: yuv420p streams are even-sized
                frames = _pad_frames(frames.reshape(k, h, w, 3), pad_h, pad_w, pad_mode).reshape(k, -1)
            frames = frames[: n_out - written]
            if n_out > n:  # a copy: the producer may reuse its buffer for the next chunk
                last = frames[-1:].copy()
            written += len(frames)
            yield written, frames
        if written < n_out and received < n:
            raise MuxError(f"the FrameStream ended after {received} of its {n} frames; fix FrameStream.count "
                           "or the generator that produces the chunks.")
        if written < n_out:  # hold_last_frame past the stream's end
            step = max(1, _CHUNK_BYTES // last.nbytes)
            for start in range(written, n_out, step):
                end = min(n_out, start + step)
                yield end, np.repeat(last, end - start, axis=0)
    finally:
        close = getattr(it, "close", None)  # a generator: run its clean-up now, not at garbage collection
        if close is not None:
            close()


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


# ----------------------------------------------------------------------------------------------
# public entry point


def mux_video(
    frames: np.ndarray | FrameStream,
    audio: np.ndarray | None,
    sample_rate: int,
    fps: float,
    out_path: str | Path,
    *,
    fmt: str = "mp4",
    crf: int | None = None,
    length_mode: str = "pad_audio",
    pad_mode: str = "edge",
    preset: str | None = None,
    audio_bitrate: str | None = None,
    extra_args: Sequence[str] = (),
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> MuxReport:
    """Encode `frames` ([N,H,W,3] uint8 or float 0..1) and `audio` (mono [T] or [C,T] float) to `out_path`.

    `frames` may also be a FrameStream (chunks produced while ffmpeg encodes; rgb24 or yuv420p).
    yuv420p input is encoded as it is (no conversion), tagged BT.709 limited range like the RGB path.

    fmt "mp4" = H.264 yuv420p + AAC + faststart (plays in every browser); "webm" = VP9 + Opus.
    crf: None = 18 for H.264 (0-51) / 31 for VP9 (0-63); lower is better quality and larger.
    length_mode: see `_plan_lengths` (pad_audio | hold_last_frame | trim | stretch_none).
    pad_mode: how odd widths/heights are padded to even: "edge" (repeat the border) or "black".
    preset: x264 preset (default "medium") or VP9 cpu-used ("0".."8", default "4").
    extra_args: additional ffmpeg output options (placed before the output file).
    progress(done, total) is called after each chunk; should_stop() -> True aborts (MuxInterrupted).
    Exceptions raised by `progress` (e.g. ComfyUI's interrupt) propagate unchanged after clean-up.
    The written file is probed; MuxError if it is not what was asked for (and it is deleted).
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}.")
    if length_mode not in LENGTH_MODES:
        raise ValueError(f"length_mode must be one of {LENGTH_MODES}, got {length_mode!r}.")
    if pad_mode not in PAD_MODES:
        raise ValueError(f"pad_mode must be one of {PAD_MODES}, got {pad_mode!r}.")
    codec = _CODECS[fmt]
    crf = codec.default_crf if crf is None else crf
    if isinstance(crf, bool) or not isinstance(crf, (int, np.integer)) or not 0 <= crf <= codec.max_crf:
        raise ValueError(f"crf for {fmt} must be an integer 0..{codec.max_crf}, got {crf!r}.")
    if fmt == "mp4" and preset is not None and preset not in X264_PRESETS:
        raise ValueError(f"preset for mp4 must be one of {X264_PRESETS}, got {preset!r}.")
    if fmt == "webm" and preset is not None and preset not in tuple(str(i) for i in range(9)):
        raise ValueError(f"preset for webm is VP9 cpu-used '0'..'8', got {preset!r}.")
    rate = fps_to_rational(fps)
    stream = frames if isinstance(frames, FrameStream) else None
    if stream is not None:
        _check_stream(stream)
        n, h, w = int(stream.count), int(stream.height), int(stream.width)
        in_pix_fmt = stream.pix_fmt
    else:
        arr = _check_frames(frames)
        n, h, w, _ = arr.shape
        in_pix_fmt = "rgb24"
    wave = _check_audio(audio, sample_rate)

    out = Path(out_path)
    if out.suffix == "":
        out = out.with_suffix(codec.ext)
    elif out.suffix.lower() != codec.ext:
        raise ValueError(f"out_path '{out}' ends in '{out.suffix}' but fmt is {fmt}; use '{codec.ext}'.")
    if out.is_dir():
        raise ValueError(f"out_path '{out}' is a folder; give a file name.")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MuxError(f"cannot create the output folder '{out.parent}': {exc}") from exc

    pad_w, pad_h, padding = _pad_spec(w, h, pad_mode)
    notes: list[str] = []
    if wave is not None:
        n_out, target, action = _plan_lengths(n, wave.shape[1], int(sample_rate), rate, length_mode)
        if target is not None and target != wave.shape[1]:
            fitted = np.zeros((wave.shape[0], target), dtype=np.float32)
            keep = min(target, wave.shape[1])
            fitted[:, :keep] = wave[:, :keep]
            wave = fitted
        peak = float(np.max(np.abs(wave))) if wave.size else 0.0
        if peak > 1.0:
            notes.append(f"warning: audio peak {peak:.2f} > 1.0 will clip; normalize it upstream")
    else:
        n_out, action = n, "no audio: video only"

    token = secrets.token_hex(4)
    partial = out.with_name(f"{out.stem}.partial-{token}{codec.ext}")
    wav_tmp = out.with_name(f"{out.stem}.partial-{token}.wav")
    cmd = [*base_args(), "-y", "-loglevel", "error",
           "-f", "rawvideo", "-pix_fmt", in_pix_fmt, "-video_size", f"{w + pad_w}x{h + pad_h}",
           "-framerate", f"{rate.numerator}/{rate.denominator}"]
    if in_pix_fmt == "yuv420p":
        # Tag the raw YUV's matrix and range: untagged, ffmpeg converts it to the output's range
        # (measured: values changed by up to 110) instead of passing it through. Primaries/transfer
        # come from the encoder's own tags (_video_args), as on the RGB path: both write the same stream.
        cmd += ["-colorspace", "bt709", "-color_range", "tv"]
    cmd += ["-i", "pipe:0"]
    if wave is not None:
        cmd += ["-i", str(wav_tmp), "-map", "0:v:0", "-map", "1:a:0"]
    cmd += _video_args(fmt, int(crf), preset, convert=in_pix_fmt == "rgb24")
    if wave is not None:
        cmd += _audio_args(fmt, int(sample_rate), wave.shape[0], audio_bitrate)
    cmd += [*map(str, extra_args), "-f", codec.muxer, str(partial)]

    t0 = time.perf_counter()
    proc: subprocess.Popen | None = None
    err: list[bytes] = []
    drain: threading.Thread | None = None
    chunks: Iterator[tuple[int, np.ndarray]] | None = None
    raised_by_stream: list[BaseException] = []  # the producer's own errors propagate unchanged
    done = 0
    try:
        if wave is not None:
            try:  # float WAV keeps the samples exact
                write_float_wav(wav_tmp, wave, int(sample_rate))
            except OSError as exc:  # unwritable folder, disk full
                raise OSError(f"writing the temporary WAV '{wav_tmp.name}' failed: {exc}") from exc
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, bufsize=0)
        drain = threading.Thread(target=drain_stderr, args=(proc.stderr, err), daemon=True)
        drain.start()
        if stream is not None:
            chunks = _stream_chunks(stream, n_out, pad_w, pad_h, pad_mode, raised_by_stream)
        else:
            chunks = _frame_chunks(arr, n_out, pad_w, pad_h, pad_mode)
        for done_now, chunk in chunks:
            if should_stop is not None and should_stop():
                raise MuxInterrupted(
                    f"video mux interrupted after {done}/{n_out} frames; no file was written."
                )
            try:
                proc.stdin.write(memoryview(chunk.reshape(-1)))
            except (BrokenPipeError, ConnectionResetError, OSError) as exc:
                proc.wait(timeout=30)
                drain.join(timeout=5)
                raise MuxError(
                    f"ffmpeg stopped accepting frames at frame {done}/{n_out} (exit {proc.returncode}):\n"
                    f"{stderr_tail(b''.join(err))}"
                ) from exc
            done = done_now
            if progress is not None:
                progress(done, n_out)
        proc.stdin.close()
        rc = proc.wait()
        drain.join(timeout=5)
        if rc != 0:
            raise MuxError(f"ffmpeg failed writing '{out.name}' (exit {rc}):\n{stderr_tail(b''.join(err))}")
        _unlink(wav_tmp)
        try:
            info = probe_media(partial)
        except ProbeError as exc:
            raise MuxError(f"the written video could not be read back: {exc}") from exc
        _verify(info, codec, n_out, float(rate), w + pad_w, h + pad_h, wave is not None,
                length_mode != "stretch_none")
        os.replace(partial, out)
        info.path = out
    except BaseException as exc:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if chunks is not None:
            try:  # a FrameStream's generator is closed now, so its own clean-up runs
                chunks.close()
            except Exception:
                pass  # the error that got us here is the one to report
        if proc is not None and proc.stdin and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass
        _unlink(partial)
        _unlink(wav_tmp)
        # InterruptedError is an OSError too, but a caller's interruption (e.g. from `progress`), not a disk problem
        if (isinstance(exc, OSError) and not isinstance(exc, InterruptedError)
                and not any(exc is e for e in raised_by_stream)):
            raise MuxError(
                f"could not write '{out}': {exc}. Check that the folder is writable and has free space."
            ) from exc
        raise

    return MuxReport(
        path=out, fmt=fmt, frames_in=n, frames_written=n_out, fps=float(rate),
        fps_rational=f"{rate.numerator}/{rate.denominator}", width=w, height=h,
        padded_width=w + pad_w, padded_height=h + pad_h, padding=padding, length_mode=length_mode,
        video_seconds=float(n_out / rate),
        audio_seconds=None if wave is None else wave.shape[1] / int(sample_rate),
        action=action, probe=info, encode_seconds=time.perf_counter() - t0, notes=notes,
    )


def _verify(info: MediaProbe, codec: _Codec, frames: int, fps: float, w: int, h: int,
            has_audio: bool, check_sync: bool) -> None:
    """Raise MuxError unless the probed file is exactly what was requested."""
    problems = []
    if info.video_codec != codec.video_codec:
        problems.append(f"video codec {info.video_codec} (expected {codec.video_codec})")
    if info.pix_fmt != "yuv420p":
        problems.append(f"pixel format {info.pix_fmt} (expected yuv420p)")
    if (info.width, info.height) != (w, h):
        problems.append(f"size {info.width}x{info.height} (expected {w}x{h})")
    if info.frame_count != frames:
        problems.append(f"{info.frame_count} frames (expected {frames})")
    if info.fps is None or abs(info.fps - fps) > 1e-3 * fps:
        problems.append(f"fps {info.fps} (expected {fps:g})")
    if has_audio:
        if info.audio_codec != codec.audio_codec:
            problems.append(f"audio codec {info.audio_codec} (expected {codec.audio_codec})")
        elif check_sync and info.av_gap_seconds is not None and info.av_gap_seconds > 1.0 / fps + 1e-6:
            problems.append(
                f"video {info.video_duration:.4f} s and audio {info.audio_duration:.4f} s differ by more than one frame"
            )
    elif info.has_audio:
        problems.append("unexpected audio stream")
    if problems:
        raise MuxError("the written video failed verification: " + "; ".join(problems))
