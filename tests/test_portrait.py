"""The `portrait` talking head and the output-frame driver: clock, schedules, input errors,
untouched pixels outside the mask, mouth motion that follows the speech (re-measured with the
face mesh), interruption. Real photo / clip / speech from the sample data."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from digital_human.audio.decode import decode_audio
from digital_human.talking_head import (AudioInputError, animate_portrait, frame_schedule,
                                        output_frame_count, schedule_track, validate_audio,
                                        validate_track)
from digital_human.talking_head.portrait.animate import portrait_crops, portrait_masks
from digital_human.talking_head.portrait.speech_drive import mouth_params
from digital_human.vision import NoFaceError, align_faces
from digital_human.vision import lipsync_metrics as M
from digital_human.vision.align import warp_image



# --- clock and schedule (no models) -------------------------------------------------------------
@pytest.mark.parametrize("seconds,fps,expected", [
    (10.0, 30, 300), (10.001, 30, 301), (2.2, 30, 66), (0.5, 25, 13), (1 / 3, 30, 10), (0.01, 25, 1),
    (27.07, 29.97, 812), (0.0, 25, 0),
])
def test_output_frame_count(seconds, fps, expected):
    assert output_frame_count(seconds, fps) == expected


def test_output_frame_count_rejects_bad_fps():
    with pytest.raises(ValueError, match="fps must be > 0"):
        output_frame_count(1.0, 0)


def test_frame_schedule_modes():
    assert frame_schedule(4, 10, "loop").tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert frame_schedule(4, 10, "ping-pong").tolist() == [0, 1, 2, 3, 2, 1, 0, 1, 2, 3]
    assert frame_schedule(4, 10, "hold").tolist() == [0, 1, 2, 3, 3, 3, 3, 3, 3, 3]
    for mode in ("loop", "ping-pong", "hold"):  # a photo is always frame 0
        assert frame_schedule(1, 5, mode).tolist() == [0] * 5
    # fps mismatch maps by time: 30 fps reference under a 15 fps output skips, 15 under 30 repeats
    assert frame_schedule(10, 5, "loop", src_fps=30, out_fps=15).tolist() == [0, 2, 4, 6, 8]
    assert frame_schedule(3, 8, "ping-pong", src_fps=15, out_fps=30).tolist() == [0, 0, 1, 1, 2, 2, 1, 1]
    assert frame_schedule(100, 4, "loop", src_fps=25, out_fps=24).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="loop mode must be one of"):
        frame_schedule(3, 3, "bounce")


def test_speech_drive_follows_bursts_and_closes_in_silence():
    sr, fps = 16000, 25.0
    rng = np.random.default_rng(0)
    t = np.arange(sr * 3) / sr
    wave = np.zeros_like(t)
    for start in (0.6, 1.8):  # voiced-like bursts: 180 Hz pulse train + harmonics, 0.4 s long
        sel = (t >= start) & (t < start + 0.4)
        wave[sel] = 0.3 * np.sign(np.sin(2 * np.pi * 180 * t[sel])) + 0.01 * rng.standard_normal(sel.sum())
    p = mouth_params(wave.astype(np.float32), sr, fps, 75)
    assert p.jaw_open[:10].max() < 0.05 and p.lip_open[60:].max() < 0.05  # silence -> closed
    assert p.jaw_open[18:24].min() > 0.5 and p.jaw_open[48:54].min() > 0.5
    # opens within a frame of the onset (frame 15 = 0.6 s): not before frame 14, fully by frame 17
    assert p.jaw_open[13] < 0.2 and p.jaw_open[17] > 0.5
    for a in (p.jaw_open, p.lip_open, p.width, p.round):
        assert a.dtype == np.float32 and a.min() >= 0 and a.max() <= 1


# --- input errors (no models) ---------------------------------------------------------------------
def test_audio_errors():
    with pytest.raises(AudioInputError, match="empty"):
        validate_audio(np.zeros(0, np.float32), 16000)
    with pytest.raises(AudioInputError, match="no audio"):
        validate_audio(None, 16000)
    with pytest.raises(AudioInputError, match="silent"):
        validate_audio(np.zeros(16000, np.float32), 16000)
    with pytest.raises(AudioInputError,
                       match="is 312 s; the maximum is 300 s: raise max_audio_seconds or split the text"):
        validate_audio(np.full(312 * 100, 0.1, np.float32), 100, max_seconds=300)
    mono = validate_audio(np.full((1, 2, 800), 0.1, np.float32), 16000)  # [B, C, T] -> [T]
    assert mono.shape == (800,)


def _fake_track(n: int = 3, found: bool = True):
    from digital_human.vision.faces import FaceTrack

    return FaceTrack(frames=np.zeros((n, 64, 64, 3), np.uint8), fps=25.0, crop_size=64,
                     found=np.full(n, found), boxes=np.zeros((n, 4), np.float32),
                     landmarks=np.zeros((n, 468, 3), np.float32), affines=np.tile(np.eye(2, 3), (n, 1, 1)),
                     presence=np.zeros(n, np.float32), crops=np.zeros((n, 64, 64, 3), np.uint8))


def test_track_without_faces_is_an_error():
    with pytest.raises(NoFaceError, match="no frame with a found face"):
        validate_track(_fake_track(found=False))
    with pytest.raises(NoFaceError, match="no frame with a found face"):
        animate_portrait(_fake_track(found=False), np.full(1600, 0.1, np.float32), 16000, 25)


def test_schedule_track_follows_indices():
    tr = _fake_track(3)
    tr.frames[:] = np.arange(3)[:, None, None, None]
    sched = schedule_track(tr, frame_schedule(3, 7, "ping-pong"), fps=30)
    assert len(sched) == 7 and sched.fps == 30 and sched.frames[:, 0, 0, 0].tolist() == [0, 1, 2, 1, 0, 1, 2]


# --- with the face models ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runners(face_runners):
    return face_runners


@pytest.fixture(scope="module")
def speech(data_dir):
    # 2.4-5.6 s: the clip's speech starts at ~3.0 s after room noise, so this has an onset
    wave, sr = decode_audio(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=6.0)
    return wave.mean(0)[int(2.4 * sr): int(5.6 * sr)], sr


@pytest.fixture(scope="module")
def photo_track(data_dir, runners):
    from digital_human.media.probe import read_video_frames

    frames, _ = read_video_frames(data_dir / "image" / "face_02_male.png")
    return align_faces(frames, 0, runners=runners)


def _frame_masks(track, crop_masks):
    h, w = track.frames.shape[1:3]
    return np.stack([warp_image(m, a, w, h, border="zero") for m, a in zip(crop_masks, track.inverse_affines())])


def test_photo_untouched_outside_mask_and_mouth_follows_speech(photo_track, speech, runners):
    wave, sr = speech
    fps = 25.0
    res = animate_portrait(photo_track, wave, sr, fps)
    n = output_frame_count(len(wave) / sr, fps)
    assert res.frames.shape == (n, *photo_track.frames.shape[1:]) and res.frames.dtype == np.uint8
    assert res.frames_generated == n and len(res.track) == n and res.track.fps == fps and res.model == "portrait"
    ref = np.broadcast_to(photo_track.frames[0], res.frames.shape)
    masks = _frame_masks(res.track, portrait_masks(photo_track, np.zeros(n, np.int64)))
    assert M.psnr_outside_mask(res.frames, ref, masks) >= 40.0
    # inside the mask the mouth really moves
    assert np.abs(res.frames.astype(int) - ref).max(axis=(1, 2, 3)).mean() > 40
    # re-measured with the mesh: opening follows the speech envelope, within one frame
    lms = M.remeasure_landmarks(res.frames, np.broadcast_to(photo_track.landmarks[0], (n, 468, 3)), runners[1])
    opening = M.mouth_opening(lms)
    lag_ms, corr = M.av_lag(opening, M.speech_envelope(wave, sr, fps, n), fps)
    print(f"\nphoto: lag {lag_ms:.1f} ms, corr {corr:.2f}, opening {opening.min():.3f}..{opening.max():.3f}; "
          f"{res.summary()}")
    assert corr >= 0.5 and abs(lag_ms) <= 1000.0 / fps
    assert opening.max() - opening.min() > 0.06
    # the updated DH_FACES carries the driven mouth: its landmark opening tracks the re-measured one
    assert np.corrcoef(M.mouth_opening(res.track.landmarks), opening)[0, 1] > 0.8


def test_short_video_ping_pong_untouched_outside_mask(data_dir, speech, runners):
    from digital_human.media.probe import read_video_frames

    frames, fps = read_video_frames(data_dir / "video" / "talk_en_male_01a.mp4", max_frames=40)
    track = align_faces(frames, fps, runners=runners)
    wave, sr = speech
    wave = wave[: int(2.0 * sr)]  # 2 s at 30 fps = 60 frames > 40 reference frames
    res = animate_portrait(track, wave, sr, fps, loop_mode="ping-pong")
    idx = frame_schedule(40, 60, "ping-pong")
    assert len(res.frames) == 60 and any("longer than the reference video" in w for w in res.warnings)
    masks = _frame_masks(res.track, portrait_masks(track, idx))
    assert M.psnr_outside_mask(res.frames, track.frames[idx], masks) >= 40.0
    assert np.abs(res.frames.astype(int) - track.frames[idx]).max() > 40  # mouths replaced


def test_should_stop_interrupts_early(photo_track, speech):
    wave, sr = speech
    calls: list[int] = []
    with pytest.raises(InterruptedError, match="interrupted after 16 of 80 frames"):
        animate_portrait(photo_track, wave, sr, 25.0, batch_size=8, progress=lambda d, t: calls.append(d),
                         should_stop=lambda: len(calls) >= 2)
    assert calls == [8, 16]


def test_audio_too_long_for_photo(photo_track):
    loud = np.full(16000 * 11, 0.1, np.float32)
    with pytest.raises(AudioInputError, match="is 11 s; the maximum is 10 s"):
        animate_portrait(photo_track, loud, 16000, 25.0, max_audio_seconds=10)
    # a whole photo track with no found face is refused before any work
    with pytest.raises(NoFaceError):
        animate_portrait(replace(photo_track, found=np.zeros(1, bool)), loud[:1600], 16000, 25.0)


def test_batch_size_zero_is_automatic_and_negative_is_refused(photo_track, speech):
    from digital_human.talking_head.portrait.animate import AUTO_BATCH

    wave, sr = speech
    steps: list[int] = []
    gen = portrait_crops(photo_track, wave, sr, 25.0, batch_size=0, progress=lambda d, t: steps.append(d))
    assert steps[0] == min(AUTO_BATCH, len(gen.crops)) and steps[-1] == len(gen.crops)
    with pytest.raises(ValueError, match="batch_size must be >= 1, or 0 for automatic"):
        portrait_crops(photo_track, wave, sr, 25.0, batch_size=-1)


def test_coarse_backward_map_matches_the_per_pixel_solve(photo_track):
    """render_mouth solves its backward map on a coarse grid plus one per-pixel step: the frames stay
    within rounding of the per-pixel 4-step solve except a few lip-edge pixels (sub-pixel shifts)."""
    from digital_human.talking_head.portrait import mouth_render as mr
    from digital_human.vision.faces import CropLandmarks

    crop = np.asarray(photo_track.crops[0])
    g = mr.mouth_geometry(crop, CropLandmarks(photo_track)[0])
    rng = np.random.default_rng(0)
    for values in [(0, 0, 0, 0), (1, 1, 1, 0), (1, 1, 0, 1), *rng.uniform(0, 1, (8, 4))]:
        pose = mr.MouthPose(*map(float, values))
        coarse = mr.render_mouth(crop, g, pose).astype(int)
        exact = mr.render_mouth(crop, g, pose, grid=1).astype(int)
        diff = np.abs(coarse - exact)
        assert diff.max() <= 24, values
        assert np.mean(diff > 2) < 0.005, values  # of the crop's pixel channels
