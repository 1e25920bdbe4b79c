"""The headless video path (talking_head/render_video.py) against the node path it replaces:
TRT_TalkingHead's CPU paste-back -> TemporalSmooth -> image_to_uint8 -> VideoMux. Real photo / clip /
speech from the sample data; torch on the CPU runs the same code a GPU would."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from digital_human.audio.decode import decode_audio
from digital_human.talking_head.driver import paste_generated
from digital_human.talking_head.portrait.animate import portrait_crops
from digital_human.talking_head.render_video import iter_video_frames, paste_region, render_talking_video
from digital_human.nodes.image_convert import image_to_uint8, uint8_to_image
from digital_human.nodes.video_nodes import TemporalSmooth
from digital_human.vision import align_faces


@pytest.fixture(scope="module")
def speech(data_dir):
    wave, sr = decode_audio(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=6.0)
    return wave.mean(0)[int(2.8 * sr): int(4.8 * sr)], sr  # 2 s with a speech onset


@pytest.fixture(scope="module")
def photo_track(data_dir, face_runners):
    from digital_human.media.probe import read_video_frames

    frames, _ = read_video_frames(data_dir / "image" / "face_02_male.png")
    return align_faces(frames, 0, runners=face_runners)


@pytest.fixture(scope="module")
def video_track(data_dir, face_runners):
    from digital_human.media.probe import read_video_frames

    frames, fps = read_video_frames(data_dir / "video" / "talk_en_male_01a.mp4", max_frames=24)
    return align_faces(frames, fps, runners=face_runners)


def _node_path(gen, strength: float) -> np.ndarray:
    result = paste_generated(gen)
    images = uint8_to_image(result.frames)
    if strength > 0:
        images, _ = TemporalSmooth().smooth(images, strength=strength, fps=gen.fps, faces=result.track)
    return image_to_uint8(images)


def _headless(gen, strength: float) -> np.ndarray:
    chunks = iter_video_frames(gen, smooth_strength=strength, device="cpu", chunk_frames=7)
    return np.concatenate([c.numpy() for c in chunks])


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


@pytest.mark.parametrize("strength,shift", [(0.0, 0), (0.5, 0), (0.5, 30)])
def test_photo_frames_match_the_node_path(photo_track, speech, strength, shift):
    wave, sr = speech
    gen = portrait_crops(photo_track, wave, sr, 25.0)
    if shift:  # crops whose colours differ from the frame's (a generator's): pasted as they are, no colour match
        gen = replace(gen, crops=np.clip(gen.crops.astype(int) + shift, 0, 255).astype(np.uint8))
    expected, got = _node_path(gen, strength), _headless(gen, strength)
    assert got.shape == expected.shape == (50, *photo_track.frames.shape[1:])
    diff = np.abs(got.astype(int) - expected.astype(int))
    # outside the face box every pixel is the photo's own; inside, the two differ by bilinear
    # rounding only (OpenCV quantises sub-pixel positions to 1/32 px, grid_sample does not)
    rows, cols = paste_region(gen)
    outside = np.ones(got.shape[1:3], bool)
    outside[rows, cols] = False
    assert 0 < outside.mean() < 1
    np.testing.assert_array_equal(got[:, outside], np.broadcast_to(photo_track.frames[0][outside], got[:, outside].shape))
    np.testing.assert_array_equal(expected[:, outside], got[:, outside])
    assert _psnr(got, expected) >= 45.0 and diff.max() <= 12 and (diff > 2).mean() < 2e-3
    assert np.abs(got.astype(int) - photo_track.frames[0]).max() > 40  # the mouth was animated


def test_video_reference_matches_the_node_path(video_track, speech):
    wave, sr = speech
    gen = portrait_crops(video_track, wave, sr, 25.0, loop_mode="ping-pong")  # 50 frames over 24
    expected, got = _node_path(gen, 0.5), _headless(gen, 0.5)
    assert got.shape == expected.shape
    assert _psnr(got, expected) >= 45.0


@pytest.mark.parametrize("yuv_on_device", [False, True])
def test_render_writes_a_probed_mp4_close_to_the_node_path(tmp_path, photo_track, speech, yuv_on_device):
    from digital_human.media.mux import mux_video
    from digital_human.media.probe import read_video_frames

    wave, sr = speech
    gen = portrait_crops(photo_track, wave, sr, 25.0)
    calls = []
    result = render_talking_video(gen, wave, sr, tmp_path / "headless.mp4", device="cpu", chunk_frames=16,
                                  yuv_on_device=yuv_on_device, progress=lambda d, t: calls.append((d, t)))
    assert result.path.is_file() and result.mux.probe.video_codec == "h264"
    assert result.mux.frames_written == 50 and abs(result.mux.probe.video_duration - 2.0) < 0.05
    assert calls[-1] == (50, 50) and all(b[0] >= a[0] for a, b in zip(calls, calls[1:]))
    node = mux_video(_node_path(gen, 0.5), wave, sr, 25.0, tmp_path / "node.mp4", length_mode="pad_audio")
    got, _ = read_video_frames(result.path)
    expected, _ = read_video_frames(node.path)
    assert got.shape == expected.shape and _psnr(got, expected) >= 40.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["headless.mp4", "node.mp4"]


def test_interrupted_render_leaves_no_file(tmp_path, photo_track, speech):
    wave, sr = speech
    gen = portrait_crops(photo_track, wave, sr, 25.0)
    calls = []
    with pytest.raises(InterruptedError, match="interrupted while encoding.*no file was written"):
        render_talking_video(gen, wave, sr, tmp_path / "out.mp4", device="cpu", chunk_frames=8,
                             progress=lambda d, t: calls.append(d), should_stop=lambda: bool(calls) and calls[-1] > 30)
    assert list(tmp_path.iterdir()) == []


def test_cli_animate_headless_and_nodes(tmp_path, data_dir, speech, setup_models):
    """`digital-human animate --render headless|nodes`: both write a probed MP4 of the speech's length."""
    import json
    import subprocess
    import sys

    from digital_human.media.wav_float import write_float_wav

    wave, sr = speech
    audio = tmp_path / "speech.wav"
    write_float_wav(audio, wave[None, : sr], sr)  # 1 s
    for render in ("headless", "nodes"):
        out = tmp_path / f"{render}.mp4"
        proc = subprocess.run([sys.executable, "-m", "digital_human", "animate", "--face",
                               str(data_dir / "image" / "face_02_male.png"), "--audio", str(audio), "--out", str(out),
                               "--render", render, "--json"], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        assert report["frames"] == 25 and abs(report["video_seconds"] - 1.0) < 0.05
        assert ("video" in report["timings"]) == (render == "headless")


def test_prefetch_thread_hands_on_items_and_errors_in_order():
    import itertools
    import time

    from digital_human.talking_head.render_video import _prefetched

    def items():
        yield 1
        yield 2
        raise RuntimeError("chunk 3 failed")

    got = []
    with pytest.raises(RuntimeError, match="chunk 3 failed"):
        for item in _prefetched(items()):
            got.append(item)
    assert got == [1, 2]
    endless = _prefetched(itertools.count())  # the consumer stops early: the worker must not hang
    assert next(endless) == 0
    start = time.perf_counter()
    endless.close()
    assert time.perf_counter() - start < 5.0


@pytest.mark.parametrize("which", ["photo", "video"])
def test_streaming_generation_has_no_seams(photo_track, video_track, speech, which):
    """Crops made on demand chunk by chunk (the bounded-memory path) give the same frames as crops
    made all at once, whatever the chunk size: no seam at chunk or smoothing-block boundaries."""
    wave, sr = speech
    track = photo_track if which == "photo" else video_track
    eager = portrait_crops(track, wave, sr, 25.0)
    streaming = portrait_crops(track, wave, sr, 25.0, streaming=True)
    assert streaming.streaming and streaming.crops is None
    whole = np.concatenate([c.numpy() for c in iter_video_frames(eager, device="cpu", chunk_frames=50)])
    for chunk in (1, 7, 16):
        got = np.concatenate([c.numpy() for c in iter_video_frames(streaming, device="cpu", chunk_frames=chunk)])
        np.testing.assert_array_equal(got, whole)


def test_gpu_paste_threads_get_only_the_paste_stream(tmp_path, photo_track, speech, monkeypatch):
    """With YUV made on the device, paste and conversion run on two threads that both make the paste stream
    current: only that stream (never another object) reaches the stream context, in both threads, and the
    frames are those of the one-thread CPU path. (A CUDA stream cannot be made here: a marker stands in.)"""
    import threading

    from digital_human.media.probe import read_video_frames
    from digital_human.talking_head import render_video as rv

    marker, seen = object(), []

    def context(stream):
        import contextlib

        seen.append((stream, threading.current_thread().name))
        return contextlib.nullcontext()

    monkeypatch.setattr(rv, "_priority_stream", lambda dev: marker)
    monkeypatch.setattr(rv, "_stream_context", context)
    wave, sr = speech
    gen = portrait_crops(photo_track, wave, sr, 25.0)
    two = render_talking_video(gen, wave, sr, tmp_path / "two.mp4", device="cpu", chunk_frames=16, yuv_on_device=True)
    assert seen and all(s is marker for s, _ in seen)
    assert {"dh-video-paste", "dh-video-frames"} <= {name for _, name in seen}
    monkeypatch.undo()
    one = render_talking_video(gen, wave, sr, tmp_path / "one.mp4", device="cpu", chunk_frames=16, yuv_on_device=True)
    a, _ = read_video_frames(two.path)
    b, _ = read_video_frames(one.path)
    np.testing.assert_array_equal(a, b)
