"""Face detection + 468-point face mesh (MediaPipe's models, converted to ONNX at setup).

Importing this package does not import torch; only `install_face_models` (the conversion) needs it.
"""
from .detect import FaceBox, default_runners, detect_faces, face_landmarks
from .mediapipe_assets import face_model_paths, install_face_models

__all__ = ["FaceBox", "default_runners", "detect_faces", "face_landmarks", "face_model_paths",
           "install_face_models"]
