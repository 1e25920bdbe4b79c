"""MuseTalk's streaming renderer on a talking video (crops made on demand): the batched path (crops of a
batch together, face crops and masks on a thread pool) gives what the per-frame loop gave."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("diffusers", reason="MuseTalk is an optional extra: pip install .[musetalk]")
pytest.importorskip("transformers", reason="MuseTalk is an optional extra: pip install .[musetalk]")
torch = pytest.importorskip("torch")

from digital_human.engines.musetalk.random_release import write_release  # noqa: E402
from digital_human.talking_head.musetalk.blend import crop_face, resize_to_box, square_box  # noqa: E402
from digital_human.vision.paste import lower_face_mask  # noqa: E402


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    root = tmp_path_factory.mktemp("mt_models")
    write_release(root, "reduced", seed=3)
    return root


@pytest.fixture(scope="module")
def video_track(talking_video_track):
    return talking_video_track


def _old_mask(renderer, r: int) -> np.ndarray:
    """The per-frame mesh mask as the renderer made it before the thread pool."""
    import cv2

    size = renderer.size
    x1, y1, x2, y2 = renderer.box(r)
    m = np.zeros((size, size), np.float32)
    face = lower_face_mask(renderer.crop_lms[r], size, jaw_margin=0.10)
    m[y1:y2, x1:x2] = face[y1:y2, x1:x2]
    xs, ys, xe, ye = square_box((x1, y1, x2, y2))
    m[:max(0, min(size, ys + int((ye - ys) * 0.5)))] = 0.0
    k = int(0.05 * (xe - xs) // 2 * 2) + 1
    return np.clip(cv2.GaussianBlur(m, (k, k), 0), 0.0, 1.0)


def test_batched_renderer_equals_per_frame_loop(video_track, release, data_dir):
    from digital_human.audio.decode import decode_audio
    from digital_human.engines.musetalk.pipeline import MuseTalkPipeline
    from digital_human.talking_head.musetalk.crops import musetalk_crops

    wave, sr = decode_audio(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=1.0)
    wave = wave.mean(0)[: int(0.5 * sr)]
    gen = musetalk_crops(video_track, wave, sr, 25.0, batch_size=4, streaming=True, models_root=release,
                         mask="mesh")
    renderer = gen.render.__self__
    n = len(gen)
    assert n >= 10 and len(np.unique(gen.idx)) >= 10  # a new reference frame per output frame
    got, _ = gen.render(0, n)
    masks = gen.mask_stack(0, n)
    assert {"crops", "crop_face", "networks", "masks"} <= set(gen.timings)

    # the loop as it was: one lazy crop, one face crop and one paste at a time, same batches and seed
    pipe = MuseTalkPipeline(renderer.pipe.net, seed=0)
    expected = []
    for s in range(0, n, 4):
        refs = [int(r) for r in gen.idx[s:s + 4]]
        latents = pipe.reference_latents_batch(refs, lambda r: crop_face(video_track.crops[r], renderer.box(r)))
        for r, face in zip(refs, pipe.generate(latents, renderer.windows(s, s + len(refs)))):
            x1, y1, x2, y2 = renderer.box(r)
            crop = np.array(video_track.crops[r], np.uint8, copy=True)
            crop[y1:y2, x1:x2] = resize_to_box(face, (x1, y1, x2, y2))
            expected.append(crop)
    assert np.array_equal(got, np.stack(expected))
    assert np.array_equal(masks, np.stack([_old_mask(renderer, int(r)) for r in gen.idx]))


def test_reference_pixels_from_a_device_tensor_equal_the_host_conversion(release):
    """encode_references converts the crops on the device on CUDA: the same float64 / 255 -> float32 steps."""
    from digital_human.engines.musetalk.networks import load_networks
    from digital_human.engines.musetalk.pipeline import MuseTalkPipeline

    pipe = MuseTalkPipeline(load_networks(models_root=release), seed=0)
    crops = np.random.default_rng(0).integers(0, 256, (3, 256, 256, 3), dtype=np.uint8)
    for half in (True, False):
        assert torch.equal(pipe._pixels(torch.from_numpy(crops), half), pipe._pixels(crops, half))
