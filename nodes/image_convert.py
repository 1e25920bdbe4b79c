"""ComfyUI IMAGE tensors <-> numpy frames, in chunks so long videos never need two float copies."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..parallel import for_each_frame

CHUNK = 16  # frames per conversion task (a few MB: cache-friendly, enough tasks for the threads)


def image_to_uint8(image: Any, name: str = "image") -> np.ndarray:
    """IMAGE float [B,H,W,C] 0..1 (torch or numpy) -> uint8 [B,H,W,3] RGB."""
    if image is None:
        raise ValueError(f"{name}: no image connected")
    shape = tuple(image.shape)
    if len(shape) == 3:
        image = image[None]
        shape = tuple(image.shape)
    if len(shape) != 4 or shape[-1] not in (3, 4) or shape[0] == 0:
        raise ValueError(f"{name}: expected IMAGE [frames, height, width, 3], got shape {shape}")
    out = np.empty(shape[:3] + (3,), np.uint8)

    def convert(chunk: int) -> None:  # numpy releases the GIL in these ufuncs: chunks run on threads
        start = chunk * CHUNK
        block = image[start:start + CHUNK, ..., :3]
        block = block.detach().cpu().float().numpy() if hasattr(block, "detach") else np.asarray(block, np.float32)
        out[start:start + CHUNK] = np.clip(block * 255.0 + 0.5, 0, 255).astype(np.uint8)

    for_each_frame(convert, 0, -(-shape[0] // CHUNK))
    return out


def uint8_to_image(frames: np.ndarray) -> Any:
    """uint8 [B,H,W,3] -> IMAGE torch float32 [B,H,W,3] 0..1."""
    import torch

    frames = np.asarray(frames)
    if frames.dtype != np.uint8:
        frames = frames.astype(np.uint8)
    out = torch.empty(frames.shape, dtype=torch.float32)
    for start in range(0, len(frames), CHUNK):
        block = frames[start:start + CHUNK]
        if not block.flags.writeable:
            block = block.copy()  # torch wants writable memory
        # one multi-threaded pass, uint8 / 255 promoted to float32 straight into the output (a true
        # division: bit-identical to ComfyUI's own `array.astype(float32) / 255.0` image loading)
        torch.div(torch.from_numpy(block), 255.0, out=out[start:start + CHUNK])
    return out
