"""LatentSync 1.6 (full size, 512x512) on one GPU: the pack's denoising vs the reference's, same random weights.

Both sides get the same UNet weights (the pack's LatentSyncUNet built from stage2_512.yaml's model section with
seeded random weights, loaded strictly into the reference's own UNet3DConditionModel too), the same
sd-vae-ft-mse-shaped VAE, DDIM scheduler, 16-frame windows of 512x512 faces and audio windows, FP16:
- reference: its LipsyncPipeline's per-window work transcribed from __call__ (prepare_mask_latents,
  prepare_image_latents, 20 steps of [latents]*2 -> scale_model_input -> cat(mask, masked, ref) -> UNet ->
  guidance -> DDIM step, decode_latents, paste_surrounding_pixels_back) with the reference's UNet class;
- pack: engines/latentsync/pipeline.LatentSyncPipeline.window.
Face detection/alignment, whisper and video I/O are outside both timings (the reference's insightface detector
cannot run here). Frames per second, the largest difference of the two sides' outputs on the same draws, and
the peak GPU memory after a short and a long run of windows (the pack streams windows: memory must not grow).

  python benchmarks/latentsync_gpu.py --ref <copy of bytedance/LatentSync> --out results.json
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]


def _seeded_init(module: torch.nn.Module, seed: int) -> None:
    dev = next(module.parameters()).device
    g = torch.Generator(device=dev).manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.ndim == 1:
                p.copy_((1.0 if "norm" in name and name.endswith("weight") else 0.0)
                        + 0.02 * torch.randn(p.shape, generator=g, device=dev))
            else:
                fan_in = math.prod(p.shape[1:])
                p.copy_(torch.randn(p.shape, generator=g, device=dev) / math.sqrt(fan_in))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", type=Path, required=True)
    ap.add_argument("--short", type=int, default=2, help="windows of the short run (memory)")
    ap.add_argument("--long", type=int, default=6, help="windows of the long run (memory and speed)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true", help="reduced size on the CPU in FP32 (checks the script runs)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT.parent))
    from diffusers import AutoencoderKL

    from digital_human.engines.latentsync.pipeline import LatentSyncPipeline, Networks
    from digital_human.engines.latentsync.random_release import (DATA, UNET_MODEL_FULL, UNET_MODEL_REDUCED,
                                                                 VAE_CONFIG_FULL, VAE_CONFIG_REDUCED, stand_in_mask)
    from digital_human.engines.latentsync.unet import LatentSyncUNet

    model_cfg, vae_cfg, res = (UNET_MODEL_REDUCED, VAE_CONFIG_REDUCED, 64) if args.smoke else \
        (UNET_MODEL_FULL, VAE_CONFIG_FULL, 512)
    dt, dev = (torch.float32, torch.device("cpu")) if args.smoke else (torch.float16, torch.device("cuda"))
    rep: dict = {"gpu": "cpu (smoke)" if args.smoke else torch.cuda.get_device_name(), "torch": torch.__version__,
                 "steps": args.steps, "resolution": res, "window": 16, "precision": str(dt)}
    if args.smoke:  # the script's CUDA calls as no-ops on the CPU
        torch.cuda.synchronize = lambda *a: None
        torch.cuda.reset_peak_memory_stats = lambda *a: None
        torch.cuda.max_memory_allocated = lambda *a: 0
    unet = LatentSyncUNet(model_cfg).to(dev)
    _seeded_init(unet, 0)
    unet = unet.to(dt).eval()
    vae = AutoencoderKL(**{k: v for k, v in vae_cfg.items() if not k.startswith("_")}).to(dev, dt).eval()
    import cv2

    mask = torch.from_numpy(cv2.resize(stand_in_mask(), (res, res), interpolation=cv2.INTER_LANCZOS4) / 255.0)
    net = Networks(files=None, config={"model": model_cfg, "data": dict(DATA, resolution=res)}, unet=unet, vae=vae,
                   whisper=None, mask_image=mask.permute(2, 0, 1).contiguous(), device=dev, dtype=dt)
    rep["unet_params"] = sum(p.numel() for p in unet.parameters())
    rng = np.random.default_rng(0)
    faces = rng.integers(0, 256, (16, res, res, 3), dtype=np.uint8)
    audio = torch.from_numpy(rng.standard_normal((16, 50, 384)).astype(np.float32))
    pipe = LatentSyncPipeline(net, steps=args.steps)

    def ours(n: int, seed: int = 5) -> tuple[float, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        noise = pipe.initial_noise(g)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = None
        for _ in range(n):
            out = pipe.window(faces, audio, noise, g)
        torch.cuda.synchronize()
        return time.perf_counter() - t0, out

    ours(1)  # warm-up (cuDNN/cuBLAS choices)
    torch.cuda.reset_peak_memory_stats()
    ours(args.short)
    rep["pack_peak_gib_short"] = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    secs, out_ours = ours(args.long)
    rep["pack_peak_gib_long"] = torch.cuda.max_memory_allocated() / 2**30
    rep["pack_fps"] = 16 * args.long / secs
    rep["windows_short"], rep["windows_long"] = args.short, args.long
    print(json.dumps(rep), flush=True)

    # --- the reference -----------------------------------------------------------------------------------
    sys.path.insert(0, str(args.ref))
    for name in ("decord", "insightface", "insightface.app"):  # imported by util.py / face_detector.py, unused here
        stub = types.ModuleType(name)
        stub.AudioReader = stub.VideoReader = stub.FaceAnalysis = None
        sys.modules.setdefault(name, stub)
    from diffusers import DDIMScheduler
    from einops import rearrange

    from latentsync.models.unet import UNet3DConditionModel

    ref_unet = UNet3DConditionModel.from_config(model_cfg)
    missing = ref_unet.load_state_dict({k: v.float() for k, v in unet.state_dict().items()}, strict=True)
    rep["reference_strict_load"] = str(missing)
    ref_unet = ref_unet.to(dev, dt).eval()
    sched = DDIMScheduler.from_pretrained(str(args.ref / "configs"))
    mask_img = net.mask_image

    @torch.no_grad()
    def reference(n: int, seed: int = 5) -> tuple[float, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        sched.set_timesteps(args.steps, device=dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        shape = (1, 4, 1, res // 8, res // 8)
        all_latents = torch.randn(shape, generator=g, dtype=dt).to(dev).repeat(1, 1, 16, 1, 1) * sched.init_noise_sigma
        decoded = None
        for _ in range(n):
            a = audio.to(dev, dt)
            a = torch.cat([torch.zeros_like(a), a])
            x = rearrange(torch.from_numpy(faces), "f h w c -> f c h w")
            pixel_values = (x / 255.0 - 0.5) / 0.5
            masked = pixel_values * mask_img
            masks = torch.stack([mask_img[0:1]] * 16)
            m = torch.nn.functional.interpolate(masks, size=(res // 8, res // 8)).to(dev, dt)
            dist = vae.encode(masked.to(dev, dt)).latent_dist
            mlat = (dist.mean + dist.std * torch.randn(dist.mean.shape, generator=g, dtype=dt).to(dev)) * 0.18215
            dist = vae.encode(pixel_values.to(dev, dt)).latent_dist
            rlat = (dist.mean + dist.std * torch.randn(dist.mean.shape, generator=g, dtype=dt).to(dev)) * 0.18215
            m = torch.cat([rearrange(m, "f c h w -> 1 c f h w")] * 2)
            mlat = torch.cat([rearrange(mlat, "f c h w -> 1 c f h w")] * 2)
            rlat = torch.cat([rearrange(rlat, "f c h w -> 1 c f h w")] * 2)
            latents = all_latents
            for t in sched.timesteps:
                u = sched.scale_model_input(torch.cat([latents] * 2), t)
                u = torch.cat([u, m, mlat, rlat], dim=1)
                pred = ref_unet(u, t, encoder_hidden_states=a).sample
                un, au = pred.chunk(2)
                pred = un + 1.5 * (au - un)
                latents = sched.step(pred, t, latents).prev_sample
            dec = vae.decode(rearrange(latents / 0.18215, "b c f h w -> (b f) c h w")).sample
            keep = masks.to(dev, dt)
            decoded = dec * (1 - keep) + pixel_values.to(dev, dt) * keep
        torch.cuda.synchronize()
        return time.perf_counter() - t0, decoded

    reference(1)
    torch.cuda.reset_peak_memory_stats()
    secs, out_ref = reference(args.long)
    rep["reference_fps"] = 16 * args.long / secs
    rep["reference_peak_gib_long"] = torch.cuda.max_memory_allocated() / 2**30
    rep["speedup"] = rep["pack_fps"] / rep["reference_fps"]
    # the same draws on both sides when each ran `long` windows from seed 5: the last windows compared
    rep["max_abs_diff_fp16"] = float((out_ours.float() - out_ref.float()).abs().max())
    rep["mean_abs_diff_fp16"] = float((out_ours.float() - out_ref.float()).abs().mean())
    print(json.dumps(rep), flush=True)
    args.out.write_text(json.dumps(rep, indent=2) + "\n")


if __name__ == "__main__":
    main()
