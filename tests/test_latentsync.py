"""`digital-human animate --model latentsync`: refused up front (exit 2, every missing file named) without the
user's LatentSync files, and run to an MP4 of the audio's length with a release-laid-out random-weight checkpoint
(reduced configuration, 2 DDIM steps to keep CI fast; the mouth is noise, the command's path is real). Plus the
strict loaders: a file that does not match its config is named with what is wrong; and stage-by-stage parity
with the reference code's outputs, committed as a fixture."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from digital_human.media.probe import probe_media


def _animate(models: Path, audio: Path, face: Path, out: Path, *extra: str,
             env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run([sys.executable, "-m", "digital_human", "animate", "--audio", str(audio), "--face", str(face),
                           "--model", "latentsync", "--out", str(out), "--json", *extra], capture_output=True, text=True,
                          env={**os.environ, "DIGITAL_HUMAN_MODELS": str(models), **(env or {})}, timeout=600)
    lines = proc.stdout.strip().splitlines()
    return proc, (json.loads(lines[-1]) if lines else {})


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    pytest.importorskip("diffusers", reason="LatentSync is an optional extra: pip install .[latentsync]")
    pytest.importorskip("yaml", reason="LatentSync is an optional extra: pip install .[latentsync]")
    from digital_human.engines.latentsync.random_release import write_release

    root = tmp_path_factory.mktemp("ls_models")
    write_release(root, "reduced", seed=0)
    return root


def _models_with(tmp_path: Path, release: Path | None) -> Path:
    """The setup step's face models, plus (or without) the LatentSync random-weight release."""
    from digital_human.paths import models_root

    root = tmp_path / "models"
    root.mkdir()
    (root / "face").symlink_to(models_root() / "face", target_is_directory=True)
    if release is not None:
        (root / "latentsync").symlink_to(release / "latentsync", target_is_directory=True)
    return root


def test_without_the_files_animate_stops_before_any_work(tmp_path, data_dir, setup_models):
    out = tmp_path / "results" / "talk.mp4"
    proc, report = _animate(_models_with(tmp_path, None), data_dir / "audio" / "spk_en_03.wav",
                            data_dir / "image" / "face_01_female.jpg", out)
    assert proc.returncode == 2 and report["ok"] is False, (proc.returncode, proc.stderr[-2000:])
    for name in ("--model latentsync", "latentsync_unet.pt", "whisper/tiny.pt", "configs/unet/stage2_512.yaml",
                 "stage2.yaml", "latentsync/utils/mask.png", "sd-vae-ft-mse/config.json",
                 "sd-vae-ft-mse/diffusion_pytorch_model.safetensors", "nothing is downloaded"):
        assert name in report["error"], (name, report["error"])
    assert "Traceback" not in proc.stderr and not (tmp_path / "results").exists()


def test_with_a_release_laid_out_checkpoint_animate_makes_an_mp4(tmp_path, data_dir, setup_models, release):
    import soundfile as sf

    wave, rate = sf.read(data_dir / "audio" / "spk_en_03.wav", dtype="float32")
    speech = tmp_path / "speech.wav"
    sf.write(speech, wave[: int(0.6 * rate)], rate)  # 0.6 s: 18 frames of the 30-fps video = two 16-frame windows
    out = tmp_path / "talk.mp4"
    video = data_dir / "video" / "talk_en_male_01a.mp4"
    # the settings as --set (2 steps keep CI fast; the cheap DeepCache-style step runs too), and a variable that
    # wins over its --set value, said in the log
    proc, report = _animate(_models_with(tmp_path, release), speech, video, out, "--set", "steps=2",
                            "--set", "guidance=2", "--set", "deepcache=2",
                            env={"DIGITAL_HUMAN_LATENTSYNC_GUIDANCE": "2.5"})
    assert proc.returncode == 0 and report["ok"] is True, (proc.returncode, proc.stderr[-3000:])
    assert "latentsync" in json.dumps(report["backend"]).lower(), report["backend"]
    assert "2 DDIM steps, guidance 2.5" in proc.stderr and "DeepCache-style faster mode (interval 2" in proc.stderr
    assert "DIGITAL_HUMAN_LATENTSYNC_GUIDANCE=2.5 overrides the guidance setting 2" in proc.stderr
    probe = probe_media(out)
    fps = probe_media(video).frame_count / probe_media(video).video_duration
    assert probe.frame_count == round(0.6 * fps) == 18 and abs(probe.audio_duration - 0.6) < 0.05, probe


def test_strict_loader_names_what_does_not_match(tmp_path, release):
    import shutil

    import torch

    from digital_human.engines.latentsync.files import LatentSyncWeightsError, locate
    from digital_human.engines.latentsync.pipeline import load_unet, read_unet_config
    from digital_human.engines.latentsync.audio import load_whisper

    root = tmp_path / "m"
    shutil.copytree(release / "latentsync", root / "latentsync")
    files = locate(root)
    cfg = read_unet_config(files.unet_config)
    ckpt = torch.load(files.unet_weights, weights_only=True)
    assert set(ckpt) == {"global_step", "state_dict"}
    load_unet(files, cfg)  # the written release loads strictly
    state = ckpt["state_dict"]
    dropped = "up_blocks.1.motion_modules.0.temporal_transformer.transformer_blocks.0.attention_blocks.1.pos_encoder.pe"
    assert dropped in state
    del state[dropped]
    state["conv_in.weight"] = state["conv_in.weight"][:, :9]  # a 9-channel (stage 1) input layer
    torch.save(ckpt, files.unet_weights)
    with pytest.raises(LatentSyncWeightsError) as err:
        load_unet(files, cfg)
    msg = str(err.value)
    assert dropped in msg and "conv_in.weight" in msg and "missing" in msg and "shape" in msg, msg

    tiny = torch.load(files.whisper, weights_only=True)
    tiny["model_state_dict"]["encoder.blocks.1.mlp.0.weight"] = torch.zeros(3, 3)
    torch.save(tiny, files.whisper)
    with pytest.raises(LatentSyncWeightsError, match="encoder.blocks.1.mlp.0.weight|blocks.1.mlp.0.weight"):
        load_whisper(files.whisper)


def _parity_module():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "latentsync_parity.py"
    spec = importlib.util.spec_from_file_location("latentsync_parity", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_stage_matches_the_reference_fixture(release):
    """The committed fixture holds the reference's own outputs (bytedance/LatentSync's LipsyncPipeline end to end,
    FP32 CPU, benchmarks/latentsync_parity.py) on the same random-weight release (reduced, seed 0) and inputs: the
    whisper features, UNet forward, LatentSync's affines and face crops, the denoised faces (3 DDIM steps, CFG 1.5,
    the same generator) and the restored frames."""
    import numpy as np

    fx = dict(np.load(Path(__file__).parent / "fixtures" / "latentsync" / "reduced.npz"))
    parity = _parity_module()
    n_ref = int(fx["ref_chunks_n"])
    ours = parity.run_pack(release, {"frames": fx["frames"], "points": fx["points"], "wave": fx["wave"],
                                     "unet_in": fx["unet_in"]}, n_ref, int(fx["steps"]), 1.5)
    ref_frames = (fx["frames"][:n_ref].astype(np.int16) + fx["ref_frames_delta"]).astype(np.uint8)
    assert np.abs(ours["features"] - fx["ref_features"]).max() < 1e-5
    assert np.abs(ours["unet_out"] - fx["ref_unet_out"]).max() < 2e-3 * np.abs(fx["ref_unet_out"]).max()
    assert np.abs(ours["affines"] - fx["ref_affines"]).max() < 1e-4
    face_diff = np.abs(ours["faces"].astype(int) - fx["ref_faces"].astype(int))
    assert face_diff.max() <= 1 and face_diff.mean() < 0.02  # float warp truncated to uint8 as the reference
    assert np.abs(ours["synced"] - fx["ref_synced"].astype(np.float32)).max() < 0.06
    frame_diff = np.abs(ours["frames"].astype(int) - ref_frames.astype(int))
    assert frame_diff.max() <= 6 and frame_diff.mean() < 0.1, (frame_diff.max(), frame_diff.mean())
    assert (ref_frames != fx["frames"][:n_ref]).any()  # the fixture's frames were really changed by the model


def test_deep_cache_reuse_on_the_same_input_gives_the_full_output():
    """The faster mode's cheap step (conv_in, first down block, last up block on the kept feature) is wired to the
    right skips: on the input that filled the cache it reproduces the full UNet's output."""
    pytest.importorskip("diffusers", reason="LatentSync is an optional extra: pip install .[latentsync]")
    import torch

    from digital_human.engines.latentsync.random_release import UNET_MODEL_REDUCED
    from digital_human.engines.latentsync.unet import LatentSyncUNet

    torch.manual_seed(0)
    net = LatentSyncUNet(UNET_MODEL_REDUCED).eval()
    x, audio = torch.randn(2, 13, 4, 8, 8), torch.randn(8, 30, 384)
    cache: dict = {}
    with torch.no_grad():
        full = net(x, torch.tensor(501), audio, uncond_rows=1, deep_cache=cache)
        cheap = net(x, torch.tensor(501), audio, uncond_rows=1, deep_cache=cache, reuse=True)
        other = net(x + 0.5, torch.tensor(501), audio, uncond_rows=1, deep_cache=cache, reuse=True)
    assert torch.allclose(full, cheap, atol=1e-5)
    assert not torch.allclose(full, other, atol=1e-3)  # the cheap step still reads its own input


def test_unet_step_exports_to_onnx_with_a_dynamic_frame_axis(tmp_path):
    """The engine layer's graph (engines/latentsync/export.py) computes the torch UNet step on ONNX Runtime (CPU),
    for a full 16-frame window and a shorter last one, at reduced size."""
    pytest.importorskip("diffusers", reason="LatentSync is an optional extra: pip install .[latentsync]")
    pytest.importorskip("onnxruntime")
    import numpy as np
    import torch

    from digital_human.engines.latentsync.export import example_inputs, export_unet, unet_spec, unet_step_module
    from digital_human.engines.latentsync.random_release import UNET_MODEL_REDUCED
    from digital_human.engines.latentsync.unet import LatentSyncUNet
    from digital_human.engines.onnx_export import parity

    torch.manual_seed(0)
    net = LatentSyncUNet(UNET_MODEL_REDUCED).eval()
    path = export_unet(net, tmp_path / "unet.onnx", latent=8, window=30)
    for frames in (16, 3):
        inputs = example_inputs(8, frames, 30, seed=frames)
        with torch.no_grad():
            scale = float(np.abs(net(*[torch.from_numpy(a) for a in inputs], uncond_rows=1).numpy()).max())
        report = parity(unet_step_module(net), path, inputs)
        assert report.max_abs_diff < 1e-3 * max(scale, 1.0), (frames, report, scale)
    spec = unet_spec(path, latent=8)
    assert spec.profiles["sample"].min[2] == 1 and spec.profiles["sample"].max[2] == 16


def test_shared_rows_gives_the_unshared_output():
    """Guidance rows that are the same latents (shared_rows=True) run once up to the first audio cross-attention;
    the output equals running every row (the rows differ only in their audio)."""
    pytest.importorskip("diffusers", reason="LatentSync is an optional extra: pip install .[latentsync]")
    import torch

    from digital_human.engines.latentsync.random_release import UNET_MODEL_REDUCED
    from digital_human.engines.latentsync.unet import LatentSyncUNet

    torch.manual_seed(0)
    net = LatentSyncUNet(UNET_MODEL_REDUCED).eval()
    x, audio = torch.randn(1, 13, 4, 8, 8).expand(2, -1, -1, -1, -1).contiguous(), torch.randn(8, 30, 384)
    with torch.no_grad():
        each = net(x, torch.tensor(501), audio, uncond_rows=1)
        shared = net(x, torch.tensor(501), audio, uncond_rows=1, shared_rows=True)
    # FP32 sums in another order (one row's GEMMs vs two rows'): 1e-4 here, against rows 0.26 apart
    assert torch.allclose(each, shared, atol=5e-4)
    assert not torch.allclose(each[0], each[1], atol=1e-2)  # the rows really differ (audio vs none)


def _reduced_unet_with_motion():
    """The reduced LatentSync UNet, seeded, with its motion modules' zero-initialised weights (AnimateDiff's proj_out)
    drawn too, so that the temporal attention counts in the output."""
    import torch

    from digital_human.engines.latentsync.random_release import UNET_MODEL_REDUCED
    from digital_human.engines.latentsync.unet import LatentSyncUNet

    torch.manual_seed(0)
    net = LatentSyncUNet(UNET_MODEL_REDUCED).eval()
    with torch.no_grad():
        for p in net.parameters():
            if not p.any():
                p.normal_(0, 0.02)
    return net


def test_short_attention_switch_routes_every_temporal_attention_and_keeps_the_output(monkeypatch):
    """set_short_attention(True) sends the motion modules' temporal attention (and nothing else) to the short-sequence
    kernel where it can run; the output stays the SDPA path's. The CPU has no Triton kernel: `available` is made true
    and the kernel's entry answered by its torch reference, so what is checked is the routing and the layout the
    kernel returns ([B, F, H, D] memory); the kernel's own maths are tests/test_short_attention.py's."""
    pytest.importorskip("diffusers", reason="LatentSync is an optional extra: pip install .[latentsync]")
    import torch

    from digital_human.engines.latentsync import short_attention as short
    from digital_human.engines.latentsync.unet import TemporalAttention

    net = _reduced_unet_with_motion()
    x, audio = torch.randn(2, 13, 4, 8, 8), torch.randn(8, 30, 384)
    calls: list = []

    def kernel(q, k, v):
        calls.append(tuple(q.shape))
        return short._reference_short_attention(q, k, v)

    monkeypatch.setattr(short, "available", lambda device: True)
    monkeypatch.setattr(short, "short_attention", kernel)
    with torch.no_grad():
        sdpa = net(x, torch.tensor(501), audio, uncond_rows=1)
        assert not calls
        switched = net.set_short_attention(True)
        fast = net(x, torch.tensor(501), audio, uncond_rows=1)
    temporal = sum(isinstance(m, TemporalAttention) for m in net.modules())
    assert switched == temporal > 0 and len(calls) == temporal  # each temporal attention once, nothing else
    assert all(shape[2] == 4 for shape in calls)  # sequences of the window's 4 frames
    # FP32 sums in another order (matmuls vs SDPA's math kernel): 1.3e-5 here; a kernel with q scaled by 1.2 or its
    # values' frames reversed moves the output by 0.11 / 0.32 (checked by hand)
    assert torch.allclose(sdpa, fast, atol=5e-4)
    net.set_short_attention(False)
    with torch.no_grad():
        net(x, torch.tensor(501), audio, uncond_rows=1)
    assert len(calls) == temporal  # switched back: SDPA again


def test_short_attention_is_the_fast_path_default_where_the_kernel_runs(monkeypatch):
    """Unset: the kernel wherever it can run (CUDA with Triton); 1 / 0 force it; anything else is refused naming the
    variable (measured on an H200: faster, windows within 1.12 of 255 levels of SDPA's; RESULTS.md)."""
    from digital_human.engines.latentsync import short_attention
    from digital_human.engines.latentsync.pipeline import SHORT_ATTENTION_ENV, short_attention_wanted

    monkeypatch.delenv(SHORT_ATTENTION_ENV, raising=False)
    monkeypatch.setattr(short_attention, "available", lambda device: str(device).startswith("cuda"))
    assert short_attention_wanted("cuda") is True and short_attention_wanted("cpu") is False
    monkeypatch.setenv(SHORT_ATTENTION_ENV, "0")
    assert short_attention_wanted("cuda") is False
    monkeypatch.setenv(SHORT_ATTENTION_ENV, "1")
    assert short_attention_wanted("cpu") is True
    monkeypatch.setenv(SHORT_ATTENTION_ENV, "yes")
    with pytest.raises(ValueError, match=SHORT_ATTENTION_ENV):
        short_attention_wanted("cuda")


def test_fused_projections_keep_the_output_and_the_state_dict():
    """fuse_projections stacks every self-attention's q/k/v (spatial attn1, the motion modules' temporal attention) into
    one projection, leaves cross-attention alone and the state dict (strict loading) as it was; the output stays."""
    pytest.importorskip("diffusers", reason="LatentSync is an optional extra: pip install .[latentsync]")
    import torch

    from digital_human.engines.latentsync.unet import Attention

    net = _reduced_unet_with_motion()
    keys = sorted(net.state_dict())
    x, audio = torch.randn(2, 13, 4, 8, 8), torch.randn(8, 30, 384)
    with torch.no_grad():
        three = net(x, torch.tensor(501), audio, uncond_rows=1)
        fused = net.fuse_projections()
        one = net(x, torch.tensor(501), audio, uncond_rows=1)
    attentions = [m for m in net.modules() if isinstance(m, Attention)]
    cross = [m for m in attentions if m.to_k.in_features != m.to_q.in_features]
    assert cross and fused == len(attentions) - len(cross) > 0
    assert all(m.qkv_weight is None for m in cross)
    assert sorted(net.state_dict()) == keys
    one_attn = next(m for m in attentions if m.qkv_weight is not None)
    stacked = one_attn.qkv_weight
    # q/k/v hold slices of the stacked weight (one copy in memory), and a second fuse keeps that tensor (the
    # fast path fuses once per guidance mode; graphs captured by the first read its address)
    assert one_attn.to_q.weight.data_ptr() == stacked.data_ptr()
    assert one_attn.to_v.weight.data_ptr() == stacked[2 * one_attn.to_q.out_features:].data_ptr()
    assert net.fuse_projections() == fused and one_attn.qkv_weight is stacked
    # FP32: the same products in one GEMM instead of three (equal here); a fused weight with k and v swapped moves the
    # output by 0.97 (checked by hand)
    assert torch.allclose(three, one, atol=1e-5)


def test_autotune_gemm_variable_reaches_the_fast_paths_compile(monkeypatch):
    """DIGITAL_HUMAN_LATENTSYNC_AUTOTUNE_GEMM=1 compiles the fast path's functions with inductor's max_autotune_gemm
    option (as a compile option, not through the process-wide inductor config); unset, torch.compile gets none."""
    pytest.importorskip("diffusers", reason="LatentSync is an optional extra: pip install .[latentsync]")
    import torch

    from digital_human.engines.latentsync import pipeline
    from digital_human.engines.latentsync.random_release import DATA, UNET_MODEL_REDUCED
    from digital_human.engines.latentsync.unet import LatentSyncUNet

    seen = []
    monkeypatch.setattr(pipeline.torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    monkeypatch.setattr(pipeline.torch.backends.cudnn, "benchmark", False)  # FastPath turns it on
    net = pipeline.Networks(files=None, config={"model": UNET_MODEL_REDUCED, "data": dict(DATA, resolution=64)},
                            unet=LatentSyncUNet(UNET_MODEL_REDUCED).eval(), vae=torch.nn.Identity(), whisper=None,
                            mask_image=torch.ones(3, 64, 64), device=torch.device("cpu"), dtype=torch.float32)
    monkeypatch.delenv(pipeline.AUTOTUNE_GEMM_ENV, raising=False)
    plain = pipeline.FastPath(net, 1, autotune_gemm=pipeline.autotune_gemm_wanted())
    monkeypatch.setenv(pipeline.AUTOTUNE_GEMM_ENV, "1")
    tuned = pipeline.FastPath(net, 1, autotune_gemm=pipeline.autotune_gemm_wanted())
    assert not plain.autotune_gemm and tuned.autotune_gemm
    assert len(seen) == 8 and all(kw["options"] is None for kw in seen[:4])
    assert all(kw["options"] == {"max_autotune_gemm": True} and kw["dynamic"] is False for kw in seen[4:])
    monkeypatch.setenv(pipeline.AUTOTUNE_GEMM_ENV, "yes")
    with pytest.raises(ValueError, match=pipeline.AUTOTUNE_GEMM_ENV):
        pipeline.autotune_gemm_wanted()


def test_a_mistyped_speed_switch_is_the_models_problem(monkeypatch, tmp_path):
    """A bad value of any LatentSync fast-path variable is refused by the model's check (the CLI before the models
    load, ComfyUI at queue time), with the files' problem when both are wrong; good values add nothing."""
    from digital_human.engines.latentsync.pipeline import (AUTOTUNE_GEMM_ENV, FUSED_QKV_ENV, SHORT_ATTENTION_ENV,
                                                           switches_problem)
    from digital_human.talking_head.registry import model_problem

    for name in (FUSED_QKV_ENV, AUTOTUNE_GEMM_ENV, SHORT_ATTENTION_ENV):
        monkeypatch.delenv(name, raising=False)
    assert switches_problem() is None
    monkeypatch.setenv("DIGITAL_HUMAN_MODELS", str(tmp_path))  # no release there
    missing = model_problem("latentsync")
    assert missing and FUSED_QKV_ENV not in missing
    for name in (FUSED_QKV_ENV, AUTOTUNE_GEMM_ENV, SHORT_ATTENTION_ENV):
        monkeypatch.setenv(name, "on")
        problem = model_problem("latentsync")
        assert name in problem and "give 1" in problem and missing.splitlines()[0] in problem
        monkeypatch.setenv(name, "1")
    assert model_problem("latentsync") == missing


def test_fused_qkv_variable(monkeypatch):
    from digital_human.engines.latentsync.pipeline import FUSED_QKV_ENV, fused_qkv_wanted

    monkeypatch.delenv(FUSED_QKV_ENV, raising=False)
    assert fused_qkv_wanted() is False
    monkeypatch.setenv(FUSED_QKV_ENV, "1")
    assert fused_qkv_wanted() is True
    monkeypatch.setenv(FUSED_QKV_ENV, "on")
    with pytest.raises(ValueError, match=FUSED_QKV_ENV):
        fused_qkv_wanted()
