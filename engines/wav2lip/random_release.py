"""A Wav2Lip release of seeded random weights in the release's exact file format (tests, parity, benchmarks).

torch.save({"state_dict": {"module.<key>": tensor, ...}, "optimizer": {...}, "global_step": int,
"global_epoch": int}) as the reference's training script saves its checkpoints (DataParallel's "module."
prefix included). Weights come from numpy's seeded generator (the same bytes on every machine and torch
version), scaled so activations neither vanish nor saturate the sigmoid: the mouth is noise, the code path
is the real one. The optimizer entry is a small Adam-shaped state (the release's holds the full Adam moments;
loaders must ignore it either way).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np


def random_state_dict(seed: int = 0) -> dict:
    """{key: float32 tensor} of the generator with seeded weights (BatchNorm statistics included)."""
    import torch

    from .networks import Wav2LipGenerator

    rng = np.random.default_rng(seed)
    out = {}
    for key, value in Wav2LipGenerator().state_dict().items():
        shape = tuple(value.shape)
        if key.endswith("num_batches_tracked"):
            out[key] = torch.tensor(int(rng.integers(1000, 100000)), dtype=torch.int64)
            continue
        if key.endswith("running_mean"):
            arr = rng.normal(0.0, 0.05, shape)
        elif key.endswith("running_var"):
            arr = rng.uniform(0.6, 1.4, shape)
        elif len(shape) == 4:
            transposed = "conv_block.0" in key and _is_transposed(key)
            fan_in = (shape[0] if transposed else shape[1]) * shape[2] * shape[3]
            # He scale for the ReLU stacks, smaller in residual branches so the sums stay bounded
            arr = rng.normal(0.0, np.sqrt(1.0 / fan_in), shape)
            if key == "output_block.1.weight":
                arr = arr * 6.0  # spread the sigmoid's output over 0..1
        elif key.endswith(".weight"):  # BatchNorm gamma
            arr = rng.uniform(0.7, 1.3, shape)
        else:  # conv / BatchNorm biases
            arr = rng.normal(0.0, 0.05, shape)
        out[key] = torch.from_numpy(np.ascontiguousarray(arr, np.float32))
    return out


_TRANSPOSED: set[str] | None = None


def _is_transposed(key: str) -> bool:
    global _TRANSPOSED
    if _TRANSPOSED is None:
        from torch import nn

        from .networks import Wav2LipGenerator

        _TRANSPOSED = {f"{name}.weight" for name, m in Wav2LipGenerator().named_modules()
                       if isinstance(m, nn.ConvTranspose2d)}
    return key in _TRANSPOSED


def write_checkpoint(path: str | Path, seed: int = 0) -> Path:
    """One release-format checkpoint (~145 MB) at `path`."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {f"module.{k}": v for k, v in random_state_dict(seed).items()}
    first = next(iter(state.values()))
    optimizer = {"state": {0: {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(first),
                               "exp_avg_sq": torch.zeros_like(first)}},
                 "param_groups": [{"lr": 1e-4, "betas": (0.5, 0.999), "eps": 1e-8, "weight_decay": 0,
                                   "amsgrad": False, "params": list(range(len(state)))}]}
    tmp = path.with_name(path.name + ".part")
    torch.save({"state_dict": state, "optimizer": optimizer, "global_step": 1, "global_epoch": 1}, tmp)
    tmp.replace(path)
    return path


def write_release(models_root: str | Path, kinds: tuple[str, ...] = ("wav2lip",), seed: int = 0) -> Path:
    """<models_root>/wav2lip/<kind>.pth for each kind ("wav2lip", "wav2lip_gan"); the folder."""
    from .files import wav2lip_root

    root = wav2lip_root(models_root)
    for i, kind in enumerate(kinds):
        write_checkpoint(root / f"{kind}.pth", seed + i)
    return root
