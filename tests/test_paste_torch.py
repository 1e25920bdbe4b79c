"""Torch paste-back (vision/paste_torch.py) against the CPU reference `paste_back` frame by frame.

Real frames (face_02_male.png, and the same face shrunk 4x for the pre-filter case), lower-face
masks from real face-mesh landmarks (align_faces, as tests/test_paste_back.py), per-frame affines
with rotation, scale and shift, and random textured crops. OpenCV's warpAffine quantises sample
positions to 1/32 px and grid_sample does not, so a few edge pixels may differ by a level; which
pixels are touched must agree exactly.
"""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from digital_human.vision import align_faces, lower_face_mask, paste_back, paste_back_batch  # noqa: E402
from digital_human.vision import paste as paste_mod  # noqa: E402
from digital_human.vision.faces import apply_affines  # noqa: E402
from digital_human.vision.paste_torch import _prefilter_plan, paste_boxes, paste_footprint  # noqa: E402

CROP = 256
MAX_DIFF = 2         # levels; measured 1
MIN_PSNR_DB = 70.0   # over the footprint; measured ~91.5 dB in both cases (worst single frame ~84 dB)


@pytest.fixture(scope="module")
def face(data_dir, face_runners):
    """(frame [512, 512, 3], source landmarks [468, 2], source -> crop affine) of a real photo."""
    from digital_human.media.probe import read_video_frames

    path = data_dir / "image" / "face_02_male.png"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    frames, _ = read_video_frames(path)
    track = align_faces(frames, 0, runners=face_runners, crop_size=CROP)
    return frames[0], track.landmarks[0, :, :2].astype(np.float64), track.affines[0]


def _similarity(angle_deg: float, scale: float, shift: tuple[float, float]) -> np.ndarray:
    """3x3 crop-space similarity about the crop centre: how a generator's crop may sit differently."""
    th = math.radians(angle_deg)
    r = scale * np.array([[math.cos(th), -math.sin(th)], [math.sin(th), math.cos(th)]])
    c = np.array([CROP / 2, CROP / 2])
    return np.vstack([np.hstack([r, (c - r @ c + np.asarray(shift))[:, None]]), [0, 0, 1]])


def _textures(rng: np.random.Generator, n: int) -> np.ndarray:
    """Generated-crop stand-ins: blurred random texture, contrast stretched (sharp edges included)."""
    import cv2

    noise = rng.uniform(0, 255, (n, CROP, CROP, 3)).astype(np.float32)
    soft = np.stack([cv2.GaussianBlur(x, (0, 0), 1.0) for x in noise])
    return np.clip(soft * 3 - 255, 0, 255).round().astype(np.uint8)


def _build(image: np.ndarray, landmarks: np.ndarray, base: np.ndarray, scales: list[float],
           moves: list[tuple[int, int]], seed: int) -> dict:
    """Frames = `image` rolled by moves[t] (the face moves with it), affines = a random similarity
    (rotation +-12 deg, scales[t], shift +-10 crop px) after the base crop, masks from the moved
    landmarks, and paste_back's results with the box and alpha it used for each frame."""
    rng = np.random.default_rng(seed)
    n = len(scales)
    frames = np.stack([np.roll(image, (dy, dx), axis=(0, 1)) for dx, dy in moves])
    affines = np.empty((n, 2, 3))
    masks = np.empty((n, CROP, CROP), np.float32)
    for t, ((dx, dy), s) in enumerate(zip(moves, scales)):
        follow = np.array([[1, 0, -dx], [0, 1, -dy], [0, 0, 1]], np.float64)
        affines[t] = (_similarity(rng.uniform(-12, 12), s, rng.uniform(-10, 10, 2))
                      @ np.vstack([base, [0, 0, 1]]) @ follow)[:2]
        masks[t] = lower_face_mask(apply_affines(landmarks + (dx, dy), affines[t]), CROP)
    crops = _textures(rng, n)
    refs, boxes, alphas = [], [], []
    real_warp = paste_mod.warp_image
    seen: list = []

    def spy(src, src_to_dst, out_w, out_h, border="replicate", origin=(0, 0)):
        out = real_warp(src, src_to_dst, out_w, out_h, border=border, origin=origin)
        if border == "zero":  # paste_back's alpha: its box is (origin, size)
            seen.append(((origin[0], origin[1], origin[0] + out_w, origin[1] + out_h), out))
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(paste_mod, "warp_image", spy)
        for t in range(n):
            seen.clear()
            refs.append(paste_back(frames[t], crops[t], affines[t], masks[t], color_match=False))
            boxes.append(seen[0][0] if seen else None)
            alphas.append(np.clip(seen[0][1], 0, 1) if seen else None)
    return dict(frames=frames, crops=crops, affines=affines, masks=masks, refs=np.stack(refs),
                boxes=boxes, alphas=alphas)


@pytest.fixture(scope="module", params=["enlarge", "shrink"])
def case(request, face):
    image, landmarks, base = face
    if request.param == "enlarge":
        # the crop is ~0.57 crop px per frame px here: warp_image never pre-filters. Frame 3 moves
        # the face so its paste is clipped by the frame's bottom edge; frame 5's mask is empty.
        c = _build(image, landmarks, base, [0.8, 0.95, 1.1, 1.3, 1.0, 1.2],
                   [(0, 0), (7, -5), (-9, 4), (0, 120), (3, 3), (-4, 0)], seed=1)
        c["masks"][5] = 0.0
        c["refs"][5] = paste_back(c["frames"][5], c["crops"][5], c["affines"][5], c["masks"][5], color_match=False)
        c["boxes"][5] = c["alphas"][5] = None
        h, w = image.shape[:2]
        assert any(b[3] == h or b[2] == w for b in c["boxes"][:5]), "no frame's paste reaches the frame edge"
    else:
        # the face shrunk 4x on a 2x-shrunk background: ~2.3 crop px per frame px, so with the
        # scales below warp_image pre-filters by k = 1, 2 and 3, on block grids of varied anchors
        small = image.reshape(128, 4, 128, 4, 3).mean((1, 3))
        canvas = image.reshape(256, 2, 256, 2, 3).mean((1, 3))
        canvas[64:192, 64:192] = small
        canvas = np.rint(canvas).astype(np.uint8)
        lm = landmarks / 4 + 64
        shrink = np.vstack([base, [0, 0, 1]]) @ np.array([[4, 0, -256], [0, 4, -256], [0, 0, 1]], np.float64)
        c = _build(canvas, lm, shrink[:2], [0.8, 1.0, 1.2, 1.3, 1.5, 1.6, 1.05],
                   [(0, 0), (3, -2), (-5, 1), (1, 6), (-2, -3), (4, 4), (-7, 2)], seed=2)
        plans = [_prefilter_plan(a, b, CROP) for a, b in zip(c["affines"], c["boxes"])]
        assert {p[0] for p in plans} == {1, 2, 3}, plans
        assert any(p[1] or p[2] for p in plans), f"every pre-filter grid starts at 0: {plans}"
    c["name"] = request.param
    return c


def _paste(c: dict, offset: float = 0.0) -> tuple[np.ndarray, tuple[slice, slice]]:
    """paste_boxes over paste_footprint's box, as float32 [N, H, W, 3] frames (`offset` added to
    the box's input, to see non-integral pixels kept)."""
    frames = c["frames"]
    ys, xs = paste_footprint(c["affines"], c["masks"], *frames.shape[1:3])
    box = torch.from_numpy(frames[:, ys, xs].astype(np.float32) + np.float32(offset))
    res = paste_boxes(box, torch.from_numpy(c["crops"]), c["affines"], torch.from_numpy(c["masks"]),
                      (xs.start, ys.start))
    out = frames.astype(np.float32) + np.float32(offset)
    out[:, ys, xs] = res.numpy()
    return out, (ys, xs)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def test_footprint_is_the_union_of_paste_back_boxes(case):
    boxes = [b for b in case["boxes"] if b is not None]
    ys, xs = paste_footprint(case["affines"], case["masks"], *case["frames"].shape[1:3])
    assert (xs.start, ys.start, xs.stop, ys.stop) == (min(b[0] for b in boxes), min(b[1] for b in boxes),
                                                      max(b[2] for b in boxes), max(b[3] for b in boxes))
    changed = np.abs(case["refs"].astype(np.int16) - case["frames"]).max(axis=(0, 3)) > 0
    assert changed.any() and not changed[:ys.start].any() and not changed[ys.stop:].any()
    assert not changed[:, :xs.start].any() and not changed[:, xs.stop:].any()


def test_matches_paste_back(case):
    out, (ys, xs) = _paste(case)
    assert np.array_equal(out, np.rint(out)) and out.min() >= 0 and out.max() <= 255
    diff = np.abs(out - case["refs"])
    psnr = _psnr(out[:, ys, xs], case["refs"][:, ys, xs])
    per_frame = [_psnr(out[t, b[1]:b[3], b[0]:b[2]], case["refs"][t, b[1]:b[3], b[0]:b[2]])
                 for t, b in enumerate(case["boxes"]) if b is not None]
    share = float((diff.max(axis=3) > 0)[:, ys, xs].mean())
    print(f"\n{case['name']}: max |diff| {diff.max():.0f} levels, PSNR in the footprint {psnr:.1f} dB "
          f"(worst frame {min(per_frame):.1f} dB), {100 * share:.3f}% of footprint pixels differ")
    assert diff.max() <= MAX_DIFF
    assert psnr >= MIN_PSNR_DB and min(per_frame) >= MIN_PSNR_DB - 6
    assert share < 0.005


def test_untouched_pixels_are_exact(case):
    frames = case["frames"]
    out, _ = _paste(case)
    lifted, _ = _paste(case, offset=0.25)  # non-integral input: rounding must not reach these
    for t, (b, alpha) in enumerate(zip(case["boxes"], case["alphas"])):
        keep = np.ones(frames.shape[1:3], bool)
        if b is not None:
            keep[b[1]:b[3], b[0]:b[2]] = False
        np.testing.assert_array_equal(out[t][keep], frames[t][keep])
        np.testing.assert_array_equal(lifted[t][keep], frames[t][keep].astype(np.float32) + np.float32(0.25))
        if b is not None:  # inside the box, where paste_back's alpha is 0: still the frame
            zero = alpha == 0
            assert zero.any()
            np.testing.assert_array_equal(out[t, b[1]:b[3], b[0]:b[2]][zero], frames[t, b[1]:b[3], b[0]:b[2]][zero])


def test_input_forms_agree(case):
    """Tensor affines, float crops, a shared [S, S] mask and the whole frame as the box."""
    frames, crops, affines, masks = case["frames"], case["crops"], case["affines"], case["masks"]
    out, (ys, xs) = _paste(case)
    box = torch.from_numpy(frames[:, ys, xs].astype(np.float32))
    origin = (xs.start, ys.start)
    alt = paste_boxes(box, torch.from_numpy(crops.astype(np.float32)), torch.from_numpy(affines),
                      torch.from_numpy(masks), origin)
    np.testing.assert_array_equal(alt.numpy(), out[:, ys, xs])
    whole = paste_boxes(torch.from_numpy(frames.astype(np.float32)), torch.from_numpy(crops), affines,
                        torch.from_numpy(masks), (0, 0)).numpy()
    assert np.abs(whole - out).max() <= 1 and (whole != out).mean() < 1e-4  # float32 grid rounding only
    shared = masks[0]
    ys1, xs1 = paste_footprint(affines, shared, *frames.shape[1:3])
    assert (ys1, xs1) == paste_footprint(affines, np.broadcast_to(shared, masks.shape), *frames.shape[1:3])
    one = paste_boxes(torch.from_numpy(frames[:, ys1, xs1].astype(np.float32)), torch.from_numpy(crops), affines,
                      torch.from_numpy(shared), (xs1.start, ys1.start))
    per = paste_boxes(torch.from_numpy(frames[:, ys1, xs1].astype(np.float32)), torch.from_numpy(crops), affines,
                      torch.from_numpy(np.ascontiguousarray(np.broadcast_to(shared, masks.shape))),
                      (xs1.start, ys1.start))
    np.testing.assert_array_equal(one.numpy(), per.numpy())


def test_empty_masks_touch_nothing():
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (3, 64, 80, 3), dtype=np.uint8)
    masks = np.zeros((3, 32, 32), np.float32)
    affines = np.tile(np.array([[0.5, 0, 0], [0, 0.5, 0]]), (3, 1, 1))
    assert paste_footprint(affines, masks, 64, 80) == (slice(0, 0), slice(0, 0))
    assert paste_footprint(affines, masks[0], 64, 80) == (slice(0, 0), slice(0, 0))
    box = torch.from_numpy(frames.astype(np.float32) + np.float32(0.5))
    out = paste_boxes(box, torch.zeros((3, 32, 32, 3), dtype=torch.uint8), affines, torch.from_numpy(masks), (0, 0))
    assert out is not box and torch.equal(out, box)


def test_device_side_is_float32_only_and_stays_on_the_inputs_device(case):
    """Every torch op paste_boxes runs is recorded: none makes or reads a float64 tensor (slow on
    most GPUs, absent on some backends) and all run on the inputs' device, so a CUDA batch takes
    this same path; the host-side float64 geometry is numpy. (No CUDA here: checked on CPU.)"""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    seen: list[tuple[str, torch.dtype, torch.device]] = []  # (op, dtype, device) of inputs and outputs
    made: list[tuple[str, torch.device]] = []  # (op, device) of outputs

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for x in tree_leaves((args, kwargs, out)):
                if isinstance(x, torch.Tensor):
                    seen.append((str(func), x.dtype, x.device))
            made.extend((str(func), x.device) for x in tree_leaves(out) if isinstance(x, torch.Tensor))
            return out

    frames = case["frames"]
    ys, xs = paste_footprint(case["affines"], case["masks"], *frames.shape[1:3])
    box = torch.from_numpy(frames[:, ys, xs].astype(np.float32))
    crops, masks = torch.from_numpy(case["crops"]), torch.from_numpy(case["masks"])
    with Record():
        out = paste_boxes(box, crops, case["affines"], masks, (xs.start, ys.start))
    ops = {name for name, _, _ in seen}
    assert "aten.grid_sampler_2d.default" in ops, sorted(ops)
    assert not [s for s in seen if s[1] == torch.float64], sorted({s[0] for s in seen if s[1] == torch.float64})
    # copies are the only ops that may land elsewhere: on a GPU, the [B, 5] mask-bbox read-back
    assert {d for name, d in made if name != "aten._to_copy.default"} == {box.device}
    assert out.dtype == torch.float32 and out.device == box.device


def test_bad_inputs():
    box = torch.zeros((2, 8, 8, 3))
    crops = torch.zeros((2, 16, 16, 3), dtype=torch.uint8)
    masks = torch.ones((2, 16, 16))
    affines = np.tile(np.eye(2, 3), (2, 1, 1))
    with pytest.raises(ValueError, match="box must be float32"):
        paste_boxes(box.to(torch.uint8), crops, affines, masks, (0, 0))
    with pytest.raises(ValueError, match="crops must be"):
        paste_boxes(box, crops[:1], affines, masks, (0, 0))
    with pytest.raises(ValueError, match="uint8 or float32"):
        paste_boxes(box, crops.to(torch.float64), affines, masks, (0, 0))
    with pytest.raises(ValueError, match="masks must be"):
        paste_boxes(box, crops, affines, masks[:, :8], (0, 0))
    with pytest.raises(ValueError, match="one affine per frame"):
        paste_boxes(box, crops, affines[:1], masks, (0, 0))
    with pytest.raises(ValueError, match="masks must be"):
        paste_footprint(affines, np.ones((3, 16, 16)), 8, 8)


def test_speed_on_this_cpu(face):
    """64 frames of 512 x 512 with 256-px crops: paste_back_batch (OpenCV, frame threads) against
    paste_boxes on torch CPU. Printed, not asserted: the torch path is meant for GPUs, where the
    crops already are."""
    image, landmarks, base = face
    n = 64
    rng = np.random.default_rng(3)
    affines = np.stack([(_similarity(rng.uniform(-10, 10), rng.uniform(0.8, 1.3), rng.uniform(-8, 8, 2))
                         @ np.vstack([base, [0, 0, 1]]))[:2] for _ in range(n)])
    masks = np.stack([lower_face_mask(apply_affines(landmarks, a), CROP) for a in affines])
    crops = rng.integers(0, 256, (n, CROP, CROP, 3), dtype=np.uint8)
    frames = np.ascontiguousarray(np.broadcast_to(image, (n, *image.shape)))
    crops_t, masks_t = torch.from_numpy(crops), torch.from_numpy(masks)

    def cpu() -> np.ndarray:
        return paste_back_batch(frames, crops, affines, masks, color_match=False)

    def torch_all() -> tuple[np.ndarray, float]:
        ys, xs = paste_footprint(affines, masks, *image.shape[:2])
        box = torch.from_numpy(frames[:, ys, xs].astype(np.float32))
        start = time.perf_counter()
        res = paste_boxes(box, crops_t, affines, masks_t, (xs.start, ys.start))
        kernel = time.perf_counter() - start
        out = frames.copy()
        out[:, ys, xs] = res.numpy().astype(np.uint8)
        return out, kernel

    def best(fn, reps: int = 3) -> tuple[float, object]:
        times, result = [], None
        for _ in range(reps):
            start = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - start)
        return min(times), result

    t_cpu, ref = best(cpu)
    t_torch, (out, kernel) = best(torch_all)
    print(f"\n64 x 512x512 frames, {CROP}-px crops, {torch.get_num_threads()} torch threads: paste_back_batch "
          f"{1e3 * t_cpu:.0f} ms, paste_footprint + paste_boxes (torch CPU) + write-back {1e3 * t_torch:.0f} ms "
          f"(paste_boxes alone {1e3 * kernel:.0f} ms); max |diff| {np.abs(out.astype(np.int16) - ref).max()}")
    assert np.abs(out.astype(np.int16) - ref).max() <= MAX_DIFF
