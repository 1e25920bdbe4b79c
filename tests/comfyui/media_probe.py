"""Probe output media with PyAV (ComfyUI's own decoder dependency): streams, codecs, durations."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

AUDIO_SUFFIXES = {".flac", ".wav", ".mp3", ".opus", ".ogg", ".m4a"}
VIDEO_SUFFIXES = {".mp4", ".webm", ".mov"}


@dataclass
class Probe:
    path: Path
    video_codec: str | None = None
    pix_fmt: str | None = None
    width: int = 0
    height: int = 0
    fps: float = 0.0
    video_seconds: float = 0.0
    audio_codec: str | None = None
    sample_rate: int = 0
    audio_seconds: float = 0.0


def probe(path: Path) -> Probe:
    """Decode every stream fully (so a truncated file fails here, not in a browser)."""
    import av

    result = Probe(Path(path))
    with av.open(str(path)) as container:
        for stream in container.streams:
            if stream.type == "video":
                result.video_codec = stream.codec_context.name
                result.pix_fmt = stream.codec_context.pix_fmt
                result.width, result.height = stream.codec_context.width, stream.codec_context.height
                result.fps = float(stream.average_rate or 0)
            elif stream.type == "audio":
                result.audio_codec = stream.codec_context.name
                result.sample_rate = stream.codec_context.sample_rate
        frames = 0
        samples = 0
        for frame in container.decode(*[s for s in container.streams if s.type in ("audio", "video")]):
            if isinstance(frame, av.AudioFrame):
                samples += frame.samples
            else:
                frames += 1
        if result.sample_rate:
            result.audio_seconds = samples / result.sample_rate
        if frames and result.fps:
            result.video_seconds = frames / result.fps
    return result


def check_media(path: Path) -> Probe:
    """Assert a pack output is well-formed media; returns the probe for further checks."""
    suffix = Path(path).suffix.lower()
    info = probe(path)
    if suffix in AUDIO_SUFFIXES:
        assert info.audio_codec, f"{path.name}: no audio stream"
        assert info.audio_seconds > 0.5, f"{path.name}: only {info.audio_seconds:.2f} s of audio"
    elif suffix in VIDEO_SUFFIXES:
        assert info.video_codec == "h264", f"{path.name}: video codec {info.video_codec}, expected h264"
        assert info.pix_fmt == "yuv420p", f"{path.name}: pixel format {info.pix_fmt}, expected yuv420p"
        assert info.width % 2 == 0 and info.height % 2 == 0, f"{path.name}: odd size {info.width}x{info.height}"
        assert info.audio_codec == "aac", f"{path.name}: audio codec {info.audio_codec}, expected aac"
        frame = 1.0 / info.fps
        assert abs(info.video_seconds - info.audio_seconds) <= frame + 0.03, (
            f"{path.name}: video {info.video_seconds:.3f} s vs audio {info.audio_seconds:.3f} s")
    else:
        raise AssertionError(f"{path.name}: unexpected output type")
    return info
