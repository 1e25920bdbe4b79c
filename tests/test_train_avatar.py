"""TrainAvatar + clone inference on a few real frames (talk_en_male_01a.mp4, aligned here):
a tiny run lowers its loss, saves/loads the avatar, resumes from its checkpoint, drives a video;
every bad input gets a clear error."""
from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from digital_human.talking_head.audio_features import MelConfig
from digital_human.talking_head.clone.avatar_store import (AvatarNotFoundError, list_avatars, load_avatar,
                                                           sanitize_name)
from digital_human.talking_head.clone.infer import animate_clone, clone_masks
from digital_human.engines.clone_model import GeneratorConfig
from digital_human.talking_head.driver import frame_schedule
from digital_human.talking_head.clone.train import (FootageError, TrainingInterrupted, check_footage,
                                                    train_avatar)
from digital_human.vision.faces import NoFaceError

TINY = GeneratorConfig(crop_size=64, base_channels=4, levels=2, audio_channels=4, audio_dim=16)
N_FRAMES = 45  # 1.5 s at 30 fps
TINY_ARGS = dict(config=TINY, device="cpu", batch_size=4, min_seconds=0.5, lr=2e-3)


@pytest.fixture(scope="module")
def clip(data_dir: Path, tmp_path_factory: pytest.TempPathFactory, fresh_face_models):
    """(track, audio [1, T], sr) of the first 1.5 s of 01a; models root is a temp folder."""
    from digital_human.engines.face import detect
    from digital_human.engines.face.blazeface import face_detector_spec
    from digital_human.engines.face.facemesh import face_mesh_spec
    from digital_human.media.probe import read_video_audio, read_video_frames
    from digital_human.vision import align_faces

    with fresh_face_models(tmp_path_factory.mktemp("clone_models")):
        runners = (detect.engine_runner(face_detector_spec(), backend="onnxruntime"),
                   detect.engine_runner(face_mesh_spec(), backend="onnxruntime"))
        path = data_dir / "video" / "talk_en_male_01a.mp4"
        frames, fps = read_video_frames(path, max_frames=N_FRAMES)
        track = align_faces(frames, fps, runners=runners)
        wave, sr = read_video_audio(path)
        yield track, wave[:, : int(round(N_FRAMES / fps * sr))], sr


@pytest.fixture(scope="module")
def trained(clip):
    track, wave, sr = clip
    losses: list[float] = []
    info = train_avatar(track, wave, sr, "tiny_test", steps=60, seed=0, resume=False,
                        progress=lambda step, total, loss: losses.append(loss), **TINY_ARGS)
    return info, losses


def test_tiny_training_lowers_loss_and_saves(trained):
    info, losses = trained
    assert len(losses) == 60 and all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.9 * losses[0], (losses[0], losses[-1])
    for name in ("generator.safetensors", "generator.onnx", "reference.safetensors", "avatar.json", "checkpoint.pt"):
        assert (info.path / name).is_file(), name
    loaded = load_avatar("tiny_test")
    assert loaded.meta["steps"] == 60 and loaded.generator_config == TINY
    assert loaded.meta["onnx_parity_max_abs"] < 1e-4
    assert loaded.mel_config == MelConfig() and loaded.meta["source_fps"] == pytest.approx(30.0)
    crop, lms = loaded.reference()
    assert crop.shape == (64, 64, 3) and crop.dtype == np.uint8 and lms.shape == (468, 2)
    assert "tiny_test" in list_avatars()


def test_resume_after_interruption(clip):
    track, wave, sr = clip
    calls = {"n": 0}

    def stop_at_three() -> bool:
        calls["n"] += 1
        return calls["n"] >= 3

    with pytest.raises(TrainingInterrupted, match="step 3"):
        train_avatar(track, wave, sr, "resume_test", steps=6, resume=False, should_stop=stop_at_three, **TINY_ARGS)
    steps_seen: list[int] = []
    info = train_avatar(track, wave, sr, "resume_test", steps=6, resume=True,
                        progress=lambda step, total, loss: steps_seen.append(step), **TINY_ARGS)
    assert steps_seen == [4, 5, 6]
    assert info.meta["steps"] == 6


def test_training_works_under_inference_mode(clip):
    """ComfyUI runs nodes under torch.inference_mode(); train_avatar turns autograd back on itself."""
    import torch

    track, wave, sr = clip
    with torch.inference_mode():
        info = train_avatar(track, wave, sr, "inference_mode_test", steps=2, resume=False, **TINY_ARGS)
    assert info.meta["steps"] == 2 and (info.path / "generator.onnx").is_file()


def test_animate_clone_frame_count_and_untouched_outside_mask(trained, clip):
    from digital_human.vision.align import warp_image

    track, wave, sr = clip
    audio = wave[:, : int(1.0 * sr)]  # 1.0 s -> 30 frames at 30 fps
    result = animate_clone("tiny_test", track, audio, sr, batch_size=8, backend="onnxruntime")
    assert result.frames.shape == (30, *track.frames.shape[1:]) and result.frames_generated == 30
    assert result.model == "clone" and "onnxruntime" in result.backend
    idx = frame_schedule(len(track), 30, "ping-pong", track.fps, track.fps)
    masks = clone_masks(track, idx)
    inv = track.inverse_affines()[idx]
    h, w = track.frames.shape[1:3]
    changed_inside = 0
    for t in range(30):
        footprint = warp_image(masks[t], inv[t], w, h, border="zero") > 0
        grown = np.zeros_like(footprint)  # +2 px for the bilinear spread of the paste
        ys, xs = np.nonzero(footprint)
        grown[max(ys.min() - 2, 0):ys.max() + 3, max(xs.min() - 2, 0):xs.max() + 3] = True
        assert np.array_equal(result.frames[t][~grown], track.frames[idx[t]][~grown])
        changed_inside += int(np.any(result.frames[t][footprint] != track.frames[idx[t]][footprint]))
    assert changed_inside > 0


def test_bad_inputs(clip, trained):
    track, wave, sr = clip
    with pytest.raises(FootageError, match=r"too little footage: 1\.5 s"):
        check_footage(track, wave, sr)  # default minimum 20 s
    with pytest.raises(NoFaceError, match="no face"):
        check_footage(replace(track, found=np.zeros(len(track), bool)), wave, sr, min_seconds=0.5)
    with pytest.raises(FootageError, match="no AUDIO"):
        check_footage(track, None, sr, min_seconds=0.5)
    with pytest.raises(FootageError, match="silent"):
        check_footage(track, np.zeros_like(wave), sr, min_seconds=0.5)
    with pytest.raises(FootageError, match="shorter than the video"):
        check_footage(track, wave[:, : sr // 2], sr, min_seconds=0.5)
    with pytest.raises(FootageError, match="not a photo"):
        one = {k: getattr(track, k)[:1] for k in ("frames", "found", "boxes", "landmarks", "affines", "presence", "crops")}
        check_footage(replace(track, **one), wave, sr, min_seconds=0.0)
    for bad in ("../evil", "a/b", "", ".hidden", "x" * 65):
        with pytest.raises(ValueError, match="not allowed"):
            sanitize_name(bad)
    with pytest.raises(ValueError, match="not allowed"):
        train_avatar(track, wave, sr, "../escape", steps=1, **TINY_ARGS)
    with pytest.raises(ValueError, match="steps must be"):
        train_avatar(track, wave, sr, "bad_steps", steps=0, **TINY_ARGS)
    with pytest.raises(ValueError, match="device must be"):
        train_avatar(track, wave, sr, "bad_device", steps=1, **{**TINY_ARGS, "device": "tpu"})
    with pytest.raises(AvatarNotFoundError, match="not found .*train one with TrainAvatar"):
        load_avatar("nobody_here")
    with pytest.raises(ValueError, match="reference must be"):
        animate_clone("tiny_test", track, wave, sr, reference="mouth")
    from digital_human.talking_head.driver import AudioInputError

    with pytest.raises(AudioInputError, match="silent"):
        animate_clone("tiny_test", track, np.zeros(sr, np.float32), sr)


def test_broken_avatar_weights_are_rejected(trained):
    info, _ = trained
    from safetensors.torch import load_file, save_file

    weights = load_file(str(info.weights_path))
    weights.pop(next(iter(weights)))
    broken = info.path.parent / "broken"
    broken.mkdir(exist_ok=True)
    for name in ("generator.onnx", "reference.safetensors", "avatar.json"):
        (broken / name).write_bytes((info.path / name).read_bytes())
    save_file(weights, str(broken / "generator.safetensors"), metadata={"config": json.dumps(info.meta["generator"])})
    with pytest.raises(ValueError, match="does not fit"):
        load_avatar("broken")


# --- training stability on synthetic footage (no video or face models needed) ------------------------
@pytest.fixture
def one_thread():
    """Tiny convolutions: one thread is fastest, and on a busy machine more threads oversubscribe badly."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _synthetic_data(config: GeneratorConfig, n: int = 60, seed: int = 0, nan_frame: int | None = None):
    """A "face" region whose dark mouth opens with the loudness of its audio window: the only way to
    get the hole right is to read the audio."""
    from digital_human.talking_head.clone.train import CloneData

    rng = np.random.default_rng(seed)
    y0, y1, x0, x1 = config.region_box()
    h, w, row = y1 - y0, x1 - x0, config.hole_row()
    loud = (np.sin(np.arange(n) * 0.7) > 0).astype(np.float32) * rng.uniform(0.5, 1.0, n).astype(np.float32)
    regions = np.empty((n, 3, h, w), np.uint8)
    for i in range(n):
        img = np.array([200, 150, 130], np.float32)[:, None, None] + rng.normal(0, 4, (3, h, w))
        top = row + (h - row) // 3
        opening = 1 + int(round(loud[i] * (h - top - 2) * 0.8))
        img[:, top:top + opening, w // 3: 2 * w // 3] = 40.0
        regions[i] = np.clip(img, 0, 255).astype(np.uint8)
    windows = (loud[:, None, None, None] * 2.0 - 1.0 + rng.normal(0, 0.1, (n, 1, config.n_mels, config.audio_columns))
               ).astype(np.float32)
    if nan_frame is not None:
        windows[nan_frame] = np.nan
    boxes = np.tile(np.array([[row, h - 1, w / 4, 3 * w / 4]], np.float32), (n, 1))
    quiet = int(np.flatnonzero(loud == 0)[0])
    # lip "landmarks": the lower half of the points drop with the opening, plus a little jitter
    from digital_human.talking_head.clone.train import MOUTH_POINTS

    k = len(MOUTH_POINTS)
    xs = np.linspace(w / 3, 2 * w / 3, k)
    ys = np.full((n, k), row + (h - row) / 3.0)
    ys[:, k // 2:] += (1 + loud[:, None] * (h - row) * 0.5)
    shapes = np.stack([np.broadcast_to(xs, (n, k)), ys + rng.normal(0, 0.2, (n, k))], axis=-1)
    return CloneData(regions=regions, windows=windows, mouth_boxes=boxes, usable=np.arange(n, dtype=np.int64),
                     neutral=quiet, fps=30.0, mouth_shapes=shapes.reshape(n, -1).astype(np.float32)), loud


def _hole_outputs(model, data, frames, config):
    import torch

    src = torch.from_numpy(data.regions[frames]).float() / 255
    ref = torch.from_numpy(data.regions[[data.neutral] * len(frames)]).float() / 255
    with torch.inference_mode():
        out = model(src, ref, torch.from_numpy(data.windows[frames]))
    return out[:, :, config.hole_row():].float().numpy()


def test_bf16_autocast_cpu_training_learns_audio_and_eval_sees_current_weights(one_thread):
    """The H200 failure: bf16 training froze the generator at a constant output. The same bf16 autocast
    path on the CPU must give finite outputs that depend on the audio, and the monitor (what the GPU
    benchmark scores) must see the weights change between evaluations."""
    import torch

    from digital_human.talking_head.clone.train import fit_clone

    data, loud = _synthetic_data(TINY)
    open_f, closed_f = int(np.argmax(loud)), int(np.flatnonzero(loud == 0)[1])
    seen: dict[int, np.ndarray] = {}
    losses: list[float] = []

    def monitor(model, step, train_s, loss):
        assert not model.training
        seen[step] = _hole_outputs(model, data, [open_f, closed_f], TINY)
        losses.append(loss)

    fit = fit_clone(data, TINY, steps=60, device="cpu", batch_size=8, amp=True, lr=3e-3, seed=0,
                    monitor=monitor, monitor_every=20)
    assert sorted(seen) == [20, 40, 60]
    assert fit.skipped == 0 and fit.dead_steps == 0 and math.isfinite(fit.loss)
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    final = _hole_outputs(fit.model, data, [open_f, closed_f], TINY)
    assert np.isfinite(final).all()
    assert np.array_equal(final, seen[60])          # the last evaluation scored the returned weights
    assert np.abs(seen[60] - seen[20]).mean() > 1e-3  # ... and evaluations saw training progress
    # a loud and a silent window into the same source/reference must give different mouths
    src = torch.from_numpy(data.regions[[data.neutral] * 2]).float() / 255
    with torch.inference_mode():
        two = fit.model(src, src, torch.from_numpy(data.windows[[open_f, closed_f]]))[:, :, TINY.hole_row():]
    assert (two[0] - two[1]).abs().mean().item() > 3e-3  # ~0 at initialisation (FiLM starts as identity)
    assert 0.02 < two.std().item() and ((two <= 0) | (two >= 1)).float().mean().item() < 0.5  # not saturated


def test_non_finite_loss_steps_are_skipped_not_applied(one_thread):
    """A NaN batch (here: a corrupt audio window) is skipped and counted; the weights stay finite."""
    import torch

    from digital_human.talking_head.clone.train import fit_clone

    data, _ = _synthetic_data(TINY, n=30, nan_frame=5)
    fit = fit_clone(data, TINY, steps=20, device="cpu", batch_size=8, amp=True, seed=1)
    assert fit.steps == 20 and 0 < fit.skipped < 20
    assert all(torch.isfinite(p).all() for p in fit.model.parameters())
    assert math.isfinite(fit.loss)


def test_warmed_up_speed_estimate(one_thread):
    from digital_human.talking_head.clone.train import fit_clone

    data, _ = _synthetic_data(TINY, n=30)
    said: list[str] = []
    fit_clone(data, TINY, steps=12, device="cpu", batch_size=2, status=said.append)
    assert any(s.startswith("training on cpu: ") and "(12 steps, batch 2)" in s for s in said), said


def test_audio_augmentation_keeps_time_alignment():
    """augment_windows changes level and spectrum only: every time column gets the same per-bin change
    (so the mouth's timing cannot move), blanked bands are whole mel bins, and the input is untouched."""
    import torch

    from digital_human.talking_head.clone.train import augment_windows

    torch.manual_seed(0)
    w = torch.randn(64, 1, 80, 40)
    before = w.clone()
    a = augment_windows(w)
    assert a.shape == w.shape and torch.equal(w, before)
    blanked = (a == 0).all(dim=-1)  # [B, 1, mels]: whole bins set to the clip mean
    assert blanked.any() and blanked.sum(-1).max() <= 10
    gain = (a[..., 1:] - a[..., :-1]) / (w[..., 1:] - w[..., :-1])  # differences along time scale by one gain
    kept = ~blanked[..., None].expand_as(gain)
    per_sample = gain[kept.reshape(gain.shape)].reshape(-1)
    assert torch.all((per_sample > 0.89) & (per_sample < 1.11))


def test_time_stretch_keeps_the_frame_instant_and_scales_time():
    """stretch_windows reads centre + factor * (t - centre): on a ramp in time the centre stays put
    (the mouth stays in sync), slopes scale by the factor, the edges repeat the edge column, and a
    factor of 1 is the identity."""
    import torch

    from digital_human.talking_head.clone.train import augment_windows, stretch_windows

    t = torch.arange(40, dtype=torch.float32) - 19.5  # window time relative to its centre
    w = t.expand(3, 1, 8, 40).clone()
    out = stretch_windows(w, torch.tensor([1.0, 0.8, 1.25]))
    assert torch.allclose(out[0], w[0], atol=1e-5)
    assert torch.allclose(out[1], 0.8 * w[1], atol=1e-4)  # slower speech: everything stays inside
    inner = t.abs() * 1.25 <= 19.5
    assert torch.allclose(out[2][..., inner], 1.25 * w[2][..., inner], atol=1e-4)
    assert torch.allclose(out[2][..., ~inner].abs(), torch.full_like(out[2][..., ~inner], 19.5), atol=1e-4)
    torch.manual_seed(1)
    a = augment_windows(t.expand(64, 1, 8, 40).clone(), strength=1.0, time_stretch=1.25)
    slopes = (a[..., 21] - a[..., 18]) / 3.0  # near the centre: gain x stretch; EQ offsets cancel
    kept = slopes != 0
    assert slopes[kept].min() > 0.9 / 1.25 - 1e-4 and slopes[kept].max() < 1.1 * 1.25 + 1e-4
    assert ((slopes[kept] < 0.89) | (slopes[kept] > 1.11)).any()  # some windows really were stretched
    from digital_human.talking_head.clone.train import fit_clone

    data, _ = _synthetic_data(TINY, n=20)
    with pytest.raises(ValueError, match="time_stretch .* >= 1"):
        fit_clone(data, TINY, steps=1, device="cpu", time_stretch=0.8)
    with pytest.raises(ValueError, match="needs augment_audio > 0"):
        fit_clone(data, TINY, steps=1, device="cpu", time_stretch=1.25, augment_audio=0.0)


def test_shape_components_are_whitened_pca_of_the_usable_frames():
    from digital_human.talking_head.clone.train import shape_components

    rng = np.random.default_rng(3)
    shapes = (rng.normal(size=(200, 3)) * [5.0, 2.0, 0.5]) @ rng.normal(size=(3, 12)) + 40.0
    shapes[0] = 1e6  # an unusable frame (no face) must not enter the statistics
    usable = np.arange(1, 200)
    mean, basis, scale = shape_components(shapes.astype(np.float32), usable, k=3)
    coeffs = ((shapes[usable] - mean) @ basis.T) / scale
    assert mean.shape == (12,) and basis.shape == (3, 12) and scale.shape == (3,)
    assert np.allclose(coeffs.mean(0), 0, atol=1e-3) and np.allclose(coeffs.std(0, ddof=1), 1, atol=1e-3)
    assert np.allclose(basis @ basis.T, np.eye(3), atol=1e-5)
    assert scale[0] > scale[1] > scale[2]
    with pytest.raises(ValueError, match="mouth_shapes"):
        from digital_human.talking_head.clone.train import fit_clone

        data, _ = _synthetic_data(TINY, n=20)
        fit_clone(replace(data, mouth_shapes=None), TINY, steps=1, device="cpu", shape_weight=0.1)


def test_shape_loss_trains_its_head_and_resumes(one_thread, tmp_path):
    """With the lip-shape loss the checkpoint carries its read-out head; a resumed run continues it, and
    a checkpoint of another recipe (no shape loss) is not mixed in."""
    import torch

    from digital_human.talking_head.clone.train import fit_clone

    data, _ = _synthetic_data(TINY, n=40)
    ckpt = tmp_path / "checkpoint.pt"
    said: list[str] = []
    first = fit_clone(data, TINY, steps=8, device="cpu", batch_size=4, seed=0, checkpoint_path=ckpt,
                      shape_weight=0.5, audio_dropout=0.3, status=said.append)
    state = torch.load(ckpt, weights_only=True)
    assert "shape_head" in state and state["step"] == 8 and math.isfinite(first.loss)
    second = fit_clone(data, TINY, steps=12, device="cpu", batch_size=4, seed=0, checkpoint_path=ckpt,
                       shape_weight=0.5, audio_dropout=0.3, status=said.append)
    assert second.steps == 12 and any("resuming from step 8" in s for s in said)
    said.clear()
    fit_clone(data, TINY, steps=2, device="cpu", batch_size=4, seed=0, checkpoint_path=ckpt, shape_weight=0.0,
              status=said.append)
    assert "checkpoint is for other footage or settings; starting fresh" in said


def test_budget_too_short_for_a_usable_avatar_warns_with_the_time_needed(one_thread, caplog):
    """A budget that cannot reach MIN_USABLE_STEPS (the step count after which the measured CPU curve beat
    the still frame) is said at the speed estimate, with the minutes it would need, and reaches the node's
    report; a run long enough says nothing."""
    from digital_human.talking_head.clone.train import (MIN_USABLE_STEPS, fit_clone,
                                                        short_training_warning)

    data, _ = _synthetic_data(TINY, n=30)
    said: list[str] = []
    fit = fit_clone(data, TINY, steps=5000, time_budget_s=1.0, device="cpu", batch_size=2, status=said.append)
    warnings = [s for s in said if s.startswith("warning: ")]
    assert fit.steps < MIN_USABLE_STEPS["cpu"] and len(warnings) == 1, said
    assert f"needs at least {MIN_USABLE_STEPS['cpu']}" in warnings[0] and "min of training" in warnings[0]
    per_step = fit.seconds / fit.steps
    text = short_training_warning(100, "cpu", per_step, "the time budget")
    minutes = float(text.split("that is about ")[1].split(" min")[0])
    assert minutes == pytest.approx(max(MIN_USABLE_STEPS["cpu"] * per_step / 60, 0.1), abs=0.051)
    assert short_training_warning(MIN_USABLE_STEPS["cpu"], "cpu", per_step, "x") is None
    assert short_training_warning(MIN_USABLE_STEPS["cpu"], "cuda", 0.02, "x") is not None  # the GPU needs more


def test_train_avatar_node_report_carries_the_warning(clip, monkeypatch):
    from digital_human.audio import to_comfy_audio
    from digital_human.talking_head.clone import train as ta
    from digital_human.nodes.talking_head_nodes import TrainAvatar

    track, wave, sr = clip
    monkeypatch.setattr(ta, "GPU_CONFIG", TINY)
    monkeypatch.setattr(ta, "CPU_CONFIG", TINY)
    monkeypatch.setattr(ta, "MIN_SECONDS", 0.5)
    monkeypatch.setattr(ta.train_avatar, "__kwdefaults__", {**ta.train_avatar.__kwdefaults__, "min_seconds": 0.5})
    out = TrainAvatar().train(track, to_comfy_audio(wave[0], sr), name="tiny_warn", steps=20,
                              time_budget_minutes=0.05, device="cpu", resume=False)
    avatar, report = out["result"]
    warning = [line for line in report.splitlines() if line.startswith("warning: ")]
    # the warning comes from the speed estimate early in training (a count near the steps reached, not
    # equal to them: the per-step time varies with the machine's load)
    found = re.search(r"allows about (\d+) training steps on cpu", warning[0]) if len(warning) == 1 else None
    assert found is not None and int(found.group(1)) < 400 and avatar.meta["steps"] < 400, report
    assert "needs at least 400" in warning[0] and out["ui"]["text"] == [report]


def test_training_with_visemes_reads_the_footages_phones(clip, trained):
    """TrainAvatar(visemes=True): the aligner's phones of the footage condition the generator (its viseme
    read-out learns), the avatar says so, reads phones at inference (the aligner runs only for such
    avatars) and still animates speech that comes without phones (with a warning)."""
    from digital_human.talking_head.clone.train import VISEME_FRAMES
    from digital_human.talking_head.registry import reads_phones

    track, wave, sr = clip
    lines: list[str] = []
    info = train_avatar(track, wave, sr, "tiny_visemes", steps=20, seed=0, resume=False, visemes=True,
                        status=lines.append, **TINY_ARGS)
    assert info.generator_config.viseme_frames == VISEME_FRAMES, lines
    assert info.meta["visemes"].startswith("training with visemes and portrait's mouth drive"), info.meta["visemes"]
    assert info.generator_config.mouth_drive and info.generator_config.viseme_width() == VISEME_FRAMES * 10
    import torch
    from safetensors import safe_open

    with safe_open(str(info.path / "generator.safetensors"), framework="pt") as f:
        assert torch.count_nonzero(f.get_tensor("visemes.out.weight")) > 0  # trained away from its zero start
    assert reads_phones("clone:tiny_visemes") and not reads_phones("clone:tiny_test")
    assert not reads_phones("clone:tiny_visemes", trained[0])  # a given DH_AVATAR wins over the name
    phones = [("HH", 0.05, 0.12), ("AH", 0.12, 0.30), ("M", 0.30, 0.42), ("OW", 0.42, 0.8)]
    with_phones = animate_clone(info, track, wave, sr, phones=phones)
    without = animate_clone(info, track, wave, sr)
    assert with_phones.frames.shape == without.frames.shape
    assert not any("phone timings" in w for w in with_phones.warnings)
    assert any("without phone timings" in w for w in without.warnings)


def test_tail_weight_average_is_the_mean_of_the_last_steps_weights(one_thread, tmp_path):
    """average_weights=0.5 over 8 steps: the result's model is the plain mean of the weights after steps
    5..8 (the updates made in the run's second half), last_model the weights after step 8; a resumed run
    continues the average from its checkpoint. Off (the default) nothing changes: no last_model."""
    import torch

    from digital_human.talking_head.clone.train import fit_clone

    data, _ = _synthetic_data(TINY, n=30)
    seen: dict[int, list] = {}

    def monitor(model, step, seconds, loss):
        seen[step] = [p.detach().clone() for p in model.parameters()]

    fit = fit_clone(data, TINY, steps=8, device="cpu", batch_size=4, seed=0, lr=3e-3, average_weights=0.5,
                    monitor=monitor, monitor_every=1)
    assert fit.averaged_steps == 4 and fit.last_model is not None
    for i, (avg, last) in enumerate(zip(fit.model.parameters(), fit.last_model.parameters())):
        expect = torch.stack([seen[s][i] for s in (5, 6, 7, 8)]).mean(0)
        assert torch.allclose(avg, expect, atol=1e-6), i
        assert torch.equal(last, seen[8][i])
    assert any(not torch.equal(seen[5][i], seen[8][i]) for i in range(len(seen[8])))  # the weights did move
    assert not fit.model.training

    plain = fit_clone(data, TINY, steps=2, device="cpu", batch_size=4, seed=0)
    assert plain.last_model is None and plain.averaged_steps == 0

    ckpt = tmp_path / "checkpoint.pt"
    first = fit_clone(data, TINY, steps=6, device="cpu", batch_size=4, seed=0, average_weights=0.5,
                      checkpoint_path=ckpt)
    assert first.averaged_steps == 3 and torch.load(ckpt, weights_only=True)["averaged_n"] == 3
    resumed = fit_clone(data, TINY, steps=8, device="cpu", batch_size=4, seed=0, average_weights=0.5,
                        checkpoint_path=ckpt)
    assert resumed.averaged_steps == 5
    with pytest.raises(ValueError, match="average_weights"):
        fit_clone(data, TINY, steps=1, device="cpu", average_weights=1.5)
