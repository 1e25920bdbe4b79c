"""LatentSync's UNet step as an ONNX graph for the engine layer (ONNX Runtime, TensorRT).

The graph takes `sample` [2, 13, F, L, L] (the guidance batch: row 0 on zero audio, row 1 on the speech; channels
= noisy latents, mask, masked-image latents, reference latents), `timestep` [1] (float) and `audio` [2F, W, 384]
(the zero windows then the speech windows, frames of row 0 first) and returns `pred` [2, 4, F, L, L]. The frame
count F is dynamic (1..16: the last window of a video is shorter); the latent side L is fixed by the config
(64 for 1.6, 32 for 1.5), so a TensorRT profile ranges over F alone. The zero-audio row's cross-attention is the
constant the torch module uses (unet.py), so the graph does no attention work for it either.

Not wired into the renderer yet: the pipeline runs the torch module (LatentSyncPipeline); this module gives the
graph and its spec, and tests/test_latentsync.py proves the graph on ONNX Runtime (CPU) against torch at reduced size.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..onnx_export import export_onnx
from ..spec import ModelSpec, TensorProfile

INPUTS = ("sample", "timestep", "audio")
OUTPUTS = ("pred",)


def unet_step_module(unet: Any) -> Any:
    """nn.Module (sample, timestep, audio) -> pred for the classifier-free-guidance batch of two rows."""
    import torch

    class UNetStep(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.unet = unet

        def forward(self, sample, timestep, audio):
            return self.unet(sample, timestep, audio, uncond_rows=1)

    return UNetStep().eval()


def example_inputs(latent: int, frames: int = 16, window: int = 50, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((2, 13, frames, latent, latent)).astype(np.float32), np.array([501.0], np.float32),
            rng.standard_normal((2 * frames, window, 384)).astype(np.float32)]


def export_unet(unet: Any, path: str | Path, latent: int, window: int = 50, opset: int = 17) -> Path:
    """Write the UNet step to `path` (atomically) with a dynamic frame axis."""
    import torch

    module = unet_step_module(unet)
    example = [torch.from_numpy(a) for a in example_inputs(latent, 4, window)]
    axes = {"sample": {2: "frames"}, "audio": {0: "rows_x_frames"}, "pred": {2: "frames"}}
    return export_onnx(module, example, Path(path), INPUTS, OUTPUTS, dynamic_axes=axes, opset=opset)


def unet_spec(onnx_path: str | Path, latent: int, unet: Any = None, window: int = 50, frames: int = 16,
              name: str = "latentsync-unet") -> ModelSpec:
    """The engine-layer spec: TensorRT profiles over the window's frame count only."""
    profiles = {"sample": TensorProfile((2, 13, 1, latent, latent), (2, 13, frames, latent, latent),
                                        (2, 13, frames, latent, latent)),
                "timestep": TensorProfile((1,), (1,), (1,)),
                "audio": TensorProfile((2, window, 384), (2 * frames, window, 384), (2 * frames, window, 384))}
    factory = (lambda: unet_step_module(unet)) if unet is not None else None
    return ModelSpec(name=name, onnx_path=Path(onnx_path), profiles=profiles, torch_factory=factory,
                     fp16_mode="autocast", cuda_graphs=True, input_names=INPUTS, output_names=OUTPUTS,
                     fp32_inputs=("timestep",))
