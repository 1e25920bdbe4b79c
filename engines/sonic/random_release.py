"""A Sonic release with seeded random weights, in the release's exact layout and formats (tests, parity,
benchmarks): `.pth`/`.pkl` state dicts through torch.save, SVD's parts as `.fp16.safetensors` beside their
diffusers configs, whisper-tiny as transformers writes it. `reduced=True` shrinks every width (the same
architecture and code paths) so CPU tests run in seconds; `reduced=False` is SVD-XT / whisper-tiny size.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .files import SVD

SCHEDULER_CONFIG = {  # stable-video-diffusion-img2vid-xt/scheduler/scheduler_config.json
    "_class_name": "EulerDiscreteScheduler", "beta_end": 0.012, "beta_schedule": "scaled_linear",
    "beta_start": 0.00085, "clip_sample": False, "interpolation_type": "linear", "num_train_timesteps": 1000,
    "prediction_type": "v_prediction", "set_alpha_to_one": False, "sigma_max": 700.0, "sigma_min": 0.002,
    "skip_prk_steps": True, "steps_offset": 1, "timestep_spacing": "leading", "timestep_type": "continuous",
    "trained_betas": None, "use_karras_sigmas": True}
WHISPER_PREPROCESSOR = {"chunk_length": 30, "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 80,
                        "hop_length": 160, "n_fft": 400, "n_samples": 480000, "nb_max_frames": 3000,
                        "padding_side": "right", "padding_value": 0.0, "processor_class": "WhisperProcessor",
                        "return_attention_mask": False, "sampling_rate": 16000}
CLIP_PREPROCESSOR = {"crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "do_convert_rgb": True,
                     "do_normalize": True, "do_rescale": True, "do_resize": True,
                     "feature_extractor_type": "CLIPFeatureExtractor",
                     "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_processor_type": "CLIPImageProcessor",
                     "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3, "rescale_factor": 0.00392156862745098,
                     "size": {"shortest_edge": 224}}


def unet_config(reduced: bool) -> dict:
    if not reduced:  # SVD-XT's unet/config.json
        return {"_class_name": "UNetSpatioTemporalConditionModel", "addition_time_embed_dim": 256,
                "block_out_channels": [320, 640, 1280, 1280], "cross_attention_dim": 1024,
                "down_block_types": ["CrossAttnDownBlockSpatioTemporal"] * 3 + ["DownBlockSpatioTemporal"],
                "in_channels": 8, "layers_per_block": 2, "num_attention_heads": [5, 10, 20, 20], "num_frames": 25,
                "out_channels": 4, "projection_class_embeddings_input_dim": 768, "sample_size": 96,
                "transformer_layers_per_block": 1,
                "up_block_types": ["UpBlockSpatioTemporal"] + ["CrossAttnUpBlockSpatioTemporal"] * 3}
    return {"_class_name": "UNetSpatioTemporalConditionModel", "addition_time_embed_dim": 16,
            "block_out_channels": [32, 64], "cross_attention_dim": 64,
            "down_block_types": ["CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"],
            "in_channels": 8, "layers_per_block": 1, "num_attention_heads": [2, 4], "num_frames": 25,
            "out_channels": 4, "projection_class_embeddings_input_dim": 48, "sample_size": 16,
            "transformer_layers_per_block": 1,
            "up_block_types": ["UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"]}


def vae_config(reduced: bool) -> dict:
    blocks = [128, 256, 512, 512] if not reduced else [32, 32, 32, 32]
    return {"_class_name": "AutoencoderKLTemporalDecoder", "block_out_channels": blocks,
            "down_block_types": ["DownEncoderBlock2D"] * len(blocks), "force_upcast": True, "in_channels": 3,
            "latent_channels": 4, "layers_per_block": 2 if not reduced else 1, "out_channels": 3,
            "sample_size": 768, "scaling_factor": 0.18215}


def clip_config(reduced: bool) -> dict:
    if not reduced:  # CLIP ViT-H/14 vision tower with projection (SVD's image_encoder/config.json)
        return {"hidden_size": 1280, "intermediate_size": 5120, "num_attention_heads": 16, "num_hidden_layers": 32,
                "patch_size": 14, "image_size": 224, "projection_dim": 1024, "hidden_act": "gelu",
                "layer_norm_eps": 1e-5}
    return {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_hidden_layers": 1,
            "patch_size": 32, "image_size": 224, "projection_dim": 64, "hidden_act": "gelu", "layer_norm_eps": 1e-5}


def whisper_config(reduced: bool) -> dict:
    if not reduced:  # whisper-tiny
        return {"d_model": 384, "encoder_layers": 4, "decoder_layers": 4, "encoder_attention_heads": 6,
                "decoder_attention_heads": 6, "encoder_ffn_dim": 1536, "decoder_ffn_dim": 1536, "vocab_size": 51865,
                "num_mel_bins": 80, "max_source_positions": 1500, "max_target_positions": 448}
    return {"d_model": 64, "encoder_layers": 2, "decoder_layers": 1, "encoder_attention_heads": 2,
            "decoder_attention_heads": 2, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "vocab_size": 64,
            "num_mel_bins": 80, "max_source_positions": 1500, "max_target_positions": 32,
            "decoder_start_token_id": 1, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def _randomize(module: torch.nn.Module, gen: torch.Generator, std: float = 0.05) -> dict:
    """Seeded random weights (norm scales near 1, biases small) so signals stay finite through deep nets."""
    state = {}
    for name, value in module.state_dict().items():
        if not value.is_floating_point():
            state[name] = value.clone()
            continue
        noise = torch.randn(value.shape, generator=gen) * std
        if name.endswith("weight") and value.ndim == 1:  # norm scales
            state[name] = 1.0 + noise
        elif name.endswith("mix_factor"):
            state[name] = torch.tensor([0.5]) + noise
        elif name.endswith("position_ids"):
            state[name] = value.clone()
        else:
            fan_in = max(1, value[0].numel()) if value.ndim > 1 else 1
            state[name] = noise if value.ndim <= 1 else torch.randn(value.shape, generator=gen) / fan_in ** 0.5
    module.load_state_dict(state, strict=True)
    return state


def write_random_release(root: str | Path, seed: int = 0, reduced: bool = True) -> Path:
    """Write <root>/sonic/... with seeded random weights; returns the sonic folder."""
    from diffusers import AutoencoderKLTemporalDecoder
    from safetensors.torch import save_file
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection, WhisperConfig, WhisperModel

    from .networks import AudioBucket, AudioTokens, IFNet, add_audio_processors, make_sonic_unet_class

    gen = torch.Generator().manual_seed(seed)
    top = Path(root) / "sonic"
    svd = top / SVD
    for d in ("Sonic", "RIFE", f"{SVD}/unet", f"{SVD}/vae", f"{SVD}/image_encoder", f"{SVD}/feature_extractor",
              f"{SVD}/scheduler", "whisper-tiny"):
        (top / d).mkdir(parents=True, exist_ok=True)

    def dump(path: Path, data: dict) -> None:
        path.write_text(json.dumps(data, indent=2), encoding="utf-8")

    ucfg = unet_config(reduced)
    dump(svd / "unet/config.json", ucfg)
    unet = make_sonic_unet_class().from_config(ucfg)
    add_audio_processors(unet)
    torch.save(_randomize(unet, gen, 0.02), top / "Sonic/unet.pth")
    del unet

    vcfg = vae_config(reduced)
    dump(svd / "vae/config.json", vcfg)
    vae = AutoencoderKLTemporalDecoder.from_config(vcfg)
    save_file({k: v.half().contiguous() for k, v in _randomize(vae, gen, 0.02).items()},
              str(svd / "vae/diffusion_pytorch_model.fp16.safetensors"))
    del vae

    ccfg = clip_config(reduced)
    dump(svd / "image_encoder/config.json", ccfg)
    clip = CLIPVisionModelWithProjection(CLIPVisionConfig(**ccfg))
    save_file({k: v.half().contiguous() for k, v in _randomize(clip, gen).items() if not k.endswith("position_ids")},
              str(svd / "image_encoder/model.fp16.safetensors"))
    dump(svd / "feature_extractor/preprocessor_config.json", CLIP_PREPROCESSOR)
    dump(svd / "scheduler/scheduler_config.json", SCHEDULER_CONFIG)

    wcfg = whisper_config(reduced)
    dump(top / "whisper-tiny/config.json", {"model_type": "whisper", **wcfg})
    dump(top / "whisper-tiny/preprocessor_config.json", WHISPER_PREPROCESSOR)
    whisper = WhisperModel(WhisperConfig(**wcfg))
    wstate = _randomize(whisper, gen)
    save_file({f"model.{k}": v.contiguous() for k, v in wstate.items()}, str(top / "whisper-tiny/model.safetensors"))

    d_model, blocks = wcfg["d_model"], wcfg["encoder_layers"] + 1
    dim = ucfg["cross_attention_dim"]
    inter = 1024 if not reduced else 64
    a2t = AudioTokens(10 * blocks * d_model, inter, 32, dim)
    torch.save(_randomize(a2t, gen), top / "Sonic/audio2token.pth")
    a2b = AudioBucket(50 * d_model + ccfg["projection_dim"], inter, 2, 1)
    torch.save(_randomize(a2b, gen), top / "Sonic/audio2bucket.pth")
    ifnet = IFNet(90 if not reduced else 16)
    torch.save({f"module.{k}": v for k, v in _randomize(ifnet, gen).items()}, top / "RIFE/flownet.pkl")
    return top
