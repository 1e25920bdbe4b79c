"""MuseTalk's renderer queues the next batch on the device before reading the current one's result
(_MuseTalkRenderer.launch_ahead, on by default on CUDA): the same crops in any order of calls. On the CPU the
switch is forced on, so the bookkeeping (the batch taken by the next call, a dropped one after a seek) runs."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("diffusers", reason="MuseTalk is an optional extra: pip install .[musetalk]")
pytest.importorskip("transformers", reason="MuseTalk is an optional extra: pip install .[musetalk]")
pytest.importorskip("torch")

from digital_human.engines.musetalk.random_release import write_release  # noqa: E402


@pytest.fixture(scope="module")
def gen(tmp_path_factory, data_dir, face_runners):
    from digital_human.audio.decode import decode_audio
    from digital_human.media.frame_source import load_face_frames
    from digital_human.talking_head.musetalk.crops import musetalk_crops
    from digital_human.vision.align import align_faces

    root = tmp_path_factory.mktemp("mt_models")
    write_release(root, "reduced", seed=3)
    frames, fps, _ = load_face_frames(data_dir / "video" / "talk_en_male_01a.mp4", 0.5)
    track = align_faces(frames, fps, runners=face_runners)
    wave, sr = decode_audio(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=1.0)
    return musetalk_crops(track, wave.mean(0)[: int(0.5 * sr)], sr, 25.0, batch_size=4, streaming=True,
                          models_root=root, mask="mesh")


def test_launch_ahead_gives_the_same_crops(gen):
    renderer = gen.render.__self__
    n = len(gen)
    assert n >= 12
    renderer.launch_ahead = False
    expected, _ = gen.render(0, n)
    renderer.launch_ahead = True
    launched = []
    orig = renderer._launch

    def launch(s, e):
        launched.append((s, e))
        return orig(s, e)

    renderer._launch = launch
    try:
        chunks = [gen.render(s, min(s + 4, n))[0] for s in range(0, n, 4)]  # the headless path's calls
        np.testing.assert_array_equal(np.concatenate(chunks), expected)
        # each batch launched once, the next one while the current one's result is read
        assert launched == [(s, min(s + 4, n)) for s in range(0, n, 4)]
        launched.clear()
        first, _ = gen.render(0, 4)  # queues (4, 8) ...
        jump, _ = gen.render(8, 12)  # ... which this call does not want: dropped, (8, 12) made
        whole, _ = gen.render(0, n)  # several batches in one call
        assert launched[:3] == [(0, 4), (4, 8), (8, 12)]
        np.testing.assert_array_equal(first, expected[0:4])
        np.testing.assert_array_equal(jump, expected[8:12])
        np.testing.assert_array_equal(whole, expected)
    finally:
        renderer._launch = orig
        renderer.launch_ahead = False
