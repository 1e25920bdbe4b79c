"""Wav2Lip keeps what does not depend on the speech between requests on the same reference video: each reference
frame's 96x96 input (under the file's content key, the frame and its box) and each paste mask (under its box, crop
transform and crop size), and gives the headless path an avatar_key for its paste region and smoothing masks. A
repeat request cuts, reads and masks nothing and its crops, masks and MP4 frames equal the first request's and
those made with nothing kept; frames in memory are never served from the kept inputs."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf

from digital_human.media.kept_arrays import KeptArrays
from digital_human.talking_head import render_video
from digital_human.talking_head.wav2lip import crops as w2l
from digital_human.vision.align import align_faces

VIDEO = "video/talk_en_male_01a.mp4"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from digital_human.engines.wav2lip.random_release import write_checkpoint

    root = tmp_path_factory.mktemp("w2l_avatar")
    write_checkpoint(root / "wav2lip" / "wav2lip.pth", 5)
    return root


@pytest.fixture(scope="module")
def inputs(data_dir, face_runners):
    from digital_human.media.frame_source import load_face_frames

    frames, fps, _ = load_face_frames(data_dir / VIDEO, 0.24)  # a file decoded on demand: content-keyed
    track = align_faces(frames, fps, runners=face_runners)
    wave, rate = sf.read(data_dir / "audio" / "spk_en_male_01.wav", dtype="float32")
    wave = wave if wave.ndim == 1 else wave.mean(1)
    return track, wave[: int(0.25 * rate)], rate, fps


@pytest.fixture()
def counted(monkeypatch):
    calls = {"faces": 0, "masks": 0, "reads": 0}
    face_input, box_mask = w2l.face_input, w2l.box_mask

    def count_face(*a, **k):
        calls["faces"] += 1
        return face_input(*a, **k)

    def count_mask(*a, **k):
        calls["masks"] += 1
        return box_mask(*a, **k)

    monkeypatch.setattr(w2l, "face_input", count_face)
    monkeypatch.setattr(w2l, "box_mask", count_mask)
    w2l.clear_avatar_caches()
    yield calls
    w2l.clear_avatar_caches()


def _crops(track, wave, rate, fps, models, streaming=True):
    gen = w2l.wav2lip_crops(track, wave, rate, fps, models_root=models, checkpoint="wav2lip", precision="fp32",
                            streaming=streaming, batch_size=4)
    return gen


def _frames(gen):
    return np.concatenate([c.numpy() for c in render_video.iter_video_frames(gen, smooth_strength=0.5,
                                                                             device="cpu", chunk_frames=4)])


def test_repeat_request_cuts_and_masks_nothing_and_equals_the_first(inputs, models, counted):
    track, wave, rate, fps = inputs
    first = _crops(track, wave, rate, fps, models)
    assert first.avatar_key is not None
    crops1, _ = first.render(0, len(first))
    masks1 = first.mask_stack(0, len(first))
    frames1 = _frames(first)
    refs = len(np.unique(first.idx))
    assert counted["faces"] == refs and counted["masks"] == refs

    decoded = track.frames.decoded
    again = _crops(track, wave, rate, fps, models)
    assert again.avatar_key == first.avatar_key
    crops2, _ = again.render(0, len(again))
    assert track.frames.decoded == decoded  # the inputs came from the kept ones: no frame read for them
    np.testing.assert_array_equal(crops2, crops1)
    np.testing.assert_array_equal(again.mask_stack(0, len(again)), masks1)
    np.testing.assert_array_equal(_frames(again), frames1)
    assert counted["faces"] == refs and counted["masks"] == refs  # the repeat cut and masked nothing

    w2l.clear_avatar_caches()  # nothing kept: the same crops and frames from scratch
    fresh = _crops(track, wave, rate, fps, models)
    np.testing.assert_array_equal(fresh.render(0, len(fresh))[0], crops1)
    np.testing.assert_array_equal(_frames(fresh), frames1)
    assert counted["faces"] == 2 * refs


def test_frames_in_memory_are_not_kept_and_other_boxes_miss(inputs, models, counted):
    track, wave, rate, fps = inputs
    in_memory = replace(track, frames=np.asarray(track.frames[:]))
    gen = _crops(in_memory, wave, rate, fps, models)
    assert gen.avatar_key is None
    crops, _ = gen.render(0, len(gen))
    assert not w2l._KEPT_FACES.items  # no content key: the inputs stay in this request
    keyed = _crops(track, wave, rate, fps, models)
    np.testing.assert_array_equal(keyed.render(0, len(keyed))[0], crops)
    made = counted["faces"]
    lms = np.array(track.landmarks, copy=True)
    lms[..., 0] += 3.0  # other boxes: other inputs, other masks, another avatar key
    moved = _crops(replace(track, landmarks=lms), wave, rate, fps, models)
    assert moved.avatar_key != keyed.avatar_key
    moved.render(0, len(moved))
    assert counted["faces"] > made


def test_kept_arrays_are_bounded_and_read_only():
    kept = KeptArrays(3 * 96 * 96 * 3)
    for i in range(5):
        kept.put(str(i), np.full((96, 96, 3), i, np.uint8))
    assert list(kept.items) == ["2", "3", "4"] and kept.bytes == 3 * 96 * 96 * 3
    with pytest.raises(ValueError):
        kept.get("4")[0, 0, 0] = 1
