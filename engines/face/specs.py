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


def _spec(name: str, model: str, size: int, input_name: str, output_names: list[str], build) -> ModelSpec:
    """A spec for one of the installed MediaPipe models (`model`: its key in face_model_paths)."""
    from .mediapipe_assets import face_model_paths

    paths = face_model_paths()
    shape = (1, size, size, 3)
    return ModelSpec(
        name=name, onnx_path=paths[model],
        profiles={input_name: TensorProfile(shape, shape, (16, size, size, 3))},
        torch_factory=lambda: build(paths[f"{model}_tflite"]),
        # FP32 on the GPU too: the nets are tiny (batch-1 calls in the tracker, launch-bound) and the
        # landmarks, hence every crop, stay close to the CPU path's (H200: within 0.07 px, RESULTS.md)
        torch_auto_precision="fp32",
        input_names=(input_name,), output_names=tuple(output_names))


def face_detector_spec() -> ModelSpec:
    """The installed face detector (torch backend uses the native port)."""
    return _spec("face_detector", "detector", DETECTOR_INPUT_SIZE, DETECTOR_INPUT_NAME, DETECTOR_OUTPUT_NAMES,
                 _detector_net)


def face_mesh_spec() -> ModelSpec:
    """The installed face mesh (torch backend uses the native port)."""
    return _spec("face_mesh", "mesh", MESH_INPUT_SIZE, MESH_INPUT_NAME, MESH_OUTPUT_NAMES, _mesh_net)
