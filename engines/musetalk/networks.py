"""MuseTalk 1.5's three networks, built by the libraries made for them from the release's configs.

UNet: diffusers' UNet2DConditionModel from musetalk.json (8 input channels = masked latent + reference
latent, cross-attention on 384-wide whisper features). VAE: diffusers' AutoencoderKL (sd-vae-ft-mse).
Audio: transformers' WhisperEncoder (whisper-tiny; the decoder is never built). Every weight file is
checked key by key and shape by shape before loading; the modules are built on the meta device and
take the file's tensors directly (no second copy of the 3.4 GB UNet in memory).

diffusers and transformers are an optional extra: `pip install comfyui-digital-human[musetalk]`.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .files import MuseTalkFiles, MuseTalkWeightsError, check_state_dict, locate, read_json, read_state_dict

EXTRA_HINT = "pip install 'comfyui-digital-human[musetalk]'  (diffusers and transformers)"
WHISPER_IGNORED = ("model.decoder.", "decoder.", "proj_out.")  # the decoder is not used by MuseTalk


def _require_libraries() -> None:
    missing = []
    for name in ("diffusers", "transformers"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ImportError(f"MuseTalk needs {' and '.join(missing)}: {EXTRA_HINT}")


def _config_kwargs(config: dict) -> dict:
    return {k: v for k, v in config.items() if not k.startswith("_")}


def _build_loaded(factory, state: dict, path: Path, what: str) -> Any:
    """Build on the meta device, check the file against the module's own keys/shapes, then assign."""
    import torch

    with torch.device("meta"):
        module = factory()
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    check_state_dict(state, expected, path, what)
    module.load_state_dict({k: state[k] for k in expected}, strict=True, assign=True)
    leftover = [n for n, t in list(module.named_parameters()) + list(module.named_buffers()) if t.is_meta]
    if leftover:  # a buffer that is not in the state dict (none in these architectures today)
        raise MuseTalkWeightsError(f"{what}: tensors not in {path}: {leftover[:5]}")
    return module.float().eval().requires_grad_(False)


def build_unet(config_path: Path, weights_path: Path) -> Any:
    from diffusers import UNet2DConditionModel

    config = read_json(config_path)
    if config.get("in_channels") != 8 or config.get("out_channels") != 4:
        raise MuseTalkWeightsError(f"{config_path}: MuseTalk's UNet has in_channels 8 and out_channels 4, got "
                                   f"{config.get('in_channels')}/{config.get('out_channels')}; is this musetalk.json?")
    try:
        factory = lambda: UNet2DConditionModel(**_config_kwargs(config))  # noqa: E731
        return _build_loaded(factory, read_state_dict(weights_path), weights_path, "MuseTalk UNet")
    except TypeError as exc:
        raise MuseTalkWeightsError(f"{config_path} is not a UNet2DConditionModel config ({exc})") from exc


def build_vae(config_path: Path, weights_path: Path) -> Any:
    from diffusers import AutoencoderKL

    config = read_json(config_path)
    try:
        factory = lambda: AutoencoderKL(**_config_kwargs(config))  # noqa: E731
        return _build_loaded(factory, read_state_dict(weights_path), weights_path, "sd-vae (AutoencoderKL)")
    except TypeError as exc:
        raise MuseTalkWeightsError(f"{config_path} is not an AutoencoderKL config ({exc})") from exc


def _encoder_keys(state: dict) -> dict:
    """whisper-tiny's file stores a full WhisperForConditionalGeneration ("model.encoder.*"); a bare
    WhisperModel ("encoder.*") or an encoder alone is accepted too. Decoder keys are ignored."""
    for prefix in ("model.encoder.", "encoder."):
        if any(k.startswith(prefix) for k in state):
            rest = [k for k in state if not k.startswith(prefix) and not k.startswith(WHISPER_IGNORED)]
            out = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            out.update({k: state[k] for k in rest})  # reported as unexpected by the check
            return out
    return {k: v for k, v in state.items() if not k.startswith(WHISPER_IGNORED)}


def build_whisper_encoder(config_path: Path, weights_path: Path) -> Any:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    read_json(config_path)  # a clear error for a broken file before transformers' own
    config = WhisperConfig.from_json_file(str(config_path))
    if config.d_model != 384:
        raise MuseTalkWeightsError(f"{config_path}: MuseTalk 1.5 uses whisper-tiny (d_model 384), got d_model "
                                   f"{config.d_model}")
    state = _encoder_keys(read_state_dict(weights_path))
    return _build_loaded(lambda: WhisperEncoder(config), state, weights_path, "whisper-tiny encoder")


@dataclass
class MuseTalkNetworks:
    unet: Any
    vae: Any
    whisper: Any
    files: MuseTalkFiles

    @property
    def scaling_factor(self) -> float:
        return float(self.vae.config.scaling_factor)

    def to(self, device: Any, dtype: Any = None) -> "MuseTalkNetworks":
        for m in (self.unet, self.vae, self.whisper):
            m.to(device=device, dtype=dtype)
        return self


def load_networks(files: MuseTalkFiles | None = None, models_root: str | Path | None = None) -> MuseTalkNetworks:
    """The three networks on the CPU in FP32 (checked files; MuseTalkFilesError lists missing ones)."""
    files = files or locate(models_root)
    _require_libraries()
    return MuseTalkNetworks(unet=build_unet(files.unet_config, files.unet_weights),
                            vae=build_vae(files.vae_config, files.vae_weights),
                            whisper=build_whisper_encoder(files.whisper_config, files.whisper_weights), files=files)


_CACHE: dict[tuple, MuseTalkNetworks] = {}
_LOCK = threading.Lock()


def cached_networks(device: str = "cpu", dtype_name: str = "fp32",
                    models_root: str | Path | None = None) -> MuseTalkNetworks:
    """load_networks once per process for (files, their mtimes, device, precision); the last one only
    (a second MuseTalk on another device replaces the first: these are big)."""
    import torch

    files = locate(models_root)
    stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in
                  (files.unet_weights, files.vae_weights, files.whisper_weights, files.unet_config))
    key = (stamp, device, dtype_name)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is None:
            for net in _CACHE.values():  # the replaced networks' kept pipelines go with them
                net.__dict__.pop("_pipelines", None)
            _CACHE.clear()
            dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
            hit = _CACHE[key] = load_networks(files).to(device, dtype)
        return hit


def release_networks() -> None:
    with _LOCK:
        for net in _CACHE.values():  # the kept pipelines (and their latents) go now, not at the next GC
            net.__dict__.pop("_pipelines", None)
        _CACHE.clear()
