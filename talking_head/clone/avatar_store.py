"""DH_AVATAR on disk: one folder per trained person under `<models>/avatars/<name>/`.

  generator.safetensors  weights (+ the generator config in the file's metadata)
  generator.onnx         the same generator exported for the engine layer (dynamic batch)
  reference.safetensors  the avatar's neutral reference frame: aligned crop + its crop landmarks
  avatar.json            metadata: name, crop size, audio feature config, steps, loss, date, fps...
  checkpoint.pt          training state for resuming (optimizer, step); plain tensors, weights_only
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...atomic_file import atomic_path, write_text_atomic
from ...engines.clone_model import GeneratorConfig
from ...paths import models_root
from ..audio_features import MelConfig

AVATAR_VERSION = 1
AVATARS_SUBDIR = "avatars"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}$")


class AvatarNotFoundError(FileNotFoundError):
    pass


def avatars_root() -> Path:
    return models_root() / AVATARS_SUBDIR


def sanitize_name(name: str) -> str:
    """Avatar names become folder names: letters, digits, space, _ . - (max 64), no path parts."""
    if not isinstance(name, str):
        raise ValueError(f"avatar name must be text, got {type(name).__name__}")
    clean = name.strip()
    if not _NAME_RE.match(clean) or ".." in clean or clean.endswith("."):
        raise ValueError(f"avatar name {name!r} is not allowed: use 1-64 letters, digits, spaces, '_', '-' or '.' "
                         "(starting with a letter or digit, no '..' or slashes), e.g. 'andrew_01'")
    return clean


def avatar_dir(name: str, create: bool = False) -> Path:
    path = avatars_root() / sanitize_name(name)
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class AvatarInfo:
    """DH_AVATAR: where a trained avatar lives and what it was trained with."""

    name: str
    path: Path
    meta: dict

    @property
    def generator_config(self) -> GeneratorConfig:
        return GeneratorConfig.from_dict(self.meta["generator"])

    @property
    def mel_config(self) -> MelConfig:
        return MelConfig.from_dict(self.meta["audio_features"])

    @property
    def crop_size(self) -> int:
        return int(self.meta["crop_size"])

    @property
    def weights_path(self) -> Path:
        return self.path / "generator.safetensors"

    @property
    def onnx_path(self) -> Path:
        return self.path / "generator.onnx"

    def reference(self) -> tuple[np.ndarray, np.ndarray]:
        """(neutral crop uint8 [S, S, 3], its crop landmarks [468, 2])."""
        from safetensors.numpy import load_file

        data = load_file(str(self.path / "reference.safetensors"))
        missing = {"crop", "landmarks"} - set(data)
        if missing:
            raise ValueError(f"{self.path / 'reference.safetensors'} lacks {sorted(missing)}; retrain the avatar")
        return data["crop"], data["landmarks"]

    def summary(self) -> str:
        m = self.meta
        return (f"avatar '{self.name}': clone generator, {m.get('steps')} steps, loss {m.get('loss', float('nan')):.4f}, "
                f"{m.get('footage_seconds', 0):.1f} s of footage @ {m.get('source_fps')} fps, crop {m.get('crop_size')}px, "
                f"trained {m.get('date')} on {m.get('device')} in {m.get('train_seconds', 0):.0f} s")


def write_reference(path: Path, crop: np.ndarray, landmarks: np.ndarray) -> None:
    from safetensors.numpy import save_file

    with atomic_path(path / "reference.safetensors") as tmp:
        save_file({"crop": np.ascontiguousarray(crop, np.uint8),
                   "landmarks": np.ascontiguousarray(landmarks, np.float32)}, str(tmp))


def write_meta(path: Path, meta: dict) -> None:
    write_text_atomic(path / "avatar.json", json.dumps({"version": AVATAR_VERSION, **meta}, indent=2))


def save_avatar(model, name: str, crop: np.ndarray, landmarks: np.ndarray, mel_config: MelConfig, meta: dict,
                check_onnx: bool = True) -> AvatarInfo:
    """Write `<models>/avatars/<name>/`: the generator's weights and ONNX graph, the neutral reference
    frame (crop + its landmarks) and avatar.json (`meta` on top of the fields every avatar has).
    avatar.json goes last, and an existing one is removed first: a save that is interrupted leaves a
    folder that is not listed as an avatar, never one that mixes new weights with old metadata."""
    from ...engines.clone_model import export_generator_onnx, save_generator

    clean = sanitize_name(name)
    folder = avatar_dir(clean, create=True)
    (folder / "avatar.json").unlink(missing_ok=True)
    model = model.float().cpu().eval()
    save_generator(model, folder / "generator.safetensors")
    report = export_generator_onnx(model, folder / "generator.onnx", check=check_onnx)
    write_reference(folder, crop, landmarks)
    full = {"name": clean, "model": "clone", "crop_size": model.config.crop_size, "generator": model.config.to_dict(),
            "audio_features": mel_config.to_dict(), "onnx_parity_max_abs": report.max_abs_diff if report else None,
            **meta}
    write_meta(folder, full)
    return AvatarInfo(clean, folder, {"version": AVATAR_VERSION, **full})


def load_avatar(name: str) -> AvatarInfo:
    """Open a trained avatar; every file must be there and the weights must fit (strict keys)."""
    clean = sanitize_name(name)
    path = avatars_root() / clean
    meta_file = path / "avatar.json"
    if not meta_file.is_file():
        raise AvatarNotFoundError(f"avatar '{clean}' not found in {avatars_root()}; train one with TrainAvatar "
                                  f"(available: {', '.join(list_avatars()) or 'none'})")
    meta = json.loads(meta_file.read_text())
    if int(meta.get("version", 0)) != AVATAR_VERSION:
        raise ValueError(f"avatar '{clean}' has format version {meta.get('version')}, expected {AVATAR_VERSION}; "
                         "retrain it with TrainAvatar")
    for needed in ("generator.safetensors", "generator.onnx", "reference.safetensors"):
        if not (path / needed).is_file():
            raise AvatarNotFoundError(f"avatar '{clean}' in {path} is incomplete ({needed} missing; training may "
                                      "have been interrupted): run TrainAvatar again with resume on")
    info = AvatarInfo(clean, path, meta)
    from ...engines.clone_model import load_generator

    load_generator(info.weights_path, info.generator_config)  # strict key/shape check now, not mid-render
    return info


def list_avatars() -> list[str]:
    root = avatars_root()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "avatar.json").is_file())
