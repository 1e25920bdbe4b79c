"""A step's windows in one UNet call (window_batch) give the latents of one call per window (reduced release)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("transformers")


def test_batched_windows_equal_one_window_per_call(tmp_path):
    from digital_human.engines.sonic.files import locate
    from digital_human.engines.sonic.load import load_networks
    from digital_human.engines.sonic.random_release import write_random_release
    from digital_human.talking_head.sonic.crop import frame_photo
    from digital_human.talking_head.sonic.pipeline import SonicLatents, SonicSettings

    write_random_release(tmp_path, seed=3, reduced=True)
    nets = load_networks(locate(tmp_path))
    rng = np.random.default_rng(1)
    photo = rng.integers(0, 255, (80, 80, 3), dtype=np.uint8)
    framing = frame_photo(photo, (25.0, 20.0, 55.0, 60.0), short_side=64)  # 8x8 latents: fast
    wave = (0.2 * rng.standard_normal(int(2.3 * 16000))).astype(np.float32)  # 28 frames: 2 windows of 25
    out, calls = {}, {}
    for batch in (1, 2):
        seen = []
        lat = SonicLatents(nets, framing, wave, SonicSettings(steps=1, resolution=64, vram="high", window_batch=batch),
                           progress=lambda done, total: seen.append((done, total)))
        out[batch] = lat.run()
        calls[batch] = seen
    assert calls[1] == [(1, 2), (2, 2)] and calls[2] == [(2, 2)]
    assert out[1].shape[1] == 28
    assert (out[1] - out[2]).abs().max() < 1e-4 * out[1].abs().max()
