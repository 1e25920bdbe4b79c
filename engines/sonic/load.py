"""Sonic's networks built from the configs in the release and loaded strictly from its weights.

diffusers (UNetSpatioTemporalConditionModel, AutoencoderKLTemporalDecoder, EulerDiscreteScheduler) and
transformers (CLIPVisionModelWithProjection, WhisperModel, the feature extractors) come from the `[sonic]`
extra; Sonic's own parts are networks.py. Every state dict is checked key by key and shape by shape before
it is loaded (files.check_state_dict); nothing else is read from disk.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .files import SonicFiles, SonicWeightsError, check_state_dict, read_json, read_state_dict
from .networks import AudioBucket, AudioTokens, IFNet, add_audio_processors, make_sonic_unet_class, mlp_from_state


@dataclass
class SonicNetworks:
    unet: Any
    vae: Any
    clip: Any
    whisper_encoder: Any
    audio2token: AudioTokens
    audio2bucket: AudioBucket
    ifnet: IFNet
    scheduler_config: dict
    clip_processor: Any
    whisper_features: Any
    dtype: torch.dtype
    device: torch.device


def _load_strict(module: torch.nn.Module, state: dict, path, what: str) -> None:
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    check_state_dict(state, expected, path, what)
    module.load_state_dict(state, strict=True)


def _config(cls, path) -> Any:
    cfg = read_json(path)
    try:
        return cls.from_config(cfg)
    except Exception as exc:  # a config the class cannot build from
        raise SonicWeightsError(f"{path} is not a valid {cls.__name__} config ({exc})") from exc


def _flownet_state(path) -> dict:
    state = read_state_dict(path)
    # the RIFE release saves the DataParallel-wrapped net ("module." prefixes), as the reference expects
    return {k[len("module."):] if k.startswith("module.") else k: v for k, v in state.items()}


def load_networks(files: SonicFiles, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                  ip_audio_scale: float = 1.0) -> SonicNetworks:
    """Every network of the release on `device` in `dtype` (whisper and the audio MLPs stay float32, as in the
    reference; the UNet, VAE and CLIP take `dtype`)."""
    from diffusers import AutoencoderKLTemporalDecoder
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection, WhisperConfig,
                              WhisperFeatureExtractor, WhisperModel)

    device = torch.device(device)
    if files.svd_checkpoint is not None:
        # ComfyUI's single-file svd_xt*.safetensors: SVD-XT's published configs, the VAE and image encoder
        # renamed strictly from Stability's original names (single_file.py)
        from .random_release import SCHEDULER_CONFIG, clip_config, unet_config, vae_config
        from .single_file import load_parts

        unet = make_sonic_unet_class().from_config(unet_config(reduced=False))
        vae, clip = load_parts(files.svd_checkpoint, vae_config(reduced=False), clip_config(reduced=False))
        scheduler_config = dict(SCHEDULER_CONFIG)
    else:
        unet = _config(make_sonic_unet_class(), files.unet_config)
        vae = _config(AutoencoderKLTemporalDecoder, files.vae_config)
        _load_strict(vae, read_state_dict(files.vae_weights), files.vae_weights, "SVD temporal VAE")
        try:
            clip = CLIPVisionModelWithProjection(CLIPVisionConfig(**read_json(files.clip_config)))
        except Exception as exc:
            raise SonicWeightsError(f"{files.clip_config} is not a CLIP vision config ({exc})") from exc
        clip_state = read_state_dict(files.clip_weights)
        # transformers keeps position_ids as a buffer that releases may or may not hold
        clip_state.pop("vision_model.embeddings.position_ids", None)
        expected = {k: tuple(v.shape) for k, v in clip.state_dict().items() if not k.endswith("position_ids")}
        check_state_dict(clip_state, expected, files.clip_weights, "SVD image encoder (CLIP ViT-H/14 vision)")
        clip.load_state_dict(clip_state, strict=False)
        scheduler_config = read_json(files.scheduler_config)
    add_audio_processors(unet, ip_audio_scale)
    _load_strict(unet, read_state_dict(files.unet), files.unet, "Sonic UNet (SVD-XT + audio adapters)")

    try:
        wcfg = WhisperConfig(**read_json(files.whisper_dir / "config.json"))
    except Exception as exc:
        raise SonicWeightsError(f"{files.whisper_dir / 'config.json'} is not a Whisper config ({exc})") from exc
    whisper = WhisperModel(wcfg)
    wstate = read_state_dict(files.whisper_weights)
    wstate = {k[len("model."):] if k.startswith("model.") else k: v for k, v in wstate.items()}
    wstate.pop("proj_out.weight", None)  # the ForConditionalGeneration head (tied), not in WhisperModel
    _load_strict(whisper, wstate, files.whisper_weights, "whisper-tiny")
    encoder = whisper.encoder  # Sonic reads the encoder's states only

    a2t_state = read_state_dict(files.audio2token)
    a2t = mlp_from_state(AudioTokens, a2t_state)
    _load_strict(a2t, a2t_state, files.audio2token, "Sonic audio2token")
    a2b_state = read_state_dict(files.audio2bucket)
    a2b = mlp_from_state(AudioBucket, a2b_state)
    _load_strict(a2b, a2b_state, files.audio2bucket, "Sonic audio2bucket")

    flow_state = _flownet_state(files.flownet)
    width = flow_state.get("block0.conv0.1.0.weight")
    ifnet = IFNet(int(width.shape[0]) if width is not None else 90)
    _load_strict(ifnet, flow_state, files.flownet, "RIFE HDv3 IFNet")

    clip_processor = CLIPImageProcessor()  # the reference's own choice: CLIP's defaults, not the folder's config
    whisper_features = WhisperFeatureExtractor(**read_json(files.whisper_dir / "preprocessor_config.json"))
    for m in (unet, vae, clip):
        m.to(device=device, dtype=dtype).eval().requires_grad_(False)
    for m in (encoder, a2t, a2b, ifnet):
        m.to(device=device, dtype=torch.float32).eval().requires_grad_(False)
    return SonicNetworks(unet=unet, vae=vae, clip=clip, whisper_encoder=encoder, audio2token=a2t, audio2bucket=a2b,
                         ifnet=ifnet, scheduler_config=scheduler_config, clip_processor=clip_processor,
                         whisper_features=whisper_features, dtype=dtype, device=device)
