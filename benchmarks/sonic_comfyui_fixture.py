"""Writes tests/fixtures/sonic/sonic_svd_xt_comfyui*.safetensors with ComfyUI's own code: a reduced SVD VAE
(comfy.ldm Encoder + temporal VideoDecoder) and a reduced CLIP vision tower (comfy.clip_vision) with seeded random
weights, saved under svd_xt.safetensors's original (SGM / open_clip) names, plus ComfyUI's forward passes.

    COMFYUI=/path/to/ComfyUI /path/to/comfy-venv/bin/python benchmarks/sonic_comfyui_fixture.py
"""
import sys, json, os
from pathlib import Path
OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sonic"
TMP = Path(os.environ.get("TMPDIR", "/tmp"))
sys.path.insert(0, os.environ.get("COMFYUI", "/tmp/ComfyUI"))
sys.argv = [sys.argv[0], "--cpu"]
import comfy.options; comfy.options.enable_args_parsing()
import comfy.cli_args
import torch
from safetensors.torch import save_file
from comfy.ldm.modules.diffusionmodules.model import Encoder
from comfy.ldm.modules.temporal_ae import VideoDecoder
import comfy.clip_vision, comfy.ops

torch.manual_seed(20261202)
g = torch.Generator().manual_seed(20261202)

def randomize(m):
    for k, p in m.state_dict().items():
        if p.dtype.is_floating_point:
            if "norm" in k and k.endswith("weight") or k.endswith(("ln_1.weight", "ln_2.weight", "layer_norm1.weight", "layer_norm2.weight", "layrnorm.weight", "layernorm.weight")):
                v = 1 + 0.1 * torch.randn(p.shape, generator=g)
            elif k.endswith("mix_factor"):
                v = torch.randn(p.shape, generator=g)
            else:
                v = 0.08 * torch.randn(p.shape, generator=g)
            # stored as fp16 (as the release); both sides compute in fp32 from the same rounded values
            p.copy_(v.half().float())

cfg = {'double_z': True, 'z_channels': 4, 'resolution': 256, 'in_channels': 3, 'out_ch': 3, 'ch': 32,
       'ch_mult': [1, 2], 'num_res_blocks': 2, 'attn_resolutions': [], 'dropout': 0.0}
enc = Encoder(**cfg).eval(); dec = VideoDecoder(**cfg, video_kernel_size=[3, 1, 1], alpha=0.0).eval()
randomize(enc); randomize(dec)

clip_cfg = {"attention_dropout": 0.0, "dropout": 0.0, "hidden_act": "gelu", "hidden_size": 32, "image_size": 32,
            "initializer_factor": 1.0, "initializer_range": 0.02, "intermediate_size": 64, "layer_norm_eps": 1e-05,
            "model_type": "clip_vision_model", "num_attention_heads": 2, "num_channels": 3, "num_hidden_layers": 1,
            "patch_size": 8, "projection_dim": 24, "torch_dtype": "float32"}
with open(str(TMP / "sonic_clip_reduced.json"), "w") as f:
    json.dump(clip_cfg, f)
cv = comfy.clip_vision.ClipVisionModel(str(TMP / "sonic_clip_reduced.json"))
cv.model.float()
randomize(cv.model)
hf_sd = {k: v.clone() for k, v in cv.model.state_dict().items()}

# open_clip naming of the same tensors (what svd_xt.safetensors holds)
P = "conditioner.embedders.0.open_clip.model.visual."
oc = {P + "class_embedding": hf_sd["vision_model.embeddings.class_embedding"],
      P + "conv1.weight": hf_sd["vision_model.embeddings.patch_embedding.weight"],
      P + "positional_embedding": hf_sd["vision_model.embeddings.position_embedding.weight"],
      P + "ln_pre.weight": hf_sd["vision_model.pre_layrnorm.weight"], P + "ln_pre.bias": hf_sd["vision_model.pre_layrnorm.bias"],
      P + "ln_post.weight": hf_sd["vision_model.post_layernorm.weight"], P + "ln_post.bias": hf_sd["vision_model.post_layernorm.bias"],
      P + "proj": hf_sd["visual_projection.weight"].t().contiguous()}
for i in range(clip_cfg["num_hidden_layers"]):
    L = f"vision_model.encoder.layers.{i}."; R = f"{P}transformer.resblocks.{i}."
    for a, b in (("ln_1", "layer_norm1"), ("ln_2", "layer_norm2"), ("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2"), ("attn.out_proj", "self_attn.out_proj")):
        for y in ("weight", "bias"):
            oc[R + a + "." + y] = hf_sd[L + b + "." + y]
    for y in ("weight", "bias"):
        oc[R + "attn.in_proj_" + y] = torch.cat([hf_sd[L + f"self_attn.{q}_proj.{y}"] for q in "qkv"])
# ComfyUI's own reader must turn that naming back into exactly its module's state dict
back = comfy.clip_vision.convert_to_transformers(dict(oc), P)
assert set(back) == set(hf_sd), (set(back) ^ set(hf_sd))
assert all(torch.equal(back[k], hf_sd[k]) for k in hf_sd)
missing, unexpected = cv.load_sd(back)
assert not unexpected, unexpected

sd = {}
sd.update({"first_stage_model.encoder." + k: v for k, v in enc.state_dict().items()})
sd.update({"first_stage_model.decoder." + k: v for k, v in dec.state_dict().items()})
sd.update(oc)
# the text tower's leftovers the real file keeps beside the image tower (not read)
sd["conditioner.embedders.0.open_clip.model.logit_scale"] = torch.tensor(4.6)
sd = {k: v.half().contiguous() for k, v in sd.items()}

frames = 3
x = torch.rand(2, 3, 32, 32, generator=g) * 2 - 1
z = torch.randn(frames, 4, 8, 8, generator=g)
pix = torch.randn(2, 3, 32, 32, generator=g)
with torch.no_grad():
    moments = enc(x)
    decoded = dec(z)  # ComfyUI decodes one clip: timesteps = batch
    out = cv.model(pixel_values=pix, intermediate_output=-2)
    image_embeds, last_hidden = out[2], out[0]
ios = {"vae_in": x, "vae_moments": moments, "latents": z, "decoded": decoded, "clip_pixels": pix,
       "clip_image_embeds": image_embeds, "clip_last_hidden": last_hidden}
save_file(sd, str(OUT / "sonic_svd_xt_comfyui.safetensors"), metadata={"made_by": "ComfyUI code (comfy.ldm Encoder/VideoDecoder, comfy.clip_vision) with seeded random weights"})
save_file({k: v.float().contiguous() for k, v in ios.items()}, str(OUT / "sonic_svd_xt_comfyui_outputs.safetensors"))
print(len(sd), "keys;", {k: tuple(v.shape) for k, v in ios.items()})
print("clip_cfg", json.dumps(clip_cfg))
