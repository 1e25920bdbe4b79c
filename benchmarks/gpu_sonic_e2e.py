"""Sonic end to end on an NVIDIA GPU: our pipeline (talking_head/sonic/pipeline.py: whisper, audio MLPs, CLIP,
VAE encode, 25 denoising steps of time-shifted 25-frame windows with three guidance branches, VAE decode in chunks
of 8, RIFE middle frames) from a framed 512x512 photo and 10 s of 16 kHz sound to 249 uint8 frames at 25 fps.
The networks are SVD-XT / whisper-tiny / RIFE shaped with seeded random weights built on the device (no files);
not timed: building them, face detection, mp4 encoding. Rows (each written to --out as soon as it is measured):
  fp16_25_steps_windows_batched   the reference's settings, a step's windows in one UNet call (window_batch=0)
  fp16_10_steps_windows_batched   the faster mode (steps=10), with PSNR / max abs against the 25-step frames
  equality_2_steps                window_batch=0 vs 1 (one window per call) on the same inputs: max abs latents
    python benchmarks/gpu_sonic_e2e.py --out benchmarks/results/gpu_sonic_e2e_h200.json
"""
from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import torch


def build(dev: torch.device):
    from diffusers import AutoencoderKLTemporalDecoder
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection, WhisperConfig,
                              WhisperFeatureExtractor, WhisperModel)

    from digital_human.engines.sonic.load import SonicNetworks
    from digital_human.engines.sonic.networks import AudioBucket, AudioTokens, IFNet, add_audio_processors, make_sonic_unet_class
    from digital_human.engines.sonic.random_release import SCHEDULER_CONFIG, clip_config, unet_config, vae_config, whisper_config

    torch.manual_seed(0)
    with dev:
        unet = make_sonic_unet_class().from_config(unet_config(False))
        add_audio_processors(unet)
        vae = AutoencoderKLTemporalDecoder.from_config(vae_config(False))
        clip = CLIPVisionModelWithProjection(CLIPVisionConfig(**clip_config(False)))
        wcfg = whisper_config(False)
        whisper = WhisperModel(WhisperConfig(**wcfg)).encoder
        a2t = AudioTokens(10 * (wcfg["encoder_layers"] + 1) * wcfg["d_model"], 1024, 32, 1024)
        a2b = AudioBucket(50 * wcfg["d_model"] + 1024, 1024, 2, 1)
        ifnet = IFNet(90)
    for m in (unet, vae, clip):
        m.to(dev, torch.float16).eval().requires_grad_(False)
    for m in (whisper, a2t, a2b, ifnet):
        m.to(dev, torch.float32).eval().requires_grad_(False)
    features = WhisperFeatureExtractor(feature_size=80, sampling_rate=16000, hop_length=160, chunk_length=30,
                                       n_fft=400, padding_value=0.0)
    return SonicNetworks(unet=unet, vae=vae, clip=clip, whisper_encoder=whisper, audio2token=a2t, audio2bucket=a2b,
                         ifnet=ifnet, scheduler_config=dict(SCHEDULER_CONFIG), clip_processor=CLIPImageProcessor(),
                         whisper_features=features, dtype=torch.float16, device=dev)


def inputs(seconds: float):
    from digital_human.talking_head.sonic.crop import frame_photo

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:640, 0:640] / 640.0
    photo = np.stack([200 * xx + 30, 180 * yy + 40, 120 + 60 * np.sin(6 * xx * yy)], -1)
    photo = np.clip(photo + rng.normal(0, 8, photo.shape), 0, 255).astype(np.uint8)
    framing = frame_photo(photo, (220.0, 200.0, 420.0, 430.0), short_side=512)
    t = np.arange(int(seconds * 16000)) / 16000.0
    wave = (0.3 * np.sin(2 * np.pi * 180 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
            + 0.05 * rng.normal(size=t.shape)).astype(np.float32)
    return framing, wave


def run(nets, framing, wave, **settings):
    from digital_human.talking_head.sonic.pipeline import SonicFrames, SonicLatents, SonicSettings

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    lat = SonicLatents(nets, framing, wave, SonicSettings(**settings))
    made = SonicFrames(lat)
    frames = np.concatenate([made.uint8(j, min(j + 25, made.count)) for j in range(0, made.count, 25)])
    torch.cuda.synchronize()
    return (time.perf_counter() - t0, torch.cuda.max_memory_allocated() / 2**30, frames, lat.latents, lat)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    t_start = time.perf_counter()
    dev = torch.device("cuda")
    report: dict = {"date": "2026-12-02", "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                    "speech_seconds": args.seconds, "resolution": 512, "rows": {}}

    def save() -> None:
        report["wall_s"] = time.perf_counter() - t_start
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=2)
        print(json.dumps(report), flush=True)

    with torch.no_grad():
        nets = build(dev)
        report["unet_parameters"] = sum(p.numel() for p in nets.unet.parameters())
        report["build_s"] = time.perf_counter() - t_start
        framing, wave = inputs(args.seconds)
        run(nets, framing, wave, steps=1, vram="high", window_batch=0)  # warm-up (cuDNN / allocator), not kept
        s, gib, ref_frames, _, lat = run(nets, framing, wave, steps=25, vram="high", window_batch=0)
        report["model_frames"], report["output_frames"] = lat.count, int(ref_frames.shape[0])
        report["windows_per_call"] = lat._windows_per_call(-(-lat.count // 25), 64, 64)
        report["rows"]["fp16_25_steps_windows_batched"] = {"seconds": round(s, 2), "peak_gib": round(gib, 2),
                                                           "frame_std": float(ref_frames.std())}
        save()
        s, gib, fast_frames, _, _ = run(nets, framing, wave, steps=10, vram="high", window_batch=0)
        report["rows"]["fp16_10_steps_windows_batched"] = {
            "seconds": round(s, 2), "peak_gib": round(gib, 2), "psnr_db_vs_25_steps": round(psnr(fast_frames, ref_frames), 2),
            "max_abs_vs_25_steps": int(np.abs(fast_frames.astype(int) - ref_frames.astype(int)).max()),
            "mean_abs_vs_25_steps": float(np.abs(fast_frames.astype(int) - ref_frames.astype(int)).mean())}
        save()
        s1, g1, f1, l1, _ = run(nets, framing, wave, steps=2, vram="high", window_batch=1)
        s0, g0, f0, l0, _ = run(nets, framing, wave, steps=2, vram="high", window_batch=0)
        report["rows"]["equality_2_steps"] = {
            "one_window_per_call_s": round(s1, 2), "one_window_peak_gib": round(g1, 2),
            "batched_s": round(s0, 2), "batched_peak_gib": round(g0, 2),
            "max_abs_latents": float((l1.float() - l0.float()).abs().max()), "latent_scale": float(l1.float().abs().max()),
            "max_abs_frames_uint8": int(np.abs(f1.astype(int) - f0.astype(int)).max()),
            "psnr_db_frames": round(psnr(f1, f0), 2)}
        save()


if __name__ == "__main__":
    main()
