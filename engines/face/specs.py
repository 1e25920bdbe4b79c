"""The two face models' specs for `engines.loader.get`, without importing torch.

The torch ports (blazeface.FaceDetectorNet, facemesh.FaceMeshNet) are built only when the torch
backend loads them, so finding faces on ONNX Runtime (the CPU path, and the CLI's input checks that
must answer in seconds) never pays torch's import time.
"""
from __future__ import annotations

from pathlib import Path

from ..spec import ModelSpec, TensorProfile

DETECTOR_INPUT_SIZE = 128
DETECTOR_INPUT_NAME = "input"
DETECTOR_OUTPUT_NAMES = ["regressors", "classificators"]
MESH_INPUT_SIZE = 192
MESH_INPUT_NAME = "input"
MESH_OUTPUT_NAMES = ["landmarks", "face_flag"]


def _detector_net(tflite_path: Path):
    from .blazeface import FaceDetectorNet

    return FaceDetectorNet(tflite_path).eval()


def _mesh_net(tflite_path: Path):
    from .facemesh import FaceMeshNet

    return FaceMeshNet(tflite_path).eval()


def face_detector_spec() -> ModelSpec:
    """The installed face detector (torch backend uses the native port)."""
    from .mediapipe_assets import face_model_paths

    paths = face_model_paths()
    shape = (1, DETECTOR_INPUT_SIZE, DETECTOR_INPUT_SIZE, 3)
    return ModelSpec(
        name="face_detector", onnx_path=paths["detector"],
        profiles={DETECTOR_INPUT_NAME: TensorProfile(shape, shape, (16, DETECTOR_INPUT_SIZE, DETECTOR_INPUT_SIZE, 3))},
        torch_factory=lambda: _detector_net(paths["detector_tflite"]),
        input_names=(DETECTOR_INPUT_NAME,), output_names=tuple(DETECTOR_OUTPUT_NAMES))


def face_mesh_spec() -> ModelSpec:
    """The installed face mesh (torch backend uses the native port)."""
    from .mediapipe_assets import face_model_paths

    paths = face_model_paths()
    shape = (1, MESH_INPUT_SIZE, MESH_INPUT_SIZE, 3)
    return ModelSpec(
        name="face_mesh", onnx_path=paths["mesh"],
        profiles={MESH_INPUT_NAME: TensorProfile(shape, shape, (16, MESH_INPUT_SIZE, MESH_INPUT_SIZE, 3))},
        torch_factory=lambda: _mesh_net(paths["mesh_tflite"]),
        input_names=(MESH_INPUT_NAME,), output_names=tuple(MESH_OUTPUT_NAMES))
