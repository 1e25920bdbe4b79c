"""Live sessions share one batched talking-head step (engines/call_batcher.py; MuseTalkPipeline.share_batches):
each caller gets exactly its own rows, errors reach every caller of the failed call, and two live sessions'
MuseTalk frames made at the same time (one batched step for both) equal the frames each makes alone (CPU,
seeded random reduced-size MuseTalk release)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from digital_human.engines.call_batcher import CallBatcher


def _run_threads(fns):
    results, errors = [None] * len(fns), [None] * len(fns)

    def run(i):
        try:
            results[i] = fns[i]()
        except BaseException as exc:  # noqa: BLE001
            errors[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
        time.sleep(0.01)  # in this order
    for t in threads:
        t.join(30)
    return results, errors


def test_each_caller_gets_its_own_rows_in_one_call():
    sizes = []

    def fn(x, y):
        sizes.append(len(x))
        time.sleep(0.1)  # the first call runs alone; the next two callers queue meanwhile
        return x * 10 + y, x - y

    batcher = CallBatcher(fn, window_s=1.0, max_rows=64)
    inputs = [(np.full((n, 2), i, np.int64), np.arange(2 * n).reshape(n, 2)) for i, n in enumerate((3, 2, 5), 1)]
    results, errors = _run_threads([lambda a=a: batcher(*a) for a in inputs])
    assert errors == [None, None, None]
    for (x, y), (a, b) in zip(inputs, results):
        np.testing.assert_array_equal(a, x * 10 + y)
        np.testing.assert_array_equal(b, x - y)
    assert sizes == [3, 7]  # the two that queued behind the first ran as one call of 2 + 5 rows
    assert batcher.calls == 2 and batcher.rows_run == 10 and batcher.largest == 2
    batcher.close()


def test_padding_and_limits():
    seen = []

    def fn(x):
        seen.append(x.copy())
        return x + 1

    batcher = CallBatcher(fn, quantum=4, max_rows=4)
    np.testing.assert_array_equal(batcher(np.arange(3)), [1, 2, 3])
    np.testing.assert_array_equal(seen[-1], [0, 1, 2, 2])  # padded with its last row to 4
    with pytest.raises(ValueError, match="same number of rows"):
        batcher(np.zeros(2), np.zeros(3))
    batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        batcher(np.zeros(1))


def test_an_error_reaches_every_caller_of_the_call_and_the_batcher_goes_on():
    def fn(x):
        time.sleep(0.1)
        if (x < 0).any():
            raise ValueError("negative row")
        return x * 2

    batcher = CallBatcher(fn, window_s=1.0)
    results, errors = _run_threads([lambda: batcher(np.ones(1)), lambda: batcher(-np.ones(1)),
                                    lambda: batcher(np.ones(2))])
    assert results[0] is not None and errors[0] is None  # alone in the first call
    assert isinstance(errors[1], ValueError) and isinstance(errors[2], ValueError)  # shared the failing call
    np.testing.assert_array_equal(batcher(np.arange(2)), [0, 2])
    batcher.close()


# --- two live sessions on MuseTalk ----------------------------------------------------------------------------
pytest.importorskip("diffusers", reason="MuseTalk is an optional extra: pip install .[musetalk]")
pytest.importorskip("transformers", reason="MuseTalk is an optional extra: pip install .[musetalk]")


@pytest.fixture(scope="module")
def musetalk_face(setup_models, data_dir, tmp_path_factory):
    import os

    from digital_human.engines.musetalk.random_release import write_release
    from digital_human.paths import models_root

    root = tmp_path_factory.mktemp("live_mt_models")
    (root / "face").symlink_to(models_root() / "face")  # the installed face models; MuseTalk random beside them
    write_release(root, "reduced", seed=5)
    before = os.environ.get("DIGITAL_HUMAN_MODELS")
    os.environ["DIGITAL_HUMAN_MODELS"] = str(root)
    try:
        from digital_human.engines.musetalk import pipeline as mp
        from digital_human.pipeline.live.face import LiveFace

        face = LiveFace(data_dir / "image" / "face_02_male.png", model="musetalk", max_side=256)
        yield face, mp
    finally:
        mp._SHARED_BATCHES = None  # later tests in this process get unbatched pipelines again
        for pipe in list(mp._PIPELINES):
            pipe._batcher = None
        if before is None:
            os.environ.pop("DIGITAL_HUMAN_MODELS", None)
        else:
            os.environ["DIGITAL_HUMAN_MODELS"] = before


def _speech(data_dir, start_s, frames):
    from digital_human.audio.decode import decode_audio

    wave, sr = decode_audio(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=6.0)
    spf = sr // 25
    a = int(start_s * sr)
    return wave.mean(0)[a:a + frames * spf].astype(np.float32), sr


def test_two_sessions_batched_get_the_frames_each_gets_alone(musetalk_face, data_dir):
    face, mp = musetalk_face
    assert face.batched
    waves = [_speech(data_dir, 1.0, 11), _speech(data_dir, 3.0, 14)]  # 11 and 14 frames: last steps of 3 and 2
    alone = [np.stack(list(face.speech(w, sr, 0))) for w, sr in waves]
    pipes = [p for p in mp._PIPELINES if p.batcher is not None]
    assert pipes, "the live face did not switch on batched steps"
    batcher = pipes[0].batcher
    batcher.window_s = 2.0  # wait for the other session's step however slow this machine is right now
    calls, rows = batcher.calls, batcher.rows_run
    results, errors = _run_threads([lambda w=w, sr=sr: np.stack(list(face.speech(w, sr, 0))) for w, sr in waves])
    assert errors == [None, None]
    for together, single in zip(results, alone):
        assert together.shape == single.shape
        np.testing.assert_array_equal(together, single)
    # 4 + 4 steps of four frames (the last ones of 3 and 2): fewer calls than steps, two sessions in one call
    assert batcher.largest >= 2
    assert batcher.calls - calls < 7, (batcher.calls - calls, batcher.rows_run - rows)
    assert len(alone[0]) == 11 and len(alone[1]) == 14


def test_a_silent_piece_is_the_idle_face_not_a_model_error(musetalk_face):
    """A pause (silence) between sentences: the models refuse silent audio; live mode shows the idle face."""
    face, _ = musetalk_face
    frames = list(face.speech(np.zeros(3 * 640, np.float32), 16000, 5))
    assert len(frames) == 3 and all(np.array_equal(f, face.idle(5 + i)) for i, f in enumerate(frames))


def test_the_prepared_photo_makes_the_crops_of_a_fresh_musetalk_request(musetalk_face, data_dir):
    """Live mode prepares the photo once (PhotoStream: box, paste mask, reference latents) and then makes only
    each piece's windows and steps: its crops equal those of a full musetalk_crops request on the same photo and
    speech, and its paste mask is the request's."""
    from digital_human.talking_head.musetalk.crops import musetalk_crops

    face, _ = musetalk_face
    assert face._stream is not None
    wave, sr = _speech(data_dir, 2.0, 11)
    got = np.concatenate(list(face._stream.crops(wave, sr)))
    ref = musetalk_crops(face.track, wave, sr, 25.0, loop_mode="hold", batch_size=4)
    assert got.shape == ref.crops.shape == (11, face.track.crop_size, face.track.crop_size, 3)
    np.testing.assert_array_equal(got, ref.crops)
    np.testing.assert_array_equal(face._stream.mask, ref.mask(0))
    # a second piece reuses the latents (no new VAE encode): the cache holds the one photo entry
    again = np.concatenate(list(face._stream.crops(wave, sr)))
    np.testing.assert_array_equal(again, got)
    assert len(face._stream._latents) == 1
