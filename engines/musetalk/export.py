"""MuseTalk's UNet step as an ONNX graph for the engine layer (ONNX Runtime, TensorRT).

The graph takes `latents` [B, 8, 32, 32] (masked ++ reference latents) and `audio` [B, L, 384] (the
frame's whisper window, L = 50 for whisper-tiny) and returns `pred` [B, 4, 32, 32]; the timestep (0)
and MuseTalk's position code are constants inside it. Only the batch is dynamic: the crop is fixed
at 256x256 (latent 32x32), so a TensorRT profile needs the batch range alone.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..onnx_export import export_onnx
from ..spec import ModelSpec, TensorProfile
from .audio import position_table

LATENT = 32
INPUTS = ("latents", "audio")
OUTPUTS = ("pred",)


def unet_step_module(unet: Any, audio_len: int) -> Any:
    """nn.Module (latents, audio) -> pred with the position code and timestep 0 built in."""
    import torch

    class UNetStep(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.unet = unet
            self.register_buffer("positions", position_table()[:, :audio_len].clone(), persistent=False)
            self.register_buffer("timestep", torch.tensor([0]), persistent=False)

        def forward(self, latents, audio):
            cond = audio + self.positions.to(audio.dtype)
            return self.unet(latents, self.timestep, encoder_hidden_states=cond, return_dict=False)[0]

    return UNetStep().eval()


def example_inputs(batch: int, audio_len: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((batch, 8, LATENT, LATENT)).astype(np.float32),
            rng.standard_normal((batch, audio_len, 384)).astype(np.float32)]


def export_unet(unet: Any, path: str | Path, audio_len: int = 50, opset: int = 17) -> Path:
    """Write the UNet step to `path` (atomically) with a dynamic batch axis."""
    import torch

    module = unet_step_module(unet, audio_len)
    example = [torch.from_numpy(a) for a in example_inputs(2, audio_len)]
    axes = {"latents": {0: "batch"}, "audio": {0: "batch"}, "pred": {0: "batch"}}
    return export_onnx(module, example, Path(path), INPUTS, OUTPUTS, dynamic_axes=axes, opset=opset)


def unet_spec(onnx_path: str | Path, unet: Any = None, audio_len: int = 50, max_batch: int = 64,
              opt_batch: int = 16, name: str = "musetalk-unet") -> ModelSpec:
    """The engine-layer spec: TensorRT profiles over the batch only (256x256 crops: 32x32 latents);
    with `unet`, the torch backend runs the module itself instead of converting the graph."""
    opt = min(opt_batch, max_batch)
    profiles = {"latents": TensorProfile((1, 8, LATENT, LATENT), (opt, 8, LATENT, LATENT),
                                         (max_batch, 8, LATENT, LATENT)),
                "audio": TensorProfile((1, audio_len, 384), (opt, audio_len, 384), (max_batch, audio_len, 384))}
    factory = (lambda: unet_step_module(unet, audio_len)) if unet is not None else None
    return ModelSpec(name=name, onnx_path=Path(onnx_path), profiles=profiles, torch_factory=factory,
                     fp16_mode="autocast", cuda_graphs=True, input_names=INPUTS, output_names=OUTPUTS)
