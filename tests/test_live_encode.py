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
        frame = np.full((size, size, 3), 40 + 20 * k, np.uint8)
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
    assert annexb_to_avcc(want) == want  # already length-prefixed (no start code): unchanged
