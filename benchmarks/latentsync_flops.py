"""Floating-point work of LatentSync 1.6 at full size (512x512, 16-frame windows), counted on the meta device
with torch.utils.flop_counter (no weights, no data: shapes only): one UNet step of the guidance batch (2 x 16
frames; the unconditional row's audio cross-attention is a constant, unet.py), with and without the guidance rows'
shared prefix, and the VAE work of one window (two encodes of 16 faces, one decode of 16 latents). Attention is
counted as its two matrix products (the math path's bmm), as the GPU's fused kernels do the same products.

  python benchmarks/latentsync_flops.py [--out benchmarks/results/latentsync_flops.json]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def import_pack() -> None:
    """`digital_human` = this checkout (not an installed copy of another): the code these counts are of."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("digital_human", ROOT / "__init__.py",
                                                  submodule_search_locations=[str(ROOT)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["digital_human"] = module
    spec.loader.exec_module(module)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "latentsync_flops.json")
    args = ap.parse_args()
    import_pack()
    from diffusers import AutoencoderKL
    from torch.utils.flop_counter import FlopCounterMode

    from digital_human.engines.latentsync.random_release import UNET_MODEL_FULL, VAE_CONFIG_FULL
    from digital_human.engines.latentsync.unet import LatentSyncUNet

    def count(fn) -> dict:
        fc = FlopCounterMode(display=False)
        with fc, torch.no_grad():
            fn()
        return {"tflop": fc.get_total_flops() / 1e12,
                "by_op": {str(k): v / 1e12 for k, v in fc.get_flop_counts()["Global"].items()}}

    rep: dict = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "what": "TFLOP (1e12 floating-point operations; a multiply-add is 2)"}
    with torch.device("meta"):
        unet = LatentSyncUNet(UNET_MODEL_FULL).half()
        x = torch.randn(2, 13, 16, 64, 64, dtype=torch.half)
        audio = torch.randn(32, 50, 384, dtype=torch.half)
        t = torch.tensor(501)
        rep["unet_step"] = count(lambda: unet(x, t, audio, uncond_rows=1))
        rep["unet_step_shared_rows"] = count(lambda: unet(x, t, audio, uncond_rows=1, shared_rows=True))
        vae = AutoencoderKL(**{k: v for k, v in VAE_CONFIG_FULL.items() if not k.startswith("_")}).half()
        faces = torch.randn(16, 3, 512, 512, dtype=torch.half)
        enc = count(lambda: vae.encode(faces))
        dec = count(lambda: vae.decode(torch.randn(16, 4, 64, 64, dtype=torch.half)))
        rep["vae_encode_16"], rep["vae_decode_16"] = enc, dec
    rep["window_20_steps"] = {
        "unet_tflop": 20 * rep["unet_step_shared_rows"]["tflop"],
        "vae_tflop": 2 * enc["tflop"] + dec["tflop"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rep, indent=2) + "\n")
    print(json.dumps({k: (v["tflop"] if isinstance(v, dict) and "tflop" in v else v) for k, v in rep.items()}, indent=1))


if __name__ == "__main__":
    main()
