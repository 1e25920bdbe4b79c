"""MuseTalk 1.5 generated frames/s at 256x256 on a GPU: eager FP32 vs FP16 / BF16, batched.

Full-size networks (musetalk.json UNet, sd-vae-ft-mse VAE) with random weights (speed does not depend
on the values), run through the pack's own pipeline (engines/musetalk/pipeline.py, parity-proven
against the reference code): per batch the UNet step at timestep 0 on cached reference latents and
whisper windows, the VAE decode, and the uint8 crops copied back to the host. The audio encoder and
the reference-latent encoding (once per reference frame) are not in the loop; their cost is reported
apart. Peak GPU memory per setting.

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


def measure(pipe, batch: int, seconds: float, audio_len: int) -> dict:
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
    for _ in range(2):  # warm-up (cuDNN autotune, allocator)
        pipe.generate(latents, windows)
    sync()
    if pipe.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    frames, t0 = 0, time.perf_counter()
    while True:
        out = pipe.generate(latents, windows)
        frames += len(out)
        if time.perf_counter() - t0 >= seconds:
            break
    sync()
    wall = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**20 if pipe.device.type == "cuda" else 0.0
    return {"batch": batch, "frames": frames, "seconds": round(wall, 3), "fps": round(frames / wall, 1),
            "peak_mb": round(peak, 1), "reference_encode_s": round(encode_s, 4), "sample": out[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tiny", action="store_true", help="reduced networks (CPU smoke test)")
    ap.add_argument("--seconds", type=float, default=4.0, help="timed seconds per setting")
    ap.add_argument("--settings", default="fp32:8,fp16:8,fp16:32,fp16:64,bf16:32,bf16:64")
    args = ap.parse_args()
    import_pack()
    import torch

    from digital_human.engines.musetalk.pipeline import MuseTalkPipeline

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cudnn.benchmark = True
    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    size = "reduced" if args.tiny else "full"
    audio_len = 20 if args.tiny else 50
    rows, samples = [], {}
    base = None
    for item in args.settings.split(","):
        name, batch = item.split(":")
        try:
            if base is None or base[0] != name:
                base = None
                if device == "cuda":
                    torch.cuda.empty_cache()
                base = (name, MuseTalkPipeline(build(size, device, dtypes[name])))
            r = measure(base[1], int(batch), args.seconds, audio_len)
        except Exception as exc:  # one failing setting must not lose the others' numbers
            r = {"batch": int(batch), "error": f"{type(exc).__name__}: {exc}"[:300]}
        samples[name] = r.pop("sample", None)
        r["precision"] = name
        rows.append(r)
        print(json.dumps(r), flush=True)
    eager = next((r for r in rows if r["precision"] == "fp32" and "fps" in r), None)
    for r in rows:
        r["x_vs_fp32"] = round(r["fps"] / eager["fps"], 2) if eager and "fps" in r else None
    diffs = {f"{k}_vs_fp32_uint8_max_diff": int(np.abs(v.astype(int) - samples["fp32"].astype(int)).max())
             for k, v in samples.items() if k != "fp32" and v is not None and samples.get("fp32") is not None}
    report = {**diffs, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
              "size": size, "crop": 256, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_musetalk.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
