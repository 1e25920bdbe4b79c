"""Face alignment for video/photos (DH_FACES), tracking + smoothing, and paste-back."""
from .align import align_faces, draw_preview
from .faces import FaceTrack, NoFaceError
from .paste import lower_face_mask, paste_back, paste_back_batch

__all__ = ["FaceTrack", "NoFaceError", "align_faces", "draw_preview", "lower_face_mask", "paste_back",
           "paste_back_batch"]
