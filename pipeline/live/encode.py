"""The clock's ticks as fragmented MP4 (H.264 + Opus, or AAC) for Media Source Extensions: the websocket transport.

Video timestamps are the tick's audio sample count (time base 1/audio rate), so the file carries the one
media clock as it is. The init segment comes first (PyAV's muxer writes it), then each tick's bytes.

Each tick leaves as one fragment of its own, written here (moof + mdat, after PyAV's init segment): PyAV's MP4
muxer held every video frame one tick (its interleaving waits for audio of a later time, and its fragmenter closes
a fragment only when the next packet arrives; PyAV exposes no flush), 40 ms of every first frame at the client.
The timestamps are the muxer's own (decoded times compared with it on 2026-12-03; tests/test_live_encode.py keeps
them): both tracks moved by the audio encoder's delay, the first video frame stretched over it.

Why Opus by default: AAC's encoder gives a tick's audio ~2 ticks late (1,024 samples of priming and 1,024-sample
frames against 960-sample ticks); Opus (20-ms frames, 6.5 ms of pre-skip) gives it at once. AAC stays available
(`audio="aac"`) for browsers whose Media Source Extensions lack Opus in MP4.
"""
from __future__ import annotations

import io
import re
import struct
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


def _box(kind: bytes, *parts: bytes) -> bytes:
    body = b"".join(parts)
    return struct.pack(">I4s", 8 + len(body), kind) + body


def _full_box(kind: bytes, version: int, flags: int, *parts: bytes) -> bytes:
    return _box(kind, struct.pack(">I", (version << 24) | flags), *parts)


def _track_timescales(init: bytes) -> dict[int, int]:
    """track_ID -> its media timescale, read from an init segment's moov (tkhd and mdhd of every trak)."""
    def children(buf: bytes):
        at = 0
        while at + 8 <= len(buf):
            size, kind = struct.unpack(">I4s", buf[at:at + 8])
            if size < 8:
                return
            yield kind, buf[at + 8:at + size]
            at += size

    out: dict[int, int] = {}
    for kind, body in children(init):
        if kind != b"moov":
            continue
        for trak_kind, trak in children(body):
            if trak_kind != b"trak":
                continue
            track_id = timescale = None
            for k, b in children(trak):
                if k == b"tkhd":
                    track_id = struct.unpack(">I", b[20:24] if b[0] == 1 else b[12:16])[0]
                elif k == b"mdia":
                    for k2, b2 in children(b):
                        if k2 == b"mdhd":
                            timescale = struct.unpack(">I", b2[20:24] if b2[0] == 1 else b2[12:16])[0]
            if track_id is not None and timescale:
                out[track_id] = timescale
    return out


def _opus_pre_skip(init: bytes) -> int | None:
    """The Opus track's pre-skip (samples at 48 kHz) from the init segment's dOps box, or None without one."""
    at = init.find(b"dOps")
    if at < 4 or at + 8 > len(init):
        return None
    return struct.unpack(">H", init[at + 6:at + 8])[0]  # after the type: version (1), channels (1), PreSkip (2)


_START_CODE = re.compile(b"\x00\x00\x01")


def annexb_to_avcc(data: bytes) -> bytes:
    """H.264 from start codes (what libx264 gives) to 4-byte lengths (what an MP4 sample holds). Only Annex-B input:
    length-prefixed data cannot be told from it in general (a length of 256-511 bytes begins 00 00 01 too)."""
    if not (data.startswith(b"\x00\x00\x01") or data.startswith(b"\x00\x00\x00\x01")):
        raise ValueError("annexb_to_avcc: the data does not begin with an H.264 start code")
    starts = [m.end() for m in _START_CODE.finditer(data)]
    out = []
    for i, begin in enumerate(starts):
        end = starts[i + 1] - 3 if i + 1 < len(starts) else len(data)
        nal = data[begin:end]
        if i + 1 < len(starts) and nal.endswith(b"\x00"):  # the next start code was 4 bytes long
            nal = nal[:-1]
        out.append(struct.pack(">I", len(nal)) + nal)
    return b"".join(out)


KEY_SAMPLE = 0x02000000      # sample_depends_on = 2: a sync sample
DELTA_SAMPLE = 0x01010000    # depends on others, not a sync sample


def fragment(sequence: int, tracks: list[tuple[int, int, list[tuple[int, bytes, int]]]]) -> bytes:
    """One moof + mdat: tracks = [(track_id, base media decode time, [(duration, data, flags), ...]), ...] with
    samples; each traf's data offset points into the one mdat (tfhd default-base-is-moof)."""
    tracks = [t for t in tracks if t[2]]
    if not tracks:
        return b""

    def moof(offsets: list[int]) -> bytes:
        trafs = []
        for (track_id, base, samples), offset in zip(tracks, offsets):
            entries = b"".join(struct.pack(">III", dur, len(data), flags) for dur, data, flags in samples)
            trafs.append(_box(b"traf", _full_box(b"tfhd", 0, 0x020000, struct.pack(">I", track_id)),
                              _full_box(b"tfdt", 1, 0, struct.pack(">Q", base)),
                              _full_box(b"trun", 0, 0x000701, struct.pack(">Ii", len(samples), offset), entries)))
        return _box(b"moof", _full_box(b"mfhd", 0, 0, struct.pack(">I", sequence)), *trafs)

    size = len(moof([0] * len(tracks)))  # offsets do not change the box sizes
    offsets, at = [], size + 8
    for _, _, samples in tracks:
        offsets.append(at)
        at += sum(len(data) for _, data, _ in samples)
    return moof(offsets) + _box(b"mdat", *(data for _, _, samples in tracks for _, data, _ in samples))


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
        self._out.start_encoding()  # the init segment (ftyp + moov) now; the fragments are written below
        self._init = self._sink.take()
        scales = _track_timescales(self._init)
        self._video_scale, self._audio_scale = scales.get(1, self.rate), scales.get(2, self._audio_rate)
        self._audio_delay: int | None = None  # the audio encoder's delay in the audio track's units, at its 1st packet
        pre_skip = _opus_pre_skip(self._init) if audio == "opus" else None
        if pre_skip is not None:  # known now: a first tick that gives no Opus packet (fps >= 50) is timed right too
            self._set_audio_delay(pre_skip)
        self._video_end = 0   # media time (video track units) where the last video sample ends
        self._last_index: int | None = None
        self._sequence = 0

    def _set_audio_delay(self, delay: int) -> None:
        self._audio_delay = delay
        if self.audio_codec == "opus":  # the clock's media time moves with it (server.py reads .shift)
            self.shift = int(round(delay / self._audio_scale * self.rate))

    def encode(self, index: int, frame: np.ndarray, audio: np.ndarray) -> bytes:
        """Tick `index` (clock frame) -> the bytes to send now: the init segment first, then this tick's fragment
        (its video frame and the audio packets its encoder gave; AAC's come ~2 ticks late)."""
        import av

        if self._origin is None:
            self._origin = index
        if self._last_index is not None and index <= self._last_index:
            raise ValueError(f"tick {index} after tick {self._last_index}: the ticks must come in order")
        audio_packets = []
        # ticks the server dropped (a slow client): their audio as silence, so the audio track has no hole; the
        # video sample of this tick starts where the last one ended (_write), so that track has none either
        for missing in range(self._last_index + 1 if self._last_index is not None else index, index):
            audio_packets += self._encode_audio(missing, np.zeros(self.spf, np.int16))
        self._last_index = index
        pts = (index - self._origin) * self.spf
        video = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
        video.pts, video.time_base = pts, Fraction(1, self.rate)
        video_packets = list(self._video.encode(video))
        audio_packets += self._encode_audio(index, audio)
        return self._init_once() + self._write(video_packets, audio_packets)

    def _encode_audio(self, index: int, audio: np.ndarray) -> list:
        import av

        sound = av.AudioFrame.from_ndarray(np.asarray(audio, np.int16).reshape(1, -1), format="s16", layout="mono")
        sound.sample_rate, sound.pts = self.rate, (index - self._origin) * self.spf
        sound.time_base = Fraction(1, self.rate)
        return list(self._audio.encode(sound))

    def _init_once(self) -> bytes:
        out, self._init = self._init, b""
        return out

    def _write(self, video_packets: list, audio_packets: list) -> bytes:
        """The packets as one fragment, timed as PyAV's muxer timed them: media time = the encoder's time + the
        audio encoder's delay (Opus: its pre-skip; AAC: its priming), both tracks; the first video frame starts
        at 0 and lasts its frame plus that delay; a frame after dropped ticks starts where the last one ended."""
        audio: list[tuple[int, bytes, int]] = []
        audio_base = None
        for packet in audio_packets:
            t = int(round(float(packet.pts * packet.time_base) * self._audio_scale))
            if self._audio_delay is None:  # AAC, or an Opus init segment without dOps: the first packet says
                self._set_audio_delay(max(0, -t))
            audio_base = t + self._audio_delay if audio_base is None else audio_base
            duration = int(round(float(packet.duration * packet.time_base) * self._audio_scale)) if packet.duration \
                else self._audio.codec_context.frame_size
            audio.append((duration, bytes(packet), KEY_SAMPLE))
        video: list[tuple[int, bytes, int]] = []
        video_base = None
        frame_ticks = int(round(self.spf / self.rate * self._video_scale))
        shift = int(round(self.shift / self.rate * self._video_scale))
        for packet in video_packets:
            if packet.dts is not None and packet.pts != packet.dts:  # the trun below has no composition offsets
                raise RuntimeError("the H.264 encoder reordered frames (B-frames); the live stream needs bf=0")
            t = int(round(float(packet.pts * packet.time_base) * self._video_scale))
            # from where the last sample ended (the first: 0, lasting its frame plus the delay) to this frame's end
            start, end = self._video_end, t + shift + frame_ticks
            video_base = start if video_base is None else video_base
            video.append((end - start, annexb_to_avcc(bytes(packet)),
                          KEY_SAMPLE if packet.is_keyframe else DELTA_SAMPLE))
            self._video_end = end
        if not (video or audio):
            return b""
        self._sequence += 1  # mfhd numbers count up from 1, one a fragment
        return fragment(self._sequence, [(1, video_base or 0, video), (2, audio_base or 0, audio)])

    def close(self) -> bytes:
        """The encoders' last packets as a last fragment."""
        try:
            tail = self._write(list(self._video.encode(None)), list(self._audio.encode(None)))
        except Exception:  # noqa: BLE001 - closing after a client left: nothing to deliver
            tail = b""
        try:
            self._out.close()  # PyAV's own trailer is not sent: the fragments above are the stream
        except Exception:  # noqa: BLE001
            pass
        self._sink.take()
        return self._init_once() + tail
