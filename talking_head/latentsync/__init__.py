"""`latentsync`: LatentSync 1.6 (512x512) or 1.5 (256x256) (ByteDance; Apache-2.0 code, weights under the
licence on their Hugging Face model card, reported as CreativeML Open RAIL++-M) on the user's own release files:
audio-conditioned latent diffusion that redraws the mouth region of LatentSync's template-aligned face crop over windows of 16
frames. The networks and their files are in engines/latentsync; this folder is the talking-head side
(LatentSync's crop geometry from FaceAlign's mesh, restore mask, the windowed renderer)."""
from __future__ import annotations

from ..contract import TalkingHeadModel


# the node's inputs / the CLI's --set keys it reads (nodes/talking_head_nodes.py MODEL_SETTING_INPUTS): DDIM
# steps, guidance scale, the DeepCache-style cache interval; fast_path = the compiled path (pipeline.py)
OPTIONS = ("steps", "guidance", "deepcache", "fast_path")


def _generate(faces, wave, rate, fps, *, loop_mode, batch_size, strength, max_audio_seconds, backend, precision,
              avatar, progress, should_stop, streaming, steps=None, guidance=None, deepcache=None, fast_path=None):
    from ...fast_path import LATENTSYNC_COMPILE_ENV, LATENTSYNC_COST, announce, switch
    from .crops import latentsync_crops

    compile = bool(switch(fast_path, LATENTSYNC_COMPILE_ENV))  # the variable (1/0) overrides the switch
    if compile:
        announce("latentsync", LATENTSYNC_COST)
    return latentsync_crops(faces, wave, rate, fps, loop_mode=loop_mode, batch_size=batch_size, backend=backend,
                            precision=precision, max_audio_seconds=max_audio_seconds, progress=progress,
                            should_stop=should_stop, streaming=streaming, steps=steps, guidance=guidance,
                            deepcache=deepcache, compile=compile)


def _problem(model: str) -> str | None:
    from ...engines.latentsync.files import LatentSyncFilesError, locate
    from ...engines.latentsync.pipeline import switches_problem
    from ...optional_parts import join_problems

    try:
        locate()
        files = None
    except LatentSyncFilesError as exc:
        files = str(exc)
    # a mistyped speed switch is refused before the models load, not at the first window
    return join_problems(files, switches_problem())


MODEL = TalkingHeadModel(
    name="latentsync",
    summary="LatentSync 1.6 (512x512) / 1.5 (256x256) from the release files you placed (Apache-2.0 code; weights "
            "under their model card's licence, reported as CreativeML Open RAIL++-M: read it)",
    needs="the LatentSync release under models/digital_human/latentsync/ (latentsync_unet.pt, whisper/tiny.pt, "
          "configs/unet/stage2_512.yaml or stage2.yaml, latentsync/utils/mask.png, sd-vae-ft-mse/) and "
          "`pip install .[latentsync]`",
    speech_features="whisper-tiny encoder states (embedding + 4 blocks), 10 positions per video frame "
                    "(engines/latentsync/audio.py)",
    crop_size="512x512 (1.6) or 256x256 (1.5) of LatentSync's template-aligned face box, from FaceAlign's mesh",
    generate=_generate, problem=_problem, extra="latentsync", options=OPTIONS,
    modules=("diffusers", "transformers", "yaml"))
