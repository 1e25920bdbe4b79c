"""portrait's mouth bank (talking_head/portrait/mouth_bank.py): frame selection (nearest shape, temporal
smoothness), the landmark-driven warp and blend, the memory cap, and the option's plumbing (library,
registry, CLI, nodes). Synthetic faces for the geometry; a short real clip for the end-to-end check."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from digital_human.talking_head.portrait import mouth_bank as MB
from digital_human.talking_head.portrait.animate import portrait_crops, resolve_mouth_bank
from digital_human.vision.faces import FaceTrack


# --- synthetic faces -----------------------------------------------------------------------------
def _face_landmarks(cx: float, cy: float, iod: float, gap: float = 0.06, width: float = 0.56,
                    angle_deg: float = 0.0) -> np.ndarray:
    """[468, 2] landmarks with eyes and lip contours only (the points the bank reads), mouth corners'
    midpoint at (cx, cy), in px; gap, width in iod. Other points sit at the mouth centre."""
    p = np.zeros((468, 2))
    half = width / 2
    t = np.linspace(0.0, 1.0, 11)
    x = -half + 2 * half * t
    bulge = np.sqrt(np.clip(1 - (x / half) ** 2, 0, 1))
    inner_x = x * 0.82
    shapes = {MB.OUTER_UPPER: np.stack([x, -(0.10 + gap / 2) * bulge], -1),
              MB.OUTER_LOWER: np.stack([x, (0.12 + gap / 2) * bulge], -1),
              MB.INNER_UPPER: np.stack([inner_x, -(gap / 2) * bulge], -1),
              MB.INNER_LOWER: np.stack([inner_x, (gap / 2) * bulge], -1)}
    for ids, pts in shapes.items():
        p[list(ids)] = pts
    p[MB.EYE_R], p[MB.EYE_L] = (-0.5, -0.95), (0.5, -0.95)
    a = np.deg2rad(angle_deg)
    rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
    return (p * iod) @ rot.T + [cx, cy]


def _bank_of(patches: np.ndarray, points: np.ndarray, scale: float) -> MB.MouthBank:
    k = len(patches)
    feats = MB.shape_features(points)
    return MB.MouthBank(patches=patches, points=points.astype(np.float32), features=feats,
                        source=np.arange(k, dtype=np.float32), scale=scale, stride=1)


def _patch_with_mark(lms_patch: np.ndarray, scale: float) -> np.ndarray:
    """A grey patch with red lips (between the outer contours) and a white mark at point 0 (the top of
    the upper lip's outer contour)."""
    import cv2

    w, h = MB._patch_size(scale)
    patch = np.full((h, w, 3), 110, np.uint8)
    outer = np.concatenate([lms_patch[list(MB.OUTER_UPPER)], lms_patch[list(MB.OUTER_LOWER)][::-1]])
    cv2.fillPoly(patch, [np.rint(outer - 0.5).astype(np.int32)], (200, 60, 60))
    x, y = np.rint(lms_patch[0] - 0.5).astype(int)
    patch[y - 1:y + 2, x - 1:x + 2] = 255
    return patch


def _patch_points(lms_crop: np.ndarray, scale: float) -> np.ndarray:
    a = MB._patch_affine(MB.mouth_frame(lms_crop), scale)
    return lms_crop @ a[:, :2].T + a[:, 2]


# --- selection -------------------------------------------------------------------------------------
def test_selection_picks_the_matching_shape():
    rng = np.random.default_rng(0)
    bank = rng.uniform(0, 1, (60, 6)).astype(np.float32)
    want = rng.permutation(60)[:25]
    targets = bank[want] + rng.normal(0, 0.002, (25, 6))
    # no temporal cost: each frame takes its own nearest bank frame
    got = MB.select_frames(bank, targets, jump_cost=0.0, hold_cost=0.0)
    assert got.tolist() == want.tolist()


def test_selection_is_temporally_smooth():
    # bank frames 10 and 11 are near twins; the target wobbles between them every frame
    rng = np.random.default_rng(1)
    bank = rng.uniform(0, 1, (40, 6)).astype(np.float32)
    bank[11] = bank[10] + 0.004
    targets = np.stack([bank[10] if i % 2 else bank[11] for i in range(30)]) + rng.normal(0, 0.001, (30, 6))
    greedy = MB.select_frames(bank, targets, candidates=1)  # each frame its nearest, no temporal cost
    smooth = MB.select_frames(bank, targets)
    switches = lambda path: int(np.sum(np.diff(path) != 0))  # noqa: E731
    assert switches(greedy) >= 20 and switches(smooth) <= 2
    assert set(smooth.tolist()) <= {10, 11}


def test_selection_prefers_consecutive_bank_frames():
    # the bank is a smooth trajectory; the target replays a stretch of it: the path plays it in order
    t = np.arange(200)
    bank = np.stack([np.sin(t / 7), np.cos(t / 11), np.sin(t / 5) * 0.5, t * 0, t * 0, t * 0], -1).astype(np.float32)
    targets = bank[50:110] + 0.01
    path = MB.select_frames(bank, targets, np.arange(200, dtype=np.float32), stride=1)
    assert np.mean(np.diff(path) == 1) > 0.9 and abs(int(path[0]) - 50) <= 2


# --- warp and blend ------------------------------------------------------------------------------
@pytest.mark.parametrize("follow", [0.0, 1.0])
def test_blend_lands_the_patch_where_the_landmarks_say(follow):
    # region "lips": the bank's lips and opening replace the crop's
    scale = 80.0
    src_lms = _face_landmarks(128, 150, 80)
    pts = np.zeros((1, 468, 2))
    pts[0] = _patch_points(src_lms, scale)
    bank = _bank_of(_patch_with_mark(pts[0], scale)[None], pts, scale)
    # the target: the same mouth moved, 1.15x larger and turned 8 degrees in another crop
    tgt = _face_landmarks(120, 170, 92, angle_deg=8.0)
    # the crop's own lips have the bank's colour (one person; the colour match then changes little) but
    # are thin (gap 0.2 iod): the bank's lips and mark are what shows
    crop = _crop_with_lips(_face_landmarks(120, 170, 92, gap=0.2, angle_deg=8.0), lip_rgb=(200, 60, 60))
    out, placed = MB.blend_mouth(crop, tgt, bank, 0, follow=follow, region="lips")
    assert out.shape == crop.shape and out.dtype == np.uint8
    # a similarity of the bank's own shape: the lips land on the target's whatever `follow` says
    np.testing.assert_allclose(placed[MB.LIP_POINTS], tgt[MB.LIP_POINTS], atol=1e-6)
    diff = np.abs(out.astype(int) - crop).sum(-1)
    ys, xs = np.nonzero(diff)
    assert len(xs) > 500
    # only the lips' surroundings changed (within the mesh ring)
    ring = MB.RING * 92 + 3
    lips = tgt[MB.LIP_POINTS]
    assert xs.min() >= lips[:, 0].min() - ring and xs.max() <= lips[:, 0].max() + ring
    assert ys.min() >= lips[:, 1].min() - ring and ys.max() <= lips[:, 1].max() + ring
    # the white mark is where the target's point 0 is (colour matching shifts it, but it stays the brightest)
    grey = out.astype(float).mean(-1)
    y, x = np.unravel_index(np.argmax(grey), grey.shape)
    assert np.hypot(x + 0.5 - tgt[0, 0], y + 0.5 - tgt[0, 1]) <= 2.5
    # the lips are redder than the skin inside the target's lip band, full weight at their middle
    mid_upper = ((tgt[37] + tgt[81]) / 2 - 0.5).round().astype(int)
    r, g, _ = out[mid_upper[1], mid_upper[0]].astype(int)
    assert r - g > 60 and tuple(crop[mid_upper[1], mid_upper[0]]) == (150, 150, 150)  # red from the bank


def test_blend_bends_the_lips_onto_a_different_shape():
    # bank mouth closed (gap 0.01), target open (gap 0.12): with follow=1 the placed inner lips are the
    # target's, with follow=0 they keep the bank's closed shape
    scale = 80.0
    pts = _patch_points(_face_landmarks(128, 150, 80, gap=0.01), scale)[None]
    bank = _bank_of(_patch_with_mark(pts[0], scale)[None], pts, scale)
    tgt = _face_landmarks(128, 150, 80, gap=0.12)
    crop = np.full((256, 256, 3), 150, np.uint8)
    gaps = {}
    for follow in (0.0, 1.0):
        _, placed = MB.blend_mouth(crop, tgt, bank, 0, follow=follow, region="lips")
        gaps[follow] = float(MB.shape_features(placed)[0]) * 1.0
    assert gaps[1.0] == pytest.approx(float(MB.shape_features(tgt)[0]), abs=1e-3)
    assert gaps[0.0] < 0.3 * gaps[1.0]


def _crop_with_lips(lms: np.ndarray, lip_rgb=(120, 40, 90), skin=150) -> np.ndarray:
    """A grey crop with its own (purple) lips drawn between the outer and inner contours."""
    import cv2

    crop = np.full((256, 256, 3), skin, np.uint8)
    for upper, lower in ((MB.OUTER_UPPER, MB.INNER_UPPER), (MB.INNER_LOWER, MB.OUTER_LOWER)):
        band = np.concatenate([lms[list(upper)], lms[list(lower)][::-1]])
        cv2.fillPoly(crop, [np.rint(band - 0.5).astype(np.int32)], lip_rgb)
    return crop


def test_interior_region_keeps_the_frames_lips_and_takes_the_opening_from_the_bank():
    scale = 80.0
    bank_lms = _face_landmarks(128, 150, 80, gap=0.12)
    pts = _patch_points(bank_lms, scale)[None]
    patch = _patch_with_mark(pts[0], scale)
    import cv2

    opening = np.concatenate([pts[0][list(MB.INNER_UPPER)], pts[0][list(MB.INNER_LOWER)][::-1]])
    cv2.fillPoly(patch, [np.rint(opening - 0.5).astype(np.int32)], (235, 235, 225))  # "teeth"
    bank = _bank_of(patch[None], pts, scale)
    tgt = _face_landmarks(124, 160, 86, gap=0.12, angle_deg=-5.0)
    crop = _crop_with_lips(tgt, lip_rgb=(190, 70, 60))  # one person: lips of about the bank's colour
    out, placed = MB.blend_mouth(crop, tgt, bank, 0, follow=1.0, region="interior")
    np.testing.assert_allclose(placed[MB.LIP_POINTS], tgt[MB.LIP_POINTS], atol=1e-6)
    centre = np.rint((tgt[13] + tgt[14]) / 2 - 0.5).astype(int)
    assert out[centre[1], centre[0]].min() > 190  # the opening shows the bank's teeth
    mid_upper = np.rint((tgt[37] + tgt[81]) / 2 - 0.5).astype(int)
    np.testing.assert_array_equal(out[mid_upper[1], mid_upper[0]], crop[mid_upper[1], mid_upper[0]])  # own lip
    # lips closed in the target: nothing of the bank shows, the crop comes back as it was
    shut = _face_landmarks(124, 160, 86, gap=0.0, angle_deg=-5.0)
    crop_shut = _crop_with_lips(shut, lip_rgb=(190, 70, 60))
    out_shut, _ = MB.blend_mouth(crop_shut, shut, bank, 0, follow=1.0, region="interior")
    np.testing.assert_array_equal(out_shut, crop_shut)


def test_reshape_lips_moves_the_frames_lips_and_leaves_the_rest():
    lms_from = _face_landmarks(128, 160, 86, gap=0.02)
    lms_to = _face_landmarks(128, 160, 86, gap=0.08)  # the lower lip lower
    crop = _crop_with_lips(lms_from)
    out = MB.reshape_lips(crop, lms_from, lms_to)
    lower_mid_to = np.rint((lms_to[17] + lms_to[14]) / 2 - 0.5).astype(int)
    assert tuple(out[lower_mid_to[1], lower_mid_to[0]]) == pytest.approx((120, 40, 90), abs=12)  # lip moved here
    far = (slice(0, 100), slice(None))
    np.testing.assert_array_equal(out[far], crop[far])  # the skin away from the mouth untouched
    np.testing.assert_array_equal(MB.reshape_lips(crop, lms_from, lms_from), crop)


# --- memory cap ----------------------------------------------------------------------------------
class _LazyCrops:
    """Crops made on demand (a decoded-on-demand video's); counts reads."""

    def __init__(self, n: int, size: int):
        self.shape, self.dtype, self.reads = (n, size, size, 3), np.uint8, 0

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, i):
        self.reads += 1
        return np.full(self.shape[1:], i % 251, np.uint8)


def _long_track(n: int, size: int) -> FaceTrack:
    lms = np.zeros((n, 468, 3), np.float32)
    gaps = 0.02 + 0.1 * (0.5 + 0.5 * np.sin(np.arange(n) / 6))
    for t in range(n):
        lms[t, :, :2] = _face_landmarks(size / 2, size * 0.62, size * 0.36, gap=gaps[t])
    affines = np.broadcast_to(np.array([[1.0, 0, 0], [0, 1.0, 0]]), (n, 2, 3)).copy()
    crops = _LazyCrops(n, size)
    return FaceTrack(frames=crops, fps=30.0, crop_size=size, found=np.ones(n, bool), boxes=np.zeros((n, 4)),
                     landmarks=lms, affines=affines, presence=np.ones(n), crops=crops)


def test_bank_is_capped_in_frames_and_bytes():
    track = _long_track(1500, 512)  # 50 s of a large face: 1500 frames, iod ~184 px in the crop
    bank = MB.build_bank(track)
    assert len(bank) <= MB.MAX_BANK_FRAMES and bank.stride == 4
    w, h = MB._patch_size(MB.MAX_PX_PER_IOD)
    assert bank.patches.shape[1:] == (h, w, 3) and bank.scale == MB.MAX_PX_PER_IOD  # resolution capped too
    assert bank.nbytes <= MB.MAX_BANK_FRAMES * (h * w * 3 + 468 * 2 * 4 + 64)
    assert bank.nbytes < 45 * 2**20 and track.crops.reads == len(bank)  # one read per bank frame, no more
    # the features follow the landmarks: the stored gap is the synthetic one
    np.testing.assert_allclose(bank.features[:, 0], MB.shape_features(track.landmarks[bank.source.astype(int), :, :2])[:, 0],
                               atol=1e-5)


def test_no_bank_from_a_photo_or_too_few_frames():
    assert MB.build_bank(_long_track(1, 256)) is None
    assert MB.build_bank(_long_track(MB.MIN_BANK_FRAMES - 1, 256)) is None
    sparse = _long_track(40, 256)
    sparse.found[:] = False
    sparse.found[:5] = True
    assert MB.build_bank(sparse) is None


def test_no_bank_without_opencv(monkeypatch):
    """The bank's warps and masks are OpenCV's: without it there is no bank (portrait draws the mouth)."""
    from digital_human.vision import align as align_mod

    track = _long_track(40, 256)
    assert MB.build_bank(track) is not None
    monkeypatch.setattr(align_mod, "_cv2", None)
    assert MB.build_bank(track) is None


# --- option plumbing --------------------------------------------------------------------------------
def test_resolve_mouth_bank_modes():
    video = _long_track(30, 256)
    assert resolve_mouth_bank("off", video) is None and resolve_mouth_bank(None, video) is None
    assert resolve_mouth_bank("auto", _long_track(1, 256)) is None  # a photo keeps the drawn mouth
    auto = resolve_mouth_bank("auto", video)
    assert isinstance(auto, MB.MouthBank) and len(auto) == 30 and auto.origin == "the reference video"
    other = resolve_mouth_bank(_long_track(50, 256), video)
    assert len(other) == 50 and other.origin == "the bank video"
    assert resolve_mouth_bank(auto, video) is auto
    with pytest.raises(ValueError, match="mouth_bank must be"):
        resolve_mouth_bank("on", video)


def test_portrait_reports_the_bank_and_registry_passes_it():
    from digital_human.talking_head.registry import MODELS, generate_crops

    track = _long_track(40, 256)
    sr = 16000
    rng = np.random.default_rng(0)
    wave = (0.3 * np.sin(np.arange(sr) * 2 * np.pi * 180 / sr) * (1 + np.sin(np.arange(sr) / 800))
            + 0.01 * rng.normal(size=sr)).astype(np.float32)
    on = portrait_crops(track, wave, sr, 30.0, mouth_bank="auto", streaming=True)
    note = on.notes["mouth_bank"]
    assert note["ran"] and note["frames"] == 40 and 1 <= note["frames_used"] <= 40 and "mouth bank: 40 frames" in on.backend
    off = portrait_crops(track, wave, sr, 30.0, streaming=True)  # the library default keeps the drawn mouth
    assert off.notes["mouth_bank"] == {"ran": False} and "mouth bank off" in off.backend
    crops_on, lms_on = on.chunk(0, 4)
    crops_off, _ = off.chunk(0, 4)
    assert crops_on.shape == crops_off.shape and lms_on.shape == (4, 468, 3)
    via = generate_crops(track, wave, sr, "portrait", 30.0, streaming=True, mouth_bank="auto")
    assert via.notes["mouth_bank"]["ran"]
    assert "mouth_bank" in MODELS["portrait"].options
    assert all("mouth_bank" not in m.options for name, m in MODELS.items() if name != "portrait")


def test_cli_mouth_bank_option(tmp_path):
    from digital_human import cli

    clip = tmp_path / "other.mp4"
    clip.write_bytes(b"\0")
    assert cli._mouth_bank_arg("auto") == "auto" and cli._mouth_bank_arg("off") == "off"
    assert cli._mouth_bank_arg(str(clip)) == str(clip)
    with pytest.raises(argparse.ArgumentTypeError, match="auto, off or a talking video"):
        cli._mouth_bank_arg(str(tmp_path / "missing.mp4"))
    parser = cli.build_parser()
    base = ["--face", "f.png", "--out", "o.mp4"]
    assert parser.parse_args(["animate", "--audio", "a.wav", *base]).mouth_bank == "auto"
    assert parser.parse_args(["animate", "--audio", "a.wav", *base, "--mouth-bank", "off"]).mouth_bank == "off"
    assert parser.parse_args(["run", "--text", "hi", "--voice", "v.wav", *base,
                              "--mouth-bank", str(clip)]).mouth_bank == str(clip)
    # a model without a bank never aligns the bank video
    got = cli._mouth_bank_inputs(None, str(clip), "musetalk", "auto", 60.0, None)
    assert got["bank_faces"] is None


def test_node_mouth_bank_inputs():
    from digital_human.nodes.talking_head_nodes import TalkingHeadVideo, TRT_TalkingHead, _mouth_bank

    faces = object()
    assert _mouth_bank("off", faces) == "off" and _mouth_bank("auto", None) == "auto"
    assert _mouth_bank("auto", faces) is faces
    with pytest.raises(ValueError):
        _mouth_bank("yes", None)
    for node in (TRT_TalkingHead, TalkingHeadVideo):
        optional = node.INPUT_TYPES()["optional"]
        assert optional["mouth_bank"][1]["default"] == "auto" and optional["bank_faces"][0] == "DH_FACES"


# --- a real clip ------------------------------------------------------------------------------------
def test_real_clip_bank_changes_only_the_mouth_and_the_mesh_finds_the_placed_lips(data_dir, face_runners):
    from digital_human.audio.decode import decode_audio
    from digital_human.media.probe import read_video_frames
    from digital_human.talking_head import animate_portrait
    from digital_human.talking_head.portrait.animate import portrait_masks
    from digital_human.vision import align_faces
    from digital_human.vision import lipsync_metrics as M
    from digital_human.vision.align import warp_image

    frames, fps = read_video_frames(data_dir / "video" / "talk_en_male_01a.mp4", max_frames=45)
    track = align_faces(frames, fps, runners=face_runners)
    wave, sr = decode_audio(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=5.0)
    wave = wave.mean(0)[int(3.0 * sr): int(4.5 * sr)]
    res = animate_portrait(track, wave, sr, fps, mouth_bank="auto")
    off = animate_portrait(track, wave, sr, fps, mouth_bank="off")
    n = len(res.frames)
    assert "mouth bank: 45 frames of the reference video" in res.backend and "mouth bank off" in off.backend
    idx = np.arange(n) % len(track)
    h, w = frames.shape[1:3]
    masks = np.stack([warp_image(m, a, w, h, border="zero")
                      for m, a in zip(portrait_masks(track, idx), track.inverse_affines()[idx])])
    assert M.psnr_outside_mask(res.frames, frames[idx], masks) >= 40.0
    assert np.abs(res.frames.astype(int) - off.frames).max() > 40  # the bank's mouth is not the drawn one
    # the mesh run again on the output finds the lips where the bank put them (DH_FACES says so too)
    found = M.remeasure_landmarks(res.frames, res.track.landmarks, face_runners[1])
    err = M.mouth_landmark_distance(found, res.track.landmarks)
    print(f"\nmesh vs placed lips: {err:.4f} iod")
    assert err < 0.025, err


def test_target_shapes_of_long_speech_are_made_in_blocks():
    """The driven shapes of every output frame come in blocks (long speech holds 6 floats a frame, not 468
    points): a long schedule gives each frame the shape it gets on its own."""
    from digital_human.talking_head.portrait.animate import target_shapes
    from digital_human.talking_head.portrait.speech_drive import MouthParams

    track = _long_track(40, 256)
    n = 1100  # over two blocks
    rng = np.random.default_rng(0)
    params = MouthParams(*(rng.random(n).astype(np.float32) for _ in range(4)), fps=25.0)
    idx = np.arange(n) % len(track)
    shapes = target_shapes(track, idx, params)
    assert shapes.shape == (n, len(MB.FEATURES))
    for i in (0, 511, 512, 1099):
        one = MouthParams(*(np.array([getattr(params, f)[i]]) for f in ("jaw_open", "lip_open", "width", "round")),
                          fps=25.0)
        np.testing.assert_allclose(shapes[i], target_shapes(track, idx[i:i + 1], one)[0], atol=1e-6)
