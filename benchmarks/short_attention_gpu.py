"""LatentSync's temporal attention (the motion modules: 16 frames per pixel) on a GPU: torch's SDPA choices against
the pack's short-sequence kernel (engines/latentsync/short_attention.py), at the three shapes of one UNet step.

No model is built: q/k/v are made in the layout the modules hand over (a [b, n, heads*d] projection viewed as
[b, heads, n, d]), so the figures are the attention calls alone; benchmarks/latentsync_gpu.py times whole steps.
Per shape: each way's time (median of `--repeats` timed batches of 20 calls, after a warm-up), its maximum
difference from SDPA's default in the same precision, and the calls a UNet step makes (10 per level, 4 levels).

  python benchmarks/short_attention_gpu.py --out $OUT/short_attention.json        # GPU
  python benchmarks/short_attention_gpu.py --device cpu --scale 64 --out -        # CPU smoke (reduced shapes)
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402

# (pixels per frame at the level, channels): LatentSync 1.6's motion modules at 64x64, 32x32, 16x16 and 8x8
# latents (results/latentsync_attn_h200_2026-12-03_4ec8394.json: 10 calls at each a step); the guidance batch
# doubles the rows; 8 heads
LEVELS = ((4096, 320), (1024, 640), (256, 1280), (64, 1280))
HEADS, FRAMES, GUIDANCE_ROWS, CALLS_PER_LEVEL = 8, 16, 2, 10


def _inputs(torch, pixels: int, channels: int, frames: int, dtype, device):
    """q, k, v as TemporalAttention makes them: rows (2 x pixels) of `frames` tokens, projected to `channels`."""
    rows = GUIDANCE_ROWS * pixels
    made = [torch.randn(rows, frames, channels, dtype=dtype, device=device) for _ in range(3)]
    return [t.view(rows, frames, HEADS, channels // HEADS).transpose(1, 2) for t in made]


def _time(torch, fn, repeats: int, device: str) -> float:
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(3):
        fn()
    sync()
    batches = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(20):
            fn()
        sync()
        batches.append((time.perf_counter() - t) / 20 * 1000)
    return statistics.median(batches)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--frames", type=int, default=FRAMES)
    ap.add_argument("--scale", type=int, default=1, help="divide the pixel counts (CPU smoke)")
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    import_pack()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from digital_human.engines.latentsync import short_attention as SA

    dtype = getattr(torch, args.dtype)
    report = {"benchmark": "short_attention_gpu", "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "commit": args.commit, "device": args.device, "dtype": args.dtype, "frames": args.frames,
              "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
              "torch": torch.__version__, "python": platform.python_version(),
              "kernel_available": SA.available(torch.device(args.device)), "levels": []}
    ways = {"sdpa_default": lambda q, k, v: F.scaled_dot_product_attention(q, k, v)}
    if args.device.startswith("cuda"):
        for name, backend in (("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION),
                              ("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            def forced(q, k, v, backend=backend):
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, v)
            ways[name] = forced
    ways["short_kernel"] = SA.short_attention
    ways["short_op"] = lambda q, k, v: torch.ops.digital_human.short_attention(q, k, v)
    with torch.inference_mode():
        for pixels, channels in LEVELS:
            pixels = max(1, pixels // args.scale)
            q, k, v = _inputs(torch, pixels, channels, args.frames, dtype, args.device)
            expected = F.scaled_dot_product_attention(q, k, v).float()
            row = {"q": list(q.shape), "q_stride": list(q.stride()), "calls_per_step": CALLS_PER_LEVEL}
            for name, fn in ways.items():
                try:
                    out = fn(q, k, v)
                    row[f"{name}_max_diff"] = float((out.float() - expected).abs().max())
                    row[f"{name}_ms"] = round(_time(torch, lambda: fn(q, k, v), args.repeats, args.device), 4)
                except Exception as exc:  # noqa: BLE001 - a backend that refuses a shape is a result too
                    row[f"{name}_ms"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            report["levels"].append(row)
            print(json.dumps(row), flush=True)
            del q, k, v, expected
    for name in ways:
        times = [r.get(f"{name}_ms") for r in report["levels"]]
        if all(isinstance(t, float) for t in times):
            report[f"{name}_ms_per_step"] = round(sum(t * CALLS_PER_LEVEL for t in times), 3)
    print(json.dumps({k: v for k, v in report.items() if k != "levels"}), flush=True)
    text = json.dumps(report, indent=1)
    if args.out == "-":
        print(text)
    else:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
