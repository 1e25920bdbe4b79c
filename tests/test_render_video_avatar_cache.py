"""The headless video path keeps a content-keyed reference's paste region and reference smoothing masks between
requests (render_video, under GeneratedCrops.avatar_key): a repeat request computes neither and gives the same
frames; another key, frame transform or landmarks is a miss; the kept masks are bounded in bytes; a model without a
key keeps nothing; the masks of a model that returns no landmarks start before its first crops."""
from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest
from digital_human.audio.decode import decode_audio
from digital_human.talking_head import render_video
from digital_human.talking_head.portrait.animate import portrait_crops
from digital_human.vision import align_faces
from digital_human.vision.paste_torch import paste_footprint


@pytest.fixture(scope="module")
def case(data_dir, face_runners):
    from digital_human.media.probe import read_video_frames

    wave, sr = decode_audio(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=6.0)
    frames, fps = read_video_frames(data_dir / "video" / "talk_en_male_01a.mp4", max_frames=24)
    track = align_faces(frames, fps, runners=face_runners)
    gen = portrait_crops(track, wave.mean(0)[int(2.8 * sr): int(4.8 * sr)], sr, 25.0, loop_mode="ping-pong")
    return replace(gen, landmarks=None)


@pytest.fixture()
def counted(monkeypatch):
    """Calls of paste_region and _smooth_masks; the kept data cleared before and after."""
    calls = {"region": 0, "masks": 0}
    region, masks = render_video.paste_region, render_video._smooth_masks

    def count_region(gen, *a, **k):
        calls["region"] += 1
        return region(gen, *a, **k)

    def count_masks(*a, **k):
        calls["masks"] += 1
        return masks(*a, **k)

    monkeypatch.setattr(render_video, "paste_region", count_region)
    monkeypatch.setattr(render_video, "_smooth_masks", count_masks)
    render_video.clear_video_caches()
    yield calls
    render_video.clear_video_caches()


def _frames(gen, threads=1, monkeypatch=None):
    if monkeypatch is not None:
        monkeypatch.setattr(render_video, "SMOOTH_MASK_THREADS", threads)
    return np.concatenate([c.numpy() for c in render_video.iter_video_frames(gen, smooth_strength=0.5, device="cpu",
                                                                             chunk_frames=7)])


def test_paste_region_equals_the_stacked_union(case):
    """One mask at a time gives the union the stacked batches gave."""
    gen = case
    refs = np.unique(np.asarray(gen.idx, np.int64))
    h, w = gen.track.frames.shape[1:3]
    masks = np.stack([gen.mask(int(r)) for r in refs]).astype(np.float32)
    assert render_video.paste_region(gen) == paste_footprint(gen.track.affines[refs], masks, h, w)
    empty = replace(gen, masks={int(r): np.zeros_like(gen.mask(int(r))) for r in refs})
    assert render_video.paste_region(empty) == (slice(0, 0), slice(0, 0))


@pytest.mark.parametrize("threads", [1, 3])
def test_repeat_request_keeps_region_and_masks_and_equals_the_first(case, counted, threads, monkeypatch):
    plain = _frames(case, threads, monkeypatch)  # no key: nothing kept
    assert counted["region"] == 1 and not render_video._REGIONS and not render_video._SMOOTH
    keyed = replace(case, avatar_key="test:avatar")
    first = _frames(keyed, threads, monkeypatch)
    chunks = len(range(0, len(keyed), 7))
    assert counted == {"region": 2, "masks": 2 * chunks}
    again = _frames(keyed, threads, monkeypatch)
    assert counted == {"region": 2, "masks": 2 * chunks}  # the repeat made neither
    np.testing.assert_array_equal(first, plain)
    np.testing.assert_array_equal(again, plain)


def test_other_key_transform_or_landmarks_is_a_miss(case, counted):
    keyed = replace(case, avatar_key="test:avatar")
    base = _frames(keyed)
    assert counted["region"] == 1
    _frames(replace(case, avatar_key="test:other"))
    assert counted["region"] == 2
    affines = np.array(case.track.affines, copy=True)
    affines[..., 2] += 1.0  # every crop transform moved by a pixel
    moved = replace(keyed, track=replace(case.track, affines=affines))
    _frames(moved)
    assert counted["region"] == 3
    lms = np.array(case.track.landmarks, copy=True)
    lms[..., 1] += 2.0  # landmarks only: same paste region, other smoothing masks
    masks_before = counted["masks"]
    shifted = replace(keyed, track=replace(case.track, landmarks=lms))
    out = _frames(shifted)
    assert counted["region"] == 4 and counted["masks"] > masks_before
    render_video.clear_video_caches()
    np.testing.assert_array_equal(out, _frames(replace(shifted, avatar_key=None)))
    np.testing.assert_array_equal(_frames(keyed), base)


def test_output_landmarks_are_never_served_from_kept_masks(case, counted):
    ref = np.asarray(case.track.landmarks)[np.asarray(case.idx)]
    gen = replace(case, landmarks=ref + np.float32(1.5), avatar_key="test:avatar")
    first = _frames(gen)
    made = counted["masks"]
    assert not render_video._SMOOTH  # masks of the output's own landmarks are not kept
    np.testing.assert_array_equal(_frames(gen), first)
    assert counted["masks"] == 2 * made


def test_kept_masks_are_bounded(case, counted, monkeypatch):
    monkeypatch.setattr(render_video, "SMOOTH_MASK_CACHE_BYTES", 1)  # smaller than one chunk's masks
    keyed = replace(case, avatar_key="test:avatar")
    first = _frames(keyed)
    assert not render_video._SMOOTH and render_video._SMOOTH_BYTES[0] == 0
    monkeypatch.setattr(render_video, "SMOOTH_MASK_CACHE_BYTES", 10**12)
    _frames(keyed)
    sizes = [m.numel() * m.element_size() for m in render_video._SMOOTH.values()]
    chunk_bytes = max(sizes)
    render_video.clear_video_caches()
    monkeypatch.setattr(render_video, "SMOOTH_MASK_CACHE_BYTES", 2 * chunk_bytes)
    np.testing.assert_array_equal(_frames(keyed), first)
    assert 0 < render_video._SMOOTH_BYTES[0] <= 2 * chunk_bytes and len(render_video._SMOOTH) <= 2
    monkeypatch.setattr(render_video, "REGION_CACHE_ENTRIES", 2)
    for k in range(4):
        render_video._kept_region(f"k{k}", keyed)
    assert list(render_video._REGIONS) == ["k2", "k3"]


def test_masks_start_before_the_first_crops_when_the_model_returns_no_landmarks(case, counted, monkeypatch):
    """A streaming model that says it returns no output landmarks: chunk 0's smoothing masks are on the pool
    before its first render call returns (that render waits for them to start)."""
    started = threading.Event()
    orig = render_video._smooth_masks

    def masks(gen, start, *a):
        if start == 0:
            started.set()
        return orig(gen, start, *a)

    monkeypatch.setattr(render_video, "_smooth_masks", masks)
    waited = []

    def render(start, stop):
        if start == 0:
            waited.append(started.wait(timeout=10))
        return case.crops[start:stop], None

    gen = replace(case, crops=None, render=render, renders_landmarks=False)
    out = _frames(gen, 3, monkeypatch)
    assert waited == [True]
    render_video.clear_video_caches()
    np.testing.assert_array_equal(out, _frames(case, 1, monkeypatch))
