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


# --- the optional face-parsing files (face-parse-bisent/) -------------------------------------------
# Key names and shapes written out here rather than taken from engines/musetalk/face_parsing.py: this
# file must stay importable by path in the reference venv; a test checks both lists agree.
def _bn_shapes(prefix: str, c: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.weight": (c,), f"{prefix}.bias": (c,), f"{prefix}.running_mean": (c,),
            f"{prefix}.running_var": (c,), f"{prefix}.num_batches_tracked": ()}


def _conv_bn_shapes(prefix: str, cin: int, cout: int, k: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.conv.weight": (cout, cin, k, k), **_bn_shapes(f"{prefix}.bn", cout)}


def resnet18_shapes(prefix: str = "", classifier: bool = True) -> dict[str, tuple[int, ...]]:
    """torchvision's ResNet-18 state dict names (resnet18-5c106cde.pth), with its 1000-way `fc`."""
    out = {f"{prefix}conv1.weight": (64, 3, 7, 7), **_bn_shapes(f"{prefix}bn1", 64)}
    cin = 64
    for i, cout in enumerate((64, 128, 256, 512), start=1):
        for b in range(2):
            p = f"{prefix}layer{i}.{b}"
            src = cin if b == 0 else cout
            out.update({f"{p}.conv1.weight": (cout, src, 3, 3), **_bn_shapes(f"{p}.bn1", cout),
                        f"{p}.conv2.weight": (cout, cout, 3, 3), **_bn_shapes(f"{p}.bn2", cout)})
            if b == 0 and (src != cout or i > 1):
                out.update({f"{p}.downsample.0.weight": (cout, src, 1, 1), **_bn_shapes(f"{p}.downsample.1", cout)})
        cin = cout
    if classifier:
        out.update({f"{prefix}fc.weight": (1000, 512), f"{prefix}fc.bias": (1000,)})
    return out


def bisenet_shapes(n_classes: int = 19) -> dict[str, tuple[int, ...]]:
    """79999_iter.pth's names and shapes (face-parsing BiSeNet with a ResNet-18 context path)."""
    out = resnet18_shapes("cp.resnet.", classifier=False)
    for name, cin in (("arm16", 256), ("arm32", 512)):
        out.update({**_conv_bn_shapes(f"cp.{name}.conv", cin, 128, 3), f"cp.{name}.conv_atten.weight": (128, 128, 1, 1),
                    **_bn_shapes(f"cp.{name}.bn_atten", 128)})
    out.update({**_conv_bn_shapes("cp.conv_head32", 128, 128, 3), **_conv_bn_shapes("cp.conv_head16", 128, 128, 3),
                **_conv_bn_shapes("cp.conv_avg", 512, 128, 1)})
    out.update({**_conv_bn_shapes("ffm.convblk", 256, 256, 1), "ffm.conv1.weight": (64, 256, 1, 1),
                "ffm.conv2.weight": (256, 64, 1, 1)})
    for name, cin, mid in (("conv_out", 256, 256), ("conv_out16", 128, 64), ("conv_out32", 128, 64)):
        out.update({**_conv_bn_shapes(f"{name}.conv", cin, mid, 3), f"{name}.conv_out.weight": (n_classes, mid, 1, 1)})
    return out


def random_bn_aware_state_dict(shapes: dict[str, tuple[int, ...]], seed: int) -> dict:
    """As random_state_dict, but BatchNorm statistics that keep eval-mode BN sane: scales near 1,
    running variances positive (near 1), small running means, counters as torch stores them (int64)."""
    import torch

    state = {}
    for name, shape in shapes.items():
        leaf = name.rsplit(".", 1)[-1]
        rng = _rng(seed, name)
        if leaf == "num_batches_tracked":
            state[name] = torch.tensor(80000, dtype=torch.long)
        elif leaf == "running_var":
            state[name] = torch.from_numpy((1.0 + 0.2 * np.abs(rng.standard_normal(shape))).astype(np.float32))
        elif leaf == "running_mean":
            state[name] = torch.from_numpy((0.1 * rng.standard_normal(shape)).astype(np.float32))
        elif name == "conv_out.conv.bn.bias":
            # a shift of -1 before the main head's ReLU makes its features sparse, so pixels differ by
            # which channels fire rather than by a shared positive mean: the labels then follow the image
            state[name] = torch.full(shape, -1.0)
        elif len(shape) == 1 and leaf == "weight":
            state[name] = torch.from_numpy((1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
        else:
            w = random_tensor(seed, name, shape)
            if name.endswith("conv_out.conv_out.weight"):
                # the classifier reads ReLU features (all >= 0): with raw random rows, the class whose row
                # sums highest wins almost every pixel and the mask under test would be empty; rows
                # centred to zero mean let the labels follow the image, so every label (skin, nose,
                # mouth) and the jaw-mode morphology are exercised
                w = w - w.mean(axis=1, keepdims=True)
                # and which label a random feature favours is arbitrary: rows 1 (skin) and 7 (an ear)
                # swapped, because on face crops row 7 wins widely and the jaw mode grows/thins skin only
                w[[1, 7]] = w[[7, 1]]
            state[name] = torch.from_numpy(w.astype(np.float32))
    return state


def write_face_parsing(root: str | Path, seed: int = 0, legacy_format: bool = True,
                       backbone: bool = True) -> Path:
    """`<root>/musetalk/face-parse-bisent/79999_iter.pth` (+ `resnet18-5c106cde.pth`) with seeded random
    weights. legacy_format: torch's pre-1.6 (non-zip) serialisation, which both released files use
    (they date from 2017 and 2019), so the loaders' fallback for it is exercised."""
    import torch

    folder = Path(root) / "musetalk" / "face-parse-bisent"
    folder.mkdir(parents=True, exist_ok=True)
    kw = {"_use_new_zipfile_serialization": False} if legacy_format else {}
    torch.save(random_bn_aware_state_dict(bisenet_shapes(), seed + 3), str(folder / "79999_iter.pth"), **kw)
    if backbone:
        state = {k: v for k, v in random_bn_aware_state_dict(resnet18_shapes(), seed + 4).items()
                 if not k.endswith("num_batches_tracked")}  # the 2017 torchvision file predates the counters
        torch.save(state, str(folder / "resnet18-5c106cde.pth"), **kw)
    return folder


def write_release(root: str | Path, size: str = "reduced", seed: int = 0, vae_format: str = "bin",
                  whisper_format: str = "bin", face_parsing: bool = False) -> Path:
    """Write `<root>/musetalk/{musetalkV15,sd-vae,whisper}` as the release lays them out, with
    seeded random weights. vae_format / whisper_format: "bin" (as the release) or "safetensors".
    face_parsing: also the optional face-parse-bisent/ files (BiSeNet is full size in both sizes:
    its 13M weights are cheap to make, and the reference code fixes its widths)."""
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
    if face_parsing:
        write_face_parsing(root, seed)
    return base
