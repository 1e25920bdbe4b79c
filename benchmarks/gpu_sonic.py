"""Sonic on an NVIDIA GPU: one UNet call of an SVD-XT-shaped Sonic UNet (1.5 B parameters, seeded random
weights built on the device) at 512x512, 25 frames, the three guidance branches, per mode, in one run:
eager FP32, eager FP16 (branches batched: vram high), FP16 branches one by one (vram low), torch.compile FP16;
the temporal VAE decode of one 8-frame chunk and one RIFE middle frame at 512 px; peak GPU memory per mode
(torch.cuda.max_memory_allocated). The time of 10 s of speech at the reference's settings (25 steps, 5 windows
of 25 frames a step = 125 UNet calls, 16 decode chunks, 249 RIFE frames) is computed from these per-call times.
    python benchmarks/gpu_sonic.py --out benchmarks/results/gpu_sonic_h200.json [--no-compile]
"""
from __future__ import annotations

import argparse
import json
import time

import torch


def timed(fn, repeat: int = 3) -> float:
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def peak(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**30


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    from digital_human.engines.sonic.networks import IFNet, add_audio_processors, make_sonic_unet_class
    from digital_human.engines.sonic.random_release import unet_config, vae_config
    from diffusers import AutoencoderKLTemporalDecoder

    t_start = time.perf_counter()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    with dev:
        unet = make_sonic_unet_class().from_config(unet_config(False))
        add_audio_processors(unet)
    unet = unet.to(dev).eval().requires_grad_(False)  # legacy torch.Tensor(...) parameters ignore `with dev`
    params = sum(p.numel() for p in unet.parameters())
    f, h = 25, 64
    gen = torch.Generator(device=dev).manual_seed(0)

    def inputs(b: int, dtype):
        return (torch.randn(b, f, 8, h, h, generator=gen, device=dev).to(dtype), torch.tensor(1.2, device=dev),
                torch.randn(b * f, 1, 1024, generator=gen, device=dev).to(dtype),
                torch.randn(b * f, 32, 1024, generator=gen, device=dev).to(dtype),
                torch.tensor([[12.5, 20.0, 18.0]] * b, device=dev, dtype=dtype),
                torch.ones(1, 1, 512, 512, device=dev, dtype=dtype))

    rows: dict[str, dict] = {}
    with torch.no_grad():
        x32 = inputs(3, torch.float32)
        rows["eager_fp32_batched"] = {"s_per_call": timed(lambda: unet(*x32), 1), "peak_gib": peak(lambda: unet(*x32))}
        del x32
        unet.half()
        x16 = inputs(3, torch.float16)
        ref16 = unet(*x16)
        rows["eager_fp16_batched (vram high)"] = {"s_per_call": timed(lambda: unet(*x16)),
                                                  "peak_gib": peak(lambda: unet(*x16))}
        singles = [tuple(t[i:i + 1] if t.dim() > 0 and t.shape[0] == 3 else
                         (t[i * f:(i + 1) * f] if t.dim() > 0 and t.shape[0] == 3 * f else t) for t in x16)
                   for i in range(3)]
        rows["eager_fp16_sequential (vram low)"] = {
            "s_per_call": timed(lambda: [unet(*s) for s in singles]),
            "peak_gib": peak(lambda: [unet(*s) for s in singles])}
        compiled_error = None
        if not args.no_compile:
            try:
                compiled = torch.compile(unet)
                t0 = time.perf_counter()
                out = compiled(*x16)
                torch.cuda.synchronize()
                compile_s = time.perf_counter() - t0
                rows["compiled_fp16_batched"] = {"s_per_call": timed(lambda: compiled(*x16)), "compile_s": compile_s,
                                                 "max_abs_vs_eager_fp16": float((out - ref16).abs().max()),
                                                 "scale": float(ref16.abs().max()),
                                                 "peak_gib": peak(lambda: compiled(*x16))}
            except Exception as exc:  # reported, not hidden
                compiled_error = repr(exc)[:400]
        with dev:
            vae = AutoencoderKLTemporalDecoder.from_config(vae_config(False))
        vae = vae.to(dev).half().eval().requires_grad_(False)
        lat = torch.randn(8, 4, h, h, device=dev, dtype=torch.float16)
        rows["vae_decode_8_frames_fp16"] = {"s_per_call": timed(lambda: vae.decode(lat, num_frames=8).sample),
                                            "peak_gib_with_unet_resident": peak(lambda: vae.decode(lat, num_frames=8))}
        with dev:
            ifnet = IFNet(90).to(dev).eval()
        a, b = torch.rand(1, 3, 512, 512, device=dev), torch.rand(1, 3, 512, 512, device=dev)
        rows["rife_middle_frame_fp32"] = {"s_per_call": timed(lambda: ifnet(a, b))}

    def clip_seconds(call: float) -> float:
        return 125 * call + 16 * rows["vae_decode_8_frames_fp16"]["s_per_call"] + 249 * rows["rife_middle_frame_fp32"]["s_per_call"]

    estimate = {name: round(clip_seconds(r["s_per_call"]), 1) for name, r in rows.items() if "batched" in name or "low" in name}
    report = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "unet_parameters": params, "resolution": 512, "frames": f, "rows": rows,
              "estimated_seconds_10s_speech_25_steps": estimate, "compile_error": compiled_error,
              "wall_s": time.perf_counter() - t_start}
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=2)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
