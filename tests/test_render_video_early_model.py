"""The headless video path starts the model before the paste region is known (render_video.iter_video_frames):
the model's chunks no longer follow the box's memory bound, the paste-back splits them (paste_ranges), and the
frames stay those of the region-first order."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from digital_human.audio.decode import decode_audio
from digital_human.talking_head import render_video
from digital_human.talking_head.portrait.animate import portrait_crops
from digital_human.vision import align_faces


def test_paste_ranges_split_each_generated_chunk():
    assert render_video.paste_ranges(70, 32, 32) == [(0, 32), (32, 64), (64, 70)]
    assert render_video.paste_ranges(70, 32, 100) == [(0, 32), (32, 64), (64, 70)]
    # 32 frames in parts of at most 12: three equal parts of 11, 11, 10, never across a generated chunk
    assert render_video.paste_ranges(40, 32, 12) == [(0, 11), (11, 22), (22, 32), (32, 40)]
    assert render_video.paste_ranges(5, 7, 1) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    ranges = render_video.paste_ranges(1000, 32, 9)
    assert ranges[0][0] == 0 and ranges[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert max(e - s for s, e in ranges) <= 9


@pytest.fixture(scope="module")
def gen(data_dir, face_runners):
    from digital_human.media.probe import read_video_frames

    wave, sr = decode_audio(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=6.0)
    frames, fps = read_video_frames(data_dir / "video" / "talk_en_male_01a.mp4", max_frames=24)
    track = align_faces(frames, fps, runners=face_runners)
    return portrait_crops(track, wave.mean(0)[int(2.8 * sr): int(4.8 * sr)], sr, 25.0, loop_mode="ping-pong",
                          streaming=True)


def _frames(gen, chunk: int, threads: int, monkeypatch, box_bytes: int | None = None) -> np.ndarray:
    monkeypatch.setattr(render_video, "SMOOTH_MASK_THREADS", threads)
    if box_bytes is not None:
        monkeypatch.setattr(render_video, "CHUNK_BOX_BYTES", box_bytes)
    frames = render_video.iter_video_frames(gen, smooth_strength=0.5, device="cpu", chunk_frames=chunk)
    return np.concatenate([c.numpy() for c in frames])


@pytest.mark.parametrize("threads", [1, 3])
def test_paste_chunks_smaller_than_model_chunks_give_the_same_frames(gen, threads, monkeypatch):
    """A box too large for a whole model chunk at a time (CHUNK_BOX_BYTES shrunk to force it): the paste-back
    and smoothing run in parts of the model's chunks, and the frames equal those made in small chunks."""
    rows, cols = render_video.paste_region(gen)
    box_bytes = (rows.stop - rows.start) * (cols.stop - cols.start) * 3 * 4
    # the same bound (it also sets the smoother's block length), model chunks no larger than the paste's
    reference = _frames(gen, 4, threads, monkeypatch, box_bytes=box_bytes * 5)
    calls = []
    orig = gen.render

    def render(start, stop):
        calls.append((start, stop))
        return orig(start, stop)

    monkeypatch.setattr(gen, "render", render)
    got = _frames(gen, 16, threads, monkeypatch, box_bytes=box_bytes * 5)  # paste at most 5 frames at a time
    np.testing.assert_array_equal(got, reference)
    n = len(gen)
    assert calls == [(s, min(s + 16, n)) for s in range(0, n, 16)]  # the model's chunks: the caller's size


def test_model_starts_before_the_paste_region(gen, monkeypatch):
    """The first chunk is asked of the model while the paste region is still being found."""
    asked = threading.Event()
    orig_render, orig_region = gen.render, render_video.paste_region

    def render(start, stop):
        asked.set()
        return orig_render(start, stop)

    def region(g, *a, **k):
        seen.append(asked.wait(timeout=30))  # the region-first order would wait here in vain
        return orig_region(g, *a, **k)

    seen: list[bool] = []
    monkeypatch.setattr(gen, "render", render)
    monkeypatch.setattr(render_video, "paste_region", region)
    frames = render_video.iter_video_frames(gen, smooth_strength=0.5, device="cpu", chunk_frames=8)
    first = next(frames)
    frames.close()
    assert seen == [True] and first.shape[0] == 8
