"""Talking-head nodes: TRT_TalkingHead / TalkingHeadVideo (any model of talking_head/registry.py) and
TrainAvatar (+ LoadAvatar).

Recipes over talking_head/: the driver schedules reference frames to cover the speech, the model
generates the lower face, the driver pastes it back (or render_video streams it to the encoder).
"""
from __future__ import annotations

import logging
from typing import Any

from .comfy_glue import (Progress, check_output_prefix, check_plain_name, interrupted, require_fps,
                         without_server_paths)
from .image_convert import uint8_to_image

log = logging.getLogger("digital_human")

CATEGORY = "DigitalHuman"
BACKENDS = ["auto", "tensorrt", "torch", "onnxruntime"]
PRECISIONS = ["auto", "fp16", "fp32"]
VISEME_MODES = ["auto", "tts-only", "off"]  # talking_head.phone_source.VISEME_MODES (not imported at start-up)
VISEMES_TOOLTIP = ("auto: portrait shapes the mouth by the phones spoken (lips meet on p/b/m, round on o/u/w): "
                   "from TRT_TTS's phone timings when the speech comes from it, else from the English phone "
                   "aligner (pocketsphinx, when installed; the report says which, or why neither). tts-only: "
                   "TRT_TTS's timings only (use it for recordings in a language other than English). "
                   "off: loudness and spectrum only.")


IDLE_MOTION_MODES = ["auto", "off"]
IDLE_MOTION_TOOLTIP = ("auto: a photo blinks (~17 a minute), sways a little and nods on stressed syllables, as one "
                       "smooth warp of the head (background and frame edges stay still; `seed` picks the blinks and "
                       "sway); a video reference keeps its own motion. off: only the mouth moves.")


MOUTH_BANK_MODES = ["auto", "off"]


def _fast_path_tooltip() -> str:
    from ..fast_path import LATENTSYNC_COST, MUSETALK_COST, SONIC_COST

    return ("Models with a compiled path (musetalk, sonic, latentsync); others ignore it. " + MUSETALK_COST + " "
            + SONIC_COST + " " + LATENTSYNC_COST)
MOUTH_BANK_TOOLTIP = ("portrait on a video reference: auto takes each frame's lips and teeth from the person's own "
                      "frames (the reference video, or `bank_faces` when connected: another talking video of the "
                      "same person), the frame whose mouth shape best matches the speech, warped into place; a photo "
                      "keeps the drawn mouth. off: the drawn mouth interior everywhere. The report says whether the "
                      "bank ran and on how many frames.")


def _mouth_bank(mouth_bank: str, bank_faces: Any) -> Any:
    """generate_crops' mouth_bank: "off", the DH_FACES of another video of the person, or "auto"."""
    if mouth_bank not in MOUTH_BANK_MODES:
        raise ValueError(f"mouth_bank must be one of {MOUTH_BANK_MODES}, got {mouth_bank!r}")
    return "off" if mouth_bank == "off" else (bank_faces if bank_faces is not None else "auto")


def _idle_motion(idle_motion: str) -> bool:
    """Whether a photo gets idle motion (generate_crops applies it to photos only)."""
    if idle_motion not in IDLE_MOTION_MODES:
        raise ValueError(f"idle_motion must be one of {IDLE_MOTION_MODES}, got {idle_motion!r}")
    return idle_motion == "auto"


def _phones(audio: Any, wave: Any, rate: int, visemes: str, model: str, avatar: Any = None) -> Any:
    """PhoneSource: the AUDIO's phone timings (TRT_TTS's side channel), else the aligner's on its samples
    `wave` (visemes auto), for models that read phones; with a note for the report."""
    from ..audio.phone_channel import phones_from_audio
    from ..talking_head.phone_source import speech_phones
    from ..talking_head.registry import reads_phones

    return speech_phones(phones_from_audio(audio), wave, rate, visemes, model_reads_phones=reads_phones(model, avatar))


def _model_choices() -> list[str]:
    from ..talking_head.registry import model_choices

    return model_choices()


# Settings of the models that read them (TalkingHeadModel.options; today: sonic and latentsync, diffusion models);
# the others never see them. Defaults are the reference's; `steps` and `guidance` 0 = the model's own reference
# value (not passed), since the two models' references differ.
MODEL_SETTING_INPUTS: dict[str, Any] = {
    "steps": ("INT", {"default": 0, "min": 0, "max": 200, "tooltip": "Diffusion steps; 0 = the model's reference "
                      "(sonic 25, latentsync 20; LatentSync's README suggests 20-50)."}),
    "appearance_guidance": ("FLOAT", {"default": 2.0, "min": 0.0, "max": 20.0, "step": 0.1,
                                      "tooltip": "Guidance toward the photo's appearance (sonic; reference 2.0)."}),
    "audio_guidance": ("FLOAT", {"default": 7.5, "min": 0.0, "max": 20.0, "step": 0.1,
                                 "tooltip": "Guidance toward the speech (sonic; reference 7.5)."}),
    "dynamic_scale": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 3.0, "step": 0.05,
                                "tooltip": "Head motion amount: scales the motion buckets (sonic; reference 1.0)."}),
    "vram": (["auto", "high", "low"], {"default": "auto", "tooltip": "sonic: high batches the three guidance "
                                       "branches; low runs them one by one (fits 12 GB cards); auto picks by memory."}),
    "paste_back": ("BOOLEAN", {"default": False, "tooltip": "sonic: put the moving face crop back into the photo "
                                                            "(feathered border) instead of returning the crop."}),
    "resolution": ("INT", {"default": 512, "min": 128, "max": 1024, "step": 64,
                           "tooltip": "sonic: short side of the generated frames (reference 512)."}),
    "speed": (["reference", "fast", "fastest"], {"default": "reference", "tooltip": "sonic: reference = the "
                                                 "reference's settings; fast = at most 8 steps, fastest = at most 5, "
                                                 "with the UNet's deep features reused every 2nd step (approximate: "
                                                 "the measured difference is in docs/sonic.md)."}),
    "guidance": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 10.0, "step": 0.1,
                           "tooltip": "latentsync: classifier-free guidance toward the speech; 0 = the reference's "
                                      "1.5 (its README: 1.0-3.0; 1.0 = no guidance, half the UNet work)."}),
    "deepcache": ("INT", {"default": 0, "min": 0, "max": 10,
                          "tooltip": "latentsync: 0 = exact frames; 2-10 = DeepCache-style faster mode, a full UNet "
                                     "every n-th step and a cheap one between (the reference's inference.sh uses 3); "
                                     "changes the frames (measured difference in benchmarks/RESULTS.md)."}),
}
# 0 means "the model's reference value": not passed (the model then uses its own default)
_MODEL_DEFAULT_ZERO = ("steps", "guidance")


def _settings(seed: int, values: dict[str, Any]) -> dict[str, Any]:
    """The model settings the node was given (generate_crops passes each only to models that read it)."""
    return {"seed": seed, **{k: v for k, v in values.items() if k in MODEL_SETTING_INPUTS and v is not None
                             and not (k in _MODEL_DEFAULT_ZERO and v == 0)}}


class TRT_TalkingHead:
    """Lip-synced frames of the face in DH_FACES speaking the AUDIO."""

    DESCRIPTION = ("Animate the mouth of the aligned face from speech. 'portrait' works zero-shot on any photo or "
                   "video (no weights); 'clone:<name>' uses a generator trained by TrainAvatar on that person; "
                   "'musetalk' runs MuseTalk 1.5 from the release's files the user placed in "
                   "models/digital_human/musetalk/ (MIT code, weights released for commercial use; sd-vae-ft-mse "
                   "and whisper-tiny MIT); 'wav2lip' runs Wav2Lip from the checkpoint the user placed in "
                   "models/digital_human/wav2lip/ (wav2lip.pth or wav2lip_gan.pth; licence: personal / research / "
                   "non-commercial use only, commercial use prohibited by its authors). "
                   "'sonic' runs Sonic (CVPR 2025) from the release the user placed in "
                   "models/digital_human/sonic/ and moves the whole head: NON-COMMERCIAL - Sonic's weights are "
                   "CC BY-NC-SA 4.0 and Stable Video Diffusion img2vid-xt's are under Stability AI's non-commercial "
                   "community licence; its frames are its own face crop (paste_back puts them into the photo). "
                   "'latentsync' runs LatentSync 1.6 (512x512; or 1.5 at 256x256 for small "
                   "cards) from the release's files placed in models/digital_human/latentsync/ (Apache-2.0 code; "
                   "weights under the licence on their Hugging Face model card, reported as CreativeML Open RAIL++-M: "
                   "use restrictions apply - read the card; diffusion, 20 steps per 16-frame window: slow, best quality). "
                   "Video references are looped / ping-ponged / held to cover the audio; only the lower face changes, "
                   "except that a photo also blinks and moves its head a little (idle_motion).")

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "faces": ("DH_FACES",),
                "audio": ("AUDIO",),
                "model": (_model_choices(), {"default": "portrait"}),
                "fps": ("FLOAT", {"default": 25.0, "min": 1.0, "max": 120.0, "step": 0.01,
                                  "tooltip": "Output frame rate (the one clock used by VideoMux too)."}),
                "loop_mode": (["ping-pong", "loop", "hold"], {"default": "ping-pong"}),
                "batch_size": ("INT", {"default": 0, "min": 0, "max": 512,
                                       "tooltip": "Frames per generator call. 0 = automatic: for clone sized to the "
                                                  "free GPU memory (up to 64), 32 on CPU; for portrait 64."}),
                "strength": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 2.0, "step": 0.05,
                                       "tooltip": "Mouth motion amplitude (portrait)."}),
                "max_audio_seconds": ("FLOAT", {"default": 600.0, "min": 1.0, "max": 7200.0, "step": 1.0}),
                "backend": (BACKENDS, {"default": "auto"}),
                "precision": (PRECISIONS, {"default": "auto"}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 2**31 - 1,
                                 "tooltip": "Seeds a photo's idle motion (blinks, sway); the models themselves are "
                                            "deterministic."}),
            },
            "optional": {"avatar": ("DH_AVATAR", {"tooltip": "A clone model straight from TrainAvatar / "
                                                             "LoadAvatar; overrides `model`."}),
                         "visemes": (VISEME_MODES, {"default": "auto", "tooltip": VISEMES_TOOLTIP}),
                         "idle_motion": (IDLE_MOTION_MODES, {"default": "auto", "tooltip": IDLE_MOTION_TOOLTIP}),
                         "mouth_bank": (MOUTH_BANK_MODES, {"default": "auto", "tooltip": MOUTH_BANK_TOOLTIP}),
                         "bank_faces": ("DH_FACES", {"tooltip": "Optional (portrait, mouth_bank auto): FaceAlign of "
                                                                "another talking video of the same person to take "
                                                                "the mouths from, instead of the reference itself."}),
                         "fast_path": ("BOOLEAN", {"default": False, "tooltip": _fast_path_tooltip()}),
                         **MODEL_SETTING_INPUTS},
        }

    RETURN_TYPES = ("IMAGE", "DH_FACES", "STRING")
    RETURN_NAMES = ("frames", "faces", "report")
    FUNCTION = "animate"
    CATEGORY = CATEGORY

    @classmethod
    def VALIDATE_INPUTS(cls, model: str = "portrait") -> bool | str:
        # checked per prompt, not from the start-up menu: avatars trained since start-up are accepted, and
        # a model's missing files (the user's own) are named before the run starts
        from ..talking_head.registry import model_problem

        problem = model_problem(model)
        return without_server_paths(problem) if problem else True

    def animate(self, faces: Any, audio: dict, model: str = "portrait", fps: float = 25.0,
                loop_mode: str = "ping-pong", batch_size: int = 0, strength: float = 1.0,
                max_audio_seconds: float = 600.0, backend: str = "auto", precision: str = "auto", seed: int = 0,
                avatar: Any = None, visemes: str = "auto", idle_motion: str = "auto", mouth_bank: str = "auto",
                bank_faces: Any = None, fast_path: bool = False, **model_settings: Any):
        from ..audio import from_comfy_audio
        from ..talking_head.driver import paste_generated, phase_progress
        from ..talking_head.registry import generate_crops

        fps = require_fps(fps, "TRT_TalkingHead")
        wave, rate = from_comfy_audio(audio)
        progress: Progress | None = None

        def report_progress(done: int, total: int) -> None:
            nonlocal progress
            progress = progress or Progress(total, "TalkingHead")
            progress.update(done - progress.done)

        _check_output_memory(faces, wave, rate, fps)
        phones = _phones(audio, wave, rate, visemes, model, avatar)
        gen = generate_crops(faces, wave, rate, model, fps, loop_mode, batch_size, strength, max_audio_seconds,
                              backend, precision, avatar, phase_progress(report_progress, 0), interrupted,
                              phones=phones.phones, idle_motion=_idle_motion(idle_motion), seed=seed,
                              mouth_bank=_mouth_bank(mouth_bank, bank_faces), fast_path=bool(fast_path),
                              settings=_settings(seed, model_settings))
        result = paste_generated(gen, 64, phase_progress(report_progress, 1), should_stop=interrupted)
        for warning in result.warnings:
            log.warning("TRT_TalkingHead: %s", warning)
        report = "\n".join(filter(None, [result.summary(), phones.note]))
        return {"ui": {"text": [report]}, "result": (uint8_to_image(result.frames), result.track, report)}


def _check_output_memory(faces: Any, wave: Any, rate: int, fps: float) -> None:
    """TRT_TalkingHead returns every output frame as a float IMAGE (plus a uint8 copy while pasting)."""
    import math

    import numpy as np

    from .memory_guard import image_bytes, require_memory

    frames = getattr(faces, "frames", None)
    if frames is None or not fps or fps <= 0 or not rate:
        return
    height, width = frames.shape[1:3]
    n_out = math.ceil(np.asarray(wave).shape[-1] / float(rate) * fps)
    require_memory(image_bytes(n_out, height, width) + image_bytes(n_out, height, width, 1), "TRT_TalkingHead",
                   f"{n_out} output frames of {width}x{height}", "shorten the speech, lower the reference size "
                   "(LoadReferenceVideo's max_side) or use Talking Head to Video, which streams frames to the file")


class TalkingHeadVideo:
    """TRT_TalkingHead -> TemporalSmooth -> VideoMux in one node, frames kept on the GPU."""

    DESCRIPTION = ("The talking head straight to a video file: the mouths are generated as in TRT_TalkingHead, then "
                   "pasted back, smoothed (TemporalSmooth) and encoded (VideoMux) with the frames kept on the GPU and "
                   "streamed to the encoder - the same frames to rounding, 1.6-2.6x faster on an H200 (no float IMAGE "
                   "between nodes). Use the three separate nodes when you want to edit the frames in between. "
                   "Models and their licences as in TRT_TalkingHead ('wav2lip': personal / research / "
                   "non-commercial use only).")

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        from ..media.mux import FORMATS

        head = TRT_TalkingHead.INPUT_TYPES()
        required = dict(head["required"])
        required.update({
            "smooth_strength": ("FLOAT", {"default": 0.5, "min": 0.0, "max": 1.0, "step": 0.05,
                                          "tooltip": "TemporalSmooth's strength on the lower face (0 = off)."}),
            "format": (list(FORMATS), {"default": "mp4"}),
            "crf": ("INT", {"default": 18, "min": 0, "max": 63, "tooltip": "Lower = better quality, larger file."}),
            "filename_prefix": ("STRING", {"default": "digital_human/clone"}),
        })
        return {"required": required, "optional": head["optional"]}

    RETURN_TYPES = ("VIDEO", "STRING", "STRING")
    RETURN_NAMES = ("video", "path", "report")
    FUNCTION = "render"
    OUTPUT_NODE = True
    CATEGORY = CATEGORY

    @classmethod
    def VALIDATE_INPUTS(cls, model: str = "portrait", filename_prefix: str = "digital_human/clone") -> bool | str:
        checked = TRT_TalkingHead.VALIDATE_INPUTS(model)
        return checked if checked is not True else check_output_prefix(filename_prefix)

    def render(self, faces: Any, audio: dict, model: str = "portrait", fps: float = 25.0,
               loop_mode: str = "ping-pong", batch_size: int = 0, strength: float = 1.0,
               max_audio_seconds: float = 600.0, backend: str = "auto", precision: str = "auto", seed: int = 0,
               smooth_strength: float = 0.5, format: str = "mp4", crf: int = 18,
               filename_prefix: str = "digital_human/clone", avatar: Any = None, visemes: str = "auto",
               idle_motion: str = "auto", mouth_bank: str = "auto", bank_faces: Any = None,
               fast_path: bool = False, **model_settings: Any):
        from ..audio import from_comfy_audio
        from ..talking_head.registry import generate_crops
        from ..talking_head.render_video import render_talking_video
        from .video_nodes import _video_value, next_output_path

        fps = require_fps(fps, "TalkingHeadVideo")
        wave, rate = from_comfy_audio(audio)
        progress = Progress(100, "TalkingHeadVideo")

        def report_progress(share_start: int, share: int):  # phases of the one bar: generate 0-40, video 40-100
            return lambda done, total: progress.update(share_start + share * done // max(total, 1) - progress.done)

        path, subfolder = next_output_path(filename_prefix, format)  # a bad prefix fails before any work
        phones = _phones(audio, wave, rate, visemes, model, avatar)
        # crops are made chunk by chunk while the video is encoded: memory does not grow with the length
        gen = generate_crops(faces, wave, rate, model, fps, loop_mode, batch_size, strength, max_audio_seconds,
                              backend, precision, avatar, None, interrupted, streaming=True,
                              phones=phones.phones, idle_motion=_idle_motion(idle_motion), seed=seed,
                              mouth_bank=_mouth_bank(mouth_bank, bank_faces), fast_path=bool(fast_path),
                              settings=_settings(seed, model_settings))
        result = render_talking_video(gen, wave, rate, path, smooth_method="one_euro",
                                      smooth_strength=smooth_strength, fmt=format, crf=crf,
                                      progress=report_progress(0, 100), should_stop=interrupted)
        for warning in result.warnings:
            log.warning("TalkingHeadVideo: %s", warning)
        report = "\n".join(filter(None, [f"{gen.model} ({gen.backend}): {len(gen)} frames generated",
                                          result.summary(), result.mux.summary(), phones.note]))
        ui = {"images": [{"filename": path.name, "subfolder": subfolder, "type": "output"}], "animated": (True,),
              "text": [report]}
        return {"ui": ui, "result": (_video_value(result.path), str(result.path), report)}


class TrainAvatar:
    """Train the person-specific 'clone' generator on a talking video of one person."""

    DESCRIPTION = ("Trains a small lower-face generator on >= 20 s of talking video (DH_FACES of the video + its "
                   "own audio). Saves safetensors + ONNX under models/digital_human/avatars/<name>; resumes after "
                   "interruption; works on CPU (slowly, with an estimate) and CUDA.")

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        from ..talking_head.clone.train import DEFAULT_STEPS

        return {
            "required": {
                "faces": ("DH_FACES",),
                "audio": ("AUDIO", {"tooltip": "The video's own sound track."}),
                "name": ("STRING", {"default": "my_avatar"}),
                "steps": ("INT", {"default": DEFAULT_STEPS, "min": 10, "max": 200000}),
                "time_budget_minutes": ("FLOAT", {"default": 10.0, "min": 0.5, "max": 600.0, "step": 0.5,
                                                  "tooltip": "Stop after this long even if steps remain."}),
                "device": (["auto", "cuda", "cpu"], {"default": "auto"}),
                "resume": ("BOOLEAN", {"default": True}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 2**31 - 1}),
            },
            "optional": {
                "visemes": ("BOOLEAN", {"default": False, "tooltip": (
                    "Also learn the mouth from the footage's phones (offline aligner, English speech) and from the "
                    "portrait model's mouth drive of the same speech: the avatar then reads the TTS's phone timings "
                    "too. Off: audio only, as before.")}),
            },
        }

    RETURN_TYPES = ("DH_AVATAR", "STRING")
    RETURN_NAMES = ("avatar", "report")
    FUNCTION = "train"
    OUTPUT_NODE = True
    CATEGORY = CATEGORY

    @classmethod
    def VALIDATE_INPUTS(cls, name: str = "my_avatar") -> bool | str:
        from ..talking_head.clone.avatar_store import sanitize_name

        if not str(name or "").strip():
            return "name is empty: give the avatar a name such as 'my_avatar' (TalkingHead lists it as clone:<name>)."
        plain = check_plain_name(name, "name", "my_avatar", "ComfyUI's models folder under digital_human/avatars/")
        if plain is not True:
            return plain
        try:
            sanitize_name(name)
        except ValueError as exc:
            return f"name: {exc}"
        return True

    def train(self, faces: Any, audio: dict, name: str = "my_avatar", steps: int | None = None,
              time_budget_minutes: float = 10.0, device: str = "auto", resume: bool = True, seed: int = 0,
              visemes: bool = False):
        from ..audio import from_comfy_audio
        from ..talking_head.clone.train import DEFAULT_STEPS, train_avatar

        steps = DEFAULT_STEPS if steps is None else steps
        wave, rate = from_comfy_audio(audio)
        progress = Progress(steps, "TrainAvatar")
        status_lines: list[str] = []

        def on_step(step: int, total: int, loss: float) -> None:
            if step % 50 == 0 or step == total:
                log.info("TrainAvatar: step %d/%d loss %.4f", step, total, loss)
            progress.update(step - progress.done)

        avatar = train_avatar(faces, wave, rate, name, steps=steps, time_budget_s=time_budget_minutes * 60.0,
                              device=device, resume=resume, seed=seed, progress=on_step,
                              should_stop=interrupted, status=status_lines.append, visemes=bool(visemes))
        # every warning (e.g. a budget too short for a usable avatar) plus the last few status lines
        warnings = [line for line in status_lines if line.startswith("warning:")]
        recent = [line for line in status_lines[-5:] if line not in warnings]
        report = "\n".join([avatar.summary() if hasattr(avatar, "summary") else str(avatar)] + warnings + recent)
        return {"ui": {"text": [report]}, "result": (avatar, report)}


class LoadAvatar:
    """A trained avatar by name (for TRT_TalkingHead's clone model or to inspect it)."""

    DESCRIPTION = "List and load an avatar trained by TrainAvatar."

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        from ..talking_head.clone.avatar_store import list_avatars

        return {"required": {"name": (list_avatars() or [""],)}}

    RETURN_TYPES = ("DH_AVATAR", "STRING")
    RETURN_NAMES = ("avatar", "report")
    FUNCTION = "load"
    CATEGORY = CATEGORY

    def load(self, name: str):
        from ..talking_head.clone.avatar_store import load_avatar

        avatar = load_avatar(name)
        return (avatar, avatar.summary() if hasattr(avatar, "summary") else str(avatar))


NODE_CLASS_MAPPINGS = {"TRT_TalkingHead": TRT_TalkingHead, "TalkingHeadVideo": TalkingHeadVideo,
                       "TrainAvatar": TrainAvatar, "DH_LoadAvatar": LoadAvatar}
NODE_DISPLAY_NAME_MAPPINGS = {
    "TRT_TalkingHead": "Talking Head (TensorRT)",
    "TalkingHeadVideo": "Talking Head to Video (fast, GPU)",
    "TrainAvatar": "Train Avatar (clone model)",
    "DH_LoadAvatar": "Load Avatar",
}
