"""Sonic's speed paths on the CPU (reduced random release): the DeepCache shallow call equals the full call on
the features it kept, speed="fast" is the named preset and runs, several VAE chunks per decode call and batched
RIFE middles give the frames of one chunk / one pair at a time, the compiled regions give the eager result."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    from digital_human.engines.sonic.files import locate
    from digital_human.engines.sonic.load import load_networks
    from digital_human.engines.sonic.random_release import write_random_release
    from digital_human.talking_head.sonic.crop import frame_photo

    root = tmp_path_factory.mktemp("sonic_speed")
    write_random_release(root, seed=5, reduced=True)
    nets = load_networks(locate(root))
    rng = np.random.default_rng(2)
    photo = rng.integers(0, 255, (80, 80, 3), dtype=np.uint8)
    framing = frame_photo(photo, (25.0, 20.0, 55.0, 60.0), short_side=64)  # 8x8 latents
    wave = (0.2 * rng.standard_normal(int(2.3 * 16000))).astype(np.float32)  # 28 model frames
    return nets, framing, wave


def _unet_inputs(nets, b=3, f=4, h=8):
    g = torch.Generator().manual_seed(0)
    d = nets.unet.config.cross_attention_dim
    return (torch.randn(b, f, 8, h, h, generator=g), torch.tensor(3.0), torch.randn(b * f, 1, d, generator=g),
            torch.randn(b * f, 32, d, generator=g), torch.tensor([[12.5, 20.0, 18.0]] * b),
            torch.ones(1, 1, h * 8, h * 8))


def test_shallow_call_on_kept_features_equals_full_call(release):
    nets = release[0]
    x = _unet_inputs(nets)
    with torch.no_grad():
        full = nets.unet(*x)
        kept_out, deep = nets.unet(*x, keep_deep=True)
        shallow = nets.unet(*x, deep=deep)
        # other inputs on the shallow path: it really recomputes the first and last blocks
        x2 = (x[0] + 0.5,) + x[1:]
        shallow2 = nets.unet(*x2, deep=deep)
    assert torch.equal(full, kept_out)
    # the second-to-last up block's output before its upsampler (half the latent size)
    assert tuple(deep.shape) == (3 * 4, nets.unet.config.block_out_channels[1], 4, 4)
    assert (shallow - full).abs().max() <= 1e-5 * full.abs().max()
    assert (shallow2 - full).abs().max() > 1e-3


def test_fast_speed_preset_and_reuse_runs(release):
    from digital_human.talking_head.sonic.pipeline import (FAST_DEEP_CACHE, FAST_STEPS, SonicLatents, SonicSettings,
                                                            resolve_speed)

    nets, framing, wave = release
    fast = resolve_speed(SonicSettings(speed="fast"))
    assert (fast.steps, fast.deep_cache_interval) == (FAST_STEPS, FAST_DEEP_CACHE)
    assert resolve_speed(SonicSettings(speed="fast", steps=3)).steps == 3
    fastest = resolve_speed(SonicSettings(speed="fastest"))
    assert (fastest.steps, fastest.deep_cache_interval) == (5, 2)
    assert resolve_speed(SonicSettings(steps=25)) == SonicSettings(steps=25)
    with pytest.raises(ValueError, match="speed must be one of"):
        resolve_speed(SonicSettings(speed="turbo"))
    calls = []
    real = nets.unet.forward

    def spy(*a, **k):
        calls.append("reuse" if k.get("deep") is not None else ("keep" if k.get("keep_deep") else "full"))
        return real(*a, **k)

    nets.unet.forward = spy
    try:
        out = {}
        for mode, vram in (("fast", "high"), ("fast", "low"), ("reference", "high")):
            calls.clear()
            lat = SonicLatents(nets, framing, wave, SonicSettings(steps=4, speed=mode, resolution=64, vram=vram,
                                                                  window_batch=2))
            out[mode, vram] = lat.run()
            out[mode, vram, "calls"] = list(calls)
    finally:
        del nets.unet.forward
    # 2 windows in one call, 4 steps: keep, reuse, keep, reuse (vram low: one window and one branch a call)
    assert out["fast", "high", "calls"] == ["keep", "reuse", "keep", "reuse"]
    assert out["fast", "low", "calls"] == ["keep"] * 6 + ["reuse"] * 6 + ["keep"] * 6 + ["reuse"] * 6
    assert out["reference", "high", "calls"] == ["full"] * 4
    a, b = out["fast", "high"], out["fast", "low"]
    assert torch.isfinite(a).all() and (a - b).abs().max() < 1e-4 * a.abs().max()
    ref = out["reference", "high"]
    assert (a - ref).abs().max() > 1e-4 * ref.abs().max()  # approximate: it is not the reference's result


def test_decode_batches_and_batched_rife_equal_one_at_a_time(release):
    from digital_human.talking_head.sonic.pipeline import SonicFrames, SonicLatents, SonicSettings

    nets, framing, wave = release
    one = SonicLatents(nets, framing, wave, SonicSettings(steps=1, resolution=64, decode_batch=1))
    many = SonicLatents(nets, framing, wave, SonicSettings(steps=1, resolution=64, decode_batch=3))
    many.latents = one.run()  # the same latents: only decoding differs
    assert one.count == 28  # chunks 8, 8, 8, 4: a batch of 3 and the short last one alone
    a = torch.stack([one.frame(i) for i in range(one.count)])
    b = torch.stack([many.frame(i) for i in range(many.count)])
    assert (a - b).abs().max() < 1e-5
    frames = SonicFrames(one)
    single = torch.stack([frames.frame(j) for j in range(3, 30)])
    batched = frames.block(3, 30)
    assert batched.shape == single.shape and (batched - single).abs().max() < 1e-5
    assert np.array_equal(frames.uint8(0, frames.count)[5:9], frames.uint8(5, 9))


def test_compiled_regions_equal_eager(release):
    pytest.importorskip("torch._inductor")
    import copy

    from digital_human.engines.sonic.accelerate import compile_regions

    nets = release[0]
    unet = copy.deepcopy(nets.unet)
    x = _unet_inputs(nets, b=1, f=2)
    with torch.no_grad():
        eager = unet(*x)
        try:
            n = compile_regions(unet)
            compiled = unet(*x)
        except Exception as exc:  # no C++ compiler for inductor's CPU code on this machine
            pytest.skip(f"torch.compile unavailable here: {exc!r}"[:200])
    assert n == sum(len(b.resnets) + len(getattr(b, "attentions", None) or ())
                    for b in [*unet.down_blocks, unet.mid_block, *unet.up_blocks])
    assert (compiled - eager).abs().max() <= 1e-4 * eager.abs().max()


def test_fast_path_frames_equal_eager(release):
    """accelerate.fast_path (channels_last UNet and VAE, compiled UNet regions and decoder) gives the eager
    frames; the compiled decoder keeps one shape: a call of fewer whole chunks is padded, the short last chunk
    runs eager."""
    pytest.importorskip("torch._inductor")
    import copy

    from digital_human.engines.sonic.accelerate import fast_path
    from digital_human.talking_head.sonic.pipeline import SonicFrames, SonicLatents, SonicSettings

    nets, framing, wave = release
    fast = copy.deepcopy(nets)
    settings = SonicSettings(steps=1, resolution=64, decode_batch=2)
    with torch.no_grad():
        eager = SonicFrames(SonicLatents(nets, framing, wave, settings))
        a = eager.block(0, eager.count)
        try:
            done = fast_path(fast)
            made = SonicFrames(SonicLatents(fast, framing, wave, settings))
            b = made.block(0, made.count)
        except Exception as exc:  # no C++ compiler for inductor's CPU code on this machine
            pytest.skip(f"torch.compile unavailable here: {exc!r}"[:200])
    assert done == ["UNet compiled", "VAE decoder channels_last", "VAE decoder compiled"]  # the UNet stays NCHW
    assert fast_path(fast) == []  # idempotent
    # 28 model frames: chunks 8+8 (compiled shape), 8 padded to 16, the last 4 eager
    assert fast.vae._sonic_decode_shape[0][0] == 16
    assert a.shape == b.shape and (a - b).abs().max() <= 1e-4
