"""rgb_to_yuv420p against ffmpeg's own conversion, and mux_video fed by a FrameStream."""
from __future__ import annotations

import platform
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from digital_human.media.ffmpeg_tools import ffmpeg_exe  # noqa: E402
from digital_human.media.mux import FrameStream, MuxError, mux_video  # noqa: E402
from digital_human.media.probe import read_video_frames  # noqa: E402
from digital_human.media.yuv import rgb_to_yuv420p  # noqa: E402

SR = 16000


def _face(data_dir, size: int = 256) -> np.ndarray:
    from PIL import Image

    path = data_dir / "image" / "face_02_male.png"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    with Image.open(path) as im:
        return np.array(im.convert("RGB").resize((size, size), Image.BILINEAR))


def _moving(face: np.ndarray, n: int, h: int, w: int) -> np.ndarray:
    """n crops of the face sliding diagonally: real image content, every frame different."""
    return np.stack([face[3 * i: 3 * i + h, 2 * i: 2 * i + w] for i in range(n)])


def _ffmpeg_yuv420p(rgb: np.ndarray) -> np.ndarray:
    """What mux.py's RGB path feeds the encoder: the same `scale` filter as `_video_args`."""
    h, w, _ = rgb.shape
    cmd = [ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-f", "rawvideo", "-pix_fmt", "rgb24",
           "-video_size", f"{w}x{h}", "-i", "pipe:0",
           "-vf", "scale=out_color_matrix=bt709:out_range=tv,format=yuv420p", "-f", "rawvideo", "pipe:1"]
    out = subprocess.run(cmd, input=np.ascontiguousarray(rgb).tobytes(), capture_output=True, check=True).stdout
    return np.frombuffer(out, np.uint8)


def _planes(flat: np.ndarray, h: int, w: int) -> dict[str, np.ndarray]:
    return {"Y": flat[: h * w], "U": flat[h * w: h * w * 5 // 4], "V": flat[h * w * 5 // 4:]}


def _tone(seconds: float) -> np.ndarray:
    t = np.arange(int(round(seconds * SR))) / SR
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def _yuv_chunks(frames: np.ndarray, per_chunk: int):
    """A generator, as a GPU producer would be: converts and yields a few frames at a time."""
    for i in range(0, len(frames), per_chunk):
        yield rgb_to_yuv420p(torch.from_numpy(frames[i: i + per_chunk])).numpy()


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


@pytest.mark.parametrize("crop, pad_mode", [((256, 256), "edge"), ((131, 255), "edge"), ((131, 255), "black")])
def test_rgb_to_yuv420p_matches_ffmpeg(data_dir, crop, pad_mode):
    h, w = crop
    rgb = np.ascontiguousarray(_face(data_dir)[:h, :w])
    ours = rgb_to_yuv420p(torch.from_numpy(rgb)[None], pad_mode=pad_mode)
    hp, wp = h + h % 2, w + w % 2
    assert ours.dtype == torch.uint8 and ours.shape == (1, hp * wp * 3 // 2)
    # mux.py pads odd sizes with np.pad before ffmpeg converts; do the same for the reference
    padded = np.pad(rgb, ((0, hp - h), (0, wp - w), (0, 0)), mode="edge" if pad_mode == "edge" else "constant")
    ref = _planes(_ffmpeg_yuv420p(padded), hp, wp)
    got = _planes(ours[0].numpy(), hp, wp)
    for name in ("Y", "U", "V"):
        diff = np.abs(got[name].astype(int) - ref[name].astype(int))
        # what any swscale build should give (its rounding differs by CPU): within 1, rarely off
        assert diff.max() <= 1 and diff.mean() < 0.3, (name, diff.max(), diff.mean())
        if platform.machine() in ("x86_64", "AMD64"):
            # what was reached against imageio-ffmpeg's ffmpeg 9.0.2 on x86-64: bit-identical (the
            # module emulates its SIMD rounding). If a new ffmpeg build breaks only this line, the
            # conversion is still within the bound above; relax this to it.
            assert diff.max() == 0, (name, int((diff > 0).sum()))
    # the padding itself: "black" adds limited-range black (Y 16), "edge" repeats the border row
    y = got["Y"].reshape(hp, wp)
    if h % 2 and pad_mode == "black":
        assert (y[-1] == 16).all()
    if h % 2 and pad_mode == "edge":
        assert np.array_equal(y[-1], y[-2])


def test_rgb_to_yuv420p_batch_and_validation():
    rng = np.random.default_rng(0)
    frames = torch.from_numpy(rng.integers(0, 256, (3, 24, 32, 3), dtype=np.uint8))
    batch = rgb_to_yuv420p(frames)
    assert batch.shape == (3, 24 * 32 * 3 // 2)
    assert torch.equal(batch[1], rgb_to_yuv420p(frames[1:2])[0])  # frames are independent
    with pytest.raises(ValueError, match="uint8"):
        rgb_to_yuv420p(frames.float() / 255)
    with pytest.raises(ValueError, match=r"\[B, H, W, 3\]"):
        rgb_to_yuv420p(frames[0])
    with pytest.raises(ValueError, match="pad_mode"):
        rgb_to_yuv420p(frames, pad_mode="mirror")


def test_yuv_stream_matches_rgb_array_path(data_dir, tmp_path):
    frames = _moving(_face(data_dir), 8, 192, 160)
    opts = dict(crf=18, preset="ultrafast")
    ref = mux_video(frames, _tone(0.32), SR, 25.0, tmp_path / "rgb.mp4", **opts)
    seen = []
    stream = FrameStream(count=8, width=160, height=192, pix_fmt="yuv420p", chunks=_yuv_chunks(frames, 3))
    rep = mux_video(stream, _tone(0.32), SR, 25.0, tmp_path / "yuv.mp4",
                    progress=lambda d, t: seen.append((d, t)), **opts)
    p = rep.probe
    assert p.video_codec == "h264" and p.pix_fmt == "yuv420p" and (p.width, p.height) == (160, 192)
    assert p.frame_count == 8 == rep.frames_written and rep.frames_in == 8 and p.audio_codec == "aac"
    assert "bt709" in p.header and "tv" in p.header  # tagged like the RGB path's output
    assert seen == [(3, 8), (6, 8), (8, 8)]  # one progress call per chunk written
    a, _ = read_video_frames(ref.path)
    b, _ = read_video_frames(rep.path)
    assert a.shape == b.shape == (8, 192, 160, 3)
    assert _psnr(a, b) >= 40.0
    if platform.machine() in ("x86_64", "AMD64"):
        # reached with imageio-ffmpeg's ffmpeg 9.0.2: the conversion is bit-identical, so x264 gets
        # the same input and the two files are byte for byte the same (tags included)
        assert ref.path.read_bytes() == rep.path.read_bytes()
    assert sorted(q.name for q in tmp_path.iterdir()) == ["rgb.mp4", "yuv.mp4"]


def test_yuv_stream_is_encoded_without_conversion(tmp_path):
    """crf 0 is lossless in x264: the decoded YUV is exactly what was streamed (no range/matrix change)."""
    rng = np.random.default_rng(1)
    yuv = rng.integers(16, 236, (3, 48 * 64 * 3 // 2), dtype=np.uint8)
    rep = mux_video(FrameStream(3, 64, 48, "yuv420p", [yuv]), None, SR, 25.0, tmp_path / "l.mp4",
                    crf=0, preset="ultrafast")
    out = subprocess.run([ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-i", str(rep.path),
                          "-f", "rawvideo", "-pix_fmt", "yuv420p", "pipe:1"], capture_output=True, check=True).stdout
    assert np.array_equal(np.frombuffer(out, np.uint8), yuv.reshape(-1))


def test_rgb24_stream_pads_like_the_array_path(tmp_path):
    rng = np.random.default_rng(2)
    frames = rng.integers(0, 256, (4, 31, 45, 3), dtype=np.uint8)
    a = mux_video(frames, None, SR, 25.0, tmp_path / "a.mp4", preset="ultrafast")
    b = mux_video(FrameStream(4, 45, 31, "rgb24", iter([frames[:1], frames[1:]])), None, SR, 25.0,
                  tmp_path / "b.mp4", preset="ultrafast")
    assert b.padding == a.padding == "1 px right (edge), 1 px bottom (edge)"
    assert np.array_equal(read_video_frames(a.path)[0], read_video_frames(b.path)[0])


def test_hold_last_frame_repeats_the_streams_last_frame(data_dir, tmp_path):
    frames = _moving(_face(data_dir, 128), 5, 64, 64)
    stream = FrameStream(5, 64, 64, "yuv420p", _yuv_chunks(frames, 2))
    rep = mux_video(stream, _tone(0.4), SR, 25.0, tmp_path / "h.mp4", length_mode="hold_last_frame", crf=0)
    assert rep.frames_written == rep.probe.frame_count == 10 and "held for 5 extra frames" in rep.action
    back, _ = read_video_frames(rep.path)
    held = back[5:].astype(int)
    assert np.abs(held - back[4].astype(int)).max() <= 2  # repeats of frame 4
    assert np.abs(back[4].astype(int) - back[3].astype(int)).mean() > 3  # the frames really differ


def test_trim_stops_pulling_frames_it_does_not_need(tmp_path):
    produced = []
    closed = []

    def gen():
        try:
            for i in range(10):
                produced.append(i)
                yield np.full((1, 16 * 16 * 3 // 2), 100 + 10 * i, np.uint8)
        finally:
            closed.append(True)

    rep = mux_video(FrameStream(10, 16, 16, "yuv420p", gen()), _tone(0.2), SR, 25.0, tmp_path / "t.mp4",
                    length_mode="trim", preset="ultrafast")
    assert rep.frames_written == 5 and produced == [0, 1, 2, 3, 4] and closed == [True]


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize(
    "chunks, match",
    [
        ([np.zeros((2, 96), np.uint8)], "ended after 2 of its 4 frames"),  # too few
        ([np.zeros((3, 96), np.uint8), np.zeros((2, 96), np.uint8)], "more frames than its count of 4"),
        ([np.zeros((1, 96), np.uint8), np.zeros(100, np.uint8)], "not a whole number"),  # partial frame
        ([np.zeros((4, 96), np.float32)], "dtype float32"),
    ],
)
def test_bad_stream_raises_and_leaves_nothing(tmp_path, chunks, match):
    with pytest.raises(MuxError, match=match):
        mux_video(FrameStream(4, 8, 8, "yuv420p", iter(chunks)), _tone(0.16), SR, 25.0, tmp_path / "c.mp4",
                  preset="ultrafast")
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("error", [RuntimeError("model crashed"), FileNotFoundError("weights missing")])
def test_exception_inside_the_generator_propagates_and_cleans_up(tmp_path, error):
    def gen():
        yield np.zeros((2, 96), np.uint8)
        raise error

    with pytest.raises(type(error)) as caught:
        mux_video(FrameStream(4, 8, 8, "yuv420p", gen()), _tone(0.16), SR, 25.0, tmp_path / "g.mp4",
                  preset="ultrafast")
    assert caught.value is error  # unchanged, not wrapped (an OSError too)
    assert _leftovers(tmp_path) == []


def test_odd_yuv420p_size_is_refused(tmp_path):
    with pytest.raises(ValueError, match="even width and height.*rgb_to_yuv420p"):
        mux_video(FrameStream(2, 9, 8, "yuv420p", iter([])), None, SR, 25.0, tmp_path / "o.mp4")
    with pytest.raises(ValueError, match="pix_fmt"):
        mux_video(FrameStream(2, 8, 8, "nv12", iter([])), None, SR, 25.0, tmp_path / "o.mp4")
    assert _leftovers(tmp_path) == []


def test_interruption_from_progress_propagates_unchanged(tmp_path):
    """InterruptedError is an OSError subclass; mux must not report it as an unwritable folder."""
    frames = np.zeros((8, 16, 16, 3), np.uint8)

    def stop(done: int, total: int) -> None:
        raise InterruptedError("stopped by the user")

    with pytest.raises(InterruptedError, match="stopped by the user"):
        mux_video(frames, None, 16000, 25.0, tmp_path / "x.mp4", progress=stop)
    assert list(tmp_path.iterdir()) == []
