"""Paste-back (vision/paste.py): round trip, geometry of the inverse affine, mask, colour matching,
and the OpenCV / numpy warp paths agreeing. Uses real frames aligned by vision.align_faces."""
from __future__ import annotations


import numpy as np
import pytest

from digital_human.vision import align as align_mod
from digital_human.vision import align_faces, lower_face_mask, paste_back, paste_back_batch
from digital_human.vision.align import warp_image



@pytest.fixture(scope="module")
def runners(face_runners):
    return face_runners


@pytest.fixture(scope="module", params=[("talk_en_male_01a.mp4", 256), ("talk_xx_female_05_1080x1920_hevc.mp4", 512)],
                ids=["256px-video", "hevc-1080x1920"])
def track(request, data_dir, runners):
    from digital_human.media.probe import read_video_frames

    name, size = request.param
    frames, fps = read_video_frames(data_dir / "video" / name, max_frames=4)
    return align_faces(frames, fps, runners=runners, crop_size=size)


def _footprint(track, t: int, mask: np.ndarray) -> np.ndarray:
    h, w = track.frames.shape[1:3]
    return warp_image(mask, track.inverse_affines()[t], w, h, border="zero")


def _dilate(region: np.ndarray, px: int) -> np.ndarray:
    out = region.copy()
    for dy in range(-px, px + 1):
        for dx in range(-px, px + 1):
            out |= np.roll(np.roll(region, dy, 0), dx, 1)
    return out


@pytest.mark.parametrize("color_match", [False, True])
def test_round_trip_of_the_unmodified_crop(track, color_match):
    t, frame = 1, track.frames[1]
    mask = lower_face_mask(track.crop_landmarks()[t], track.crop_size)
    alpha = _footprint(track, t, mask)
    out = paste_back(frame, track.crops[t], track.affines[t], mask, color_match=color_match)
    diff = np.abs(out.astype(np.int16) - frame).max(axis=2)
    # outside the mask's footprint plus a 2-px seam the frame is untouched
    assert diff[~_dilate(alpha > 1e-4, 2)].max() <= 1
    # inside, only the loss of resampling frame -> crop -> frame remains (bilinear twice)
    inside = alpha > 0.5
    err = diff[inside].mean()
    print(f"\ncrop {track.crop_size}: round-trip mean |error| inside the mask {err:.2f}/255 "
          f"(colour match {color_match})")
    assert err < 2.0
    # the bound has teeth: the same paste through an affine off by 1.5 px fails it clearly
    shifted = track.affines[t].copy()
    shifted[:, 2] += 1.5 * np.sqrt(abs(np.linalg.det(shifted[:, :2])))
    bad = np.abs(paste_back(frame, track.crops[t], shifted, mask, color_match=color_match).astype(np.int16)
                 - frame).max(axis=2)
    assert bad[inside].mean() > 1.5 * err
    # keep_detail pastes the change, which is zero here: the whole frame within 1/255
    exact = paste_back(frame, track.crops[t], track.affines[t], mask, color_match=color_match, keep_detail=True)
    assert np.abs(exact.astype(np.int16) - frame).max() <= 1


def test_paste_puts_crop_pixels_where_the_landmarks_are(track):
    """Geometry: a marker painted at a crop landmark lands on the same landmark in the frame."""
    t, frame = 2, track.frames[2]
    size = track.crop_size
    gen = track.crops[t].copy()
    lip = track.crop_landmarks()[t, 14]
    r = size // 64
    x, y = int(lip[0]), int(lip[1])
    gen[y - r:y + r + 1, x - r:x + r + 1] = (255, 0, 255)
    ones = np.ones((size, size), np.float32)
    out = paste_back(frame, gen, track.affines[t], ones, color_match=False)
    plain = paste_back(frame, track.crops[t], track.affines[t], ones, color_match=False)
    changed = np.abs(out.astype(np.int16) - plain).sum(axis=2) > 60
    ys, xs = np.nonzero(changed)
    centre = np.array([xs.mean(), ys.mean()]) + 0.5
    marker_crop = np.array([x + 0.5, y + 0.5])
    inv = track.inverse_affines()[t]
    expected = inv[:, :2] @ marker_crop + inv[:, 2]
    assert np.linalg.norm(centre - expected) < 1.0
    source_px_per_crop_px = 1 / np.sqrt(abs(np.linalg.det(track.affines[t][:, :2])))
    assert np.linalg.norm(expected - track.landmarks[t, 14, :2]) < 2 * r * source_px_per_crop_px + 1


def test_lower_face_mask_covers_mouth_and_jaw_not_eyes(track):
    lm = track.crop_landmarks()[0]
    size = track.crop_size
    mask = lower_face_mask(lm, size, feather_px=size / 32)
    at = lambda i: mask[int(lm[i, 1]), int(lm[i, 0])]  # noqa: E731
    for i in (13, 14, 61, 291, 17, 152):  # lips, mouth corners, chin
        assert at(i) > 0.45, i
    for i in (33, 263, 168, 10):  # eyes, nose bridge, forehead
        assert at(i) == 0.0, i
    assert mask.dtype == np.float32 and 0 < np.count_nonzero((mask > 0.05) & (mask < 0.95)) < mask.size // 4
    assert mask[0].max() == 0 and mask[:, 0].max() == 0  # nothing at the crop's top/left border


def test_color_matching_removes_a_tint_but_keeps_the_shape(track):
    t, frame = 0, track.frames[0]
    size = track.crop_size
    mask = lower_face_mask(track.crop_landmarks()[t], size)
    tinted = np.clip(track.crops[t].astype(np.int16) + (40, -20, 10), 0, 255).astype(np.uint8)
    inside = _footprint(track, t, mask) > 0.5
    plain = paste_back(frame, tinted, track.affines[t], mask, color_match=False)
    matched = paste_back(frame, tinted, track.affines[t], mask, color_match=True)
    mean_shift = lambda img: (img[inside].astype(np.float64) - frame[inside]).mean(0)  # noqa: E731
    assert np.abs(mean_shift(plain)).max() > 15
    assert np.abs(mean_shift(matched)).max() < 3
    # float 0..1 crops (ComfyUI IMAGE) are accepted and give the same result as uint8
    as_float = paste_back(frame, tinted.astype(np.float32) / 255, track.affines[t], mask, color_match=True)
    assert np.abs(as_float.astype(np.int16) - matched).max() <= 1


@pytest.mark.parametrize("threads", ["1", "3"])
def test_batch_matches_single_frames(track, threads, monkeypatch):
    monkeypatch.setenv("DIGITAL_HUMAN_FRAME_THREADS", threads)  # threaded paste == frame by frame
    n = len(track)
    masks = np.stack([lower_face_mask(lm, track.crop_size) for lm in track.crop_landmarks()])
    calls = []
    batch = paste_back_batch(track.frames, track.crops, track.affines, masks, progress=lambda d, t: calls.append(d))
    assert calls == sorted(calls) and calls[-1] == n
    for t in range(n):
        np.testing.assert_array_equal(batch[t], paste_back(track.frames[t], track.crops[t], track.affines[t], masks[t]))
    with pytest.raises(ValueError, match="one crop and affine per frame"):
        paste_back_batch(track.frames, track.crops[:1], track.affines, masks)


def test_numpy_fallback_matches_opencv(track, monkeypatch):
    pytest.importorskip("cv2")
    t = 0
    ref_crop = warp_image(track.frames[t], track.affines[t], track.crop_size, track.crop_size)
    mask_ref = lower_face_mask(track.crop_landmarks()[t], track.crop_size)
    monkeypatch.setattr(align_mod, "_cv2", None)
    np_crop = warp_image(track.frames[t], track.affines[t], track.crop_size, track.crop_size)
    mask_np = lower_face_mask(track.crop_landmarks()[t], track.crop_size)
    assert np.abs(np_crop - ref_crop).mean() < 0.1 and np.abs(np_crop - ref_crop).max() < 2.0
    assert np.abs(mask_np - mask_ref).mean() < 0.01


def test_bad_paste_inputs():
    frame = np.zeros((64, 64, 3), np.uint8)
    with pytest.raises(ValueError, match="frame must be uint8"):
        paste_back(frame.astype(np.float32), np.zeros((32, 32, 3), np.uint8), np.eye(2, 3), np.ones((32, 32)))
    with pytest.raises(ValueError, match="mask must be"):
        paste_back(frame, np.zeros((32, 32, 3), np.uint8), np.eye(2, 3), np.ones((16, 16)))
    with pytest.raises(ValueError, match="468 face-mesh points"):
        lower_face_mask(np.zeros((10, 2)), 64)
