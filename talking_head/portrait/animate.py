"""`portrait`: zero-shot talking head. Animates the mouth of any face (photo or video) from speech.

No weights: speech_drive turns the waveform into per-frame jaw/lip/width/round controls, and
mouth_render re-poses the mouth in each aligned crop (warp + rendered interior). Only the
lower-face mask region of each frame changes; a video keeps its own head motion and blinks.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, Callable, Sequence

import numpy as np

from ...parallel import for_each_frame
from ...vision import align as _align
from ...vision.faces import CropLandmarks, apply_affines, invert_affines
from ...vision.paste import lower_face_mask
from ..driver import (GeneratedCrops, TalkingHeadResult, frame_schedule, output_frame_count, paste_generated,
                      phase_progress, reference_warnings, validate_audio, validate_track)
from .mouth_bank import FEATURES, LIP_POINTS, MouthBank, blend_mouth, build_bank, select_frames, shape_features
from .mouth_render import MouthGeometry, MouthPose, drive_landmarks, mouth_geometry, mouth_shape, render_mouth
from .speech_drive import MouthParams

MODEL_NAME = "portrait"
# The mask grows past the jaw line (fraction of mouth->silhouette distance) so a dropped chin and
# the neck region its warp compresses stay inside; the warp is zero at the mask's edge.
MASK_JAW_MARGIN = 0.30


def _backend_name() -> str:
    return "numpy+opencv" if _align._cv2 is not None else "numpy"


AUTO_BATCH = 64  # frames per progress step when batch_size is 0 (the renderer is per frame, on the CPU)


def resolve_batch_size(batch_size: int) -> int:
    """`batch_size` when >= 1; 0 = automatic (AUTO_BATCH), as for `clone`."""
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 1, or 0 for automatic, got {batch_size}")
    return int(batch_size) or AUTO_BATCH


class _PortraitRenderer:
    """Re-posed crops of output frames start..stop-1 on demand; each reference frame's mouth geometry
    and paste mask are made once and kept for the most recent reference frames only (a video
    reference has one per frame)."""

    def __init__(self, track, idx: np.ndarray, params, keep: int = 256, bank: MouthBank | None = None,
                 bank_idx: np.ndarray | None = None):
        self.track, self.idx, self.params = track, idx, params
        self.bank, self.bank_idx = bank, bank_idx  # the mouth bank and its frame per output frame
        self.size = track.crop_size
        self.crop_lms = CropLandmarks(track)  # per frame on demand: flat in the video's length
        self.inv = invert_affines(track.affines)
        self._geoms: OrderedDict[int, MouthGeometry] = OrderedDict()
        self._masks: OrderedDict[int, np.ndarray] = OrderedDict()
        self._keep = keep

    def _cached(self, cache: OrderedDict, r: int, make):
        hit = cache.get(r)
        if hit is None:
            hit = cache[r] = make()
            while len(cache) > self._keep:
                cache.popitem(last=False)
        cache.move_to_end(r)
        return hit

    def geometry(self, r: int) -> MouthGeometry:
        return self._cached(self._geoms, r, lambda: mouth_geometry(self.track.crops[r], self.crop_lms[r]))

    def mask(self, r: int) -> np.ndarray:
        return self._cached(self._masks, r,
                            lambda: lower_face_mask(self.crop_lms[r], self.size, jaw_margin=MASK_JAW_MARGIN))

    def render(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        idx, params = self.idx, self.params
        refs = {int(r): self.track.crops[int(r)] for r in np.unique(idx[start:stop])}  # read before the threads
        geoms = {r: self.geometry(r) for r in refs}
        crops = np.empty((stop - start, self.size, self.size, 3), np.uint8)
        lms = np.asarray(self.track.landmarks[idx[start:stop]], np.float32).copy()

        def render_one(i: int) -> None:  # writes only slot i - start
            r = int(idx[i])
            pose = MouthPose(float(params.jaw_open[i]), float(params.lip_open[i]), float(params.width[i]),
                             float(params.round[i]))
            driven = drive_landmarks(geoms[r], self.crop_lms[r], pose)
            # with a bank the lips and the opening between them are the person's own (drawn interior hidden)
            crop = render_mouth(refs[r], geoms[r], pose, interior=self.bank is None)
            if self.bank is not None:
                crop, driven = blend_mouth(crop, driven, self.bank, int(self.bank_idx[i]))
            crops[i - start] = crop
            lms[i - start, :, :2] = apply_affines(driven, self.inv[r])

        for_each_frame(render_one, start, stop)
        return crops, lms


def portrait_crops(track, audio: np.ndarray, sample_rate: int, fps: float | None = None, *,
                   loop_mode: str = "ping-pong", max_audio_seconds: float = 600.0, strength: float = 1.0,
                   batch_size: int = 64, progress: Callable[[int, int], None] | None = None,
                   should_stop: Callable[[], bool] | None = None, streaming: bool = False,
                   phones: Sequence[Any] | None = None, mouth_bank: Any = "off") -> GeneratedCrops:
    """The re-posed crop of every output frame (no paste-back yet); arguments as animate_portrait.
    streaming: return at once with crops made on demand (GeneratedCrops.render), for the headless
    video path, whose memory must not grow with the length.
    phones: (phone, start_s, end_s[, confidence]) timings of the speech (TTS or aligner): the mouth
    then takes viseme shapes (viseme_drive.py); None keeps the audio-only drive, frame for frame.
    mouth_bank: "off" (the drawn mouth interior), "auto" (a video reference's own frames are the bank;
    a photo keeps the drawn interior), a FaceTrack of another talking video of the same person, or a
    built MouthBank: each frame's lips and mouth are then the bank frame nearest the driven shape,
    warped into place (mouth_bank.py); the report says whether it ran and on how many frames."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    validate_track(track)
    wave = validate_audio(audio, sample_rate, max_audio_seconds)
    if not 0.0 <= strength <= 3.0:
        raise ValueError(f"strength must be in 0..3 (1 = natural), got {strength}")
    batch_size = resolve_batch_size(batch_size)
    fps = float(fps) if fps and fps > 0 else float(track.fps)
    n_out = output_frame_count(len(wave) / float(sample_rate), fps)
    idx = frame_schedule(len(track), n_out, loop_mode, track.fps, fps)
    params = _drive(wave, int(sample_rate), fps, n_out, phones).scaled(strength)
    timings["drive"] = time.perf_counter() - t0

    warnings = reference_warnings(track, idx, n_out, fps, loop_mode,
                                  "; their mouths follow the interpolated position")
    bank, bank_idx = _bank_schedule(mouth_bank, track, idx, params, timings)
    renderer = _PortraitRenderer(track, idx, params, bank=bank, bank_idx=bank_idx)
    backend = (_backend_name() + ("; visemes from phone timings" if phones else "")
               + (f"; {bank.summary()}" if bank is not None else "; drawn mouth (mouth bank off)" if len(track) > 1
                  else ""))
    gen = GeneratedCrops(track=track, idx=idx, fps=fps, crops=None, masks={}, model=MODEL_NAME,
                         backend=backend, timings=timings, warnings=warnings, render=renderer.render,
                         mask_of=renderer.mask, notes={"mouth_bank": bank_note(bank, bank_idx, timings)})
    return gen.finished(streaming, progress, should_stop, batch=batch_size, timing="render")


MOUTH_BANK_MODES = ("auto", "off")


def resolve_mouth_bank(mouth_bank: Any, track) -> MouthBank | None:
    """The MouthBank that `mouth_bank` names for reference `track` (see portrait_crops), or None."""
    if isinstance(mouth_bank, MouthBank):
        return mouth_bank
    if mouth_bank is None or mouth_bank is False or (isinstance(mouth_bank, str) and mouth_bank == "off"):
        return None
    if isinstance(mouth_bank, str):
        if mouth_bank != "auto":
            raise ValueError(f"mouth_bank must be one of {MOUTH_BANK_MODES}, a FaceTrack or a MouthBank, "
                             f"got {mouth_bank!r}")
        return build_bank(track) if len(track) > 1 else None  # a photo has one mouth: nothing to choose
    return build_bank(mouth_bank, origin="the bank video")  # a FaceTrack of another video


def target_shapes(track, idx: np.ndarray, params: MouthParams) -> np.ndarray:
    """float32 [M, 6] mouth-shape features (mouth_bank.shape_features) of every output frame's driven
    lips, from the landmarks alone (no crop is read), for choosing bank frames before rendering."""
    crop_lms = CropLandmarks(track)
    ids = np.concatenate([LIP_POINTS, [33, 263]])
    idx = np.asarray(idx, np.int64)
    out = np.empty((len(idx), len(FEATURES)), np.float32)
    pts = np.zeros((min(len(idx), 512), 468, 2), np.float32)  # a block of output frames at a time: long
    geoms: dict[int, MouthGeometry] = {}                       # speech must not hold 468 points a frame
    for start in range(0, len(idx), len(pts)):
        block = idx[start:start + len(pts)]
        for j, r in enumerate(block):
            r, i = int(r), start + j
            if r not in geoms:
                geoms = geoms if len(geoms) < 256 else {}
                geoms[r] = mouth_shape(crop_lms[r], track.crop_size)
            pose = MouthPose(float(params.jaw_open[i]), float(params.lip_open[i]), float(params.width[i]),
                             float(params.round[i]))
            pts[j, ids] = drive_landmarks(geoms[r], crop_lms[r], pose, points=ids)
        out[start:start + len(block)] = shape_features(pts[:len(block)])
    return out


def _bank_schedule(mouth_bank: Any, track, idx: np.ndarray, params: MouthParams,
                   timings: dict[str, float]) -> tuple[MouthBank | None, np.ndarray | None]:
    """(bank, bank frame per output frame), or (None, None) when no bank runs; the time to build the
    bank and to choose its frames goes to timings["mouth_bank"] (reported apart from rendering)."""
    t0 = time.perf_counter()
    bank = resolve_mouth_bank(mouth_bank, track)
    if bank is None:
        return None, None
    chosen = select_frames(bank.features, target_shapes(track, idx, params), bank.source, bank.stride)
    timings["mouth_bank"] = time.perf_counter() - t0
    return bank, chosen


def bank_note(bank: MouthBank | None, chosen: np.ndarray | None, timings: dict[str, float]) -> dict[str, Any]:
    """What the reports say about the mouth bank: whether it ran, on how many bank frames (and how many
    of them the output shows), its memory and the seconds it cost apart from rendering."""
    if bank is None:
        return {"ran": False}
    return {"ran": True, "frames": len(bank), "frames_used": int(len(np.unique(chosen))), "source": bank.origin,
            "stride": bank.stride, "patch_px": list(bank.patches.shape[2:0:-1]), "megabytes": round(bank.nbytes / 2**20, 2),
            "seconds": round(timings.get("mouth_bank", 0.0), 3)}


def _drive(wave: np.ndarray, rate: int, fps: float, n_out: int, phones: Sequence[Any] | None) -> MouthParams:
    """Audio-only mouth parameters, or (with phone timings) those blended with the viseme track."""
    from ..visemes import viseme_track
    from .viseme_drive import speech_mouth

    return speech_mouth(wave, rate, fps, n_out, viseme_track(phones, fps, n_out) if phones else None)


def animate_portrait(track, audio: np.ndarray, sample_rate: int, fps: float | None = None, *,
                     loop_mode: str = "ping-pong", max_audio_seconds: float = 600.0, strength: float = 1.0,
                     batch_size: int = 64, progress: Callable[[int, int], None] | None = None,
                     should_stop: Callable[[], bool] | None = None,
                     phones: Sequence[Any] | None = None, mouth_bank: Any = "off") -> TalkingHeadResult:
    """Animate `track` (DH_FACES) with `audio` (mono float32 [T], or [C, T] / [B, C, T]).

    fps: output frame rate (None/0 = the track's own). Output frames = ceil(audio seconds x fps).
    loop_mode: how a video reference covers audio longer than itself ("loop", "ping-pong", "hold").
    strength: mouth-motion amplitude (1 = default). batch_size: frames per progress step (0 = 64).
    progress(done, total) after each batch, over rendering then paste-back; should_stop() -> True
    aborts with InterruptedError. phones: the speech's phone timings; mouth_bank: the person's own
    mouths (see portrait_crops)."""
    gen = portrait_crops(track, audio, sample_rate, fps, loop_mode=loop_mode, max_audio_seconds=max_audio_seconds,
                         strength=strength, batch_size=batch_size, progress=phase_progress(progress, 0),
                         should_stop=should_stop, phones=phones, mouth_bank=mouth_bank)
    return paste_generated(gen, resolve_batch_size(batch_size), phase_progress(progress, 1), should_stop)


def portrait_masks(track, idx: np.ndarray) -> np.ndarray:
    """The crop-space masks [M, S, S] animate_portrait pastes through, for schedule `idx`
    (what the PSNR-outside-mask check needs)."""
    lms = track.crop_landmarks()
    cache: dict[int, np.ndarray] = {}
    for r in np.unique(idx):
        cache[int(r)] = lower_face_mask(lms[int(r)], track.crop_size, jaw_margin=MASK_JAW_MARGIN)
    return np.stack([cache[int(r)] for r in idx])
