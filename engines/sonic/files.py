"""Where Sonic's files go (the release's own layout, unchanged) and how they are read safely.

Under the pack's models folder (paths.models_root(), e.g. ComfyUI/models/digital_human/):

    sonic/Sonic/unet.pth, audio2token.pth, audio2bucket.pth     huggingface.co/LeonJoe13/Sonic (folder Sonic)
    sonic/RIFE/flownet.pkl                                       huggingface.co/LeonJoe13/Sonic (folder RIFE)
    sonic/stable-video-diffusion-img2vid-xt/                     huggingface.co/stabilityai/stable-video-diffusion-img2vid-xt
        unet/config.json                                         (its weights are not read: Sonic/unet.pth holds them all)
        vae/config.json + diffusion_pytorch_model[.fp16].safetensors
        image_encoder/config.json + model[.fp16].safetensors
        feature_extractor/preprocessor_config.json
        scheduler/scheduler_config.json
    sonic/whisper-tiny/config.json, preprocessor_config.json,    huggingface.co/openai/whisper-tiny
        model.safetensors | pytorch_model.bin

Nothing is downloaded. Safetensors files are read as such, .pth/.pkl/.bin with torch.load(weights_only=True)
(no pickled code runs); every key and shape is checked against the architecture the configs describe.
The reference's YOLO face detector (yoloface_v5m.pt, TorchScript) is not needed: FaceAlign's box is used.
Licences: Sonic's code and weights: CC BY-NC-SA 4.0 (the LICENSE file of jixiaozhong/Sonic: Creative Commons
Attribution-NonCommercial-ShareAlike 4.0 International); stable-video-diffusion-img2vid-xt: Stability AI's licence
in that folder's LICENSE file (non-commercial community licence); whisper-tiny: MIT; RIFE (Practical-RIFE): MIT.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FOLDER = "sonic"
SVD = "stable-video-diffusion-img2vid-xt"
LICENCE_NOTE = ("Sonic weights: CC BY-NC-SA 4.0 (Attribution-NonCommercial-ShareAlike; Tencent / Zhejiang University); "
                "Stable Video Diffusion img2vid-xt weights: Stability AI's non-commercial community licence (the "
                "LICENSE file in that folder); whisper-tiny MIT; RIFE MIT. Not for commercial use.")

_SONIC_SRC = "huggingface.co/LeonJoe13/Sonic"
_SVD_SRC = f"huggingface.co/stabilityai/{SVD}"
_WHISPER_SRC = "huggingface.co/openai/whisper-tiny"
REQUIRED: tuple[tuple[tuple[str, ...], str], ...] = (
    (("Sonic/unet.pth",), _SONIC_SRC),
    (("Sonic/audio2token.pth",), _SONIC_SRC),
    (("Sonic/audio2bucket.pth",), _SONIC_SRC),
    (("RIFE/flownet.pkl",), _SONIC_SRC),
    ((f"{SVD}/unet/config.json",), _SVD_SRC),
    ((f"{SVD}/vae/config.json",), _SVD_SRC),
    ((f"{SVD}/vae/diffusion_pytorch_model.fp16.safetensors", f"{SVD}/vae/diffusion_pytorch_model.safetensors"),
     _SVD_SRC),
    ((f"{SVD}/image_encoder/config.json",), _SVD_SRC),
    ((f"{SVD}/image_encoder/model.fp16.safetensors", f"{SVD}/image_encoder/model.safetensors"), _SVD_SRC),
    ((f"{SVD}/feature_extractor/preprocessor_config.json",), _SVD_SRC),
    ((f"{SVD}/scheduler/scheduler_config.json",), _SVD_SRC),
    (("whisper-tiny/config.json",), _WHISPER_SRC),
    (("whisper-tiny/preprocessor_config.json",), _WHISPER_SRC),
    (("whisper-tiny/model.safetensors", "whisper-tiny/pytorch_model.bin"), _WHISPER_SRC),
)


class SonicFilesError(FileNotFoundError):
    """One or more Sonic files are missing; the message lists every one and where it goes."""


class SonicWeightsError(ValueError):
    """A Sonic file is present but does not match the architecture (keys, shapes, config)."""


def sonic_root(models_root: str | Path | None = None) -> Path:
    """<models root>/sonic (not created)."""
    if models_root is None:
        from ...paths import models_root as _root

        models_root = _root()
    return Path(models_root) / FOLDER


@dataclass(frozen=True)
class SonicFiles:
    root: Path
    unet: Path
    audio2token: Path
    audio2bucket: Path
    flownet: Path
    unet_config: Path
    vae_config: Path
    vae_weights: Path
    clip_config: Path
    clip_weights: Path
    clip_preprocessor: Path
    scheduler_config: Path
    whisper_dir: Path
    whisper_weights: Path


def file_status(models_root: str | Path | None = None) -> list[tuple[str, bool, str]]:
    """(relative path shown to the user, present?, source) for every required file."""
    root = sonic_root(models_root)
    out = []
    for names, source in REQUIRED:
        found = next((n for n in names if (root / n).is_file()), None)
        out.append((found or " or ".join(names), found is not None, source))
    return out


def locate(models_root: str | Path | None = None) -> SonicFiles:
    """The release's files under the models folder, or SonicFilesError listing every missing one."""
    root = sonic_root(models_root)
    missing = [(name, source) for name, present, source in file_status(models_root) if not present]
    if missing:
        lines = "\n".join(f"  - {root / name.split(' or ')[0]}" + (f"  (or {name.split(' or ')[1]})" if " or " in name
                                                                   else "") + f"  <- {source}"
                          for name, source in missing)
        raise SonicFilesError(
            f"Sonic needs {len(missing)} more file(s) under {root} (the release's own layout; nothing is "
            f"downloaded):\n{lines}\nDownload them from the pages named and place them exactly there. "
            f"Licences: {LICENCE_NOTE}")

    def pick(*names: str) -> Path:
        return next(root / n for n in names if (root / n).is_file())

    svd = root / SVD
    return SonicFiles(
        root=root, unet=root / "Sonic/unet.pth", audio2token=root / "Sonic/audio2token.pth",
        audio2bucket=root / "Sonic/audio2bucket.pth", flownet=root / "RIFE/flownet.pkl",
        unet_config=svd / "unet/config.json", vae_config=svd / "vae/config.json",
        vae_weights=pick(f"{SVD}/vae/diffusion_pytorch_model.fp16.safetensors",
                         f"{SVD}/vae/diffusion_pytorch_model.safetensors"),
        clip_config=svd / "image_encoder/config.json",
        clip_weights=pick(f"{SVD}/image_encoder/model.fp16.safetensors", f"{SVD}/image_encoder/model.safetensors"),
        clip_preprocessor=svd / "feature_extractor/preprocessor_config.json",
        scheduler_config=svd / "scheduler/scheduler_config.json", whisper_dir=root / "whisper-tiny",
        whisper_weights=pick("whisper-tiny/model.safetensors", "whisper-tiny/pytorch_model.bin"))


def _wrap(fn, *args, **kwargs):
    from ..musetalk.files import MuseTalkWeightsError

    try:
        return fn(*args, **kwargs)
    except MuseTalkWeightsError as exc:
        raise SonicWeightsError(str(exc)) from None


def read_json(path: Path) -> dict:
    from ..musetalk.files import read_json as _read

    return _wrap(_read, path)


def read_state_dict(path: Path) -> dict:
    """Tensors of a .safetensors file, or of a .pth/.pkl/.bin through torch.load(weights_only=True)."""
    from ..musetalk.files import read_state_dict as _read

    return _wrap(_read, path)


def check_state_dict(state: dict, expected: dict, path: Path, what: str) -> None:
    """Every expected key present with its shape, and no unknown key."""
    from ..musetalk.files import check_state_dict as _check

    _wrap(_check, state, expected, path, what)
