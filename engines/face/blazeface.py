"""MediaPipe's short-range face detector (BlazeFace, 128x128) as a torch module, and its ONNX export.

The network is rebuilt from the .tflite weights (see tflite_reader); this module pins down the
interface the rest of the pack relies on, so a different file fails here with a clear message.
ONNX I/O: `input` [B,128,128,3] float RGB scaled to [-1, 1] (NHWC, as in TFLite) ->
`regressors` [B,896,16] (box cx,cy,w,h + 6 keypoints, in 128-px units relative to the anchors),
`classificators` [B,896,1] (score logits).
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .specs import DETECTOR_INPUT_NAME, DETECTOR_INPUT_SIZE, DETECTOR_OUTPUT_NAMES, face_detector_spec  # noqa: F401 (re-exported)
from .tflite_reader import UnsupportedTflite, export_onnx, load_tflite_module

NUM_ANCHORS = 896
INPUT_SIZE, INPUT_NAME, OUTPUT_NAMES = DETECTOR_INPUT_SIZE, DETECTOR_INPUT_NAME, DETECTOR_OUTPUT_NAMES


class FaceDetectorNet(nn.Module):
    def __init__(self, tflite_path: Path) -> None:
        super().__init__()
        self.net = load_tflite_module(tflite_path)
        graph = self.net.graph
        in_shape = graph.tensors[graph.inputs[0]].shape
        expected_out = [(1, NUM_ANCHORS, 16), (1, NUM_ANCHORS, 1)]
        if in_shape != (1, INPUT_SIZE, INPUT_SIZE, 3) or [tuple(s) for s in self.net.output_shapes] != expected_out:
            raise UnsupportedTflite(
                f"{tflite_path} is not MediaPipe's short-range face detector (input {in_shape}, outputs "
                f"{self.net.output_shapes}); re-run `python -m digital_human setup`")

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        regressors, scores = self.net(x)
        return regressors, scores


def export_face_detector(tflite_path: Path, onnx_path: Path) -> float:
    """Write the detector ONNX; returns max |ONNX - torch| (expected ~1e-5)."""
    return export_onnx(FaceDetectorNet(tflite_path).eval(), (1, INPUT_SIZE, INPUT_SIZE, 3), onnx_path,
                       INPUT_NAME, OUTPUT_NAMES)
