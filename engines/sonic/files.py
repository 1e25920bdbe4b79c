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
Instead of the stable-video-diffusion-img2vid-xt folder, ComfyUI's own single-file SVD-XT checkpoint is accepted:
`svd_xt*.safetensors` in ComfyUI's checkpoints folder(s) (folder_paths inside ComfyUI; outside it
$DIGITAL_HUMAN_CHECKPOINTS, else <models root>/../checkpoints, i.e. ComfyUI/models/checkpoints beside
ComfyUI/models/digital_human). Its VAE and image encoder are renamed strictly (single_file.py); the UNet,
scheduler and CLIP-preprocessing configs are SVD-XT's published ones (random_release holds them).
The reference's YOLO face detector (yoloface_v5m.pt, TorchScript) is not needed: FaceAlign's box is used.
Licences: Sonic's code and weights: CC BY-NC-SA 4.0 (the LICENSE file of jixiaozhong/Sonic: Creative Commons
Attribution-NonCommercial-ShareAlike 4.0 International); stable-video-diffusion-img2vid-xt: Stability AI's licence
in that folder's LICENSE file (non-commercial community licence); whisper-tiny: MIT; RIFE (Practical-RIFE): MIT.
"""
from __future__ import annotations

import os
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
SONIC_REQUIRED: tuple[tuple[tuple[str, ...], str], ...] = (
    (("Sonic/unet.pth",), _SONIC_SRC),
    (("Sonic/audio2token.pth",), _SONIC_SRC),
    (("Sonic/audio2bucket.pth",), _SONIC_SRC),
    (("RIFE/flownet.pkl",), _SONIC_SRC),
    (("whisper-tiny/config.json",), _WHISPER_SRC),
    (("whisper-tiny/preprocessor_config.json",), _WHISPER_SRC),
    (("whisper-tiny/model.safetensors", "whisper-tiny/pytorch_model.bin"), _WHISPER_SRC),
)
SVD_REQUIRED: tuple[tuple[tuple[str, ...], str], ...] = (
    ((f"{SVD}/unet/config.json",), _SVD_SRC),
    ((f"{SVD}/vae/config.json",), _SVD_SRC),
    ((f"{SVD}/vae/diffusion_pytorch_model.fp16.safetensors", f"{SVD}/vae/diffusion_pytorch_model.safetensors"),
     _SVD_SRC),
    ((f"{SVD}/image_encoder/config.json",), _SVD_SRC),
    ((f"{SVD}/image_encoder/model.fp16.safetensors", f"{SVD}/image_encoder/model.safetensors"), _SVD_SRC),
    ((f"{SVD}/feature_extractor/preprocessor_config.json",), _SVD_SRC),
    ((f"{SVD}/scheduler/scheduler_config.json",), _SVD_SRC),
)
REQUIRED = SONIC_REQUIRED + SVD_REQUIRED
SVD_CHECKPOINT_GLOB = "svd_xt*.safetensors"
CHECKPOINTS_ENV = "DIGITAL_HUMAN_CHECKPOINTS"


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
    whisper_dir: Path
    whisper_weights: Path
    # the diffusers folder's files, or None when SVD's parts come from ComfyUI's single-file checkpoint
    unet_config: Path | None = None
    vae_config: Path | None = None
    vae_weights: Path | None = None
    clip_config: Path | None = None
    clip_weights: Path | None = None
    clip_preprocessor: Path | None = None
    scheduler_config: Path | None = None
    svd_checkpoint: Path | None = None


def checkpoint_dirs(models_root: str | Path | None = None) -> list[Path]:
    """Where ComfyUI's checkpoints are: $DIGITAL_HUMAN_CHECKPOINTS (os.pathsep-separated) if set; inside ComfyUI
    its folder_paths "checkpoints" entries (extra_model_paths included); else <models root>/../checkpoints
    (ComfyUI/models/checkpoints when the models root is ComfyUI/models/digital_human)."""
    env = os.environ.get(CHECKPOINTS_ENV)
    if env:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    if models_root is None:
        try:
            import folder_paths  # type: ignore[import-not-found]  # only exists inside ComfyUI

            return [Path(p) for p in folder_paths.get_folder_paths("checkpoints")]
        except (ImportError, KeyError):
            pass
    return [sonic_root(models_root).parent.parent / "checkpoints"]


def svd_checkpoint(models_root: str | Path | None = None) -> Path | None:
    """ComfyUI's single-file SVD-XT checkpoint (svd_xt*.safetensors, first by name), or None."""
    for folder in checkpoint_dirs(models_root):
        found = sorted(p for p in folder.glob(SVD_CHECKPOINT_GLOB) if p.is_file()) if folder.is_dir() else []
        if found:
            return found[0]
    return None


def _status(root: Path, table) -> list[tuple[str, bool, str]]:
    out = []
    for names, source in table:
        found = next((n for n in names if (root / n).is_file()), None)
        out.append((found or " or ".join(names), found is not None, source))
    return out


def file_status(models_root: str | Path | None = None) -> list[tuple[str, bool, str]]:
    """(path shown to the user, present?, source) for every required file; SVD's rows are the diffusers folder's,
    or one row for ComfyUI's svd_xt*.safetensors when that folder is incomplete and the checkpoint is there."""
    root = sonic_root(models_root)
    svd_rows = _status(root, SVD_REQUIRED)
    if not all(present for _, present, _ in svd_rows):
        ckpt = svd_checkpoint(models_root)
        if ckpt is not None:
            svd_rows = [(str(ckpt), True, "ComfyUI checkpoint (stabilityai/stable-video-diffusion-img2vid-xt)")]
    return _status(root, SONIC_REQUIRED) + svd_rows


def _line(root: Path, name: str, source: str) -> str:
    alt = f"  (or {name.split(' or ')[1]})" if " or " in name else ""
    return f"  - {root / name.split(' or ')[0]}{alt}  <- {source}"


def locate(models_root: str | Path | None = None) -> SonicFiles:
    """The release's files under the models folder, or SonicFilesError listing every missing one."""
    root = sonic_root(models_root)
    sonic_missing = [(n, s) for n, present, s in _status(root, SONIC_REQUIRED) if not present]
    svd_missing = [(n, s) for n, present, s in _status(root, SVD_REQUIRED) if not present]
    ckpt = svd_checkpoint(models_root) if svd_missing else None
    if sonic_missing or (svd_missing and ckpt is None):
        lines = "\n".join(_line(root, n, s) for n, s in sonic_missing)
        svd_text = ""
        if svd_missing and ckpt is None:
            dirs = ", ".join(str(d) for d in checkpoint_dirs(models_root))
            svd_text = (f"\nStable Video Diffusion img2vid-xt: either (1) the diffusers folder, missing "
                        f"{len(svd_missing)} file(s):\n" + "\n".join(_line(root, n, s) for n, s in svd_missing)
                        + f"\nor (2) ComfyUI's single-file checkpoint {SVD_CHECKPOINT_GLOB} (e.g. svd_xt.safetensors "
                        f"from {_SVD_SRC}) in ComfyUI's checkpoints folder: {dirs} (outside ComfyUI set "
                        f"${CHECKPOINTS_ENV} to that folder).")
        count = len(sonic_missing) + (len(svd_missing) if svd_missing and ckpt is None else 0)
        raise SonicFilesError(
            f"Sonic needs {count} more file(s) under {root} (the release's own layout; nothing is "
            f"downloaded):\n{lines}{svd_text}\nDownload them from the pages named and place them exactly there. "
            f"Licences: {LICENCE_NOTE}")

    def pick(*names: str) -> Path:
        return next(root / n for n in names if (root / n).is_file())

    common = dict(root=root, unet=root / "Sonic/unet.pth", audio2token=root / "Sonic/audio2token.pth",
                  audio2bucket=root / "Sonic/audio2bucket.pth", flownet=root / "RIFE/flownet.pkl",
                  whisper_dir=root / "whisper-tiny",
                  whisper_weights=pick("whisper-tiny/model.safetensors", "whisper-tiny/pytorch_model.bin"))
    if ckpt is not None:
        return SonicFiles(**common, svd_checkpoint=ckpt)
    svd = root / SVD
    return SonicFiles(
        **common, unet_config=svd / "unet/config.json", vae_config=svd / "vae/config.json",
        vae_weights=pick(f"{SVD}/vae/diffusion_pytorch_model.fp16.safetensors",
                         f"{SVD}/vae/diffusion_pytorch_model.safetensors"),
        clip_config=svd / "image_encoder/config.json",
        clip_weights=pick(f"{SVD}/image_encoder/model.fp16.safetensors", f"{SVD}/image_encoder/model.safetensors"),
        clip_preprocessor=svd / "feature_extractor/preprocessor_config.json",
        scheduler_config=svd / "scheduler/scheduler_config.json")


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
