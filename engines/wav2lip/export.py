"""Wav2Lip's generator as an ONNX graph for the engine layer (ONNX Runtime, TensorRT).

The graph takes `mel` [B, 1, 80, 16] (the frame's mel window) and `faces` [B, 6, 96, 96] (masked ++ reference
face, 0..1, BGR as trained) and returns `pred` [B, 3, 96, 96] in 0..1. The BatchNorms are folded before export
(the same function; FP32 differences ~1e-6). Only the batch is dynamic: the face is fixed at 96x96, so a
TensorRT profile needs the batch range alone.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..onnx_export import export_onnx
from ..spec import ModelSpec, TensorProfile

INPUTS = ("mel", "faces")
OUTPUTS = ("pred",)


def example_inputs(batch: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(2.0 * rng.standard_normal((batch, 1, 80, 16))).astype(np.float32),
            rng.random((batch, 6, 96, 96)).astype(np.float32)]


def export_generator(net: Any, path: str | Path, opset: int = 17) -> Path:
    """Write the (folded, FP32, CPU) generator to `path` atomically with a dynamic batch axis."""
    import torch

    module = net.float().cpu().to(memory_format=torch.contiguous_format).eval()
    example = [torch.from_numpy(a) for a in example_inputs(2)]
    axes = {"mel": {0: "batch"}, "faces": {0: "batch"}, "pred": {0: "batch"}}
    return export_onnx(module, example, Path(path), INPUTS, OUTPUTS, dynamic_axes=axes, opset=opset)


def generator_spec(onnx_path: str | Path, net: Any = None, max_batch: int = 512, opt_batch: int = 128,
                   name: str = "wav2lip-generator") -> ModelSpec:
    """The engine-layer spec: TensorRT profiles over the batch only; with `net`, the torch backend runs the
    module itself instead of converting the graph."""
    opt = min(opt_batch, max_batch)
    profiles = {"mel": TensorProfile((1, 1, 80, 16), (opt, 1, 80, 16), (max_batch, 1, 80, 16)),
                "faces": TensorProfile((1, 6, 96, 96), (opt, 6, 96, 96), (max_batch, 6, 96, 96))}
    factory = (lambda: net) if net is not None else None
    return ModelSpec(name=name, onnx_path=Path(onnx_path), profiles=profiles, torch_factory=factory,
                     fp16_mode="half", cuda_graphs=True, input_names=INPUTS, output_names=OUTPUTS)
