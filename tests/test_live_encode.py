"""The websocket transport's fragmented MP4 (pipeline/live/encode.py): each tick's video frame leaves in that tick's
bytes (PyAV's own muxer held it one tick), with the muxer's timing (both tracks moved by the audio encoder's delay),
decodable by FFmpeg for both audio codecs."""
import io
import struct

import numpy as np
import pytest

av = pytest.importorskip("av")

from digital_human.pipeline.live.encode import FMP4Encoder, annexb_to_avcc  # noqa: E402

RATE, SPF, FPS = 24000, 960, 25.0


def _ticks(n: int, size: int = 64):
    rng = np.random.default_rng(0)
    for k in range(n):
        frame = np.full((size, size, 3), (40 + 20 * k) % 256, np.uint8)
        frame[:, : size // 2] = rng.integers(0, 255, (size, size // 2, 3), dtype=np.uint8)
        yield k, frame, (3000 * np.sin(np.arange(SPF) * 0.05 * (k + 1))).astype(np.int16)


def _decode(data: bytes) -> tuple[list[float], list[float]]:
    """Seconds of every decoded video frame and audio frame of a byte stream."""
    video, audio = [], []
    with av.open(io.BytesIO(data), format="mp4") as container:
        for frame in container.decode(*container.streams):
            (video if isinstance(frame, av.VideoFrame) else audio).append(float(frame.pts * frame.time_base))
    return video, audio


@pytest.mark.parametrize("codec", ["opus", "aac"])
def test_each_tick_frame_leaves_in_its_own_tick_with_the_muxer_timing(codec):
    encoder = FMP4Encoder(64, 64, FPS, RATE, SPF, bitrate=200_000, audio=codec)
    sent = b""
    for k, frame, sound in _ticks(8):
        sent += encoder.encode(100 + k, frame, sound)  # the clock's index need not start at 0
        video, _ = _decode(sent)
        assert len(video) == k + 1, f"tick {k}: {len(video)} frames decodable"
    shift = encoder.shift
    assert shift == (1024 if codec == "aac" else 156)  # AAC's priming; Opus's 312-sample pre-skip at 48 kHz
    video, audio = _decode(sent + encoder.close())
    expected = [0.0] + [(k * SPF + shift) / RATE for k in range(1, 8)]
    assert np.allclose(video, expected, atol=1e-6)
    # the audio track starts at media time 0; the decoder drops Opus's 312-sample pre-skip (6.5 ms) from its start.
    # Video and audio times are those PyAV's own muxer gave (compared on 2026-12-03 before it was replaced)
    assert audio and abs(audio[0] - (312 / 48000 if codec == "opus" else 0.0)) < 1e-6


def test_frames_decode_to_what_was_sent():
    encoder = FMP4Encoder(64, 64, FPS, RATE, SPF, bitrate=2_000_000)
    frames = []
    data = b""
    for k, frame, sound in _ticks(5):
        frames.append(frame)
        data += encoder.encode(k, frame, sound)
    with av.open(io.BytesIO(data + encoder.close()), format="mp4") as container:
        got = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(got) == 5
    for want, have in zip(frames, got):  # H.264 at a high rate: the flat half within a few levels
        assert np.abs(want[:, 40:].astype(int) - have[:, 40:].astype(int)).mean() < 4


def test_annexb_to_avcc():
    nal1, nal2 = b"\x67\x42\x00\x1f", b"\x65\x88\x80\x00\x00\x03\x00"
    annexb = b"\x00\x00\x00\x01" + nal1 + b"\x00\x00\x01" + nal2
    want = struct.pack(">I", len(nal1)) + nal1 + struct.pack(">I", len(nal2)) + nal2
    assert annexb_to_avcc(annexb) == want
    long_nal = b"\x65" + bytes(range(1, 256)) + b"\x11" * 44  # 300 bytes, start codes 3 and 4 bytes long
    assert annexb_to_avcc(b"\x00\x00\x01" + long_nal + b"\x00\x00\x00\x01" + nal1) == (
        struct.pack(">I", 300) + long_nal + struct.pack(">I", len(nal1)) + nal1)
    with pytest.raises(ValueError, match="start code"):  # length-prefixed input is refused, not guessed at
        annexb_to_avcc(want)


def _timelines(data: bytes) -> dict[str, list[tuple[int, int]]]:
    """(pts, duration) of every demuxed packet per track, in the track's time base."""
    out: dict[str, list[tuple[int, int]]] = {"video": [], "audio": []}
    with av.open(io.BytesIO(data), format="mp4") as container:
        for packet in container.demux():
            if packet.size:
                out[packet.stream.type].append((int(packet.pts), int(packet.duration)))
    return out


def _holes(track: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(a + da, b) for (a, da), (b, _) in zip(track, track[1:]) if a + da != b]


@pytest.mark.parametrize("codec", ["opus", "aac"])
def test_dropped_ticks_leave_no_hole_in_either_track(codec):
    """The server drops ticks a slow websocket client cannot take (ticks_dropped_ws): the next tick's frame starts
    where the last frame ended and the dropped ticks' audio is silence, so neither track has a gap (a gap splits
    the browser's buffered range and stalls playback)."""
    encoder = FMP4Encoder(64, 64, FPS, RATE, SPF, bitrate=200_000, audio=codec)
    data = b""
    dropped = {20, 21, 47}
    for k, frame, sound in _ticks(80):
        if k not in dropped:
            data += encoder.encode(k, frame, sound)
    data += encoder.close()
    tracks = _timelines(data)
    assert len(tracks["video"]) == 80 - len(dropped)
    assert _holes(tracks["video"]) == [] and _holes(tracks["audio"]) == []
    v_end = tracks["video"][-1][0] + tracks["video"][-1][1]
    assert v_end == 80 * SPF + encoder.shift  # video time scale: the session rate (24 kHz)
    a_end = tracks["audio"][-1][0] + tracks["audio"][-1][1]
    audio_rate = 48000 if codec == "opus" else RATE
    assert a_end >= 80 * SPF * audio_rate // RATE  # all 80 ticks' samples, the dropped ones' as silence
    with pytest.raises(ValueError, match="must come in order"):
        encoder.encode(79, *next(_ticks(1))[1:])


def test_opus_first_frame_timed_from_the_pre_skip_when_its_tick_gives_no_packet():
    """At 50 frames/s a tick holds 10 ms of audio and the first gives no Opus packet (20-ms frames): the pre-skip
    comes from the init segment (dOps), so the first frame is timed as at 25 frames/s (no 6.5-ms hole after it)."""
    spf = RATE // 50
    encoder = FMP4Encoder(64, 64, 50.0, RATE, spf, bitrate=200_000, audio="opus")
    assert encoder.shift == 156  # known before any packet: 312 samples at 48 kHz
    data = b""
    for k in range(30):
        data += encoder.encode(k, np.full((64, 64, 3), 8 * k, np.uint8),
                               (3000 * np.sin(np.arange(spf) * 0.05)).astype(np.int16))
    tracks = _timelines(data + encoder.close())
    assert tracks["video"][0] == (0, spf + 156) and _holes(tracks["video"]) == []
