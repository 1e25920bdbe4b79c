"""The contract's whole-frame kind (DESIGN 5b): a model that makes whole frames (the head moving) returns
GeneratedFrames; generate_crops, the node path (paste_generated) and the headless video path take its frames as
they are, read from the entry's `kind` - no code names the model."""
from __future__ import annotations

import numpy as np
import pytest

from digital_human.talking_head import registry
from digital_human.talking_head.contract import TalkingHeadModel
from digital_human.talking_head.driver import GeneratedFrames, paste_generated, paste_whole_frames


def _track(n_frames: int = 1, size: int = 96):
    from digital_human.vision.faces import FaceTrack

    lm = np.zeros((n_frames, 468, 3), np.float32)
    lm[..., 0], lm[..., 1] = np.linspace(30, 60, 468), np.linspace(20, 70, 468)
    aff = np.tile(np.array([[[2.0, 0, -40], [0, 2.0, -30]]]), (n_frames, 1, 1))
    return FaceTrack(frames=np.full((n_frames, size, size, 3), 90, np.uint8), fps=25.0, crop_size=64,
                     found=np.ones(n_frames, bool), boxes=np.tile([[30.0, 20, 60, 70]], (n_frames, 1)), landmarks=lm,
                     affines=aff, presence=np.ones(n_frames, np.float32),
                     crops=np.zeros((n_frames, 64, 64, 3), np.uint8))


def _whole_frame_entry(name: str = "animator"):
    def generate(faces, wave, rate, fps, **kw):
        n = int(np.ceil(len(wave) / rate * fps - 1e-6))
        # whole frames of the model's own 48x48 framing, each a different grey (a moving head)
        return GeneratedFrames(track=faces, fps=fps, count=n, size=(48, 48), model=name, backend="test",
                               render=lambda a, b: np.stack([np.full((48, 48, 3), 10 + j, np.uint8)
                                                             for j in range(a, b)]),
                               to_output=np.array([[0.5, 0.0, -5.0], [0.0, 0.5, -5.0]]))

    return TalkingHeadModel(name=name, summary="s", needs="", speech_features="f", crop_size="48", generate=generate,
                            kind="whole-frame")


def test_a_whole_frame_model_runs_through_the_node_path_by_its_kind(monkeypatch):
    monkeypatch.setitem(registry.MODELS, "animator", _whole_frame_entry())
    wave = (np.sin(np.arange(16000) / 7.0) * 0.3).astype(np.float32)
    gen = registry.generate_crops(_track(), wave, 16000, "animator", 25.0, idle_motion=True)
    assert isinstance(gen, GeneratedFrames) and len(gen) == 25  # no idle motion attached to a whole-frame model
    result = paste_generated(gen, batch_size=7)
    assert result.frames.shape == (25, 48, 48, 3) and result.frames_generated == 25
    assert [int(f[0, 0, 0]) for f in result.frames] == list(range(10, 35))  # taken as made, in order
    # the output's DH_FACES holds the reference landmarks in the output's coordinates
    assert np.allclose(result.track.landmarks[0, 0, :2], [30 * 0.5 - 5, 20 * 0.5 - 5])
    assert result.track.frames.shape == (25, 48, 48, 3) and any("moves the whole head" in w for w in result.track.warnings)


def test_the_headless_video_path_encodes_whole_frames(tmp_path, monkeypatch):
    from digital_human.media.probe import probe_media
    from digital_human.talking_head.render_video import render_talking_video

    monkeypatch.setitem(registry.MODELS, "animator", _whole_frame_entry())
    wave = (np.sin(np.arange(16000) / 7.0) * 0.3).astype(np.float32)
    gen = registry.generate_crops(_track(), wave, 16000, "animator", 25.0, streaming=True)
    out = render_talking_video(gen, wave, 16000, tmp_path / "w.mp4")
    probe = probe_media(out.path)
    assert probe.frame_count == 25 and (probe.width, probe.height) == (48, 48)


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind must be one of"):
        TalkingHeadModel(name="x", summary="s", needs="", speech_features="f", crop_size="c",
                         generate=lambda *a, **k: None, kind="half-frame")


def test_paste_whole_frames_keeps_the_photo_outside_the_box_and_the_crop_inside():
    photo = np.full((100, 120, 3), 200, np.uint8)
    frames = np.full((2, 40, 40, 3), 20, np.uint8)
    out = paste_whole_frames(photo, frames, (30, 20, 90, 80))
    assert out.shape == (2, 100, 120, 3)
    assert (out[:, :20] == 200).all() and (out[:, :, :30] == 200).all()  # outside the box: the photo
    assert (out[:, 45:55, 55:65] == 20).all()  # the box's middle: the model's frame
    assert 20 < int(out[0, 50, 30, 0]) < 200  # the border is blended
