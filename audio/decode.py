"""Decode an audio file into float32 samples, whatever common format it is in.

Two decoders, tried in order:
1. `soundfile` (libsndfile): wav (int 16/24/32, float), flac, ogg/vorbis/opus and, with
   libsndfile >= 1.1, mp3. Fast, in-process, exact for PCM.
2. The ffmpeg binary bundled by `imageio-ffmpeg`: m4a/aac and anything libsndfile rejects
   (also the audio track of a video file). Decoded to raw f32le on stdout at the file's own
   sample rate and channel count, both read from ffmpeg's stream description first and then
   requested explicitly, so the byte stream can never be misinterpreted.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

__all__ = [
    "AudioInputError",
    "AudioFileNotFoundError",
    "EmptyAudioFileError",
    "AudioDecodeError",
    "EmptyAudioError",
    "decode_audio",
    "ffmpeg_exe",
]

# ffmpeg gets this long to decode one file; a 10-minute reference decodes in about a second,
# so hitting the limit means a pathological input, not a slow machine.
_FFMPEG_TIMEOUT_S = 300


class AudioInputError(ValueError):
    """A reference-audio input the pack cannot use; the message names the input and the fix."""


class AudioFileNotFoundError(AudioInputError, FileNotFoundError):
    """The path does not exist or is not a regular file."""


class EmptyAudioFileError(AudioInputError):
    """The file exists but has 0 bytes (typically an interrupted upload or copy)."""


class AudioDecodeError(AudioInputError):
    """No decoder could read the file (corrupt, truncated, or not audio)."""


class EmptyAudioError(AudioInputError):
    """The file decoded but holds no samples."""


def decode_audio(path: str | Path, *, max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    """Decode `path` to (float32 array [channels, samples], sample_rate).

    max_seconds: decode at most this much from the start (bounds memory for hour-long files;
    the caller decides how to report the cut). None decodes everything.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise AudioFileNotFoundError(
            f"Audio file not found: '{p}'. Check the path, or upload the file into ComfyUI's "
            f"input folder and pick it again."
        )
    if not p.is_file():
        raise AudioFileNotFoundError(
            f"'{p}' is not a file (a folder?). Pick an audio file instead.")
    try:
        size = p.stat().st_size
    except OSError as e:
        raise AudioDecodeError(f"Cannot read '{p}': {e}. Check the file's permissions.") from e
    if size == 0:
        raise EmptyAudioFileError(
            f"Audio file '{p.name}' is empty (0 bytes), probably an interrupted upload or copy. "
            f"Upload the file again."
        )
    if max_seconds is not None and not max_seconds > 0:
        raise ValueError(f"max_seconds must be > 0 or None, got {max_seconds!r}")

    failures: list[str] = []
    result = _decode_soundfile(p, max_seconds, failures)
    if result is None:
        result = _decode_ffmpeg(p, max_seconds, failures)
    if result is None:
        raise AudioDecodeError(
            f"Could not decode '{p.name}': the file is corrupt, truncated, or not audio. "
            f"Tried {'; '.join(failures)}. Re-export it as WAV, MP3, M4A or FLAC and try again."
        )
    wave, sr = result
    if wave.shape[1] == 0:
        raise EmptyAudioError(
            f"Audio file '{p.name}' decodes to zero samples (an empty recording). "
            f"Record again or pick another file."
        )
    return wave, sr


def _decode_soundfile(p: Path, max_seconds: float | None,
                      failures: list[str]) -> tuple[np.ndarray, int] | None:
    try:
        import soundfile as sf
    except ImportError as e:  # pragma: no cover - soundfile is a hard dependency
        failures.append(f"soundfile (not installed: {e})")
        return None
    try:
        with sf.SoundFile(str(p)) as f:
            sr = int(f.samplerate)
            frames = -1 if max_seconds is None else int(round(max_seconds * sr))
            data = f.read(frames=frames, dtype="float32", always_2d=True)
    except Exception as e:  # libsndfile raises several types (LibsndfileError, RuntimeError, ...)
        # libsndfile says "File does not exist" for some unrecognised files; we have already
        # checked existence, so report only that it could not read the file.
        msg = str(e).replace(str(p), p.name)
        failures.append(f"soundfile/libsndfile ({msg})")
        return None
    if sr <= 0:
        failures.append(f"soundfile/libsndfile (invalid sample rate {sr})")
        return None
    return np.ascontiguousarray(data.T), sr


def ffmpeg_exe() -> str:
    """Path of the ffmpeg binary: $IMAGEIO_FFMPEG_EXE, else imageio-ffmpeg's (one rule for the pack:
    media.ffmpeg_tools, so imageio-ffmpeg need not be installed when the variable is set)."""
    from ..media.ffmpeg_tools import ffmpeg_exe as pack_ffmpeg

    return pack_ffmpeg()


# Channel counts of ffmpeg's named layouts (libavutil/channel_layout.c); a name not listed is
# downmixed to stereo rather than guessed.
_LAYOUT_CHANNELS = {
    "mono": 1, "stereo": 2, "2.1": 3, "3.0": 3, "3.0(back)": 3, "4.0": 4, "quad": 4,
    "quad(side)": 4, "3.1": 4, "5.0": 5, "5.0(side)": 5, "4.1": 5, "5.1": 6, "5.1(side)": 6,
    "6.0": 6, "6.0(front)": 6, "hexagonal": 6, "6.1": 7, "6.1(back)": 7, "6.1(front)": 7,
    "7.0": 7, "7.0(front)": 7, "7.1": 8, "7.1(wide)": 8, "7.1(wide-side)": 8, "octagonal": 8,
    "downmix": 2,
}
_AUDIO_STREAM = re.compile(r"Stream #\d+:\d+.*?: Audio: (?P<desc>.*)")
_RATE = re.compile(r"(\d+) Hz")
_NCH = re.compile(r"(\d+) channels")


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    kwargs: dict = {}
    if sys.platform == "win32":  # no console window flashing up under ComfyUI on Windows
        kwargs["creationflags"] = getattr(subprocess, "CREATE_NO_WINDOW", 0)
    return subprocess.run(cmd, capture_output=True, stdin=subprocess.DEVNULL,
                          timeout=_FFMPEG_TIMEOUT_S, check=False, **kwargs)


def _last_lines(stderr: bytes, n: int = 2) -> str:
    lines = [ln.strip() for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    return " / ".join(lines[-n:]) if lines else "no message"


def _probe_ffmpeg(exe: str, src: str) -> tuple[int, int] | str:
    """(sample_rate, channels) of the first audio stream, or a failure reason."""
    # `ffmpeg -i X` without an output describes the streams on stderr and exits 1 by design.
    proc = _run([exe, "-hide_banner", "-nostdin", "-i", src])
    text = proc.stderr.decode("utf-8", "replace")
    for line in text.splitlines():
        m = _AUDIO_STREAM.search(line)
        if not m:
            continue
        desc = m.group("desc")
        rate = _RATE.search(desc)
        if not rate:
            continue
        after = desc[rate.end():].lstrip(", ").split(",")[0].strip()
        nch = _NCH.match(after)
        channels = int(nch.group(1)) if nch else _LAYOUT_CHANNELS.get(after, 2)
        return int(rate.group(1)), max(channels, 1)
    if "Stream #" in text:
        return "ffmpeg (the file has no audio stream)"
    return f"ffmpeg ({_last_lines(proc.stderr)})"


def _decode_ffmpeg(p: Path, max_seconds: float | None,
                   failures: list[str]) -> tuple[np.ndarray, int] | None:
    try:
        exe = ffmpeg_exe()
    except Exception as e:
        failures.append(f"ffmpeg (imageio-ffmpeg has no ffmpeg binary: {e}; "
                        f"`pip install imageio-ffmpeg`)")
        return None
    # "file:" + absolute path: a name starting with "-" or containing "proto:" stays a file name.
    src = "file:" + str(p.resolve())
    try:
        probed = _probe_ffmpeg(exe, src)
        if isinstance(probed, str):
            failures.append(probed)
            return None
        sr, channels = probed
        cmd = [exe, "-hide_banner", "-nostdin", "-v", "error", "-i", src,
               "-map", "0:a:0", "-vn", "-sn", "-dn"]
        if max_seconds is not None:
            cmd += ["-t", f"{max_seconds:.6f}"]
        cmd += ["-f", "f32le", "-acodec", "pcm_f32le", "-ac", str(channels), "-ar", str(sr),
                "pipe:1"]
        proc = _run(cmd)
    except subprocess.TimeoutExpired:
        failures.append(f"ffmpeg (no result after {_FFMPEG_TIMEOUT_S} s)")
        return None
    except OSError as e:
        failures.append(f"ffmpeg (could not start {exe}: {e})")
        return None
    if proc.returncode != 0:
        failures.append(f"ffmpeg ({_last_lines(proc.stderr)})")
        return None
    raw = np.frombuffer(proc.stdout, dtype="<f4")
    usable = raw.size - raw.size % channels
    wave = raw[:usable].reshape(-1, channels).T.astype(np.float32)  # astype copies: writable
    return np.ascontiguousarray(wave), sr
