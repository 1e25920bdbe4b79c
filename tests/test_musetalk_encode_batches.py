"""The compiled encoder's batching (MuseTalkPipeline._moments): fixed batches of ENCODE_BATCH, a short one padded,
the results cut back - equal to one eager call. On the CPU the "compiled" callable is the eager function itself
(torch.compile of MuseTalk runs on CUDA only), so this checks the splitting and padding, not inductor."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("diffusers", reason="MuseTalk is an optional extra: pip install .[musetalk]")
pytest.importorskip("transformers", reason="MuseTalk is an optional extra: pip install .[musetalk]")
torch = pytest.importorskip("torch")

from digital_human.engines.musetalk import pipeline as pipeline_mod  # noqa: E402
from digital_human.engines.musetalk.networks import load_networks  # noqa: E402
from digital_human.engines.musetalk.random_release import write_release  # noqa: E402


def test_encoder_batches_padded_and_cut_back(tmp_path, monkeypatch):
    write_release(tmp_path, "reduced", seed=5)
    pipe = pipeline_mod.MuseTalkPipeline(load_networks(models_root=tmp_path), seed=0)
    crops = np.random.default_rng(1).integers(0, 256, (5, 256, 256, 3), dtype=np.uint8)
    expected = pipe.encode_references(crops)
    seen = []

    def fake_compiled(x):
        seen.append(len(x))
        return pipe._encode_moments(x.contiguous())  # NCHW: the CPU's parity layout

    monkeypatch.setattr(pipeline_mod, "ENCODE_BATCH", 2)
    pipe._compiled_encode = fake_compiled
    got = pipe.encode_references(crops)
    assert seen == [2, 2, 2] * 2  # 5 crops -> 2 + 2 + (1 padded to 2), for each half
    assert torch.allclose(got, expected, atol=1e-5, rtol=0)
    assert pipe.encode_compile_seconds is None  # the CPU never timed a compilation
