"""LatentSync's renderer queues the next window on the model while it restores the current one (talking_head/
latentsync/crops.py, windows_ahead: on a GPU): the crops must be those of one window at a time, to the byte (the video's
generator is drawn window by window in order), in streaming order, on a random access that restarts the
draws, and a stop must end the render. And a face the loop shows again is not encoded again (the VAE moments
kept per reference frame), with the same frames."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("diffusers", reason="LatentSync is an optional extra: pip install .[latentsync]")
pytest.importorskip("yaml", reason="LatentSync is an optional extra: pip install .[latentsync]")


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    from digital_human.engines.latentsync.random_release import write_release

    root = tmp_path_factory.mktemp("ls_ahead")
    write_release(root, "reduced", seed=0)
    return root


@pytest.fixture(scope="module")
def track(talking_video_track):
    return talking_video_track


@pytest.fixture(scope="module")
def wave(data_dir):
    from digital_human.audio.decode import decode_audio

    audio, rate = decode_audio(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=2.0)
    assert rate == 16000
    return audio.mean(0)[: int(1.6 * rate)]  # 40 frames at 25 fps: windows of 16, 16 and 8


def _crops(track, wave, release, **kw):
    from digital_human.talking_head.latentsync.crops import latentsync_crops

    return latentsync_crops(track, wave, 16000, 25.0, loop_mode="ping-pong", streaming=True, models_root=release,
                            steps=2, **kw)


def test_windows_queued_ahead_give_the_one_at_a_time_crops(track, wave, release, monkeypatch):
    from digital_human.talking_head.latentsync import crops as ls

    assert ls.windows_ahead("cpu") == 0 and ls.windows_ahead("cuda") == ls.WINDOWS_AHEAD == 1
    monkeypatch.setattr(ls, "windows_ahead", lambda device: 0)
    one_at_a_time = _crops(track, wave, release)
    n = len(one_at_a_time)
    assert n == 40
    expected = np.concatenate([one_at_a_time.chunk(s, min(s + 8, n))[0] for s in range(0, n, 8)])

    monkeypatch.setattr(ls, "windows_ahead", lambda device: 1)  # as on a GPU
    ahead = _crops(track, wave, release)
    renderer = ahead.render.__self__
    first, _ = ahead.chunk(0, 8)
    assert sorted(renderer._ahead) == [1]  # window 1 was queued while window 0 was restored
    rest = np.concatenate([ahead.chunk(s, min(s + 8, n))[0] for s in range(8, n, 8)])
    assert np.array_equal(np.concatenate([first, rest]), expected)
    assert not renderer._ahead  # nothing queued past the last window
    assert ahead.timings["unet"] > 0 and ahead.timings["faces"] > 0

    # a random access (window 0 after window 2 was made and windows 0-1 evicted) restarts the draws
    renderer._keep = 1
    renderer._windows.clear()
    again, _ = ahead.chunk(0, 4)
    assert np.array_equal(again, expected[:4])


def test_a_stop_ends_the_render_and_leaves_no_window_running(track, wave, release, monkeypatch):
    from digital_human.talking_head.latentsync import crops as ls

    monkeypatch.setattr(ls, "windows_ahead", lambda device: 1)  # as on a GPU
    calls = {"n": 0}

    def should_stop() -> bool:  # true once the first window has been asked for
        calls["n"] += 1
        return calls["n"] > 2

    gen = _crops(track, wave, release, should_stop=should_stop)
    with pytest.raises(InterruptedError):
        for s in range(0, len(gen), 16):
            gen.chunk(s, s + 16)
    renderer = gen.render.__self__
    for future in renderer._ahead.values():
        assert isinstance(future.exception(timeout=60), InterruptedError)


def test_a_face_shown_again_is_not_encoded_again(release):
    """The VAE posterior's moments are kept per reference frame (pipeline.window's keys): a window of faces already
    encoded calls no encoder and gives the frames a fresh encode gives (the generator's draws are still made)."""
    import torch

    from digital_human.engines.latentsync.files import locate
    from digital_human.engines.latentsync.pipeline import LatentSyncPipeline, load_networks

    net = load_networks(locate(release))
    r = net.resolution
    rng = np.random.default_rng(5)
    faces = rng.integers(0, 256, (4, r, r, 3), dtype=np.uint8)
    audio = torch.from_numpy(rng.standard_normal((4, 50, 384)).astype(np.float32))
    encodes = {"n": 0}
    real_encode = net.vae.encode

    def counted(x):
        encodes["n"] += 1
        return real_encode(x)

    net.vae.encode = counted

    def run(keys, windows):
        pipe = LatentSyncPipeline(net, steps=2)
        g = torch.Generator().manual_seed(11)
        noise = pipe.initial_noise(g)
        return [pipe.window(faces[order], audio, noise, g, keys=None if keys is None else [keys[i] for i in order])
                for order in windows]

    orders = [[0, 1, 2, 3], [3, 2, 1, 0]]  # the second window shows the same faces backwards (a ping-pong loop)
    plain = run(None, orders)
    plain_encodes, encodes["n"] = encodes["n"], 0
    kept = run([10, 11, 12, 13], orders)
    assert encodes["n"] == plain_encodes // 2  # the second window encoded nothing
    for a, b in zip(plain, kept):
        assert torch.equal(a, b)
