"""TrainAvatar logic: fit the `clone` generator to one person's talking footage and save DH_AVATAR.

Data: every frame with a found face gives (target crop region, audio window centred on the frame).
The reference for a target is another frame of the same video at least `ref_gap_s` away (so its
mouth says nothing about the target's), or - a third of the time - the avatar's fixed neutral
frame, which is what inference uses. The generator sees the target with its lower face blanked
(clone_model), so the mouth shape can only come from the audio.

Losses (no pretrained networks are available offline): L1 over the hole with extra weight on the
mouth box of the target's landmarks (the lips are a small part of the hole but all of the metric),
plus 1 - SSIM over the hole for structure (teeth/lip edges that plain L1 blurs), plus a lip-shape
loss on the audio embedding (a training-only linear head predicts the target's lip-landmark PCA
coefficients: geometry is a low-dimensional target that carries over to unseen speech better than
pixels alone); the audio embedding is dropped out in training.

Runs on CUDA (bf16 autocast) or CPU (FP32 by default, slowly; a time estimate is reported after a
few steps). Stability (the first H200 run froze at a constant output - see clone_model's `_head`):
the sigmoid head and the losses run in FP32 under autocast, the learning rate warms up linearly
(Adam's first steps move every weight by ~lr at once, which in this normalisation-free U-Net
swung the whole hole to near-white within 5 steps), gradients are clipped, and a step with a
non-finite loss or gradient is skipped and counted instead of being applied.
State is checkpointed every `checkpoint_every` steps and on interruption; `resume=True` continues
a checkpoint of the same footage and config.
"""
from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Callable

import numpy as np

from ...atomic_file import atomic_path
from ...engines.clone_model import CloneGenerator, GeneratorConfig, crops_to_regions
from ...vision.faces import FaceTrack, NoFaceError
from ..audio_features import MelConfig, windows_for_frames
from .avatar_store import AvatarInfo, avatar_dir, sanitize_name, save_avatar

log = logging.getLogger("digital_human.train_avatar")

MIN_SECONDS = 20.0
MOUTH_POINTS = (0, 13, 14, 17, 37, 39, 40, 61, 78, 80, 81, 82, 84, 87, 88, 91, 95, 146, 178, 181, 185, 191,
                267, 269, 270, 291, 308, 310, 311, 312, 314, 317, 318, 321, 324, 375, 402, 405, 409, 415)
GAP_PAIRS = ((81, 178), (82, 87), (13, 14), (312, 317), (311, 402))
RIGID_POINTS = (33, 263, 133, 362, 168, 6, 197, 195, 5, 4, 1, 2, 98, 327, 116, 345, 9, 151)
# Fewest steps after which a trained clone beat the still reference mouth (baseline (a)) on held-out
# footage in the measured curves (benchmarks/RESULTS.md, "Training to the held-out target"): the CPU
# config (128 px, batch 8) went from MLD +43% vs (a) at step 100 to -1.5% at step 400; the GPU config
# (batch 32) was already -8.7% at its first checkpoint, step 800 (30 s on the H200). Fewer steps than
# this save an avatar whose lower face is a blur, so TrainAvatar warns and says how long it would need.
MIN_USABLE_STEPS = {"cpu": 400, "cuda": 800}
DEFAULT_STEPS = 5000  # TrainAvatar / CLI default on CUDA: the length of the measured H200 runs (RESULTS.md)
CPU_CONFIG = GeneratorConfig(crop_size=128, base_channels=16)  # ~16x cheaper than the 256-px default
GPU_CONFIG = GeneratorConfig()


class TrainingInterrupted(RuntimeError):
    """Training stopped on request; the checkpoint holds the progress (run again with resume)."""


class FootageError(ValueError):
    """The training footage or its audio is unusable (too short, no face, no audio)."""


# --- data --------------------------------------------------------------------------------------
@dataclass
class CloneData:
    """Everything training needs, already at the generator's crop size."""

    regions: np.ndarray        # uint8 [N, 3, h, w]
    windows: np.ndarray        # float32 [N, 1, mels, T]
    mouth_boxes: np.ndarray    # float32 [N, 4] y0, y1, x0, x1 in region pixels (loss weighting)
    usable: np.ndarray         # int64 indices of frames with a found face (targets and references)
    neutral: int               # index of the neutral reference frame
    fps: float
    mouth_shapes: np.ndarray | None = None  # float32 [N, 2 * len(MOUTH_POINTS)] lip points in region pixels
    visemes: np.ndarray | None = None  # float32 [N, config.viseme_width()] (conditioning.condition_windows) or None
    # what a sample whose phones are dropped sees instead (viseme_dropout): zeros for a phones-only config,
    # the audio-only drive for a mouth_drive one (None = zeros)
    visemes_without_phones: np.ndarray | None = None

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for arr in (self.regions[:: max(1, len(self.regions) // 16)], self.windows[:: max(1, len(self.windows) // 16)],
                    self.usable):
            h.update(np.ascontiguousarray(arr).tobytes())
        if self.mouth_shapes is not None:
            h.update(np.ascontiguousarray(self.mouth_shapes[:: max(1, len(self.mouth_shapes) // 16)]).tobytes())
        for extra in (self.visemes, self.visemes_without_phones):
            if extra is not None:
                h.update(np.ascontiguousarray(extra[:: max(1, len(extra) // 16)]).tobytes())
        h.update(f"{len(self.regions)}|{self.fps}".encode())
        return h.hexdigest()[:24]


def mouth_opening(crop_landmarks: np.ndarray) -> np.ndarray:
    lm = np.asarray(crop_landmarks, np.float64)
    gap = np.linalg.norm(lm[:, [b for _, b in GAP_PAIRS], :2] - lm[:, [a for a, _ in GAP_PAIRS], :2], axis=-1).mean(-1)
    iod = np.linalg.norm(lm[:, 263, :2] - lm[:, 33, :2], axis=-1)
    return gap / np.maximum(iod, 1e-6)


def pick_neutral_frame(crop_landmarks: np.ndarray, usable: np.ndarray) -> int:
    """A frame with the typical head pose and a slightly open mouth (lips apart a little shows the
    teeth's colour; a wide-open one would look odd as the resting mouth)."""
    lm = np.asarray(crop_landmarks, np.float64)[usable]
    rigid = lm[:, list(RIGID_POINTS), :2]
    pose_dev = np.linalg.norm(rigid - np.median(rigid, axis=0), axis=-1).mean(-1)
    opening = mouth_opening(lm)
    target = np.percentile(opening, 30)
    score = pose_dev / max(float(np.median(pose_dev)), 1e-6) + np.abs(opening - target) / max(float(opening.std()), 1e-6)
    return int(usable[int(np.argmin(score))])


def mouth_boxes(crop_landmarks: np.ndarray, config: GeneratorConfig, grow: float = 0.35) -> np.ndarray:
    """[N, 4] mouth box (y0, y1, x0, x1) per frame in region pixels, grown by `grow` each side."""
    y0, _, x0, _ = config.region_box()
    pts = np.asarray(crop_landmarks, np.float64)[:, list(MOUTH_POINTS), :2]
    lo, hi = pts.min(1), pts.max(1)
    pad = (hi - lo) * grow
    lo, hi = lo - pad, hi + pad
    return np.stack([lo[:, 1] - y0, hi[:, 1] - y0, lo[:, 0] - x0, hi[:, 0] - x0], axis=1).astype(np.float32)


def mouth_shapes(crop_landmarks: np.ndarray, config: GeneratorConfig) -> np.ndarray:
    """[N, 2 * len(MOUTH_POINTS)] lip landmarks (x, y) in region pixels: the shape loss's targets."""
    y0, _, x0, _ = config.region_box()
    pts = np.asarray(crop_landmarks, np.float64)[:, list(MOUTH_POINTS), :2] - np.array([x0, y0], np.float64)
    return pts.reshape(len(pts), -1).astype(np.float32)


def shape_components(shapes: np.ndarray, usable: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean [D], basis [k, D], scale [k]) of the footage's lip shapes (PCA): the shape loss predicts
    the first k whitened coefficients, so the opening (the first component) and the next few shape
    changes count alike and head-size units drop out."""
    x = np.asarray(shapes, np.float64)[usable]
    mean = x.mean(0)
    _, sv, vt = np.linalg.svd(x - mean, full_matrices=False)
    k = int(min(k, len(sv)))
    scale = np.maximum(sv[:k] / np.sqrt(max(len(x) - 1, 1)), 1e-6)
    return mean.astype(np.float32), vt[:k].astype(np.float32), scale.astype(np.float32)


def crops_at_size(track: FaceTrack, size: int, frames: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(crops uint8 [K, size, size, 3], crop landmarks [K, 468, 2]) of reference frames `frames`
    (None = all) at `size` px, re-warped from the source frames when the track was aligned at another
    crop size (same geometry, scaled)."""
    which = np.arange(len(track)) if frames is None else np.asarray(frames, np.int64)
    if track.crop_size == size:
        crops = track.crops if frames is None else track.crops[which]
        return np.asarray(crops), track.crop_landmarks()[which]
    from ...vision.align import crop_frames
    from ...vision.faces import apply_affines

    affines = np.asarray(track.affines, np.float64)[which] * (size / float(track.crop_size))
    return (crop_frames(track.frames[which], affines, size),
            apply_affines(track.landmarks[which][..., :2], affines).astype(np.float32))


def prepare_data(crops: np.ndarray, crop_landmarks: np.ndarray, found: np.ndarray, windows: np.ndarray,
                 fps: float, config: GeneratorConfig, visemes: np.ndarray | None = None,
                 visemes_without_phones: np.ndarray | None = None) -> CloneData:
    """visemes: the footage's viseme windows [N, config.viseme_width()] (a viseme config needs them);
    visemes_without_phones: the same windows as speech without phones gives them (a mouth_drive config
    needs them: its drive channels are not zeros there)."""
    if crops.shape[1] != config.crop_size:
        raise ValueError(f"crops are {crops.shape[1]} px but the generator expects {config.crop_size} px")
    if config.viseme_frames:
        want = (len(windows), config.viseme_width())
        for label, arr, needed in (("viseme windows", visemes, True),
                                   ("phone-less viseme windows", visemes_without_phones, config.mouth_drive)):
            if (arr is None and needed) or (arr is not None and np.shape(arr) != want):
                raise ValueError(f"a generator with viseme_frames={config.viseme_frames}"
                                 f"{' and mouth_drive' if config.mouth_drive else ''} trains on {label} "
                                 f"{list(want)}, got {None if arr is None else np.shape(arr)}")
    usable = np.flatnonzero(np.asarray(found, bool)[: len(windows)])
    return CloneData(regions=crops_to_regions(crops, config), windows=np.asarray(windows, np.float32),
                     mouth_boxes=mouth_boxes(crop_landmarks, config), usable=usable.astype(np.int64),
                     neutral=pick_neutral_frame(crop_landmarks, usable), fps=float(fps),
                     mouth_shapes=mouth_shapes(crop_landmarks, config),
                     visemes=None if not config.viseme_frames else np.asarray(visemes, np.float32),
                     visemes_without_phones=None if not config.viseme_frames or visemes_without_phones is None
                     else np.asarray(visemes_without_phones, np.float32))


def check_footage(track: FaceTrack, audio: np.ndarray | None, sample_rate: int | None,
                  min_seconds: float = MIN_SECONDS) -> np.ndarray:
    """Validate TrainAvatar's inputs; returns mono float32 audio. Raises FootageError/NoFaceError."""
    from ..audio_features import to_mono

    if not isinstance(track, FaceTrack) or len(track) == 0:
        raise NoFaceError("TrainAvatar needs DH_FACES of a talking video (run FaceAlign on the video first)")
    if len(track) < 2:
        raise FootageError("TrainAvatar needs a video, not a photo: DH_FACES has 1 frame; give >= "
                           f"{min_seconds:g} s of talking footage of the person")
    found = np.asarray(track.found, bool)
    if not found.any():
        raise NoFaceError(f"no face was found in any of the {len(track)} frames; TrainAvatar needs footage with "
                          "a visible frontal face")
    fps = float(track.fps)
    if not fps > 0:
        raise FootageError(f"DH_FACES has no valid fps ({track.fps}); run FaceAlign with the video's frame rate")
    seconds = found.sum() / fps
    if seconds < min_seconds:
        raise FootageError(f"too little footage: {seconds:.1f} s with a face found ({int(found.sum())} of "
                           f"{len(track)} frames at {fps:g} fps); TrainAvatar needs at least {min_seconds:g} s "
                           "of the person talking")
    if audio is None or sample_rate is None:
        raise FootageError("no AUDIO given: TrainAvatar needs the video's own soundtrack (connect the AUDIO "
                           "output of the video loader)")
    mono = to_mono(audio, "audio")
    if int(sample_rate) <= 0:
        raise FootageError(f"audio sample_rate must be positive, got {sample_rate}")
    if mono.size == 0 or float(np.abs(mono).max(initial=0.0)) < 1e-4:
        raise FootageError("the AUDIO is empty or silent; TrainAvatar needs the video's own speech track")
    audio_s, video_s = mono.size / float(sample_rate), len(track) / fps
    if audio_s < video_s - max(0.25, 2.0 / fps):
        raise FootageError(f"the audio ({audio_s:.2f} s) is shorter than the video ({video_s:.2f} s); give the "
                           "video's own full soundtrack, or trim the video to the audio")
    return mono


# --- losses ------------------------------------------------------------------------------------
def _ssim_map(x, y, window: int = 7):
    import torch.nn.functional as F

    pad = window // 2
    mu_x = F.avg_pool2d(x, window, 1, pad, count_include_pad=False)
    mu_y = F.avg_pool2d(y, window, 1, pad, count_include_pad=False)
    sxx = F.avg_pool2d(x * x, window, 1, pad, count_include_pad=False) - mu_x ** 2
    syy = F.avg_pool2d(y * y, window, 1, pad, count_include_pad=False) - mu_y ** 2
    sxy = F.avg_pool2d(x * y, window, 1, pad, count_include_pad=False) - mu_x * mu_y
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    return ((2 * mu_x * mu_y + c1) * (2 * sxy + c2)) / ((mu_x ** 2 + mu_y ** 2 + c1) * (sxx + syy + c2))


def clone_loss(pred, target, hole, boxes, mouth_weight: float = 4.0, ssim_weight: float = 0.5):
    """(total, l1) - L1 over the hole, mouth box weighted up, + ssim_weight * (1 - SSIM) over the hole."""
    import torch

    _, _, h, w = pred.shape
    ys = torch.arange(h, device=pred.device, dtype=torch.float32)[None, :, None]
    xs = torch.arange(w, device=pred.device, dtype=torch.float32)[None, None, :]
    b = boxes.float()
    in_box = ((ys >= b[:, 0, None, None]) & (ys <= b[:, 1, None, None]) &
              (xs >= b[:, 2, None, None]) & (xs <= b[:, 3, None, None])).float()[:, None]
    weight = hole * (1.0 + mouth_weight * in_box)
    diff = (pred.float() - target.float()).abs()
    l1 = (diff * weight).sum() / (weight.sum() * 3.0)
    ssim = _ssim_map(pred.float(), target.float())
    s = (ssim * hole).sum() / (hole.sum() * 3.0 * pred.shape[0])
    return l1 + ssim_weight * (1.0 - s), l1


# --- training loop -------------------------------------------------------------------------------
@dataclass
class FitResult:
    model: CloneGenerator
    steps: int
    loss: float
    seconds: float
    device: str
    history: list[tuple[int, float, float]]  # (step, seconds, loss EMA)
    skipped: int = 0           # steps skipped for a non-finite loss or gradient
    dead_steps: int = 0        # steps whose gradient was exactly zero (saturated output)
    last_model: CloneGenerator | None = None  # average_weights > 0: the last step's weights (model is the average)
    averaged_steps: int = 0    # how many steps' weights the averaged model holds (0: not averaged)


def resolve_device(device: str) -> str:
    import torch

    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if device == "auto":
        from ...engines.devices import torch_cuda_usable

        return "cuda" if torch_cuda_usable() else "cpu"  # ComfyUI's --cpu keeps training on the CPU
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for but torch sees no CUDA GPU; use 'auto' or 'cpu'")
    return device


def stretch_windows(windows, factors):
    """Windows [B, 1, mels, T] resampled in time about their centre (the video frame's instant, which
    stays put): output column x reads input time centre + factors[b] * (x - centre), linearly
    interpolated; beyond the edges the edge column repeats. factors > 1: faster speech."""
    import torch
    import torch.nn.functional as F

    b = windows.shape[0]
    theta = torch.zeros(b, 2, 3, device=windows.device, dtype=windows.dtype)
    theta[:, 0, 0] = factors.to(windows.dtype)  # x is time; normalised 0 is the window's centre
    theta[:, 1, 1] = 1.0                        # y (mel bins) unchanged
    grid = F.affine_grid(theta, list(windows.shape), align_corners=False)
    return F.grid_sample(windows, grid, mode="bilinear", padding_mode="border", align_corners=False)


def augment_windows(windows, strength: float = 1.0, time_stretch: float = 1.0):
    """Training-time jitter of normalised log-mel windows [B, 1, mels, T] (torch): a random EQ per
    sample (each mel bin offset by N(0, 0.15) of the clip's std - another microphone or room), a gain
    of 0.9-1.1, and with probability 1/2 one band of 1-10 mel bins blanked to the clip mean (0), as
    SpecAugment does; `strength` scales the offsets, the gain range and the widest band.
    time_stretch > 1: each window is also resampled in time about its centre column (the video
    frame's instant, which stays put, so the mouth stays in sync) by a factor drawn log-uniformly in
    [1/time_stretch, time_stretch] - the same words spoken faster or slower; columns beyond the
    window's edges repeat the edge column."""
    import torch

    b, _, mels, _ = windows.shape
    dev = windows.device
    out = windows
    if time_stretch > 1.0:
        log_max = math.log(float(time_stretch))
        out = stretch_windows(windows, torch.exp(torch.empty(b, device=dev).uniform_(-log_max, log_max)))
    spread = 0.1 * strength
    out = out * torch.empty(b, 1, 1, 1, device=dev).uniform_(1.0 - spread, 1.0 + spread)
    out = out + 0.15 * strength * torch.randn(b, 1, mels, 1, device=dev)
    width = torch.randint(1, max(2, int(round(10 * strength)) + 1), (b,), device=dev)
    start = (torch.rand(b, device=dev) * (mels - width + 1)).long()
    bins = torch.arange(mels, device=dev)[None]
    band = (bins >= start[:, None]) & (bins < (start + width)[:, None]) & (torch.rand(b, 1, device=dev) < 0.5)
    return out.masked_fill(band[:, None, :, None], 0.0)


def _config_key(config: GeneratorConfig) -> str:
    """The config as the checkpoint fingerprint spells it: a config without the mouth drive keeps the
    text it had before that field existed, so a training interrupted on an older version still resumes."""
    return str(config).replace(", mouth_drive=False", "")


def fit_clone(data: CloneData, config: GeneratorConfig, *, steps: int | None = None,
              time_budget_s: float | None = None, device: str = "auto", batch_size: int | None = None,
              lr: float = 5e-4, seed: int = 0, ref_gap_s: float = 1.0, neutral_prob: float = 1 / 3,
              progress: Callable[[int, int, float], None] | None = None,
              should_stop: Callable[[], bool] | None = None, status: Callable[[str], None] | None = None,
              checkpoint_path=None, checkpoint_every: int = 250, resume: bool = True,
              monitor: Callable[[CloneGenerator, int, float, float], bool | None] | None = None,
              monitor_every: int = 0, amp: bool | None = None, warmup_steps: int = 100,
              clip_grad_norm: float = 1.0, max_bad_steps: int = 50, augment_audio: float = 1.0,
              shape_weight: float = 0.2, shape_components_k: int = 8, audio_dropout: float = 0.3,
              mouth_weight: float = 10.0, time_stretch: float = 1.0, viseme_dropout: float = 0.3,
              average_weights: float = 0.0, audio_mute: float = 0.0) -> FitResult:
    """Train (or continue training) the generator on prepared data. Stops at `steps` total steps or
    after `time_budget_s` seconds of training (whichever first), or when `monitor` returns True.

    monitor(model, step, train_seconds, loss_ema) is called every `monitor_every` steps with the live
    model in eval mode. amp: bf16 autocast on the training device (default: on for CUDA, off for
    CPU, where bf16 convolutions are slower than FP32). warmup_steps: linear lr warm-up (capped at a
    tenth of `steps`). After `max_bad_steps` consecutive skipped (non-finite) or zero-gradient
    steps training stops with a RuntimeError instead of burning the budget on a frozen model.
    augment_audio: strength of the training audio windows' jitter (augment_windows; 0 = off), so the mouth is learned from
    what the words share rather than from one recording's exact spectra (H200, 5 minutes on 01a, held-out
    01b: mouth-landmark distance -23.6% vs baseline (a) with it, -21.0% without; benchmarks/RESULTS.md).
    shape_weight: weight of the lip-shape loss - a training-only linear read-out of the audio embedding
    predicts the target frame's first `shape_components_k` whitened PCA coefficients of its lip landmarks
    (shape_components), so the embedding carries the mouth's geometry explicitly. audio_dropout: dropout on
    the audio embedding where it enters the U-Net (training only). mouth_weight: extra L1 weight on the
    mouth box. These three defaults (0.2 / 0.3 / 10; before: 0 / 0 / 4) gave -27.1% mean over four 150-s H200
    runs against -25.3% over two of the old recipe - within the 2.8-point spread between repeats of one run -
    and raised the held-out mouth opening's correlation with the real one from 0.32-0.37 to 0.41-0.46
    (benchmarks/RESULTS.md). time_stretch > 1: the audio windows are also resampled in time by up to that
    factor (augment_windows); off by default: at 1.25 three H200 runs averaged -26.9% against the default's
    -27.1% (benchmarks/RESULTS.md, 2026-11-30). viseme_dropout (viseme configs only): share of samples
    whose viseme window is zeroed (no phones known), so the generator also serves speech without phones.
    average_weights: share of the run (of `steps`, or of the time budget) at its end over which the weights
    are also averaged uniformly, one average over every step's weights (tail / stochastic weight averaging;
    the generator has no normalisation layers, so the average needs no re-estimated statistics). 0 = off;
    on, the result's `model` is the average and `last_model` the last step's weights. Off by default: over the
    second half of four 4,500-step H200 runs the average scored 0.1 point better to 2.3 points worse on held-out
    01b than the same runs' last weights (mean 0.9 worse; results/gpu_clone_visemes_h200_2026-12-01_2f7fc11.json).
    audio_mute (viseme configs only): share of samples whose audio embedding is zeroed, so the generator
    must also draw the mouth from the viseme window (and the mouth drive) alone."""
    import copy

    import torch
    import torch.nn.functional as F

    dev = resolve_device(device)
    if steps is not None and int(steps) < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not time_stretch >= 1.0:
        raise ValueError(f"time_stretch is a largest stretch factor: >= 1 (1 = off), got {time_stretch}")
    if time_stretch > 1.0 and not augment_audio > 0:
        raise ValueError("time_stretch is part of the audio augmentation: it needs augment_audio > 0")
    if time_budget_s is not None and not time_budget_s > 0:
        raise ValueError(f"time_budget_s must be > 0 seconds, got {time_budget_s}")
    if steps is None and time_budget_s is None:
        steps = DEFAULT_STEPS if dev == "cuda" else 800
    bs = int(batch_size or (32 if dev == "cuda" else 8))
    use_amp = (dev == "cuda") if amp is None else bool(amp)
    warmup = max(0, int(warmup_steps))
    if steps is not None:
        warmup = min(warmup, int(steps) // 10)
    if bs < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if len(data.usable) < 2:
        raise FootageError("need at least 2 frames with a face to train")
    if config.viseme_frames and data.visemes is None:
        raise ValueError("a viseme generator config needs CloneData.visemes (prepare_data(visemes=...))")
    if not 0.0 <= viseme_dropout < 1.0:
        raise ValueError(f"viseme_dropout is a share of samples in [0, 1), got {viseme_dropout}")
    if not 0.0 <= audio_mute < 1.0:
        raise ValueError(f"audio_mute is a share of samples in [0, 1), got {audio_mute}")
    if audio_mute > 0 and not config.viseme_frames:
        raise ValueError("audio_mute needs a viseme config: without visemes a muted sample has nothing to draw from")
    if not 0.0 <= average_weights <= 1.0:
        raise ValueError(f"average_weights is a share of the run in [0, 1], got {average_weights}")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    if dev == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes: let cuDNN pick the fastest kernels
    model = CloneGenerator(config).to(dev)
    model.audio_dropout = float(audio_dropout)
    model.audio_mute = float(audio_mute)
    shape_head = None
    if shape_weight > 0:
        if data.mouth_shapes is None:
            raise ValueError("shape_weight > 0 needs CloneData.mouth_shapes (prepare_data fills it)")
        s_mean, s_basis, s_scale = shape_components(data.mouth_shapes, data.usable, shape_components_k)
        coeffs = ((data.mouth_shapes - s_mean) @ s_basis.T) / s_scale  # whitened PCA coefficients
        shape_targets = torch.from_numpy(coeffs.astype(np.float32)).to(dev)
        # training-only linear read-out of the audio embedding: pushes the embedding to carry the lip
        # shape explicitly (a low-dimensional target that generalises better than pixels alone)
        shape_head = torch.nn.Linear(config.audio_dim, len(s_scale)).to(dev)
    # beta1 0.9 (not the GAN-style 0.5): a plain regression loss, and momentum damps the noisy
    # per-batch gradients of a small batch that otherwise make single large steps
    trained = list(model.parameters()) + (list(shape_head.parameters()) if shape_head is not None else [])
    opt = torch.optim.Adam(trained, lr=lr, betas=(0.9, 0.999))
    # the footage, the architecture and the recipe: a checkpoint of other data or settings is not continued
    fingerprint = (f"{data.fingerprint()}|{_config_key(config)}|shape{shape_weight:g}x{shape_components_k}|drop{audio_dropout:g}"
                   f"|mouth{mouth_weight:g}|augment{augment_audio:g}"
                   + (f"|stretch{time_stretch:g}" if time_stretch > 1.0 else "")  # off: as before, resumable
                   + (f"|vdrop{viseme_dropout:g}" if config.viseme_frames else "")
                   + (f"|avg{average_weights:g}" if average_weights > 0 else "")
                   + (f"|mute{audio_mute:g}" if audio_mute > 0 else ""))  # off: as before, resumable
    # the tail average of the weights (average_weights > 0): a running mean, kept in FP32 beside the model
    averaged = copy.deepcopy(model).requires_grad_(False) if average_weights > 0 else None
    averaged_n = 0
    step, elapsed, ema, history = 0, 0.0, None, []
    if resume and checkpoint_path is not None and checkpoint_path.is_file():
        state = torch.load(checkpoint_path, map_location=dev, weights_only=True)
        if state.get("fingerprint") == fingerprint:
            model.load_state_dict(state["model"])
            if shape_head is not None:
                shape_head.load_state_dict(state["shape_head"])
            opt.load_state_dict(state["opt"])
            step, elapsed, ema = int(state["step"]), float(state["elapsed"]), float(state["loss"])
            if averaged is not None and "averaged" in state:
                averaged.load_state_dict(state["averaged"])
                averaged_n = int(state["averaged_n"])
            rng = np.random.default_rng(seed + step)
            _say(status, f"resuming from step {step} ({elapsed:.0f} s trained so far)")
        else:
            _say(status, "checkpoint is for other footage or settings; starting fresh")

    def save_checkpoint() -> None:
        if checkpoint_path is None:
            return
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "elapsed": elapsed,
                 "loss": float(ema if ema is not None else float("nan")), "fingerprint": fingerprint}
        if shape_head is not None:
            state["shape_head"] = shape_head.state_dict()
        if averaged is not None:
            state["averaged"], state["averaged_n"] = averaged.state_dict(), averaged_n
        with atomic_path(checkpoint_path) as tmp:
            torch.save(state, tmp)

    regions = torch.from_numpy(data.regions).to(dev)
    windows = torch.from_numpy(data.windows).to(dev)
    visemes = torch.from_numpy(data.visemes).to(dev) if config.viseme_frames else None
    phoneless = (torch.from_numpy(data.visemes_without_phones).to(dev)
                 if visemes is not None and data.visemes_without_phones is not None else None)
    boxes = torch.from_numpy(data.mouth_boxes).to(dev)
    hole = model.hole
    usable = data.usable
    gap = max(1, int(round(ref_gap_s * data.fps)))
    if np.ptp(usable) < 2 * gap:
        gap = max(1, int(np.ptp(usable) // 3))  # tiny clips (tests): keep references as far as possible
    autocast = torch.autocast(dev, dtype=torch.bfloat16, enabled=use_amp)  # follows the device: CPU runs
    # can exercise the same bf16 path (amp=True) that CUDA training takes
    no_autocast = torch.autocast(dev, enabled=False)
    params = [p for p in trained if p.requires_grad]
    live_avg = list(model.parameters())
    mean_avg = list(averaged.parameters()) if averaged is not None else []
    skipped = dead = bad_run = 0
    total = int(steps) if steps is not None else None
    start_step, t0 = step, time.perf_counter()
    estimate_said, t_warm, warned = False, None, False
    model.train()
    while True:
        run_s = elapsed + (time.perf_counter() - t0)
        if total is not None and step >= total:
            break
        if time_budget_s is not None and run_s - 0.0 >= time_budget_s and step > start_step:
            break
        frac = max(step / total if total else 0.0, run_s / time_budget_s if time_budget_s else 0.0)
        ramp = min(1.0, (step + 1) / warmup) if warmup else 1.0
        for group in opt.param_groups:  # warm-up, then cosine decay to 5 % by the end of steps/budget
            group["lr"] = ramp * lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        tgt = rng.choice(usable, bs)
        ref = rng.choice(usable, bs)
        far = np.abs(ref - tgt) >= gap
        for _ in range(8):  # re-draw references too close in time
            if far.all():
                break
            ref[~far] = rng.choice(usable, int((~far).sum()))
            far = np.abs(ref - tgt) >= gap
        use_neutral = (rng.random(bs) < neutral_prob) & (np.abs(tgt - data.neutral) >= gap)
        ref[use_neutral] = data.neutral
        ti, ri = torch.from_numpy(tgt).to(dev), torch.from_numpy(ref).to(dev)
        gain = torch.empty(bs, 1, 1, 1, device=dev).uniform_(0.85, 1.15)  # lighting jitter, same for all inputs
        target = (regions[ti].float() / 255.0 * gain).clamp(0, 1)
        reference = (regions[ri].float() / 255.0 * gain).clamp(0, 1)
        audio = augment_windows(windows[ti], augment_audio, time_stretch) if augment_audio > 0 else windows[ti]
        vis = None
        if visemes is not None:  # some samples without phones: what the generator sees when none are known
            keep = torch.from_numpy((rng.random(bs) >= viseme_dropout).astype(np.float32)).to(dev)
            vis = visemes[ti] * keep[:, None] if phoneless is None else \
                torch.where(keep[:, None] > 0, visemes[ti], phoneless[ti])
        with autocast:
            pred, embedding = model.forward_parts(target, reference, audio, vis)
        with no_autocast:  # SSIM's variance terms (E[x^2] - E[x]^2) cancel badly in low precision
            loss, l1 = clone_loss(pred.float(), target, hole, boxes[ti], mouth_weight=mouth_weight)
            if shape_head is not None:
                loss = loss + shape_weight * F.mse_loss(shape_head(embedding.float()), shape_targets[ti])
        opt.zero_grad(set_to_none=True)
        loss.backward()  # a NaN loss gives NaN gradients; they are dropped below, never applied
        gnorm = torch.nn.utils.clip_grad_norm_(params, clip_grad_norm if clip_grad_norm else float("inf"))
        value, gvalue = torch.stack([loss.detach().float(), gnorm.float()]).tolist()  # one device sync per step
        ok = math.isfinite(value) and math.isfinite(gvalue)
        if ok:
            opt.step()
            if gvalue == 0.0:
                dead += 1  # no parameter can move: the output is saturated (or the loss ignores it)
                bad_run += 1
            else:
                bad_run = 0
        else:
            skipped += 1
            bad_run += 1
            opt.zero_grad(set_to_none=True)
        step += 1
        if averaged is not None and ok and frac >= 1.0 - average_weights:  # frac: this step's share of the run
            averaged_n += 1
            with torch.no_grad():
                torch._foreach_lerp_(mean_avg, live_avg, 1.0 / averaged_n)
        if bad_run >= max_bad_steps:
            elapsed = elapsed + (time.perf_counter() - t0)
            raise RuntimeError(f"training is stuck at step {step}: {bad_run} steps in a row had a non-finite loss/"
                               f"gradient or an exactly zero gradient ({skipped} skipped, {dead} zero-gradient so "
                               "far); try a lower lr, amp off, or another seed")
        if math.isfinite(value):
            ema = value if ema is None else 0.95 * ema + 0.05 * value
        now = elapsed + (time.perf_counter() - t0)
        if step % 10 == 0 or step == total:
            history.append((step, now, ema))
        shown_total = total if total is not None else max(step + 1, int(step * time_budget_s / max(now, 1e-6)))
        # time the estimate over steps 4..8: the first steps include cuDNN autotuning / allocator
        # warm-up (on the H200 they made 0.67 s/step look like 1/70 of the real speed)
        if step - start_step == 3:
            t_warm = time.perf_counter()
        if not estimate_said and t_warm is not None and step - start_step == 8:
            per_step = (time.perf_counter() - t_warm) / 5
            remaining = (total - step) * per_step if total else time_budget_s - now
            if total is None:
                shown_total = max(step + 1, step + int(remaining / max(per_step, 1e-9)))
            _say(status, f"training on {dev}{' (bf16 autocast)' if use_amp else ''}: {per_step:.3f} s/step, about "
                 f"{remaining / 60:.1f} min to go ({shown_total} steps, batch {bs})")
            estimate_said = True
            by_budget = step + int(max(0.0, time_budget_s - now) / max(per_step, 1e-9)) if time_budget_s else None
            reachable = min(v for v in (total, by_budget) if v is not None)
            early = short_training_warning(reachable, dev, per_step, "the time budget" if reachable == by_budget
                                           else f"steps={total}")
            if early:
                _warn(status, early)
                warned = True
        try:
            if progress is not None:
                progress(step, shown_total, ema)
            if should_stop is not None and should_stop():
                raise TrainingInterrupted(f"training stopped at step {step}; run TrainAvatar again (resume on) "
                                          "to continue from the checkpoint")
        except BaseException:
            elapsed = now
            save_checkpoint()
            raise
        if checkpoint_every and step % checkpoint_every == 0:
            elapsed, t0 = now, time.perf_counter()
            save_checkpoint()
        if monitor is not None and monitor_every and step % monitor_every == 0:
            paused = time.perf_counter()
            model.eval()
            done = bool(monitor(model, step, now, float(ema if ema is not None else float("nan"))))
            model.train()
            t0 += time.perf_counter() - paused  # evaluation time is not training time
            if done:
                break
    elapsed = elapsed + (time.perf_counter() - t0)
    save_checkpoint()
    model.eval()
    if not warned:  # not warned at the estimate (too short a run, or slower than estimated): judge the steps made
        final = short_training_warning(step, dev, elapsed / max(step, 1), "this run")
        if final:
            _warn(status, final)
    if skipped or dead:
        _say(status, f"{skipped} steps skipped (non-finite loss/gradient), {dead} with a zero gradient")
    last = None
    if averaged is not None and averaged_n > 0:
        model, last = averaged.eval(), model
        _say(status, f"weights averaged over the last {averaged_n} steps")
    return FitResult(model, step, float(ema if ema is not None else float("nan")), elapsed, dev, history,
                     skipped, dead, last, averaged_n)


def short_training_warning(reachable: int, device: str, per_step_s: float, limit: str) -> str | None:
    """The warning for a run that stops (or stopped) at `reachable` steps, below what a usable avatar
    needs on `device`; None when it is enough. `limit` says what stops it ("the time budget", "steps")."""
    needed = MIN_USABLE_STEPS.get(device, MIN_USABLE_STEPS["cpu"])
    if reachable >= needed:
        return None
    minutes = needed * per_step_s / 60.0
    return (f"{limit} allows about {reachable} training steps on {device}, but an avatar needs at least {needed} "
            f"to move the mouth better than a still frame (benchmarks/RESULTS.md); at {per_step_s:.2f} s/step that "
            f"is about {max(minutes, 0.1):.1f} min of training: raise time_budget_minutes (and steps) - training "
            "resumes from the checkpoint")


def _warn(status: Callable[[str], None] | None, text: str) -> None:
    log.warning("[digital_human] TrainAvatar: %s", text)
    if status is not None:
        status(f"warning: {text}")


def _say(status: Callable[[str], None] | None, text: str) -> None:
    log.info("[digital_human] TrainAvatar: %s", text)
    if status is not None:
        status(text)


# --- visemes of the footage ----------------------------------------------------------------------
VISEME_FRAMES = 9  # +-4 frames (+-160 ms at 25 fps): about the reach of the mel window and of coarticulation


def footage_visemes(mono: np.ndarray, sample_rate: int, fps: float, n_frames: int,
                    config: GeneratorConfig) -> tuple[np.ndarray | None, np.ndarray | None, str]:
    """(viseme windows [n_frames, config.viseme_width()] of the footage's own speech or None, the same
    windows without phones (viseme_dropout's samples), a note saying where the phones came from or why
    there are none). config: a viseme config (viseme_frames > 0)."""
    from ..phone_source import speech_phones
    from .conditioning import condition_windows

    found = speech_phones(None, mono, sample_rate, "auto")
    if not found.phones:
        return None, None, f"training without visemes: {found.note}"
    drive = " and portrait's mouth drive" if config.mouth_drive else ""
    return (condition_windows(found.phones, mono, sample_rate, fps, n_frames, config),
            condition_windows(None, mono, sample_rate, fps, n_frames, config),
            f"training with visemes{drive} ({config.viseme_frames} frames): {found.note}")


# --- the node's entry point -----------------------------------------------------------------------
def train_avatar(track: FaceTrack, audio: np.ndarray, sample_rate: int, name: str, *, steps: int | None = None,
                 time_budget_s: float | None = None, device: str = "auto", batch_size: int | None = None,
                 config: GeneratorConfig | None = None, mel_config: MelConfig = MelConfig(),
                 progress: Callable[[int, int, float], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, status: Callable[[str], None] | None = None,
                 resume: bool = True, seed: int = 0, min_seconds: float = MIN_SECONDS,
                 checkpoint_every: int = 250, lr: float = 5e-4, amp: bool | None = None,
                 visemes: bool = False, mouth_drive: bool = True) -> AvatarInfo:
    """Train the `clone` generator on one person's talking video (DH_FACES + its own audio) and save
    the avatar under `<models>/avatars/<name>/`. Returns the DH_AVATAR.

    visemes: also condition the generator on the footage's viseme track (phones from the offline aligner,
    English), so that at inference the TTS's phone timings (or the aligner's on a recording) shape the
    mouth next to the audio; without alignable speech it trains audio-only and says so. mouth_drive (with
    visemes; on by default): the generator also reads portrait's mouth drive of the same speech
    (clone/conditioning.py; why it is the default: benchmarks/RESULTS.md, 2026-12-02 clone notes)."""
    import torch

    # ComfyUI runs every node under torch.inference_mode(): building the model, the training steps and
    # the ONNX export all need autograd back
    with torch.inference_mode(False), torch.enable_grad():
        clean = sanitize_name(name)
        mono = check_footage(track, audio, sample_rate, min_seconds)
        dev = resolve_device(device)
        if config is None:
            config = GPU_CONFIG if dev == "cuda" else CPU_CONFIG
        if config.audio_columns != mel_config.window_columns or config.n_mels != mel_config.n_mels:
            config = replace(config, audio_columns=mel_config.window_columns, n_mels=mel_config.n_mels)
        crops, lms = crops_at_size(track, config.crop_size)
        windows = windows_for_frames(mono, int(sample_rate), track.fps, len(track), mel_config)
        viseme_windows, phoneless, viseme_note = None, None, ""
        if visemes:
            wanted = replace(config, viseme_frames=VISEME_FRAMES, mouth_drive=bool(mouth_drive))
            viseme_windows, phoneless, viseme_note = footage_visemes(mono, int(sample_rate), track.fps, len(track),
                                                                     wanted)
            _say(status, viseme_note)
            if viseme_windows is not None:
                config = wanted
        data = prepare_data(crops, lms, track.found, windows, track.fps, config, visemes=viseme_windows,
                            visemes_without_phones=phoneless)
        folder = avatar_dir(clean, create=True)  # the checkpoint lives there while training
        fit = fit_clone(data, config, steps=steps, time_budget_s=time_budget_s, device=dev, batch_size=batch_size,
                        lr=lr, seed=seed, progress=progress, should_stop=should_stop, status=status,
                        checkpoint_path=folder / "checkpoint.pt", checkpoint_every=checkpoint_every, resume=resume, amp=amp)
        info = save_avatar(fit.model, clean, crops[data.neutral], lms[data.neutral], mel_config, {
            "steps": fit.steps, "loss": fit.loss, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "source_fps": float(track.fps), "frames": int(len(track)),
            "footage_seconds": float(len(data.usable) / track.fps), "neutral_frame": int(data.neutral),
            "device": fit.device, "train_seconds": fit.seconds, "seed": seed,
            **({"visemes": viseme_note} if visemes else {})})
        _say(status, f"saved avatar '{clean}' to {folder} ({fit.steps} steps, loss {fit.loss:.4f})")
        return info
