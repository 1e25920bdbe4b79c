"""The clock's ticks as fragmented MP4 (H.264 + AAC) for Media Source Extensions: the websocket transport.

Video timestamps are the tick's audio sample count (time base 1/audio rate), so the file carries the one
media clock as it is. Each tick is muxed as it comes; the bytes the muxer wrote since the last tick
(the init segment first, then moof+mdat fragments of ~one frame) are returned for sending.
"""
from __future__ import annotations

import io
from fractions import Fraction

import numpy as np

MIME = 'video/mp4; codecs="avc1.42E01F, mp4a.40.2"'  # H.264 constrained baseline, AAC-LC
AAC_PRIMING = 1024  # samples: the muxer shifts both tracks by the AAC encoder delay (media time = pts + this)


class _Sink(io.RawIOBase):
    """A write-only file that keeps what was written until `take`. Not seekable: the muxer streams."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def write(self, data) -> int:  # type: ignore[override]
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self._parts = b"".join(self._parts), []
        return out


class FMP4Encoder:
    def __init__(self, width: int, height: int, fps: float, rate: int, samples_per_frame: int,
                 bitrate: int = 1_500_000) -> None:
        import av

        self.rate, self.spf = int(rate), int(samples_per_frame)
        self._sink = _Sink()
        # one fragment per frame (frag_duration below a frame); empty_moov: the init segment comes first
        self._out = av.open(self._sink, mode="w", format="mp4", options={
            "movflags": "frag_keyframe+empty_moov+default_base_moof+omit_tfhd_offset", "frag_duration": "1"})
        self._video = self._out.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
        self._video.width, self._video.height, self._video.pix_fmt = width, height, "yuv420p"
        self._video.bit_rate = bitrate
        self._video.time_base = Fraction(1, self.rate)
        # no B-frames, no lookahead: a frame is coded when it arrives; a keyframe every second for late joiners
        self._video.codec_context.options = {"preset": "ultrafast", "tune": "zerolatency", "profile": "baseline",
                                             "g": str(int(round(fps))), "bf": "0"}
        self._audio = self._out.add_stream("aac", rate=self.rate, layout="mono")
        self._audio.time_base = Fraction(1, self.rate)
        self._origin: int | None = None  # the first tick's clock frame: the file starts at 0

    def encode(self, index: int, frame: np.ndarray, audio: np.ndarray) -> bytes:
        """Tick `index` (clock frame) -> the bytes to send now (may be empty while the encoders fill)."""
        import av

        if self._origin is None:
            self._origin = index
        pts = (index - self._origin) * self.spf
        video = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
        video.pts, video.time_base = pts, Fraction(1, self.rate)
        for packet in self._video.encode(video):
            self._out.mux(packet)
        sound = av.AudioFrame.from_ndarray(np.asarray(audio, np.int16).reshape(1, -1), format="s16", layout="mono")
        sound.sample_rate, sound.pts, sound.time_base = self.rate, pts, Fraction(1, self.rate)
        for packet in self._audio.encode(sound):
            self._out.mux(packet)
        return self._sink.take()

    def close(self) -> bytes:
        try:
            for stream in (self._video, self._audio):
                for packet in stream.encode(None):
                    self._out.mux(packet)
            self._out.close()
        except Exception:  # noqa: BLE001 - closing after a client left: nothing to deliver
            pass
        return self._sink.take()
