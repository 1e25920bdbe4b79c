"""`clone` inference: drive a trained avatar's generator with speech and paste the mouths back.

Per output frame: the scheduled reference frame's crop (at the avatar's crop size) is the source
(its lower face is blanked inside the generator), the avatar's stored neutral frame is the
reference (so the source's own mouth never reaches the output - on held-out footage that would
be the answer), and the audio window around the frame's time drives the mouth; an avatar trained with
visemes also reads the viseme window of the speech's phones (zeros, confidence 0, where none are known).
The generator runs through the engine loader (TensorRT / torch CUDA FP16 / ONNX Runtime) in batches.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from ...engines.clone_model import (VISEME_INPUT, GeneratorConfig, batch_for_free_memory, crops_to_regions,
                                    generator_spec, regions_into_crops)
from ...vision.faces import CropLandmarks, FaceTrack
from ...vision.paste import lower_face_mask
from ..audio_features import windows_for_frames
from ..driver import (GeneratedCrops, TalkingHeadResult, frame_schedule, output_frame_count, paste_generated,
                      phase_progress, reference_warnings, validate_audio, validate_track)
from .avatar_store import AvatarInfo, load_avatar
from .conditioning import condition_windows
from .train import crops_at_size

MODEL_NAME = "clone"
MASK_JAW_MARGIN = 0.15  # a generated open jaw may reach a little below the reference frame's chin
REFERENCE_MODES = ("neutral", "frame")


def generator_runner(avatar: AvatarInfo, backend: str = "auto", precision: str = "auto"):
    """The avatar's generator from the engine loader (cached per process)."""
    from ...engines import loader

    spec = generator_spec(avatar.onnx_path, avatar.weights_path, name=f"clone-{avatar.name}")
    return loader.get(spec, backend=backend, precision=precision, stage="face")


def _resize(img: np.ndarray, size: int) -> np.ndarray:
    from ...vision import align as _align

    if _align._cv2 is not None:
        return _align._cv2.resize(img, (size, size), interpolation=_align._cv2.INTER_CUBIC)
    k = img.shape[0] / float(size)  # numpy fallback: bilinear through the shared warp
    return np.clip(np.rint(_align.warp_image(img, np.array([[1 / k, 0, 0], [0, 1 / k, 0]]), size, size)),
                   0, 255).astype(np.uint8)


def resolve_batch_size(requested: int, runner, config: GeneratorConfig) -> int:
    """`requested` when > 0; 0 = automatic: on CUDA the largest batch whose activations fit in half the
    free GPU memory (at most the engine profiles' 64), elsewhere 32."""
    if requested > 0:
        return int(requested)
    if getattr(runner.info, "device", "cpu") != "cuda":
        return 32
    import torch

    free, _ = torch.cuda.mem_get_info()
    return batch_for_free_memory(free, config, 2 if runner.precision == "fp16" else 4)


def generate_regions(runner, sources: np.ndarray, references: np.ndarray, windows: np.ndarray,
                     batch_size: int, should_stop: Callable[[], bool] | None = None,
                     progress: Callable[[int, int], None] | None = None,
                     visemes: np.ndarray | None = None) -> np.ndarray:
    """uint8 [N, 3, h, w] sources/references (references may be one [1, 3, h, w]) + windows (+ viseme
    windows [N, W] for a viseme avatar) -> uint8 regions."""
    n = len(sources)
    out = np.empty_like(sources)
    for start in range(0, n, batch_size):
        if should_stop is not None and should_stop():
            raise InterruptedError(f"clone talking head interrupted after {start} of {n} frames")
        stop = min(start + batch_size, n)
        src = sources[start:stop].astype(np.float32) / 255.0
        ref = references[start:stop] if len(references) == n else np.broadcast_to(references, src.shape)
        feeds = {"source": src, "reference": np.ascontiguousarray(ref, np.float32) / 255.0,
                 "audio": np.ascontiguousarray(windows[start:stop], np.float32)}
        if visemes is not None:
            feeds[VISEME_INPUT] = np.ascontiguousarray(visemes[start:stop], np.float32)
        region = runner(feeds)["region"]
        out[start:stop] = np.clip(np.rint(np.asarray(region, np.float32) * 255.0), 0, 255).astype(np.uint8)
        if progress is not None:
            progress(stop, n)
    return out


class _CloneRenderer:
    """Generated crops of output frames start..stop-1 on demand (the generator in batches), so the
    headless path never holds every frame's crop; reference crops are re-warped per chunk."""

    def __init__(self, runner, track: FaceTrack, idx: np.ndarray, windows: np.ndarray, config: GeneratorConfig,
                 neutral: np.ndarray | None, batch_size: int, should_stop: Callable[[], bool] | None,
                 visemes: np.ndarray | None = None):
        self.runner, self.track, self.idx, self.windows, self.config = runner, track, idx, windows, config
        self.visemes = visemes
        self.neutral, self.batch_size, self.should_stop = neutral, batch_size, should_stop
        self.size = track.crop_size
        self.crop_lms = CropLandmarks(track)  # per frame on demand: flat in the video's length
        self._masks: dict[int, np.ndarray] = {}

    def mask(self, r: int) -> np.ndarray:
        hit = self._masks.get(r)
        if hit is None:
            if len(self._masks) >= 256:  # a video reference has one per frame: keep the recent ones
                self._masks.pop(next(iter(self._masks)))
            hit = self._masks[r] = lower_face_mask(self.crop_lms[r], self.size, jaw_margin=MASK_JAW_MARGIN)
        return hit

    def render(self, start: int, stop: int) -> tuple[np.ndarray, None]:
        config = self.config
        refs, pos = np.unique(self.idx[start:stop], return_inverse=True)
        crops_a = crops_at_size(self.track, config.crop_size, refs)[0][pos]
        sources = crops_to_regions(crops_a, config)
        references = sources if self.neutral is None else self.neutral
        visemes = None if self.visemes is None else self.visemes[start:stop]
        regions = generate_regions(self.runner, sources, references, self.windows[start:stop], self.batch_size,
                                   self.should_stop, visemes=visemes)
        gen = regions_into_crops(crops_a, regions, config)
        if config.crop_size != self.size:
            gen = np.stack([_resize(g, self.size) for g in gen])
        return gen, None


def clone_crops(avatar: AvatarInfo | str, track: FaceTrack, audio: np.ndarray, sample_rate: int,
                fps: float | None = None, *, loop_mode: str = "ping-pong", batch_size: int = 32,
                backend: str = "auto", precision: str = "auto", reference: str = "neutral",
                max_audio_seconds: float = 600.0, progress: Callable[[int, int], None] | None = None,
                should_stop: Callable[[], bool] | None = None, streaming: bool = False,
                phones: Sequence | None = None) -> GeneratedCrops:
    """The generator's crops for every output frame (no paste-back yet); arguments as animate_clone.
    streaming: return at once with crops generated on demand (GeneratedCrops.render). phones: the
    speech's phone timings (visemes.py), read by avatars trained with visemes; others ignore them."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    info = load_avatar(avatar) if isinstance(avatar, str) else avatar
    if not isinstance(info, AvatarInfo):
        raise ValueError(f"avatar must be a DH_AVATAR (from TrainAvatar) or an avatar name, got {type(avatar).__name__}")
    validate_track(track)
    wave = validate_audio(audio, sample_rate, max_audio_seconds)
    if reference not in REFERENCE_MODES:
        raise ValueError(f"reference must be one of {REFERENCE_MODES}, got {reference!r}")
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 1, or 0 for automatic, got {batch_size}")
    config: GeneratorConfig = info.generator_config
    fps = float(fps) if fps and fps > 0 else float(track.fps)
    n_out = output_frame_count(len(wave) / float(sample_rate), fps)
    idx = frame_schedule(len(track), n_out, loop_mode, track.fps, fps)
    windows = windows_for_frames(wave, int(sample_rate), fps, n_out, info.mel_config)
    visemes = None
    warnings: list[str] = []
    if config.viseme_frames:  # small: 6 (10 with the mouth drive) floats x the window per output frame
        visemes = condition_windows(phones, wave, int(sample_rate), fps, n_out, config)
        if not phones:
            warnings.append("this avatar reads visemes but the speech came without phone timings: the mouth "
                            "follows the audio alone (TTS speech carries them; for recordings, visemes auto)")
    neutral = crops_to_regions(info.reference()[0][None], config) if reference == "neutral" else None
    timings["prepare"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    runner = generator_runner(info, backend, precision)
    timings["load"] = time.perf_counter() - t1
    batch_size = resolve_batch_size(batch_size, runner, config)
    if config.crop_size != track.crop_size:
        warnings.append(f"avatar was trained at {config.crop_size}px crops, the faces are {track.crop_size}px: "
                        f"generated at {config.crop_size}px and resized")
    warnings += reference_warnings(track, idx, n_out, fps, loop_mode, lost_detail=None)
    renderer = _CloneRenderer(runner, track, idx, windows, config, neutral, batch_size, should_stop, visemes)
    gen = GeneratedCrops(track=track, idx=idx, fps=fps, crops=None, masks={}, model=MODEL_NAME,
                         backend=f"{runner.backend} {runner.precision}", timings=timings, warnings=warnings,
                         render=renderer.render, mask_of=renderer.mask)
    return gen.finished(streaming, progress, should_stop, batch=max(batch_size, 1))


def animate_clone(avatar: AvatarInfo | str, track: FaceTrack, audio: np.ndarray, sample_rate: int,
                  fps: float | None = None, *, loop_mode: str = "ping-pong", batch_size: int = 32,
                  backend: str = "auto", precision: str = "auto", reference: str = "neutral",
                  max_audio_seconds: float = 600.0, progress: Callable[[int, int], None] | None = None,
                  should_stop: Callable[[], bool] | None = None, phones: Sequence | None = None) -> TalkingHeadResult:
    """Animate `track` (DH_FACES, photo or video of the avatar's person) with `audio`.

    reference: "neutral" = the avatar's stored neutral frame (default), "frame" = each scheduled
    frame's own crop (keeps that frame's lighting, but shows its mouth to the generator).
    progress(done, total) runs over generation then paste-back."""
    gen = clone_crops(avatar, track, audio, sample_rate, fps, loop_mode=loop_mode, batch_size=batch_size,
                      backend=backend, precision=precision, reference=reference,
                      max_audio_seconds=max_audio_seconds, progress=phase_progress(progress, 0),
                      should_stop=should_stop, phones=phones)
    return paste_generated(gen, max(batch_size, 32), phase_progress(progress, 1), should_stop)


def clone_masks(track: FaceTrack, idx: np.ndarray) -> np.ndarray:
    """Crop-space masks [M, S, S] animate_clone pastes through, for schedule `idx` (PSNR checks)."""
    lms = track.crop_landmarks()
    cache = {int(r): lower_face_mask(lms[int(r)], track.crop_size, jaw_margin=MASK_JAW_MARGIN) for r in np.unique(idx)}
    return np.stack([cache[int(r)] for r in idx])
