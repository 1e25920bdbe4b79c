"""Deterministic random weights for a key -> shape manifest (tests and parity runs, no real weights).

Each tensor is drawn from its own generator seeded by (seed, crc32 of its name), so any program that
knows the names and shapes (the reference code, this pack, a test) rebuilds the same values without
storing them. Scales keep activations moderate: fan-in scaled matrices, norm gains near 1.
"""
from __future__ import annotations

import zlib

import torch


def seeded_tensor(name: str, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2 ** 63))
    noise = torch.randn(tuple(shape), generator=gen)
    if len(shape) <= 1:
        if name.endswith("bias"):
            return noise * 0.02
        return 1.0 + 0.1 * noise  # norm gains, snake alphas, ...
    fan_in = 1
    for dim in shape[1:]:
        fan_in *= int(dim)
    if fan_in == 1:  # weight-norm gains [out, 1, 1]
        return 1.0 + 0.1 * noise
    return noise / fan_in ** 0.5


def seeded_state_dict(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, torch.Tensor]:
    return {name: seeded_tensor(name, tuple(shape), seed) for name, shape in shapes.items()}
