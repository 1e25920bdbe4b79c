"""Sonic's UNet call exported to ONNX (engines/sonic/export.py) equals the torch module on ONNX Runtime CPU, at a
reduced size of the SVD-XT architecture with the audio adapters, for batch 1 (vram low) and 3 (vram high)."""
from __future__ import annotations

import pytest


def test_the_onnx_unet_equals_torch_on_onnx_runtime(tmp_path):
    pytest.importorskip("diffusers", reason="Sonic is an optional extra: pip install .[sonic]")
    pytest.importorskip("onnxruntime")
    import torch

    from digital_human.engines.onnx_export import parity
    from digital_human.engines.sonic.export import example_inputs, export_unet, unet_spec
    from digital_human.engines.sonic.networks import add_audio_processors, make_sonic_unet_class
    from digital_human.engines.sonic.random_release import _randomize, unet_config

    unet = make_sonic_unet_class().from_config(unet_config(reduced=True))
    add_audio_processors(unet)
    _randomize(unet, torch.Generator().manual_seed(0), 0.02)
    path = export_unet(unet, tmp_path / "sonic_unet.onnx", 64, 64)
    for batch in (1, 3):  # the dynamic batch axis: one guidance branch or all three
        report = parity(unet, path, example_inputs(unet, batch, 64, 64, seed=batch))
        assert report.max_abs_diff < 1e-4, str(report)  # measured 3e-6
    spec = unet_spec(path, unet, 64, 64)
    assert spec.profiles["sample"].min[0] == 1 and spec.profiles["sample"].max[0] == 3
