"""`sonic`: Sonic (Tencent / Zhejiang University, CVPR 2025) on the user's own release files: Stable Video
Diffusion img2vid-xt with Sonic's audio adapters animates the whole head of one photo from speech. A whole-frame
model (contract kind): it returns the frames of its own face crop (or pasted back into the photo). Networks and
files are in engines/sonic; the framing (crop.py), the pipeline (pipeline.py) and the contract glue (model.py) here.
LICENCE: Sonic's weights CC BY-NC-SA 4.0; SVD-XT's weights Stability AI's non-commercial community licence."""
from __future__ import annotations

from ..contract import TalkingHeadModel

OPTIONS = ("steps", "appearance_guidance", "audio_guidance", "dynamic_scale", "seed", "vram", "paste_back",
           "resolution", "speed", "fast_path")


def _generate(faces, wave, rate, fps, *, loop_mode, batch_size, strength, max_audio_seconds, backend, precision,
              avatar, progress, should_stop, streaming, fast_path=None, **settings):
    from ...fast_path import SONIC_COMPILE_ENV, SONIC_COST, announce, switch
    from .model import sonic_frames

    compile_unet = bool(switch(fast_path, SONIC_COMPILE_ENV))  # the variable (1/0) overrides the switch
    if compile_unet:
        announce("sonic", SONIC_COST)
    return sonic_frames(faces, wave, rate, fps, backend=backend, precision=precision,
                        max_audio_seconds=max_audio_seconds, progress=progress, should_stop=should_stop,
                        streaming=streaming, compile_unet=compile_unet, **settings)


def _problem(model: str) -> str | None:
    from ...engines.sonic.files import SonicFilesError, locate

    try:
        locate()
    except SonicFilesError as exc:
        return str(exc)
    import importlib.util

    missing = [m for m in ("diffusers", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        return f"sonic needs {', '.join(missing)}: pip install .[sonic]"
    return None


MODEL = TalkingHeadModel(
    name="sonic",
    summary="Sonic (CVPR 2025, on Stable Video Diffusion) from the release files you placed: the whole head moves "
            "(NON-COMMERCIAL: Sonic weights CC BY-NC-SA 4.0, SVD-XT under Stability AI's non-commercial community "
            "licence)",
    needs="the Sonic release under models/digital_human/sonic/ (Sonic/, RIFE/, whisper-tiny/, and SVD-XT as "
          "stable-video-diffusion-img2vid-xt/ there or ComfyUI's models/checkpoints/svd_xt*.safetensors) and "
          "`pip install .[sonic]`",
    speech_features="whisper-tiny encoder states: 10-frame token windows and 50-frame motion windows per video frame",
    crop_size="the reference's expanded square face crop at 512 px on the short side (multiples of 64)",
    generate=_generate, problem=_problem, kind="whole-frame", options=OPTIONS, extra="sonic",
    modules=("diffusers", "transformers"))
