"""The work of one Sonic UNet call (a window: 3 guidance branches x 25 frames at 64x64 latents, SVD-XT-shaped),
counted with torch.utils.flop_counter on fake tensors (no weights, no GPU). The CPU's SDPA is not counted by the
counter: attention is added by formula (4 x batch x queries x keys x width per self-attention).
    python benchmarks/sonic_flops.py"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402


def main() -> None:
    import_pack()
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from digital_human.engines.sonic.networks import add_audio_processors, make_sonic_unet_class
    from digital_human.engines.sonic.random_release import unet_config

    with FakeTensorMode(allow_non_fake_inputs=True):
        unet = make_sonic_unet_class().from_config(unet_config(False))
        add_audio_processors(unet)
        x = (torch.randn(3, 25, 8, 64, 64), torch.tensor(700.0), torch.randn(75, 1, 1024), torch.randn(75, 32, 1024),
             torch.randn(3, 3), torch.randn(1, 1, 512, 512))
        counter = FlopCounterMode(display=False)
        with counter:
            unet(*x)
    ops = {str(op): round(n / 1e12, 2) for op, n in counter.get_flop_counts()["Global"].items()}
    # spatial self-attention: 5 transformers a level (2 down, 3 up) at 4096, 1024, 256 tokens; mid 64
    attention = sum(4 * 75 * t * t * c * k for t, c, k in ((4096, 320, 5), (1024, 640, 5), (256, 1280, 5),
                                                           (64, 1280, 1)))
    attention += sum(4 * 3 * t * 25 * 25 * c * k for t, c, k in ((4096, 320, 5), (1024, 640, 5), (256, 1280, 5)))
    total = counter.get_total_flops() + attention
    print({"counted_tflop": ops, "attention_tflop_by_formula": round(attention / 1e12, 2),
           "total_tflop": round(total / 1e12, 1)})


if __name__ == "__main__":
    main()
