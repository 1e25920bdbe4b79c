"""Sonic's UNet call as an ONNX graph for the engine layer (ONNX Runtime, TensorRT).

Inputs: `sample` [B, 25, 8, h, w] (scaled noisy latents ++ image latents), `timestep` [1], `context`
[B*25, 1, D] (CLIP image embedding per frame), `audio` [B*25, 32, D] (audio tokens per frame), `time_ids` [B, 3]
(fps, the two motion buckets) and `mask` [1, 1, H, W] (the face mask); output `v` [B, 25, 4, h, w]. The batch
(guidance branches: 3 with vram high, 1 with vram low) is dynamic; frames (25) and the resolution are fixed per
graph (the face mask's token grids are sized from them), so one graph is exported per resolution and its
TensorRT profile spans the batch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..onnx_export import export_onnx
from ..spec import ModelSpec, TensorProfile

INPUTS = ("sample", "timestep", "context", "audio", "time_ids", "mask")
OUTPUTS = ("v",)
FRAMES = 25


def example_inputs(unet: Any, batch: int, height: int, width: int, seed: int = 0) -> list[np.ndarray]:
    """Random inputs of the graph's shapes (latent size = pixels / 8 for SVD's VAE)."""
    rng = np.random.default_rng(seed)
    dim = unet.config.cross_attention_dim
    h, w = height // 8, width // 8
    return [rng.standard_normal((batch, FRAMES, 8, h, w)).astype(np.float32), np.array([1.2], np.float32),
            rng.standard_normal((batch * FRAMES, 1, dim)).astype(np.float32),
            rng.standard_normal((batch * FRAMES, 32, dim)).astype(np.float32),
            np.tile(np.array([[12.5, 20.0, 18.0]], np.float32), (batch, 1)),
            (rng.random((1, 1, height, width)) > 0.5).astype(np.float32)]


def export_unet(unet: Any, path: str | Path, height: int = 512, width: int = 512, opset: int = 17) -> Path:
    """Write the UNet call to `path` (atomically) with a dynamic batch axis."""
    import torch

    example = [torch.from_numpy(a) for a in example_inputs(unet, 2, height, width)]
    axes = {"sample": {0: "batch"}, "context": {0: "batch_frames"}, "audio": {0: "batch_frames"},
            "time_ids": {0: "batch"}, "v": {0: "batch"}}
    return export_onnx(unet.eval(), example, Path(path), INPUTS, OUTPUTS, dynamic_axes=axes, opset=opset)


def unet_spec(onnx_path: str | Path, unet: Any, height: int = 512, width: int = 512,
              name: str = "sonic-unet") -> ModelSpec:
    """Engine-layer spec: TensorRT profiles over the batch (1 = one guidance branch, 3 = all three)."""
    h, w, dim = height // 8, width // 8, unet.config.cross_attention_dim

    def shapes(b: int) -> dict[str, tuple[int, ...]]:
        return {"sample": (b, FRAMES, 8, h, w), "timestep": (1,), "context": (b * FRAMES, 1, dim),
                "audio": (b * FRAMES, 32, dim), "time_ids": (b, 3), "mask": (1, 1, height, width)}

    lo, opt, hi = shapes(1), shapes(3), shapes(3)
    profiles = {k: TensorProfile(lo[k], opt[k], hi[k]) for k in INPUTS}
    return ModelSpec(name=name, onnx_path=Path(onnx_path), profiles=profiles, torch_factory=lambda: unet,
                     fp16_mode="autocast", cuda_graphs=True, input_names=INPUTS, output_names=OUTPUTS)
