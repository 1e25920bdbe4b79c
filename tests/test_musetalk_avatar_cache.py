"""What is kept between requests for a reference video ("avatar preparation"): the face track, MuseTalk's
reference latents and paste masks, under the video's content key. A repeat request gives the same crops and
masks as the first while tracking and encoding nothing; other content, or frames without a key, are never
served from them."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

pytest.importorskip("diffusers", reason="MuseTalk is an optional extra: pip install .[musetalk]")
pytest.importorskip("transformers", reason="MuseTalk is an optional extra: pip install .[musetalk]")
torch = pytest.importorskip("torch")

from digital_human.engines.musetalk.pipeline import LatentCache, MuseTalkPipeline  # noqa: E402
from digital_human.engines.musetalk.random_release import write_release  # noqa: E402
from digital_human.talking_head.musetalk.crops import clear_avatar_caches, musetalk_crops  # noqa: E402
from digital_human.vision.align import align_faces  # noqa: E402
from digital_human.vision.content_key import frames_key  # noqa: E402

VIDEO = "video/talk_en_male_01a.mp4"


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    root = tmp_path_factory.mktemp("mt_avatar_models")
    write_release(root, "reduced", seed=3)
    return root


class Counting:
    """A face runner that counts its calls (and reports the wrapped runner's identity, so it is cacheable)."""

    def __init__(self, runner):
        self.runner, self.info, self.calls = runner, runner.info, 0

    def __call__(self, batch):
        self.calls += 1
        return self.runner(batch)


def _video(path, seconds=0.4):
    from digital_human.media.frame_source import load_face_frames

    frames, fps, _ = load_face_frames(path, seconds)
    return frames, fps


@pytest.fixture()
def fresh():
    clear_avatar_caches()
    yield
    clear_avatar_caches()


def test_face_track_kept_by_content(data_dir, face_runners, tmp_path, fresh):
    runners = tuple(Counting(r) for r in face_runners)
    frames, fps = _video(data_dir / VIDEO)
    first = align_faces(frames, fps, runners=runners)
    calls = sum(r.calls for r in runners)
    assert calls > 0
    first.landmarks[:] = 0  # what a caller does to its track never reaches the kept one
    again_frames, _ = _video(data_dir / VIDEO)  # a new reader of the same file: same content key
    again = align_faces(again_frames, fps, runners=runners)
    assert sum(r.calls for r in runners) == calls  # nothing tracked
    fresh_track = align_faces(frames[:], fps, runners=face_runners)  # in memory: no key, tracked
    assert np.array_equal(again.landmarks, fresh_track.landmarks)
    assert np.array_equal(again.affines, fresh_track.affines) and again.frames is again_frames

    other = tmp_path / "other.mp4"  # same bytes under another name: same content, kept track
    shutil.copy(data_dir / VIDEO, other)
    align_faces(_video(other)[0], fps, runners=runners)
    assert sum(r.calls for r in runners) == calls
    changed = tmp_path / "changed.mp4"  # other bytes, other key
    changed.write_bytes((data_dir / VIDEO).read_bytes() + b"\0" * 16)
    assert frames_key(_video(changed)[0]) != frames_key(frames)
    align_faces(_video(data_dir / VIDEO, 0.3)[0], fps, runners=runners)  # other frames read: tracked again
    assert sum(r.calls for r in runners) > calls


def test_repeat_request_encodes_nothing_and_equals_the_first(data_dir, face_runners, release, fresh,
                                                             monkeypatch):
    from digital_human.audio.decode import decode_audio

    wave, sr = decode_audio(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=1.0)
    wave = wave.mean(0)[: int(0.5 * sr)]
    from digital_human.talking_head.musetalk import crops as crops_mod

    encoded, masks_made = [], []
    real = MuseTalkPipeline.encode_references
    monkeypatch.setattr(MuseTalkPipeline, "encode_references",
                        lambda self, crops: encoded.append(len(crops)) or real(self, crops))
    real_mask = crops_mod._MuseTalkRenderer._mesh_mask
    monkeypatch.setattr(crops_mod._MuseTalkRenderer, "_mesh_mask",
                        lambda self, r: masks_made.append(r) or real_mask(self, r))

    def request():
        frames, fps = _video(data_dir / VIDEO)
        track = align_faces(frames, fps, runners=face_runners)
        gen = musetalk_crops(track, wave, sr, 25.0, batch_size=4, streaming=True, models_root=release, mask="mesh")
        crops, _ = gen.render(0, len(gen))
        return crops, gen.mask_stack(0, len(gen)), gen

    crops1, masks1, gen1 = request()
    first = sum(encoded)
    assert first == len(np.unique(gen1.idx)) == len(masks_made)  # each reference frame once
    crops2, masks2, _ = request()
    assert sum(encoded) == first and len(masks_made) == first  # the repeat request encoded and masked nothing
    assert np.array_equal(crops1, crops2) and np.array_equal(masks1, masks2)

    clear_avatar_caches()  # a first request again: the same result, made anew
    crops3, masks3, _ = request()
    assert sum(encoded) == 2 * first and len(masks_made) == 2 * first
    assert np.array_equal(crops1, crops3) and np.array_equal(masks1, masks3)


def test_in_memory_frames_keep_nothing_between_requests(data_dir, face_runners, release, fresh):
    from digital_human.audio.decode import decode_audio

    wave, sr = decode_audio(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=1.0)
    wave = wave.mean(0)[: int(0.3 * sr)]
    frames, fps = _video(data_dir / VIDEO, 0.2)
    track = align_faces(frames[:], fps, runners=face_runners)
    gen = musetalk_crops(track, wave, sr, 25.0, batch_size=4, streaming=True, models_root=release, mask="mesh")
    renderer = gen.render.__self__
    gen.render(0, len(gen))
    assert renderer.latents is not None and len(renderer.latents) > 0  # the request's own, by frame index
    assert len(renderer.pipe._latents) == 0  # the kept pipeline's cache was not touched


def test_latent_cache_drops_least_recently_used():
    cache = LatentCache(2)
    for k in "abc":
        cache.put(k, torch.zeros(1))
    assert len(cache) == 3  # a batch's own keys stay until it has read them
    cache.get("a")
    cache.trim()
    assert "a" in cache and "c" in cache and "b" not in cache


def test_kept_pipeline_lives_and_dies_with_its_networks(release):
    """cached_pipeline keeps one pipeline per networks, seed and mode, on the networks: when the loader drops
    the networks, the pipeline and its latents go too (a module-level map would keep their memory alive)."""
    import gc
    import weakref

    from digital_human.engines.musetalk.networks import load_networks
    from digital_human.engines.musetalk.pipeline import cached_pipeline

    net = load_networks(models_root=release)
    pipe = cached_pipeline(net, seed=0, compile=False)
    assert cached_pipeline(net, seed=0, compile=False) is pipe
    assert cached_pipeline(net, seed=1, compile=False) is not pipe
    pipe_ref, unet_ref = weakref.ref(pipe), weakref.ref(net.unet)
    del pipe, net
    gc.collect()
    assert pipe_ref() is None and unet_ref() is None


def test_a_long_videos_track_is_not_kept(data_dir, face_runners, fresh, monkeypatch):
    """Kept tracks are bounded in bytes too: a track over the budget (a long video's, in a one-shot CLI
    run) is tracked and returned but not kept, so the process holds one copy of it, not two."""
    from digital_human.vision import track as track_mod

    frames, fps = _video(data_dir / VIDEO)
    monkeypatch.setattr(track_mod, "TRACK_CACHE_BYTES", 1000)  # smaller than this clip's track
    runners = tuple(Counting(r) for r in face_runners)
    align_faces(frames, fps, runners=runners)
    calls = sum(r.calls for r in runners)
    assert not track_mod._TRACKS
    align_faces(_video(data_dir / VIDEO)[0], fps, runners=runners)
    assert sum(r.calls for r in runners) == 2 * calls  # tracked again: nothing was kept
