"""MediaPipe's 468-point face mesh (192x192) as a torch module, and its ONNX export.

ONNX I/O: `input` [B,192,192,3] float RGB scaled to [0, 1] (NHWC, as in TFLite), the face crop
rotated so the eyes are level -> `landmarks` [B,468,3] (x, y in crop pixels 0..192, z in the same
scale, relative to the face centre) and `face_flag` [B,1] (face-presence logit; sigmoid > 0.5 means
a face; this is what rejects a dog or a false detection).
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .specs import MESH_INPUT_NAME, MESH_INPUT_SIZE, MESH_OUTPUT_NAMES, face_mesh_spec  # noqa: F401 (re-exported)
from .tflite_reader import UnsupportedTflite, export_onnx, load_tflite_module

NUM_LANDMARKS = 468
INPUT_SIZE, INPUT_NAME, OUTPUT_NAMES = MESH_INPUT_SIZE, MESH_INPUT_NAME, MESH_OUTPUT_NAMES


class FaceMeshNet(nn.Module):
    def __init__(self, tflite_path: Path) -> None:
        super().__init__()
        self.net = load_tflite_module(tflite_path)
        graph = self.net.graph
        in_shape = graph.tensors[graph.inputs[0]].shape
        expected_out = [(1, 1, 1, NUM_LANDMARKS * 3), (1, 1, 1, 1)]
        if in_shape != (1, INPUT_SIZE, INPUT_SIZE, 3) or [tuple(s) for s in self.net.output_shapes] != expected_out:
            raise UnsupportedTflite(
                f"{tflite_path} is not MediaPipe's face_landmark model (input {in_shape}, outputs "
                f"{self.net.output_shapes}); re-run `python -m digital_human setup`")

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        coords, flag = self.net(x)
        return coords.reshape(-1, NUM_LANDMARKS, 3), flag.reshape(-1, 1)


def export_face_mesh(tflite_path: Path, onnx_path: Path) -> float:
    """Write the face-mesh ONNX; returns max |ONNX - torch| (expected ~1e-4 on 0..192 px outputs)."""
    return export_onnx(FaceMeshNet(tflite_path).eval(), (1, INPUT_SIZE, INPUT_SIZE, 3), onnx_path,
                       INPUT_NAME, OUTPUT_NAMES)
