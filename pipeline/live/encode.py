"""The clock's ticks as fragmented MP4 (H.264 + Opus, or AAC) for Media Source Extensions: the websocket transport.

Video timestamps are the tick's audio sample count (time base 1/audio rate), so the file carries the one
media clock as it is. Each tick is muxed as it comes; the bytes the muxer wrote since the last tick
(the init segment first, then moof+mdat fragments of ~one frame) are returned for sending.

Why Opus by default: the muxer writes a video frame only once it holds audio of the same time (interleaving),
and AAC's encoder gives a tick's audio ~2 ticks late (1,024 samples of priming and 1,024-sample frames against
960-sample ticks), so with AAC a tick's frame was decodable at the client 3-4 ticks (120-160 ms) after the
encoder took it; Opus (20-ms frames, 6.5 ms of pre-skip) gives its audio at once, and the frame is decodable 1
tick later (the fragment holding it closes when the next tick's first packet is muxed). Measured with the encoder
and PyAV's decoder alone on the CPU (2026-12-02). AAC stays available (`audio="aac"`) for browsers whose Media
Source Extensions lack Opus in MP4.
"""
from __future__ import annotations

import io
from fractions import Fraction

import numpy as np

VIDEO_CODEC = "avc1.42E01F"  # H.264 constrained baseline
AUDIO_CODECS = {"opus": ("libopus", "opus"), "aac": ("aac", "mp4a.40.2")}  # name -> (encoder, MSE codec string)
AAC_PRIMING = 1024  # samples: the muxer shifts both tracks by the AAC encoder delay (media time = pts + this)
MIME = f'video/mp4; codecs="{VIDEO_CODEC}, {AUDIO_CODECS["aac"][1]}"'  # the AAC stream's type (kept for callers)


def mime(audio: str = "opus") -> str:
    """The Media Source Extensions type of a stream with `audio` ("opus" or "aac")."""
    if audio not in AUDIO_CODECS:
        raise ValueError(f"audio must be one of {sorted(AUDIO_CODECS)}, got {audio!r}")
    return f'video/mp4; codecs="{VIDEO_CODEC}, {AUDIO_CODECS[audio][1]}"'


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
                 bitrate: int = 1_500_000, audio: str = "opus") -> None:
        import av

        self.mime = mime(audio)
        self.audio_codec = audio
        self.rate, self.spf = int(rate), int(samples_per_frame)
        # media time of a tick = (its sample count + shift) / rate at the client: the muxer moves both tracks by
        # the audio encoder's delay (AAC: 1,024 samples; Opus: its pre-skip, read from its first packet)
        self.shift = AAC_PRIMING if audio == "aac" else 0
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
        # Opus at 48 kHz (the rate its MP4 sample entry states; Chromium's Media Source Extensions played no
        # frame of a 24 kHz track): PyAV's encoder resamples the ticks' audio to it
        self._audio_rate = 48000 if audio == "opus" else self.rate
        self._audio = self._out.add_stream(AUDIO_CODECS[audio][0], rate=self._audio_rate, layout="mono")
        self._audio.time_base = Fraction(1, self._audio_rate)
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
            if self.audio_codec == "opus" and packet.pts is not None and packet.pts < 0 and self._origin == index:
                # the pre-skip: the first packet starts that far before 0 (in the audio track's time base)
                self.shift = int(round(-packet.pts * float(packet.time_base) * self.rate))
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
