"""Face and video nodes: LoadReferenceVideo, FaceAlign, TemporalSmooth, VideoMux.

Recipes over vision/ (alignment, paste-back masks), media/ (decode, smoothing, mux) and engines/face.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from .comfy_glue import Progress, in_comfyui, interrupted, list_input_files, output_directory, resolve_input_file
from .image_convert import image_to_uint8, uint8_to_image

log = logging.getLogger("digital_human")

CATEGORY = "DigitalHuman"
VIDEO_EXTENSIONS = (".mp4", ".mov", ".mkv", ".webm", ".avi", ".m4v")
BACKENDS = ["auto", "tensorrt", "torch", "onnxruntime"]


class LoadReferenceVideo:
    """A talking video from the input folder -> frames, its own audio, and its fps."""

    DESCRIPTION = ("Decode a reference video (H.264/HEVC/VP9...) with the bundled ffmpeg: frames (optionally "
                   "downscaled), the sound track and the frame rate, for FaceAlign / TrainAvatar.")

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {
            "video_file": (list_input_files(VIDEO_EXTENSIONS) or [""], {"video_upload": True}),
            "max_seconds": ("FLOAT", {"default": 60.0, "min": 0.1, "max": 3600.0, "step": 1.0}),
            "max_side": ("INT", {"default": 1024, "min": 128, "max": 4096, "step": 16,
                                 "tooltip": "Downscale so the longer side is at most this (saves memory)."}),
        }, "optional": {
            "frame_load_cap": ("INT", {"default": 600, "min": 1, "max": 100000,
                                       "tooltip": "Load at most this many frames. Frames are ComfyUI IMAGEs held in "
                                       "memory (1024 px: ~7 MB each as float); the defaults fit a 16 GB machine. "
                                       "For long or large videos use the CLI / Talking Head to Video path, which "
                                       "streams frames."}),
        }}

    RETURN_TYPES = ("IMAGE", "AUDIO", "FLOAT", "STRING")
    RETURN_NAMES = ("frames", "audio", "fps", "report")
    FUNCTION = "load"
    CATEGORY = CATEGORY

    @classmethod
    def VALIDATE_INPUTS(cls, video_file: str = "") -> bool | str:
        try:
            resolve_input_file(video_file, "video_file")
        except (ValueError, FileNotFoundError) as exc:
            return str(exc)
        return True

    def load(self, video_file: str, max_seconds: float = 60.0, max_side: int = 1024, frame_load_cap: int = 600):
        from ..audio import to_comfy_audio
        from ..media.probe import probe_media, read_video_audio, read_video_frames
        from .memory_guard import image_bytes, require_memory

        path = resolve_input_file(video_file, "video_file")
        info = probe_media(path)
        if not info.has_video:
            raise ValueError(f"video_file '{video_file}' has no video stream")
        scale = min(1.0, max_side / max(info.width, info.height))
        size = None if scale >= 1.0 else (int(round(info.width * scale / 2)) * 2, int(round(info.height * scale / 2)) * 2)
        max_frames = min(int(frame_load_cap), max(1, int(round(max_seconds * (info.fps or 25.0)))))
        count = min(max_frames, info.frame_count or max_frames)
        width, height = size or (info.width, info.height)
        # the uint8 frames while decoding + the float IMAGE this node returns
        require_memory(image_bytes(count, height, width, 1) + image_bytes(count, height, width), "LoadReferenceVideo",
                       f"{count} frames of {width}x{height}", "lower max_seconds, frame_load_cap or max_side")
        frames, fps = read_video_frames(path, max_frames=max_frames, size=size)
        audio_out = None
        notes = [f"{path.name}: {len(frames)} frames {frames.shape[2]}x{frames.shape[1]} @ {fps:g} fps"]
        if info.has_audio:
            wave, rate = read_video_audio(path)
            wave = wave[:, : int(round(len(frames) / fps * rate))]
            audio_out = to_comfy_audio(wave, rate)
            notes.append(f"audio {wave.shape[1] / rate:.2f} s @ {rate} Hz")
        else:
            notes.append("no audio track")
            audio_out = to_comfy_audio(np.zeros((1, 1), np.float32), 16000)
        return (uint8_to_image(frames), audio_out, float(fps), "\n".join(notes))


class FaceAlign:
    """Detect the main face on a photo or every video frame; stable aligned crops (DH_FACES)."""

    DESCRIPTION = ("MediaPipe face detector + 468-point mesh (Apache-2.0, run as ONNX). Picks the main face, "
                   "rejects non-faces, makes similarity-aligned crops with room for the chin, tracks and "
                   "smooths across video frames, and interpolates frames where the face is lost. Optional "
                   "insightface SCRFD detector (buffalo_l / antelopev2 packs you supply in "
                   "models/insightface/models/; those weights are NON-COMMERCIAL research only).")

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "image": ("IMAGE",),
                "fps": ("FLOAT", {"default": 25.0, "min": 1.0, "max": 240.0, "step": 0.01,
                                  "tooltip": "Frame rate of the frames (ignored for one photo)."}),
                "crop_size": ([256, 512], {"default": 256}),
                "expand": ("FLOAT", {"default": 0.35, "min": 0.0, "max": 1.0, "step": 0.01,
                                     "tooltip": "Extra room around the face so chin and mouth stay inside."}),
                "face_index": ("INT", {"default": 0, "min": 0, "max": 16, "tooltip": "0 = largest face."}),
                "smoothing": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 4.0, "step": 0.1}),
                "draw_landmarks": ("BOOLEAN", {"default": True}),
                "backend": (BACKENDS, {"default": "auto"}),
            },
            "optional": {
                "detector": (["mediapipe", "insightface:buffalo_l", "insightface:antelopev2"],
                             {"default": "mediapipe", "tooltip": "insightface packs are never downloaded: put them "
                              "in models/insightface/models/<pack>/ (non-commercial research licence)."}),
            },
        }

    RETURN_TYPES = ("DH_FACES", "IMAGE", "STRING")
    RETURN_NAMES = ("faces", "aligned_preview", "report")
    FUNCTION = "align"
    CATEGORY = CATEGORY

    def align(self, image: Any, fps: float = 25.0, crop_size: int = 256, expand: float = 0.35,
              face_index: int = 0, smoothing: float = 1.0, draw_landmarks: bool = True, backend: str = "auto",
              detector: str = "mediapipe"):
        from ..engines.face.detect import default_runners
        from ..vision.align import align_faces, draw_preview

        face_detector = None  # MediaPipe's, inside align_faces
        if detector.startswith("insightface:"):
            from ..engines.face.insightface_models import insightface_detector

            face_detector = insightface_detector(detector.split(":", 1)[1], backend=backend)
        elif detector != "mediapipe":
            raise ValueError(f"detector must be mediapipe or insightface:<pack>, got '{detector}'")
        from .memory_guard import image_bytes, require_memory

        if hasattr(image, "shape") and len(image.shape) == 4:  # the uint8 copy and the crops
            n, height, width = (int(v) for v in image.shape[:3])
            require_memory(image_bytes(n, height, width, 1) + image_bytes(n, crop_size, crop_size, 1) * 2, "FaceAlign",
                           f"{n} frames of {width}x{height}", "load fewer or smaller frames (LoadReferenceVideo's "
                           "max_seconds / frame_load_cap / max_side)")
        frames = image_to_uint8(image, "image")
        progress = Progress(len(frames), "FaceAlign")
        track = align_faces(frames, fps, crop_size=int(crop_size), expand=expand, face_index=face_index,
                            smoothing=smoothing, runners=default_runners(backend=backend),
                            progress=lambda done, total: progress.update(done - progress.done), input_name="image",
                            detector=face_detector)
        for warning in track.warnings:
            log.warning("FaceAlign: %s", warning)
        preview = draw_preview(track, landmarks=draw_landmarks)
        return (track, uint8_to_image(preview), track.summary())


class TemporalSmooth:
    """Remove flicker in the generated face region without delaying mouth motion."""

    DESCRIPTION = ("Zero-lag temporal filter (One-Euro, motion-adaptive; or EMA) over the face region from "
                   "DH_FACES, or the whole frame without it. Restarts at scene cuts; static pixels stay exact.")

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "images": ("IMAGE",),
                "method": (["one_euro", "ema", "none"], {"default": "one_euro"}),
                "strength": ("FLOAT", {"default": 0.5, "min": 0.0, "max": 1.0, "step": 0.05}),
                "fps": ("FLOAT", {"default": 25.0, "min": 1.0, "max": 240.0, "step": 0.01}),
            },
            "optional": {"faces": ("DH_FACES", {"tooltip": "Limit smoothing to the lower face of these tracks."})},
        }

    RETURN_TYPES = ("IMAGE", "STRING")
    RETURN_NAMES = ("images", "report")
    FUNCTION = "smooth"
    CATEGORY = CATEGORY

    def smooth(self, images: Any, method: str = "one_euro", strength: float = 0.5, fps: float = 25.0,
               faces: Any = None):
        from ..media.smoothing import smooth_frames

        from .memory_guard import image_bytes, require_memory

        if hasattr(images, "shape") and len(images.shape) == 4:
            n, height, width = (int(v) for v in images.shape[:3])
            require_memory(image_bytes(n, height, width), "TemporalSmooth", f"a copy of {n} frames of {width}x{height}",
                           "shorten the speech or lower the reference size (LoadReferenceVideo's max_side), or use "
                           "Talking Head to Video, which streams frames")
        # The output is a new IMAGE (inputs must not change); torch's clone copies with all threads.
        frames = (images.detach().cpu().float().clone().numpy() if hasattr(images, "detach")
                  else np.array(images, np.float32))
        if frames.ndim != 4 or frames.shape[-1] != 3:
            raise ValueError(f"images: expected IMAGE [frames, height, width, 3], got shape {frames.shape}")
        mask = None
        region = (slice(None), slice(None))
        if faces is not None:
            if len(faces.frames) != len(frames):
                raise ValueError(f"faces has {len(faces.frames)} frames but images has {len(frames)}: connect the "
                                 "DH_FACES output of the node that produced these images")
            mask, region = _frame_masks(faces, frames.shape[1], frames.shape[2])
        # Work on the face's bounding box only: the rest of the frame is returned untouched anyway,
        # and whole-frame float copies of a long video cost seconds and gigabytes.
        box = np.ascontiguousarray(frames[:, region[0], region[1]])
        before = _flicker(box, mask)
        progress = Progress(len(frames), "TemporalSmooth")
        import torch

        from ..engines.devices import torch_cuda_usable

        # on a GPU the per-frame filter steps are microseconds; on the CPU numpy runs row bands on threads
        device = "cuda" if torch_cuda_usable() else None
        # in place on `box` (already this node's own copy): one less box-sized allocation, which on a
        # minute of video is ~0.6 GB of fresh pages
        def run(on: str | None) -> np.ndarray:
            return smooth_frames(box, mask, method=method, strength=strength, fps=fps, device=on, out=box,
                                 progress=lambda done, total: progress.update(done - progress.done))

        try:
            smoothed = run(device)
        except torch.cuda.OutOfMemoryError:  # the box is written only after the GPU pass: still the input
            log.warning("TemporalSmooth: the face box of %d frames does not fit the GPU; smoothing on the CPU",
                        len(frames))
            torch.cuda.empty_cache()
            device = None
            smoothed = run(device)
        after = _flicker(smoothed, mask)
        frames[:, region[0], region[1]] = smoothed
        where = "lower face" if mask is not None else "whole frame"
        report = (f"{method} strength {strength:g} on the {where} ({device or 'cpu'}): frame-to-frame change "
                  f"{before * 255:.2f} -> {after * 255:.2f} (/255)")
        return (torch.from_numpy(frames), report)


def _frame_masks(faces: Any, height: int, width: int) -> tuple[np.ndarray, tuple[slice, slice]]:
    """TemporalSmooth's lower-face masks in frame space, over the box they can cover (vision.paste)."""
    from ..vision.paste import frame_space_masks

    return frame_space_masks(faces.crop_landmarks(), faces.inverse_affines(), faces.crop_size, height, width)


def _flicker(frames: np.ndarray, mask: np.ndarray | None, step: int = 2) -> float:
    """Mean |frame-to-frame change| (inside the mask) on every `step`-th pixel row/column: a report
    figure, so a quarter of the pixels is plenty and keeps it cheap on long videos."""
    if len(frames) < 2 or frames.size == 0:
        return 0.0
    total = weight_sum = 0.0
    sub = (slice(None, None, step), slice(None, None, step))
    for i in range(1, len(frames)):
        diff = np.abs(frames[i][sub] - frames[i - 1][sub]).mean(axis=-1)
        weight = None if mask is None else (mask[sub] if mask.ndim == 2 else mask[i][sub])
        total += float((diff * weight).sum()) if weight is not None else float(diff.sum())
        weight_sum += float(weight.sum()) if weight is not None else diff.size
    return total / max(weight_sum, 1e-6)


class VideoMux:
    """Frames + speech -> MP4 (H.264 yuv420p + AAC) in ComfyUI's output folder, probed and previewed."""

    DESCRIPTION = ("Encode with the ffmpeg bundled in imageio-ffmpeg (no system ffmpeg). Written atomically "
                   "(no partial files), even-sized, faststart; the result is probed so video and audio "
                   "durations agree within one frame.")

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        from ..media.mux import FORMATS, LENGTH_MODES

        return {
            "required": {
                "images": ("IMAGE",),
                "audio": ("AUDIO",),
                "fps": ("FLOAT", {"default": 25.0, "min": 1.0, "max": 240.0, "step": 0.01}),
                "format": (list(FORMATS), {"default": "mp4"}),
                "crf": ("INT", {"default": 18, "min": 0, "max": 63, "tooltip": "Lower = better quality, larger file."}),
                "length_mode": (list(LENGTH_MODES), {"default": "pad_audio",
                                "tooltip": "pad_audio: video length rules; hold_last_frame: audio length rules; "
                                           "trim: cut both to the shorter; stretch_none: change nothing."}),
                "filename_prefix": ("STRING", {"default": "digital_human/clone"}),
            },
        }

    RETURN_TYPES = ("VIDEO", "STRING", "STRING")
    RETURN_NAMES = ("video", "path", "report")
    FUNCTION = "mux"
    OUTPUT_NODE = True
    CATEGORY = CATEGORY

    def mux(self, images: Any, audio: dict, fps: float = 25.0, format: str = "mp4", crf: int = 18,
            length_mode: str = "pad_audio", filename_prefix: str = "digital_human/clone"):
        from ..audio import from_comfy_audio
        from ..media.mux import mux_video

        frames = image_to_uint8(images, "images")
        wave, rate = from_comfy_audio(audio)
        path, subfolder = next_output_path(filename_prefix, format)
        progress = Progress(len(frames), "VideoMux")
        report = mux_video(frames, wave, rate, fps, path, fmt=format, crf=crf, length_mode=length_mode,
                           progress=lambda done, total: progress.update(done - progress.done),
                           should_stop=interrupted)
        ui = {"images": [{"filename": path.name, "subfolder": subfolder, "type": "output"}], "animated": (True,),
              "text": [report.summary()]}
        return {"ui": ui, "result": (_video_value(path), str(path), report.summary())}


def next_output_path(prefix: str, fmt: str) -> tuple[Path, str]:
    """A fresh file name under the output folder; the prefix cannot leave that folder."""
    from ..paths import resolve_inside

    if in_comfyui():
        import folder_paths  # type: ignore[import-not-found]

        out_dir = folder_paths.get_output_directory()
        # get_save_image_path refuses prefixes that escape the output folder
        folder, name, counter, subfolder, _ = folder_paths.get_save_image_path(prefix, out_dir)
        base = Path(folder)
    else:
        root = output_directory()
        target = resolve_inside(prefix, root, what="filename_prefix")
        base, name, subfolder = target.parent, target.name, str(target.parent.relative_to(root.resolve()))
        counter = 1
    base.mkdir(parents=True, exist_ok=True)
    while True:
        path = base / f"{name}_{counter:05d}.{fmt}"
        if not path.exists():
            return path, ("" if subfolder == "." else subfolder)
        counter += 1


def _video_value(path: Path) -> Any:
    """ComfyUI's VIDEO type when available (core SaveVideo/preview nodes accept it), else the path."""
    try:
        from comfy_api.input_impl import VideoFromFile  # type: ignore[import-not-found]
    except ImportError:
        return str(path)
    return VideoFromFile(str(path))


NODE_CLASS_MAPPINGS = {
    "DH_LoadReferenceVideo": LoadReferenceVideo,
    "FaceAlign": FaceAlign,
    "TemporalSmooth": TemporalSmooth,
    "VideoMux": VideoMux,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "DH_LoadReferenceVideo": "Load Reference Video (Digital Human)",
    "FaceAlign": "Face Align (Digital Human)",
    "TemporalSmooth": "Temporal Smooth (Digital Human)",
    "VideoMux": "Video Mux (MP4)",
}
