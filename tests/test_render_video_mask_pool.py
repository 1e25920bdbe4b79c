"""The headless video path's smoothing masks made ahead on a thread pool (render_video.SMOOTH_MASK_THREADS > 1)
give the same frames as made in line (one thread, the 2-core default): for a model that returns no output
landmarks (the masks come from the reference's, made chunks ahead) and for one that returns them (made per chunk
as it arrives)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from digital_human.audio.decode import decode_audio
from digital_human.talking_head import render_video
from digital_human.talking_head.portrait.animate import portrait_crops
from digital_human.vision import align_faces


@pytest.fixture(scope="module")
def case(data_dir, face_runners):
    from digital_human.media.probe import read_video_frames

    wave, sr = decode_audio(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=6.0)
    frames, fps = read_video_frames(data_dir / "video" / "talk_en_male_01a.mp4", max_frames=24)
    track = align_faces(frames, fps, runners=face_runners)
    return portrait_crops(track, wave.mean(0)[int(2.8 * sr): int(4.8 * sr)], sr, 25.0, loop_mode="ping-pong")


def _frames(gen, threads, monkeypatch):
    monkeypatch.setattr(render_video, "SMOOTH_MASK_THREADS", threads)
    return np.concatenate([c.numpy() for c in render_video.iter_video_frames(gen, smooth_strength=0.5, device="cpu",
                                                                             chunk_frames=7)])


@pytest.mark.parametrize("landmarks", ["none", "given"])
def test_masks_made_ahead_give_the_same_frames(case, landmarks, monkeypatch):
    gen = case
    if landmarks == "none":
        gen = replace(gen, landmarks=None)
    else:  # output landmarks of their own (the reference's, moved a little): masks follow them per chunk
        ref = np.asarray(gen.track.landmarks)[np.asarray(gen.idx)]
        gen = replace(gen, landmarks=ref + np.float32(1.5))
    seen = []
    orig = render_video._smooth_masks

    def counted(g, start, stop, lms, rows, cols):
        seen.append((start, lms is not None))
        return orig(g, start, stop, lms, rows, cols)

    in_line = _frames(gen, 1, monkeypatch)
    monkeypatch.setattr(render_video, "_smooth_masks", counted)
    ahead = _frames(gen, 3, monkeypatch)
    np.testing.assert_array_equal(ahead, in_line)
    starts = list(range(0, len(gen), 7))
    assert sorted(s for s, _ in seen) == starts  # each chunk's masks made once
    assert all(given == (landmarks == "given") for _, given in seen)
