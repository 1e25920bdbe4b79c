"""Seeded random-weight MuseTalk 1.5 release, written in the release's own files and layout.

No model hub is reachable, so the runtime is proven with random weights (DESIGN 5b): the parity
script writes a release with this module, runs the reference code on it in its own venv and the
pack on the same files. Weights come from numpy's PCG64 seeded per tensor name, so a test can
re-create the exact files of a committed fixture instead of committing megabytes of weights.

Self-contained on purpose (numpy, torch, json, safetensors only; no package-relative imports):
the reference venv loads this file by path.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

# musetalkV15/musetalk.json as released (diffusers UNet2DConditionModel; "attention_head_dim" is
# really the number of heads in diffusers' naming).
UNET_CONFIG_FULL = {
    "_class_name": "UNet2DConditionModel", "_diffusers_version": "0.6.0.dev0", "act_fn": "silu",
    "attention_head_dim": 8, "block_out_channels": [320, 640, 1280, 1280], "center_input_sample": False,
    "cross_attention_dim": 384,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "downsample_padding": 1, "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": 8, "layers_per_block": 2,
    "mid_block_scale_factor": 1, "norm_eps": 1e-05, "norm_num_groups": 32, "out_channels": 4, "sample_size": 64,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
}
# stabilityai/sd-vae-ft-mse config.json (scaling_factor absent: diffusers' default 0.18215).
VAE_CONFIG_FULL = {
    "_class_name": "AutoencoderKL", "_diffusers_version": "0.4.2", "act_fn": "silu",
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4, "in_channels": 3, "latent_channels": 4,
    "layers_per_block": 2, "norm_num_groups": 32, "out_channels": 3, "sample_size": 256,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
}
# openai/whisper-tiny: transformers' WhisperConfig() defaults are whisper-tiny.
WHISPER_CONFIG_FULL: dict = {}
FEATURE_SIZE_FULL = 80

# A reduced configuration of the same architectures for committed fixtures: every block type and
# the 384-wide audio path (MuseTalk's positional encoding is fixed at 384) are kept; widths,
# depths and the mel bins shrink.
UNET_CONFIG_REDUCED = dict(UNET_CONFIG_FULL, block_out_channels=[32, 64, 64, 64], layers_per_block=1)
VAE_CONFIG_REDUCED = dict(VAE_CONFIG_FULL, block_out_channels=[32, 32, 64, 64], layers_per_block=1)
WHISPER_CONFIG_REDUCED = {"num_mel_bins": 16, "encoder_layers": 1, "decoder_layers": 1, "encoder_ffn_dim": 64,
                          "decoder_ffn_dim": 64, "vocab_size": 128, "max_target_positions": 16,
                          "encoder_attention_heads": 6, "decoder_attention_heads": 6,
                          "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 1, "decoder_start_token_id": 2,
                          "begin_suppress_tokens": None, "suppress_tokens": None}
FEATURE_SIZE_REDUCED = 16

CONFIGS = {
    "full": (UNET_CONFIG_FULL, VAE_CONFIG_FULL, WHISPER_CONFIG_FULL, FEATURE_SIZE_FULL),
    "reduced": (UNET_CONFIG_REDUCED, VAE_CONFIG_REDUCED, WHISPER_CONFIG_REDUCED, FEATURE_SIZE_REDUCED),
}


def _rng(seed: int, name: str) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def random_tensor(seed: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """float32 weights with sane activations: N(0, 1/fan_in) for weights, small biases, norm
    scales near 1 (the networks stay out of saturation, so the comparison means something)."""
    rng = _rng(seed, name)
    leaf = name.rsplit(".", 1)[-1]
    if len(shape) == 1:
        if "norm" in name and leaf == "weight":
            return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else int(shape[0])
    if "embed_positions" in name or "embed_tokens" in name:
        fan_in = 1  # embeddings: unit scale, like trained ones
    return (rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))).astype(np.float32)


def _shapes(module_factory) -> dict[str, tuple[int, ...]]:
    import torch

    with torch.device("meta"):
        module = module_factory()
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def unet_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    from diffusers import UNet2DConditionModel

    cfg = {k: v for k, v in config.items() if not k.startswith("_")}
    return _shapes(lambda: UNet2DConditionModel(**cfg))


def vae_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    from diffusers import AutoencoderKL

    cfg = {k: v for k, v in config.items() if not k.startswith("_")}
    return _shapes(lambda: AutoencoderKL(**cfg))


def whisper_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Keys as in openai/whisper-tiny's checkpoint (WhisperForConditionalGeneration: "model.encoder.*",
    "model.decoder.*"; proj_out is tied to the token embedding and not stored)."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    shapes = _shapes(lambda: WhisperForConditionalGeneration(WhisperConfig(**config)))
    return {k: v for k, v in shapes.items() if not k.startswith("proj_out")}


def random_state_dict(shapes: dict[str, tuple[int, ...]], seed: int) -> dict:
    import torch

    return {name: torch.from_numpy(random_tensor(seed, name, shape)) for name, shape in shapes.items()}


def _save(state: dict, path: Path) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        torch.save(state, str(path))


def write_release(root: str | Path, size: str = "reduced", seed: int = 0, vae_format: str = "bin",
                  whisper_format: str = "bin") -> Path:
    """Write `<root>/musetalk/{musetalkV15,sd-vae,whisper}` as the release lays them out, with
    seeded random weights. vae_format / whisper_format: "bin" (as the release) or "safetensors"."""
    unet_cfg, vae_cfg, whisper_cfg, feature_size = CONFIGS[size]
    base = Path(root) / "musetalk"
    v15, vae_dir, whisper_dir = base / "musetalkV15", base / "sd-vae", base / "whisper"
    for d in (v15, vae_dir, whisper_dir):
        d.mkdir(parents=True, exist_ok=True)

    (v15 / "musetalk.json").write_text(json.dumps(unet_cfg, indent=2))
    state = random_state_dict(unet_shapes(unet_cfg), seed)
    _save(state, v15 / "unet.pth")
    del state

    (vae_dir / "config.json").write_text(json.dumps(vae_cfg, indent=2))
    _save(random_state_dict(vae_shapes(vae_cfg), seed + 1),
          vae_dir / ("diffusion_pytorch_model." + ("safetensors" if vae_format == "safetensors" else "bin")))

    from transformers import WhisperConfig, WhisperFeatureExtractor

    WhisperConfig(**whisper_cfg).to_json_file(str(whisper_dir / "config.json"))
    WhisperFeatureExtractor(feature_size=feature_size).to_json_file(str(whisper_dir / "preprocessor_config.json"))
    _save(random_state_dict(whisper_shapes(whisper_cfg), seed + 2),
          whisper_dir / ("model.safetensors" if whisper_format == "safetensors" else "pytorch_model.bin"))
    return base
