"""SVD's parts from ComfyUI's single-file checkpoint (`models/checkpoints/svd_xt*.safetensors`).

That file keeps Stability's original (generative-models, "SGM") names:
    model.diffusion_model.*                               the SVD UNet (not read: Sonic/unet.pth holds Sonic's whole UNet;
                                                          a few shapes are checked so a wrong checkpoint is refused)
    first_stage_model.encoder.* / .decoder.*              the VAE (ldm Encoder + temporal VideoDecoder)
    conditioner.embedders.0.open_clip.model.visual.*      the OpenCLIP ViT-H/14 image tower
    conditioner.embedders.0.open_clip.model.<other>       the text tower's leftovers (not read)
    conditioner.embedders.<n>.*, denoiser.*               other conditioners / buffers (not read)
Here they are renamed onto the diffusers / transformers modules the pipeline uses
(AutoencoderKLTemporalDecoder, CLIPVisionModelWithProjection): every key of the parts read must map, every
mapped key must exist in the module with its shape, and every module key must be filled - a missing or extra
key is named in the error. The renaming follows the layouts of the two code bases (ComfyUI reads the same
file with comfy.ldm's Encoder/VideoDecoder and comfy.clip_vision.convert_to_transformers); it was checked
against ComfyUI's own modules (tests/test_sonic_single_file.py, fixture made by ComfyUI's code).
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from .files import SonicWeightsError

VAE_PREFIX = "first_stage_model."
CLIP_PREFIX = "conditioner.embedders.0.open_clip.model.visual."
UNET_PREFIX = "model.diffusion_model."
_IGNORED_PREFIXES = ("model.diffusion_model.", "conditioner.embedders.", "denoiser.")

# the SVD-XT UNet's signature in SGM names: (key, shape) -> refuses an SD / SDXL / SV3D checkpoint early
UNET_SIGNATURE = (("input_blocks.0.0.weight", (320, 8, 3, 3)), ("label_emb.0.0.weight", (1280, 768)),
                  ("input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight", (320, 1024)),
                  ("out.2.weight", (4, 320, 3, 3)))

_RES = (("norm1.", "norm1."), ("conv1.", "conv1."), ("norm2.", "norm2."), ("conv2.", "conv2."),
        ("nin_shortcut.", "conv_shortcut."))
_TIME = (("time_stack.in_layers.0.", "temporal_res_block.norm1."), ("time_stack.in_layers.2.", "temporal_res_block.conv1."),
         ("time_stack.out_layers.0.", "temporal_res_block.norm2."), ("time_stack.out_layers.3.", "temporal_res_block.conv2."),
         ("mix_factor", "time_mixer.mix_factor"))
_ATTN = (("norm.", "group_norm."), ("q.", "to_q."), ("k.", "to_k."), ("v.", "to_v."), ("proj_out.", "to_out.0."))


def _sub(rest: str, table) -> str | None:
    for old, new in table:
        if rest.startswith(old):
            return new + rest[len(old):]
    return None


def vae_key(key: str, num_levels: int) -> str | None:
    """SGM VAE name (without first_stage_model.) -> diffusers AutoencoderKLTemporalDecoder name, None if unknown."""
    for part in ("encoder.", "decoder."):
        if key.startswith(part):
            side, rest = part, key[len(part):]
            break
    else:
        return None
    if rest.startswith(("conv_in.", "conv_out.weight", "conv_out.bias")):
        return side + rest
    if rest.startswith("norm_out."):
        return side + "conv_norm_out." + rest[len("norm_out."):]
    if side == "decoder." and rest.startswith("conv_out.time_mix_conv."):
        return "decoder.time_conv_out." + rest[len("conv_out.time_mix_conv."):]
    if rest.startswith("mid.attn_1."):
        sub = _sub(rest[len("mid.attn_1."):], _ATTN)
        return None if sub is None else side + "mid_block.attentions.0." + sub
    m = re.match(r"mid\.block_([12])\.(.*)", rest)
    if m:
        return _resnet(side, f"mid_block.resnets.{int(m.group(1)) - 1}.", m.group(2))
    m = re.match(r"(down|up)\.(\d+)\.(block\.(\d+)|downsample|upsample)\.(.*)", rest)
    if not m:
        return None
    kind, level, what, block, tail = m.group(1), int(m.group(2)), m.group(3), m.group(4), m.group(5)
    if (kind == "down") != (side == "encoder."):
        return None
    if kind == "up":  # diffusers numbers the decoder's levels from the bottom
        level = num_levels - 1 - level
    group = f"{'down' if kind == 'down' else 'up'}_blocks.{level}."
    if what == "downsample" and tail.startswith("conv."):
        return side + group + "downsamplers.0." + tail
    if what == "upsample" and tail.startswith("conv."):
        return side + group + "upsamplers.0." + tail
    if block is not None:
        return _resnet(side, group + f"resnets.{block}.", tail)
    return None


def _resnet(side: str, prefix: str, tail: str) -> str | None:
    if side == "encoder.":
        sub = _sub(tail, _RES)
        return None if sub is None else side + prefix + sub
    sub = _sub(tail, _TIME)  # the decoder's resnets are spatial + temporal with a learned mix
    if sub is not None:
        return side + prefix + sub
    sub = _sub(tail, _RES)
    return None if sub is None else side + prefix + "spatial_res_block." + sub


def vae_state(sgm: dict, expected: dict, path: Path) -> dict:
    """diffusers AutoencoderKLTemporalDecoder state dict from the file's first_stage_model.* tensors."""
    levels = 1 + max((int(k.split(".")[2]) for k in expected if k.startswith("encoder.down_blocks.")), default=0)
    out, unknown = {}, []
    for key, value in sgm.items():
        if not key.startswith(VAE_PREFIX):
            continue
        name = vae_key(key[len(VAE_PREFIX):], levels)
        if name is None or name not in expected:
            unknown.append(key)
            continue
        if name.endswith(("to_q.weight", "to_k.weight", "to_v.weight", "to_out.0.weight")) and value.dim() == 4:
            value = value[:, :, 0, 0]  # the ldm attention's 1x1 convs are diffusers' linears
        out[name] = value
    # SGM's AutoencodingEngine has no quant_conv; diffusers' class always applies one: identity keeps it the same map
    if "quant_conv.weight" in expected and "quant_conv.weight" not in out:
        ch = expected["quant_conv.weight"][0]
        out["quant_conv.weight"] = torch.eye(ch).reshape(ch, ch, 1, 1)
        out["quant_conv.bias"] = torch.zeros(ch)
    _check(out, expected, unknown, path, "SVD temporal VAE (first_stage_model.*)")
    return out


def clip_state(sgm: dict, expected: dict, path: Path) -> dict:
    """transformers CLIPVisionModelWithProjection state dict from the file's open_clip visual tower."""
    fixed = {"class_embedding": "vision_model.embeddings.class_embedding",
             "conv1.weight": "vision_model.embeddings.patch_embedding.weight",
             "positional_embedding": "vision_model.embeddings.position_embedding.weight",
             "ln_pre.weight": "vision_model.pre_layrnorm.weight", "ln_pre.bias": "vision_model.pre_layrnorm.bias",
             "ln_post.weight": "vision_model.post_layernorm.weight", "ln_post.bias": "vision_model.post_layernorm.bias"}
    layer = {"ln_1": "layer_norm1", "ln_2": "layer_norm2", "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2",
             "attn.out_proj": "self_attn.out_proj"}
    out, unknown = {}, []
    for key, value in sgm.items():
        if not key.startswith(CLIP_PREFIX):
            continue
        rest = key[len(CLIP_PREFIX):]
        if rest in fixed:
            out[fixed[rest]] = value
            continue
        if rest == "proj":  # open_clip multiplies x @ proj; the transformers Linear holds its transpose
            out["visual_projection.weight"] = value.t().contiguous()
            continue
        m = re.match(r"transformer\.resblocks\.(\d+)\.(.+)[._](weight|bias)$", rest)
        if m and m.group(2) in layer and rest.endswith("." + m.group(3)):
            out[f"vision_model.encoder.layers.{m.group(1)}.{layer[m.group(2)]}.{m.group(3)}"] = value
        elif m and m.group(2) == "attn.in_proj" and rest.endswith("_" + m.group(3)):  # q, k, v in one tensor
            for i, q in enumerate(value.chunk(3, dim=0)):
                out[f"vision_model.encoder.layers.{m.group(1)}.self_attn.{'qkv'[i]}_proj.{m.group(3)}"] = q.contiguous()
        else:
            unknown.append(key)
    unknown += [f"{CLIP_PREFIX}(-> {k})" for k in out if k not in expected]
    out = {k: v for k, v in out.items() if k in expected}
    _check(out, expected, unknown, path, "SVD image encoder (open_clip ViT-H/14 visual tower)")
    return out


def check_layout(sgm: dict, path: Path, unet_signature=UNET_SIGNATURE) -> None:  # values: anything with .shape
    """The file is an SVD(-XT) checkpoint in SGM names: no unknown top-level part, the UNet's signature shapes."""
    stray = sorted({k.split(".")[0] for k in sgm if not k.startswith((VAE_PREFIX, CLIP_PREFIX) + _IGNORED_PREFIXES)})
    if stray:
        raise SonicWeightsError(f"{path} has parts an SVD checkpoint does not have: {', '.join(stray)} (expected "
                                f"model.diffusion_model.*, first_stage_model.*, conditioner.embedders.*)")
    for name, shape in unet_signature:
        key = UNET_PREFIX + name
        if key not in sgm:
            raise SonicWeightsError(f"{path} is not an SVD-XT checkpoint: {key} is missing")
        if tuple(sgm[key].shape) != tuple(shape):
            raise SonicWeightsError(f"{path} is not an SVD-XT checkpoint: {key} has shape "
                                    f"{tuple(sgm[key].shape)}, SVD-XT's is {tuple(shape)}")


def _check(out: dict, expected: dict, unknown: list, path: Path, what: str) -> None:
    missing = [k for k in expected if k not in out]
    wrong = [f"{k} {tuple(v.shape)} (expected {tuple(expected[k])})" for k, v in out.items()
             if k in expected and tuple(v.shape) != tuple(expected[k])]
    if missing or unknown or wrong:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (diffusers names): " + ", ".join(missing[:8]))
        if unknown:
            parts.append(f"{len(unknown)} not part of the architecture: " + ", ".join(unknown[:8]))
        if wrong:
            parts.append(f"{len(wrong)} with another shape: " + ", ".join(wrong[:8]))
        raise SonicWeightsError(f"{path} does not hold the expected {what}: " + "; ".join(parts))


def read_parts(path: Path, unet_signature=UNET_SIGNATURE) -> dict:
    """Only the VAE and image-encoder tensors of the checkpoint (in its dtype, on the CPU), after the layout check;
    the UNet's gigabytes are never read."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
            check_layout({k: _Shape(s) for k, s in shapes.items()}, path, unet_signature)
            return {k: f.get_tensor(k) for k in shapes if k.startswith((VAE_PREFIX, CLIP_PREFIX))}
    except SonicWeightsError:
        raise
    except Exception as exc:  # not a safetensors file, truncated download
        raise SonicWeightsError(f"{path} could not be read as safetensors ({exc})") from exc


class _Shape:
    """A tensor's shape without its data (check_layout reads only .shape)."""

    def __init__(self, shape):
        self.shape = tuple(shape)


def load_parts(path: Path, vae_config: dict, clip_config: dict, dtype: torch.dtype = torch.float32,
               unet_signature=UNET_SIGNATURE):
    """(AutoencoderKLTemporalDecoder, CLIPVisionModelWithProjection) built from the configs and filled strictly
    from the single-file checkpoint."""
    from diffusers import AutoencoderKLTemporalDecoder
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    sgm = read_parts(path, unet_signature)
    vae = AutoencoderKLTemporalDecoder.from_config(vae_config)
    vae.load_state_dict(vae_state(sgm, {k: tuple(v.shape) for k, v in vae.state_dict().items()}, path), strict=True)
    clip = CLIPVisionModelWithProjection(CLIPVisionConfig(**clip_config))
    expected = {k: tuple(v.shape) for k, v in clip.state_dict().items() if not k.endswith("position_ids")}
    clip.load_state_dict(clip_state(sgm, expected, path), strict=False)  # position_ids: a buffer, not a weight
    for m in (vae, clip):
        m.to(dtype=dtype).eval().requires_grad_(False)
    return vae, clip
