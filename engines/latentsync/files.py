"""Where LatentSync's files go (the release's own layout, unchanged) and how they are read safely.

Under the pack's models folder (paths.models_root(), e.g. ComfyUI/models/digital_human/):

    latentsync/latentsync_unet.pt               UNet weights        (huggingface.co/ByteDance/LatentSync-1.6,
                                                                     or LatentSync-1.5 for the 256x256 model)
    latentsync/whisper/tiny.pt                  audio encoder       (same repository, whisper/tiny.pt)
    latentsync/configs/unet/stage2_512.yaml     UNet config, 1.6    (github.com/bytedance/LatentSync, configs/unet/)
      or latentsync/configs/unet/stage2.yaml    UNet config, 1.5 (256x256: about 8 GB of VRAM instead of 18)
    latentsync/latentsync/utils/mask.png        the fixed mouth mask (github.com/bytedance/LatentSync, same path)
    latentsync/sd-vae-ft-mse/config.json        VAE                 (huggingface.co/stabilityai/sd-vae-ft-mse)
    latentsync/sd-vae-ft-mse/diffusion_pytorch_model.safetensors | .bin

stable_syncnet.pt is not needed: the reference reads it only for training (and for evaluation). The DDIM
scheduler's values are the repository's configs/scheduler_config.json, fixed in the pipeline (not a file).
When both UNet configs are there, 1.6 (stage2_512.yaml) is used unless DIGITAL_HUMAN_LATENTSYNC_CONFIG
names another file of configs/unet/ (e.g. `stage2` for 1.5).

Nothing is downloaded. Weights are read with safetensors when that file exists, else with
torch.load(weights_only=True) (no pickled code runs); every key and shape is checked.
LICENCE: LatentSync's code is Apache-2.0 (github.com/bytedance/LatentSync/LICENSE; the repository states no
other licence). The weights' licence is the one on their Hugging Face model cards (ByteDance/LatentSync-1.5,
-1.6), reported as `openrail++` (CreativeML Open RAIL++-M: use allowed, commercial included, under use-based
restrictions that must be passed on); the cards could not be read from here, so users are told to read them.
sd-vae-ft-mse is MIT; whisper-tiny is MIT.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

LICENCE_NOTE = ("LatentSync 1.6/1.5 (ByteDance; Apache-2.0 code; weights under the licence on their Hugging Face "
                "model card, reported as CreativeML Open RAIL++-M: use restrictions apply - read the card), "
                "sd-vae-ft-mse (MIT), whisper tiny (MIT); place the files yourself, nothing is downloaded")
FOLDER = "latentsync"
CONFIG_ENV = "DIGITAL_HUMAN_LATENTSYNC_CONFIG"

_HF = "huggingface.co/ByteDance/LatentSync-1.6 (or LatentSync-1.5)"
_GH = "github.com/bytedance/LatentSync (same path in the repository)"
_VAE = "huggingface.co/stabilityai/sd-vae-ft-mse"
CONFIGS = {"stage2_512": "1.6", "stage2": "1.5"}  # configs/unet/<name>.yaml -> the release it configures
REQUIRED: tuple[tuple[tuple[str, ...], str], ...] = (
    (("latentsync_unet.pt",), _HF),
    (("whisper/tiny.pt",), _HF),
    (("configs/unet/stage2_512.yaml", "configs/unet/stage2.yaml"), _GH + "; stage2.yaml is the 1.5 (256x256) one"),
    (("latentsync/utils/mask.png",), _GH),
    (("sd-vae-ft-mse/config.json",), _VAE),
    (("sd-vae-ft-mse/diffusion_pytorch_model.safetensors", "sd-vae-ft-mse/diffusion_pytorch_model.bin"), _VAE),
)


class LatentSyncFilesError(FileNotFoundError):
    """One or more LatentSync files are missing; the message lists every one and where it goes."""


class LatentSyncWeightsError(ValueError):
    """A LatentSync file is present but does not match what the release holds (keys, shapes, config)."""


def latentsync_root(models_root: str | Path | None = None) -> Path:
    """<models root>/latentsync (not created)."""
    if models_root is None:
        from ...paths import models_root as _root

        models_root = _root()
    return Path(models_root) / FOLDER


@dataclass(frozen=True)
class LatentSyncFiles:
    root: Path
    unet_weights: Path
    unet_config: Path
    whisper: Path
    mask_image: Path
    vae_config: Path
    vae_weights: Path

    @property
    def vae_dir(self) -> Path:
        return self.vae_config.parent

    @property
    def version(self) -> str:
        return CONFIGS.get(self.unet_config.stem, self.unet_config.stem)


def file_status(models_root: str | Path | None = None) -> list[tuple[str, bool, str]]:
    """(relative path shown to the user, present?, source) for every required file."""
    root = latentsync_root(models_root)
    out = []
    for names, source in REQUIRED:
        found = next((n for n in names if (root / n).is_file()), None)
        out.append((found or " or ".join(names), found is not None, source))
    return out


def _config_choice(root: Path) -> Path:
    """The UNet config in use: DIGITAL_HUMAN_LATENTSYNC_CONFIG's file, else 1.6's, else 1.5's."""
    asked = os.environ.get(CONFIG_ENV, "").strip()
    if asked:
        path = root / "configs" / "unet" / (asked if asked.endswith(".yaml") else asked + ".yaml")
        if not path.is_file():
            raise LatentSyncFilesError(f"{CONFIG_ENV}={asked!r} names {path}, which is not there; place the "
                                       f"config from {_GH} or unset the variable")
        return path
    return next(root / n for n in REQUIRED[2][0] if (root / n).is_file())


def locate(models_root: str | Path | None = None) -> LatentSyncFiles:
    """The release's files under the models folder, or LatentSyncFilesError listing every missing one."""
    root = latentsync_root(models_root)
    missing = [(name, source) for name, present, source in file_status(models_root) if not present]
    if missing:
        lines = "\n".join(f"  - {root / name.split(' or ')[0]}" + (f"  (or {name.split(' or ')[1]})" if " or " in name
                                                                   else "") + f"  <- {source}"
                          for name, source in missing)
        raise LatentSyncFilesError(
            f"LatentSync needs {len(missing)} more file(s) under {root} (the release's own layout; nothing is "
            f"downloaded):\n{lines}\nDownload them from the pages named and place them exactly there.")

    def pick(*names: str) -> Path:
        return next(root / n for n in names if (root / n).is_file())

    return LatentSyncFiles(
        root=root, unet_weights=root / "latentsync_unet.pt", unet_config=_config_choice(root),
        whisper=root / "whisper/tiny.pt", mask_image=root / "latentsync/utils/mask.png",
        vae_config=root / "sd-vae-ft-mse/config.json",
        vae_weights=pick("sd-vae-ft-mse/diffusion_pytorch_model.safetensors",
                         "sd-vae-ft-mse/diffusion_pytorch_model.bin"))


def read_unet_config(path: Path) -> dict:
    """A configs/unet/*.yaml as a dict, its `model:` and `data:` sections checked for what inference reads."""
    try:
        import yaml

        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except ImportError as exc:
        raise ImportError("LatentSync needs PyYAML for its config: pip install .[latentsync]") from exc
    except Exception as exc:  # OSError, UnicodeError, yaml.YAMLError
        raise LatentSyncWeightsError(f"{path} is not a readable YAML config ({exc}); use the repository's file")
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict) or not isinstance(data.get("data"), dict):
        raise LatentSyncWeightsError(f"{path} has no `model:` and `data:` sections; use the repository's "
                                     "configs/unet/stage2_512.yaml or stage2.yaml")
    model, dat = data["model"], data["data"]
    needs = {"model": ("in_channels", "out_channels", "block_out_channels", "layers_per_block", "cross_attention_dim",
                       "attention_head_dim", "down_block_types", "up_block_types", "norm_num_groups", "norm_eps",
                       "use_motion_module", "motion_module_resolutions", "motion_module_kwargs", "add_audio_layer"),
             "data": ("resolution", "num_frames", "audio_feat_length")}
    lacking = [f"{sec}.{k}" for sec, keys in needs.items() for k in keys if k not in data[sec]]
    if lacking:
        raise LatentSyncWeightsError(f"{path} lacks {', '.join(lacking)}; use the repository's config unchanged")
    if int(dat["resolution"]) % 64:
        raise LatentSyncWeightsError(f"{path}: data.resolution must be a multiple of 64, got {dat['resolution']}")
    if model.get("cross_attention_dim") != 384:
        raise LatentSyncWeightsError(f"{path}: model.cross_attention_dim {model.get('cross_attention_dim')} needs "
                                     "whisper small; only the released whisper tiny (384) configurations are supported")
    return data


def read_checkpoint(path: Path) -> dict:
    """A torch checkpoint read with torch.load(weights_only=True, mmap) (no pickled code runs): latentsync_unet.pt
    holds {"state_dict": ..., "global_step": ...}; whisper tiny.pt {"dims": ..., "model_state_dict": ...}."""
    import torch

    path = Path(path)
    try:
        try:
            ckpt = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc).lower() and "zip" not in str(exc).lower():
                raise
            ckpt = torch.load(str(path), map_location="cpu", weights_only=True)  # legacy (non-zip) format
    except Exception as exc:
        raise LatentSyncWeightsError(f"{path} could not be read as a weights-only torch checkpoint ({exc}); "
                                     "use the release's file") from exc
    if not isinstance(ckpt, dict):
        raise LatentSyncWeightsError(f"{path} does not hold a dict; use the release's file")
    return ckpt


def tensors_of(ckpt: dict, key: str, path: Path) -> dict:
    state = ckpt.get(key)
    if not isinstance(state, dict) or not all(hasattr(v, "shape") for v in state.values()):
        raise LatentSyncWeightsError(f"{path} has no `{key}` dict of tensors (found keys: "
                                     f"{', '.join(map(str, list(ckpt)[:6]))}); use the release's file")
    return state


def read_safetensors_or_bin(path: Path) -> dict:
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as exc:
            raise LatentSyncWeightsError(f"{path} is not a readable safetensors file ({exc})") from exc
    ckpt = read_checkpoint(path)
    if not all(hasattr(v, "shape") for v in ckpt.values()):
        raise LatentSyncWeightsError(f"{path} does not hold a state dict of tensors")
    return ckpt


def check_state_dict(state: dict, expected: dict[str, tuple[int, ...]], path: Path, what: str,
                     ignore_prefixes: tuple[str, ...] = ()) -> None:
    """Every expected key present with its shape, and no unknown key (outside ignore_prefixes)."""
    from ..state_dict_check import state_dict_mismatch

    problem = state_dict_mismatch(state, expected, path, what, ignore_prefixes)
    if problem:
        raise LatentSyncWeightsError(problem)


def read_json_file(path: Path) -> dict:
    import json

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LatentSyncWeightsError(f"{path} is not a readable JSON config ({exc}); replace it with the release's file")
    if not isinstance(data, dict):
        raise LatentSyncWeightsError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data
