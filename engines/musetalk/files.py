"""Where MuseTalk 1.5's files go (the release's own layout, unchanged) and how they are read safely.

Under the pack's models folder (paths.models_root(), e.g. ComfyUI/models/digital_human/):

    musetalk/musetalkV15/musetalk.json   UNet config        (huggingface.co/TMElyralab/MuseTalk)
    musetalk/musetalkV15/unet.pth        UNet weights
    musetalk/sd-vae/config.json          VAE config         (huggingface.co/stabilityai/sd-vae-ft-mse)
    musetalk/sd-vae/diffusion_pytorch_model.safetensors | .bin
    musetalk/whisper/config.json         audio encoder      (huggingface.co/openai/whisper-tiny)
    musetalk/whisper/preprocessor_config.json
    musetalk/whisper/model.safetensors | pytorch_model.bin
    optional:
    musetalk/face-parse-bisent/79999_iter.pth         BiSeNet face parsing (the paste mask as the reference
                                                      makes it; without it the face mesh gives the mask)
    musetalk/face-parse-bisent/resnet18-5c106cde.pth  its ImageNet backbone (read by the reference, not needed
                                                      here: 79999_iter.pth holds every backbone weight; checked)

Nothing is downloaded. Weights are read with safetensors when that file exists, else with
torch.load(weights_only=True) (no pickled code runs).
LICENCE: MuseTalk's code is MIT and its weights are released for any use including commercial;
sd-vae-ft-mse is MIT; whisper-tiny is MIT.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

LICENCE_NOTE = ("MuseTalk 1.5 (TMElyralab, MIT code; weights released for commercial use), sd-vae-ft-mse (MIT), "
                "whisper-tiny (MIT); place the files yourself, nothing is downloaded")
FOLDER = "musetalk"

# (relative path, alternatives that count as the same file, where to get it)
_UNET_SRC = "huggingface.co/TMElyralab/MuseTalk (folder musetalkV15)"
_VAE_SRC = "huggingface.co/stabilityai/sd-vae-ft-mse"
_WHISPER_SRC = "huggingface.co/openai/whisper-tiny"
REQUIRED: tuple[tuple[tuple[str, ...], str], ...] = (
    (("musetalkV15/musetalk.json",), _UNET_SRC),
    (("musetalkV15/unet.pth",), _UNET_SRC),
    (("sd-vae/config.json",), _VAE_SRC),
    (("sd-vae/diffusion_pytorch_model.safetensors", "sd-vae/diffusion_pytorch_model.bin"), _VAE_SRC),
    (("whisper/config.json",), _WHISPER_SRC),
    (("whisper/preprocessor_config.json",), _WHISPER_SRC),
    (("whisper/model.safetensors", "whisper/pytorch_model.bin"), _WHISPER_SRC),
)


# Optional: never block a run; `setup --check musetalk` lists them as optional. Names as MuseTalk's
# download_weights.sh writes them (models/face-parse-bisent/).
_PARSE_SRC = ("the MuseTalk README's 'face-parse-bisent' link (drive.google.com, file id "
              "154JgKpzCPW82qINcVieuPH3fZ2e0P812; zllrunning/face-parsing.PyTorch)")
_RESNET_SRC = "download.pytorch.org/models/resnet18-5c106cde.pth"
OPTIONAL: tuple[tuple[str, str], ...] = (
    ("face-parse-bisent/79999_iter.pth", _PARSE_SRC),
    ("face-parse-bisent/resnet18-5c106cde.pth", _RESNET_SRC),
)


class MuseTalkFilesError(FileNotFoundError):
    """One or more MuseTalk files are missing; the message lists every one and where it goes."""


class MuseTalkWeightsError(ValueError):
    """A MuseTalk file is present but does not match the architecture (keys, shapes, config)."""


def musetalk_root(models_root: str | Path | None = None) -> Path:
    """<models root>/musetalk (not created)."""
    if models_root is None:
        from ...paths import models_root as _root

        models_root = _root()
    return Path(models_root) / FOLDER


@dataclass(frozen=True)
class MuseTalkFiles:
    root: Path
    unet_config: Path
    unet_weights: Path
    vae_config: Path
    vae_weights: Path
    whisper_config: Path
    whisper_preprocessor: Path
    whisper_weights: Path
    face_parsing: Path | None = None           # optional BiSeNet (79999_iter.pth), None when absent
    face_parsing_backbone: Path | None = None  # optional resnet18-5c106cde.pth, None when absent

    @property
    def whisper_dir(self) -> Path:
        return self.whisper_config.parent


def file_status(models_root: str | Path | None = None) -> list[tuple[str, bool, str]]:
    """(relative path shown to the user, present?, source) for every required file."""
    root = musetalk_root(models_root)
    out = []
    for names, source in REQUIRED:
        found = next((n for n in names if (root / n).is_file()), None)
        out.append((found or " or ".join(names), found is not None, source))
    return out


def optional_status(models_root: str | Path | None = None) -> list[tuple[str, bool, str]]:
    """(relative path, present?, source) for the optional files (face parsing)."""
    root = musetalk_root(models_root)
    return [(name, (root / name).is_file(), source) for name, source in OPTIONAL]


def locate(models_root: str | Path | None = None) -> MuseTalkFiles:
    """The release's files under the models folder, or MuseTalkFilesError listing every missing one."""
    root = musetalk_root(models_root)
    missing = [(name, source) for name, present, source in file_status(models_root) if not present]
    if missing:
        lines = "\n".join(f"  - {root / name.split(' or ')[0]}" + (f"  (or {name.split(' or ')[1]})" if " or " in name
                                                                   else "") + f"  <- {source}"
                          for name, source in missing)
        raise MuseTalkFilesError(
            f"MuseTalk 1.5 needs {len(missing)} more file(s) under {root} (the release's own layout; nothing is "
            f"downloaded):\n{lines}\nDownload them from the pages named and place them exactly there.")

    def pick(*names: str) -> Path:
        return next(root / n for n in names if (root / n).is_file())

    return MuseTalkFiles(
        root=root, unet_config=root / "musetalkV15/musetalk.json", unet_weights=root / "musetalkV15/unet.pth",
        vae_config=root / "sd-vae/config.json",
        vae_weights=pick("sd-vae/diffusion_pytorch_model.safetensors", "sd-vae/diffusion_pytorch_model.bin"),
        whisper_config=root / "whisper/config.json", whisper_preprocessor=root / "whisper/preprocessor_config.json",
        whisper_weights=pick("whisper/model.safetensors", "whisper/pytorch_model.bin"),
        face_parsing=next((root / n for n, present, _ in optional_status(models_root)[:1] if present), None),
        face_parsing_backbone=next((root / n for n, present, _ in optional_status(models_root)[1:] if present), None))


def read_json(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MuseTalkWeightsError(f"{path} is not a readable JSON config ({exc}); replace it with the release's file")
    if not isinstance(data, dict):
        raise MuseTalkWeightsError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def read_state_dict(path: Path) -> dict:
    """Tensors of a .safetensors file, or of a .pth/.bin through torch.load(weights_only=True, mmap)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as exc:
            raise MuseTalkWeightsError(f"{path} is not a readable safetensors file ({exc})") from exc
    import torch

    try:
        try:  # mmap: the 3.4 GB UNet is not copied into memory twice
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc).lower() and "zip" not in str(exc).lower():
                raise
            state = torch.load(str(path), map_location="cpu", weights_only=True)  # legacy (non-zip) format
    except Exception as exc:
        raise MuseTalkWeightsError(f"{path} could not be read as a weights-only torch checkpoint ({exc}); "
                                   "use the release's file") from exc
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(hasattr(v, "shape") for v in state.values()):
        raise MuseTalkWeightsError(f"{path} does not hold a state dict of tensors")
    return state


def check_state_dict(state: dict, expected: dict[str, tuple[int, ...]], path: Path, what: str,
                     ignore_prefixes: tuple[str, ...] = ()) -> None:
    """Every expected key present with its shape, and no unknown key (outside ignore_prefixes)."""
    from ..state_dict_check import state_dict_mismatch

    problem = state_dict_mismatch(state, expected, path, what, ignore_prefixes)
    if problem:
        raise MuseTalkWeightsError(problem)
