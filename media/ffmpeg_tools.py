"""Locate the ffmpeg binary shipped by `imageio-ffmpeg` and run it with argument lists.

imageio-ffmpeg (BSD-2-Clause) bundles a static ffmpeg build, so users need no system ffmpeg.
It has no ffprobe; probe.py derives stream facts from `ffmpeg` itself.
"""
from __future__ import annotations

import functools
import os
import re
import subprocess


class FFmpegMissingError(RuntimeError):
    """No usable ffmpeg binary was found."""


@functools.lru_cache(maxsize=1)
def ffmpeg_exe() -> str:
    """Path of the ffmpeg binary (IMAGEIO_FFMPEG_EXE overrides the bundled one)."""
    override = os.environ.get("IMAGEIO_FFMPEG_EXE")
    if override:
        # honoured without imageio-ffmpeg installed too: machines that bring their own ffmpeg
        # (a system build, or the GPU benchmark machine's carried one) need not install the 68 MB wheel
        if not os.path.isfile(override) or not os.access(override, os.X_OK):
            raise FFmpegMissingError(f"IMAGEIO_FFMPEG_EXE points at '{override}', which is not an executable file. "
                                     "Fix: set it to the full path of an ffmpeg binary, or unset it to use "
                                     "imageio-ffmpeg's bundled one.")
        return override
    try:
        import imageio_ffmpeg
    except ImportError as exc:
        raise FFmpegMissingError(
            "ffmpeg is needed for video files but the 'imageio-ffmpeg' package is not installed. "
            "Fix: `pip install imageio-ffmpeg` in the Python environment that runs ComfyUI."
        ) from exc
    try:
        exe = imageio_ffmpeg.get_ffmpeg_exe()
    except RuntimeError as exc:
        raise FFmpegMissingError(
            f"imageio-ffmpeg is installed but found no ffmpeg binary ({exc}). Fix: reinstall it "
            "with `pip install --force-reinstall imageio-ffmpeg` (wheels bundle ffmpeg), or set "
            "IMAGEIO_FFMPEG_EXE to the path of an ffmpeg executable."
        ) from exc
    if not os.path.isfile(exe) or not os.access(exe, os.X_OK):
        raise FFmpegMissingError(
            f"ffmpeg binary '{exe}' is missing or not executable. Fix: reinstall imageio-ffmpeg "
            "or point IMAGEIO_FFMPEG_EXE at a working ffmpeg."
        )
    return exe


def base_args() -> list[str]:
    """Arguments every call starts with: quiet banner, never read the terminal."""
    return [ffmpeg_exe(), "-hide_banner", "-nostdin"]


def ffmpeg_version() -> tuple[int, int] | None:
    """(major, minor) of the ffmpeg binary in use, or None for builds that name no release (git
    snapshots "N-12345-g...", newer than any release this pack meets)."""
    return _binary_version(ffmpeg_exe())


@functools.lru_cache(maxsize=4)
def _binary_version(exe: str) -> tuple[int, int] | None:
    try:
        head = subprocess.run([exe, "-hide_banner", "-version"], capture_output=True, text=True,
                              timeout=30, check=False).stdout.split("\n", 1)[0]
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.match(r"ffmpeg version n?(\d+)\.(\d+)", head)
    return (int(match.group(1)), int(match.group(2))) if match else None


def passthrough_args() -> list[str]:
    """Output options for one output frame per decoded frame (no frame dropped or repeated to fit a
    rate). ffmpeg 5.1 renamed `-vsync` to `-fps_mode` and 8.0 removed `-vsync`; imageio-ffmpeg 0.5.1
    (which this pack accepts, and which ComfyUI set-ups often hold) bundles ffmpeg 4.2.2."""
    version = ffmpeg_version()
    if version is not None and version < (5, 1):
        return ["-vsync", "passthrough"]
    return ["-fps_mode", "passthrough"]


def stderr_tail(text: str | bytes, lines: int = 12) -> str:
    """Last non-empty lines of ffmpeg's stderr, for error messages."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    kept = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join(kept[-lines:])


def drain_stderr(stream, sink: list[bytes], keep: int = 64) -> None:
    """Read a pipe until EOF into `sink`, keeping only recent chunks (errors are at the end).

    Run it in a thread: an undrained stderr pipe fills up and blocks ffmpeg mid-write.
    """
    for chunk in iter(lambda: stream.read(8192), b""):
        sink.append(chunk)
        if len(sink) > 2 * keep:
            del sink[:-keep]
