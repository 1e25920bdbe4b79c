"""The one contract every talking-head model meets (the registry in registry.py holds one entry per model).

A model takes the aligned faces of a reference (`DH_FACES`: a FaceTrack) and speech. Two kinds (DESIGN 5b):
- "mouth-crop" models return a `GeneratedCrops`: one generated crop per output frame (or a renderer that makes
  them on demand), which the shared driver pastes back (node path) or render_video streams to the encoder.
- "whole-frame" models (Sonic) make the moving head's frames themselves and return a `GeneratedFrames`: full
  output frames of the model's own framing (or pasted back into the photo where the model can do that without
  seams); the driver and render_video pass them through, with no paste-back or mouth smoothing.
What differs per model is said here, so the CLI, the nodes and the benchmarks need no per-model code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from .driver import GeneratedCrops, GeneratedFrames

KINDS = ("mouth-crop", "whole-frame")


class CropGenerator(Protocol):
    def __call__(self, faces: Any, wave: Any, rate: int, fps: float, *, loop_mode: str, batch_size: int,
                 strength: float, max_audio_seconds: float, backend: str, precision: str, avatar: Any,
                 progress: Callable[[int, int], None] | None, should_stop: Callable[[], bool] | None,
                 streaming: bool) -> GeneratedCrops | GeneratedFrames: ...


def _always_ready(model: str) -> str | None:
    return None


@dataclass(frozen=True)
class TalkingHeadModel:
    name: str                      # the `model` value users pick (`clone` is picked as `clone:<avatar name>`)
    summary: str                   # one line for help texts and node descriptions
    needs: str                     # what the user must provide beyond a face and speech ("" = nothing)
    speech_features: str          # what it reads from the audio
    crop_size: str                 # the crop it generates, in words (fixed, or chosen per face/avatar)
    generate: CropGenerator
    # `model` (e.g. "musetalk" or "clone:anna") -> None when it can run now, else a message naming
    # every missing file / avatar and where it goes; called before any work starts (CLI, node validation)
    problem: Callable[[str], str | None] = _always_ready
    per_avatar: bool = False       # picked as `<name>:<avatar>`; menus list one entry per avatar
    # generate() also takes `phones=` (phone, start_s, end_s) timings of the speech (visemes.py), passed
    # when known (the TTS's side channel); models without it never see the keyword. A callable decides
    # per avatar (DH_AVATAR or name; `clone`: only avatars trained with visemes) - see registry.reads_phones
    reads_phones: bool | Callable[[Any], bool] = False
    # its crops are made at whatever size the faces were aligned at, so a large face may be aligned at a
    # larger crop to keep its detail (crop_choice.py); False: the model fixes its own crop size
    adaptive_crop: bool = False
    # extra keywords its generate() takes, passed only when the caller sets them (e.g. portrait's
    # "mouth_bank", musetalk's "fast_path": compiled/CUDA-graph generation, fast_path.py); models without
    # an option never see its keyword
    options: tuple[str, ...] = ()
    # the pyproject extra that installs its Python dependencies ("" = the core install has them) and the
    # top-level modules that extra provides; checked without importing them (optional_parts.py) before
    # any work, so a missing extra is named with its pip line instead of failing later with a traceback
    extra: str = ""
    modules: tuple[str, ...] = ()
    # "mouth-crop": generate() returns GeneratedCrops (the driver pastes the lower face); "whole-frame": it returns
    # GeneratedFrames (whole frames, the head moving; no paste-back, idle motion or mouth smoothing is added)
    kind: str = "mouth-crop"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"TalkingHeadModel.kind must be one of {KINDS}, got {self.kind!r}")
