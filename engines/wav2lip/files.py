"""Where the user's Wav2Lip checkpoints go (the release's own file names) and which one is used.

Under the pack's models folder (paths.models_root(), e.g. ComfyUI/models/digital_human/):

    wav2lip/wav2lip.pth       the plain generator (most accurate lip-sync)      (github.com/Rudrabha/Wav2Lip README)
    wav2lip/wav2lip_gan.pth   the generator trained with the visual-quality discriminator (sharper mouth)

One of the two is enough. Which one runs: DIGITAL_HUMAN_WAV2LIP_CHECKPOINT=auto|wav2lip|wav2lip_gan (auto: the
GAN checkpoint when it is there, else the plain one); the report says which. Nothing is downloaded; both are
read with torch.load(weights_only=True) (no pickled code runs). The face detector checkpoint the reference
uses (s3fd.pth) is not needed: faces come from FaceAlign.

LICENCE: the repository's README says "This repository can only be used for personal/research/non-commercial
purposes" and "any form of commercial use is strictly prohibited" (the models are trained on LRS2); commercial
requests go to the authors (sync.so).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

FOLDER = "wav2lip"
CHECKPOINTS = ("wav2lip_gan", "wav2lip")  # auto-pick order
CHECKPOINT_ENV = "DIGITAL_HUMAN_WAV2LIP_CHECKPOINT"
SOURCE = ("the links in the Wav2Lip README (github.com/Rudrabha/Wav2Lip, 'Getting the weights': "
          "Wav2Lip / Wav2Lip + GAN)")
LICENCE_NOTE = ("Wav2Lip (Rudrabha/Wav2Lip): personal / research / non-commercial use only, commercial use "
                "strictly prohibited (trained on LRS2); place wav2lip.pth or wav2lip_gan.pth yourself, nothing is "
                "downloaded")


class Wav2LipFilesError(FileNotFoundError):
    """No Wav2Lip checkpoint is where it goes; the message says both names and where they go."""


class Wav2LipWeightsError(ValueError):
    """A Wav2Lip checkpoint is present but is not the release's format (keys, shapes)."""


def wav2lip_root(models_root: str | Path | None = None) -> Path:
    """<models root>/wav2lip (not created)."""
    if models_root is None:
        from ...paths import models_root as _root

        models_root = _root()
    return Path(models_root) / FOLDER


@dataclass(frozen=True)
class Wav2LipFiles:
    root: Path
    checkpoint: Path     # the one used
    kind: str            # "wav2lip" or "wav2lip_gan"
    why: str             # how it was chosen, for the report


def file_status(models_root: str | Path | None = None) -> list[tuple[str, bool, str]]:
    """(relative path, present?, source) for both checkpoints (either one suffices)."""
    root = wav2lip_root(models_root)
    return [(f"{k}.pth", (root / f"{k}.pth").is_file(), SOURCE) for k in ("wav2lip", "wav2lip_gan")]


def requested_checkpoint(choice: str | None = None) -> str:
    """"auto", "wav2lip" or "wav2lip_gan" (None: the environment variable, else auto)."""
    value = choice if choice is not None else (os.environ.get(CHECKPOINT_ENV, "").strip() or "auto")
    if value not in ("auto",) + CHECKPOINTS:
        raise ValueError(f"Wav2Lip checkpoint must be auto, wav2lip or wav2lip_gan (option or {CHECKPOINT_ENV}), "
                         f"got {value!r}")
    return value


def locate(models_root: str | Path | None = None, checkpoint: str | None = None) -> Wav2LipFiles:
    """The checkpoint to use, or Wav2LipFilesError naming every file that could be placed and where."""
    root = wav2lip_root(models_root)
    want = requested_checkpoint(checkpoint)
    present = {k: root / f"{k}.pth" for k in CHECKPOINTS if (root / f"{k}.pth").is_file()}
    if want != "auto":
        if want in present:
            return Wav2LipFiles(root, present[want], want, f"{want}.pth (asked for)")
        raise Wav2LipFilesError(
            f"Wav2Lip: the checkpoint asked for is missing (nothing is downloaded):\n  - {root / (want + '.pth')}"
            f"  <- {SOURCE}\nPlace it exactly there, or unset {CHECKPOINT_ENV} to use the one that is present.")
    if present:
        kind = next(k for k in CHECKPOINTS if k in present)
        other = "wav2lip.pth" if kind == "wav2lip_gan" else "wav2lip_gan.pth"
        why = f"{kind}.pth (auto: " + ("the GAN checkpoint is preferred when present" if kind == "wav2lip_gan"
                                        else f"{other} is not there") + ")"
        return Wav2LipFiles(root, present[kind], kind, why)
    raise Wav2LipFilesError(
        f"Wav2Lip needs one of its 2 checkpoints under {root} (the release's own file names; nothing is "
        f"downloaded):\n  - {root / 'wav2lip.pth'}  <- {SOURCE}\n  - {root / 'wav2lip_gan.pth'}  (or this one; "
        f"used first when present)  <- {SOURCE}\nDownload one (personal / research / non-commercial use only) "
        "and place it exactly there.")
