"""SVD's parts from ComfyUI's single-file svd_xt*.safetensors (Stability's original names).

tests/fixtures/sonic/sonic_svd_xt_comfyui.safetensors was written by ComfyUI's own code
(benchmarks/sonic_comfyui_fixture.py, run in ComfyUI's venv): a reduced SVD VAE (comfy.ldm Encoder + temporal
VideoDecoder) and a reduced open_clip image tower (comfy.clip_vision; ComfyUI's convert_to_transformers reads the
names back exactly) with seeded random weights, and ..._outputs.safetensors holds ComfyUI's forward passes.
"""
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402

from digital_human.engines.sonic import files as sonic_files  # noqa: E402
from digital_human.engines.sonic import single_file as sf  # noqa: E402
from digital_human.engines.sonic.files import SonicFilesError, SonicWeightsError  # noqa: E402

HERE = Path(__file__).parent / "fixtures" / "sonic"
CKPT = HERE / "sonic_svd_xt_comfyui.safetensors"
OUTS = HERE / "sonic_svd_xt_comfyui_outputs.safetensors"
# the reduced sizes the fixture was built with (ComfyUI: ch 32, ch_mult [1, 2], num_res_blocks 2)
VAE = {"_class_name": "AutoencoderKLTemporalDecoder", "block_out_channels": [32, 64],
       "down_block_types": ["DownEncoderBlock2D"] * 2, "in_channels": 3, "latent_channels": 4, "layers_per_block": 2,
       "out_channels": 3, "sample_size": 32, "scaling_factor": 0.18215, "force_upcast": True}
CLIP = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_hidden_layers": 1, "patch_size": 8,
        "image_size": 32, "projection_dim": 24, "hidden_act": "gelu", "layer_norm_eps": 1e-5}


def test_equals_comfyui_modules():
    vae, clip = sf.load_parts(CKPT, VAE, CLIP, unet_signature=())  # the fixture has no UNet
    ref = load_file(str(OUTS))
    with torch.no_grad():
        moments = vae.quant_conv(vae.encoder(ref["vae_in"]))
        decoded = vae.decode(ref["latents"], num_frames=ref["latents"].shape[0]).sample
        out = clip(pixel_values=ref["clip_pixels"])
    assert (moments - ref["vae_moments"]).abs().max() < 1e-4
    assert (decoded - ref["decoded"]).abs().max() < 1e-4
    assert ref["decoded"].std() > 0.05  # a real signal, not a constant
    assert (out.image_embeds - ref["clip_image_embeds"]).abs().max() < 1e-5
    assert (out.last_hidden_state - ref["clip_last_hidden"]).abs().max() < 1e-5


def _expected(module):
    return {k: tuple(v.shape) for k, v in module.state_dict().items() if not k.endswith("position_ids")}


def test_missing_and_extra_keys_name_themselves():
    from diffusers import AutoencoderKLTemporalDecoder
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    sgm = load_file(str(CKPT))
    vae_expected = _expected(AutoencoderKLTemporalDecoder.from_config(VAE))
    clip_expected = _expected(CLIPVisionModelWithProjection(CLIPVisionConfig(**CLIP)))
    gone = dict(sgm)
    del gone["first_stage_model.decoder.up.0.block.1.time_stack.out_layers.3.weight"]
    with pytest.raises(SonicWeightsError, match=r"decoder\.up_blocks\.1\.resnets\.1\.temporal_res_block\.conv2\.weight"):
        sf.vae_state(gone, vae_expected, CKPT)
    extra = dict(sgm)
    extra["first_stage_model.decoder.up.0.block.7.norm1.weight"] = torch.zeros(32)
    with pytest.raises(SonicWeightsError, match=r"first_stage_model\.decoder\.up\.0\.block\.7\.norm1\.weight"):
        sf.vae_state(extra, vae_expected, CKPT)
    bad = dict(sgm)
    bad[sf.CLIP_PREFIX + "proj"] = torch.zeros(32, 25)
    with pytest.raises(SonicWeightsError, match=r"visual_projection\.weight \(25, 32\)"):
        sf.clip_state(bad, clip_expected, CKPT)
    extra = dict(sgm)
    extra[sf.CLIP_PREFIX + "transformer.resblocks.0.attn.bogus"] = torch.zeros(1)
    with pytest.raises(SonicWeightsError, match=r"resblocks\.0\.attn\.bogus"):
        sf.clip_state(extra, clip_expected, CKPT)


def test_layout_refuses_other_checkpoints():
    class Shape:
        def __init__(self, *s):
            self.shape = s

    svd = {sf.UNET_PREFIX + k: Shape(*s) for k, s in sf.UNET_SIGNATURE}
    sf.check_layout(svd, CKPT)
    sd15 = dict(svd)
    sd15[sf.UNET_PREFIX + "input_blocks.0.0.weight"] = Shape(320, 4, 3, 3)
    with pytest.raises(SonicWeightsError, match=r"input_blocks\.0\.0\.weight has shape \(320, 4, 3, 3\)"):
        sf.check_layout(sd15, CKPT)
    with pytest.raises(SonicWeightsError, match="cond_stage_model"):
        sf.check_layout({**svd, "cond_stage_model.x": Shape(1)}, CKPT)


def _sonic_files(root: Path) -> None:
    for names, _ in sonic_files.SONIC_REQUIRED:
        path = root / "sonic" / names[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")


def test_locate_uses_comfyui_checkpoint_and_error_names_both_options(tmp_path, monkeypatch):
    monkeypatch.delenv(sonic_files.CHECKPOINTS_ENV, raising=False)
    models = tmp_path / "models" / "digital_human"
    _sonic_files(models)
    with pytest.raises(SonicFilesError) as err:
        sonic_files.locate(models)
    text = str(err.value)
    assert "stable-video-diffusion-img2vid-xt/vae/config.json" in text  # option 1: the diffusers folder
    assert "svd_xt*.safetensors" in text and str(tmp_path / "models" / "checkpoints") in text  # option 2
    assert sonic_files.CHECKPOINTS_ENV in text and "CC BY-NC-SA" in text
    ckpt = tmp_path / "models" / "checkpoints" / "svd_xt.safetensors"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(CKPT.read_bytes())
    found = sonic_files.locate(models)
    assert found.svd_checkpoint == ckpt and found.vae_weights is None
    assert any(row[0] == str(ckpt) and row[1] for row in sonic_files.file_status(models))
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.setenv(sonic_files.CHECKPOINTS_ENV, str(other))
    with pytest.raises(SonicFilesError, match="svd_xt"):
        sonic_files.locate(models)
