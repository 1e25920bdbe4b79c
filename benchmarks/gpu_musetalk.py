"""MuseTalk 1.5 generated frames/s at 256x256 on a GPU: eager FP32 vs FP16 / BF16, batched, eager or compiled.

Full-size networks (musetalk.json UNet, sd-vae-ft-mse VAE) with random weights (speed does not depend
on the values), run through the pack's own pipeline (engines/musetalk/pipeline.py, parity-proven
against the reference code): per batch the UNet step at timestep 0 on cached reference latents and
whisper windows, the VAE decode, and the uint8 crops copied back to the host. The audio encoder and
the reference-latent encoding (once per reference frame) are not in the loop; their cost is reported
apart. Peak GPU memory per setting.

A setting is precision:batch[:mode]. Modes: "eager" (the pipeline's default: NCHW, uint8 quantisation
on the GPU), "cl" (the same with a channels-last UNet and VAE decoder), "old" (the pipeline before
2026-12: float crops copied to the host and quantised there by numpy), "compile"
(MuseTalkPipeline(compile=True): the whole step through torch.compile, channels-last, for the batch; its
first call, the compilation, is reported as compile_s), "compile-nchw" (compiled with NCHW weights).
x_vs_fp32 is against the faster eager FP32 row (eager or old) at the smallest FP32 batch of the run.

  python benchmarks/gpu_musetalk.py --out $OUT            # GPU
  python benchmarks/gpu_musetalk.py --out /tmp/x --tiny   # CPU smoke test (reduced networks)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402


def build(size: str, device: str, dtype):
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel

    from digital_human.engines.musetalk import random_release as rr
    from digital_human.engines.musetalk.networks import MuseTalkNetworks

    unet_cfg, vae_cfg, _, _ = rr.CONFIGS[size]
    torch.manual_seed(0)
    with torch.device(device):
        unet = UNet2DConditionModel(**{k: v for k, v in unet_cfg.items() if not k.startswith("_")})
        vae = AutoencoderKL(**{k: v for k, v in vae_cfg.items() if not k.startswith("_")})
    unet = unet.to(dtype).eval().requires_grad_(False)
    vae = vae.to(dtype).eval().requires_grad_(False)
    return MuseTalkNetworks(unet=unet, vae=vae, whisper=None, files=None)


def legacy_generate(pipe, latents, windows):
    """The pipeline's generate() before 2026-12: decoded floats to the host, quantised there by numpy."""
    image = pipe.decode(pipe.unet_step(latents, windows))
    return (image.detach().cpu().permute(0, 2, 3, 1).float().numpy() * 255).round().astype(np.uint8)


def stage_ms(pipe, latents, windows, reps: int = 3) -> dict:
    """Per-batch milliseconds of the eager UNet step and VAE decode alone (synchronised)."""
    import torch

    out = {}
    for name, fn in (("unet_ms", lambda: pipe.unet_step(latents, windows)),
                     ("decode_ms", lambda: pipe.decode(pred))):
        pred = pipe.unet_step(latents, windows)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        out[name] = round(1000 * (time.perf_counter() - t0) / reps, 1)
    return out


def measure(pipe, batch: int, seconds: float, audio_len: int, mode: str = "eager") -> dict:
    import torch

    rng = np.random.default_rng(0)
    crop = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
    sync = torch.cuda.synchronize if pipe.device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    ref = pipe.reference_latents(0, crop)
    sync()
    encode_s = time.perf_counter() - t0
    latents = ref.repeat(batch, 1, 1, 1)
    windows = torch.from_numpy(rng.standard_normal((batch, audio_len, 384)).astype(np.float32)).to(pipe.device)
    generate = (lambda a, b: legacy_generate(pipe, a, b)) if mode == "old" else pipe.generate
    t0 = time.perf_counter()
    generate(latents, windows)  # warm-up (compilation, cuDNN autotune, allocator)
    sync()
    first_s = time.perf_counter() - t0
    generate(latents, windows)
    sync()
    if pipe.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    frames, t0 = 0, time.perf_counter()
    while True:
        out = generate(latents, windows)
        frames += len(out)
        if time.perf_counter() - t0 >= seconds:
            break
    sync()
    wall = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**20 if pipe.device.type == "cuda" else 0.0
    r = {"batch": batch, "frames": frames, "seconds": round(wall, 3), "fps": round(frames / wall, 1),
         "peak_mb": round(peak, 1), "reference_encode_s": round(encode_s, 4), "first_call_s": round(first_s, 2)}
    if mode.startswith("compile"):
        r["compile_s"] = None if pipe.compile_seconds is None else round(pipe.compile_seconds, 1)
        r["compile_note"] = pipe.compile_note
    elif pipe.device.type == "cuda":
        r.update(stage_ms(pipe, latents, windows))
    r["sample"] = out[0]
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tiny", action="store_true", help="reduced networks (CPU smoke test)")
    ap.add_argument("--seconds", type=float, default=4.0, help="timed seconds per setting")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="start no new setting after this many seconds (0 = no limit); skipped ones are listed")
    ap.add_argument("--settings", default="fp32:8:old,fp32:8,bf16:64,fp16:64,bf16:64:compile,fp16:64:compile,"
                                          "bf16:128:compile,bf16:64:compile-nchw")
    args = ap.parse_args()
    import_pack()
    import torch

    from digital_human.engines.musetalk.pipeline import MuseTalkPipeline

    start = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cudnn.benchmark = True
    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    size = "reduced" if args.tiny else "full"
    audio_len = 20 if args.tiny else 50
    rows, samples, skipped = [], {}, []
    nets = None  # (precision, networks): one precision's networks at a time
    args.out.mkdir(parents=True, exist_ok=True)

    def report() -> dict:
        eager = [r for r in rows if r["precision"] == "fp32" and r["mode"] in ("eager", "old") and "fps" in r]
        small = min((r["batch"] for r in eager), default=None)
        base = max((r["fps"] for r in eager if r["batch"] == small), default=None)
        for r in rows:
            r["x_vs_fp32"] = round(r["fps"] / base, 2) if base and "fps" in r else None
        ref = samples.get("fp32") if samples.get("fp32") is not None else samples.get("fp32 old")
        diffs = {f"{k.replace(' ', '_')}_vs_fp32_uint8_max_diff": int(np.abs(v.astype(int) - ref.astype(int)).max())
                 for k, v in samples.items() if k != "fp32" and v is not None and ref is not None}
        out = {**diffs, "fp32_baseline_fps": base, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
               "torch": torch.__version__, "size": size, "crop": 256, "rows": rows, "skipped": skipped}
        (args.out / "gpu_musetalk.json").write_text(json.dumps(out, indent=2))
        return out

    for item in args.settings.split(","):
        name, batch, *rest = item.split(":")
        mode = rest[0] if rest else "eager"
        if args.budget_s and time.perf_counter() - start > args.budget_s:
            skipped.append(item)
            continue
        try:
            if nets is None or nets[0] != name:
                nets = None
                if device == "cuda":
                    torch.cuda.empty_cache()
                nets = (name, build(size, device, dtypes[name]))
            pipe = MuseTalkPipeline(nets[1], compile=mode.startswith("compile"),
                                    channels_last={"cl": True, "old": False, "compile-nchw": False}.get(mode))
            r = measure(pipe, int(batch), args.seconds, audio_len, mode)
        except Exception as exc:  # one failing setting must not lose the others' numbers
            r = {"batch": int(batch), "error": f"{type(exc).__name__}: {exc}"[:300]}
        label = name if mode == "eager" else f"{name} {mode}"
        sample = r.pop("sample", None)
        if label not in samples or samples[label] is None:
            samples[label] = sample
        r.update(precision=name, mode=mode, elapsed_s=round(time.perf_counter() - start, 1))
        rows.append(r)
        print(json.dumps(r), flush=True)
        report()
    print(json.dumps(report(), indent=2))


if __name__ == "__main__":
    main()
