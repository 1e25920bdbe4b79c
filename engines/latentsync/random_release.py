"""Seeded random-weight LatentSync release, written in the release's own files and layout (DESIGN 5b).

No model hub is reachable, so the runtime is proven with random weights: tests and the parity script
write a release with this module; the reference code (in its own venv) and the pack read the same files.
Weights come from numpy's PCG64 seeded per tensor name (engines/musetalk/random_release.random_tensor);
fixed tables a trained file holds as they are computed (the motion modules' `pos_encoder.pe`, whisper's
sinusoidal `encoder.positional_embedding`) are written with their true values.

"full": the released architectures (configs/unet/stage2_512.yaml's model at 512x512, whisper tiny, sd-vae-ft-mse);
"reduced": the same block types at small widths (UNet 32-64 channels, one layer per block; whisper 2 layers;
VAE 32-64 channels) at 64x64, for CI. The mouth mask written is a stand-in drawn here (a filled lower-face
shape); users place the repository's latentsync/utils/mask.png.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..musetalk.random_release import random_tensor

UNET_MODEL_FULL = {
    "act_fn": "silu", "add_audio_layer": True, "attention_head_dim": 8, "block_out_channels": [320, 640, 1280, 1280],
    "center_input_sample": False, "cross_attention_dim": 384,
    "down_block_types": ["CrossAttnDownBlock3D", "CrossAttnDownBlock3D", "CrossAttnDownBlock3D", "DownBlock3D"],
    "mid_block_type": "UNetMidBlock3DCrossAttn",
    "up_block_types": ["UpBlock3D", "CrossAttnUpBlock3D", "CrossAttnUpBlock3D", "CrossAttnUpBlock3D"],
    "downsample_padding": 1, "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": 13, "layers_per_block": 2,
    "mid_block_scale_factor": 1, "norm_eps": 1e-5, "norm_num_groups": 32, "out_channels": 4, "sample_size": 64,
    "resnet_time_scale_shift": "default", "use_motion_module": True, "motion_module_resolutions": [1, 2, 4, 8],
    "motion_module_mid_block": False, "motion_module_decoder_only": False, "motion_module_type": "Vanilla",
    "motion_module_kwargs": {"num_attention_heads": 8, "num_transformer_block": 1,
                             "attention_block_types": ["Temporal_Self", "Temporal_Self"],
                             "temporal_position_encoding": True, "temporal_position_encoding_max_len": 24,
                             "temporal_attention_dim_div": 1, "zero_initialize": True},
}
UNET_MODEL_REDUCED = dict(UNET_MODEL_FULL, block_out_channels=[32, 64, 64, 64], layers_per_block=1, sample_size=8)
DATA = {"num_frames": 16, "resolution": 512, "mask_image_path": "latentsync/utils/mask.png", "audio_sample_rate": 16000,
        "video_fps": 25, "audio_feat_length": [2, 2]}
VAE_CONFIG_FULL = {
    "_class_name": "AutoencoderKL", "_diffusers_version": "0.4.2", "act_fn": "silu",
    "block_out_channels": [128, 256, 512, 512], "down_block_types": ["DownEncoderBlock2D"] * 4, "in_channels": 3,
    "latent_channels": 4, "layers_per_block": 2, "norm_num_groups": 32, "out_channels": 3, "sample_size": 256,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
}
VAE_CONFIG_REDUCED = dict(VAE_CONFIG_FULL, block_out_channels=[32, 32, 64, 64], layers_per_block=1)
WHISPER_DIMS_FULL = {"n_mels": 80, "n_vocab": 51865, "n_audio_ctx": 1500, "n_audio_state": 384, "n_audio_head": 6,
                     "n_audio_layer": 4, "n_text_ctx": 448, "n_text_state": 384, "n_text_head": 6, "n_text_layer": 4}
WHISPER_DIMS_REDUCED = dict(WHISPER_DIMS_FULL, n_audio_layer=2, n_vocab=64, n_text_ctx=8, n_text_layer=1)
SIZES = {"full": (UNET_MODEL_FULL, 512, VAE_CONFIG_FULL, WHISPER_DIMS_FULL),
         "reduced": (UNET_MODEL_REDUCED, 64, VAE_CONFIG_REDUCED, WHISPER_DIMS_REDUCED)}


def _yaml(cfg: dict) -> str:
    """The config as YAML (json is valid YAML flow style; written one section per key for reading)."""
    return "".join(f"{section}: {json.dumps(values)}\n" for section, values in cfg.items())


def unet_state(model: dict, seed: int) -> dict:
    import torch

    from .unet import expected_shapes

    state = {}
    for name, shape in expected_shapes(model).items():
        if name.endswith("pos_encoder.pe"):
            _, max_len, dim = shape
            pos = torch.arange(max_len).unsqueeze(1)
            div = torch.exp(torch.arange(0, dim, 2) * (-math.log(10000.0) / dim))
            pe = torch.zeros(1, max_len, dim)
            pe[0, :, 0::2], pe[0, :, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
            state[name] = pe
        else:
            state[name] = torch.from_numpy(random_tensor(seed, name, shape))
    return state


def whisper_shapes(d: dict) -> dict[str, tuple[int, ...]]:
    """OpenAI whisper's checkpoint names (model_state_dict) for dims `d`."""
    a, t = d["n_audio_state"], d["n_text_state"]
    out = {"encoder.conv1.weight": (a, d["n_mels"], 3), "encoder.conv1.bias": (a,), "encoder.conv2.weight": (a, a, 3),
           "encoder.conv2.bias": (a,), "encoder.positional_embedding": (d["n_audio_ctx"], a),
           "encoder.ln_post.weight": (a,), "encoder.ln_post.bias": (a,),
           "decoder.token_embedding.weight": (d["n_vocab"], t), "decoder.positional_embedding": (d["n_text_ctx"], t),
           "decoder.ln.weight": (t,), "decoder.ln.bias": (t,)}

    def block(p: str, n: int, cross: bool) -> None:
        for att in ("attn", "cross_attn") if cross else ("attn",):
            for proj in ("query", "key", "value", "out"):
                out[f"{p}.{att}.{proj}.weight"] = (n, n)
                if proj != "key":
                    out[f"{p}.{att}.{proj}.bias"] = (n,)
            out[f"{p}.{att}_ln.weight"], out[f"{p}.{att}_ln.bias"] = (n,), (n,)
        out.update({f"{p}.mlp.0.weight": (4 * n, n), f"{p}.mlp.0.bias": (4 * n,), f"{p}.mlp.2.weight": (n, 4 * n),
                    f"{p}.mlp.2.bias": (n,), f"{p}.mlp_ln.weight": (n,), f"{p}.mlp_ln.bias": (n,)})

    for i in range(d["n_audio_layer"]):
        block(f"encoder.blocks.{i}", a, False)
    for i in range(d["n_text_layer"]):
        block(f"decoder.blocks.{i}", t, True)
    return out


def whisper_checkpoint(d: dict, seed: int) -> dict:
    import torch

    state = {}
    for name, shape in whisper_shapes(d).items():
        if name == "encoder.positional_embedding":  # whisper's sinusoids(n_ctx, n_state)
            length, ch = shape
            inc = np.log(10000) / (ch // 2 - 1)
            inv = torch.exp(-inc * torch.arange(ch // 2))
            scaled = torch.arange(length)[:, None] * inv[None, :]
            state[name] = torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1)
        else:
            state[name] = torch.from_numpy(random_tensor(seed, name, shape))
    return {"dims": dict(d), "model_state_dict": state}


def vae_state(cfg: dict, seed: int) -> dict:
    import torch
    from diffusers import AutoencoderKL

    with torch.device("meta"):
        net = AutoencoderKL(**{k: v for k, v in cfg.items() if not k.startswith("_")})
    return {k: torch.from_numpy(random_tensor(seed, k, tuple(v.shape))) for k, v in net.state_dict().items()}


def stand_in_mask(size: int = 256) -> np.ndarray:
    """uint8 (size, size, 3): white (kept) with a black lower-face region (regenerated), mask.png's format."""
    import cv2

    m = np.full((size, size, 3), 255, np.uint8)
    s = size / 256.0
    cv2.ellipse(m, (int(128 * s), int(150 * s)), (int(118 * s), int(92 * s)), 0, 0, 360, (0, 0, 0), -1)
    m[: int(95 * s)] = 255
    return m


def write_release(root: str | Path, size: str = "reduced", seed: int = 0, vae_format: str = "safetensors",
                  version: str = "1.6") -> Path:
    """Write `<root>/latentsync/` as the release lays it out (files.py), with seeded random weights.
    version "1.6": configs/unet/stage2_512.yaml; "1.5": configs/unet/stage2.yaml (the reduced size keeps its
    64x64 resolution either way)."""
    import cv2
    import torch

    model, res, vae_cfg, dims = SIZES[size]
    base = Path(root) / "latentsync"
    (base / "configs/unet").mkdir(parents=True, exist_ok=True)
    (base / "whisper").mkdir(parents=True, exist_ok=True)
    (base / "latentsync/utils").mkdir(parents=True, exist_ok=True)
    (base / "sd-vae-ft-mse").mkdir(parents=True, exist_ok=True)
    if size == "full" and version == "1.5":
        res = 256
    name = "stage2_512.yaml" if version == "1.6" else "stage2.yaml"
    (base / "configs/unet" / name).write_text(_yaml({"data": dict(DATA, resolution=res), "model": model}))
    torch.save({"global_step": 0, "state_dict": unet_state(model, seed)}, str(base / "latentsync_unet.pt"))
    torch.save(whisper_checkpoint(dims, seed + 2), str(base / "whisper/tiny.pt"))
    cv2.imwrite(str(base / "latentsync/utils/mask.png"), stand_in_mask())
    (base / "sd-vae-ft-mse/config.json").write_text(json.dumps(vae_cfg, indent=2))
    state = vae_state(vae_cfg, seed + 1)
    if vae_format == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()},
                  str(base / "sd-vae-ft-mse/diffusion_pytorch_model.safetensors"))
    else:
        torch.save(state, str(base / "sd-vae-ft-mse/diffusion_pytorch_model.bin"))
    return base
