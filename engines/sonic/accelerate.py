"""torch.compile for the Sonic UNet by regions: every resnet and every transformer of the UNet is compiled
(the same code for blocks of the same shapes), so the compile is shared by the full call, the faster mode's
shallow call (the same first and last blocks) and any batch of windows, instead of one whole-graph compile per
call shape. The math is the module's own (inductor fuses the normalisations and activations with their
neighbours): frames equal to eager FP16 within FP16 rounding (benchmarks/gpu_sonic_e2e.py measures it)."""
from __future__ import annotations

import torch

from .networks import sonic_transformer_forward


def compile_regions(unet, mode: str | None = None) -> int:
    """Compile `unet`'s resnets and transformers in place (idempotent); the number of regions compiled.
    Dynamo's per-function cache is raised so every block shape (about 20 in SVD-XT) keeps its compiled code."""
    import torch._dynamo as dynamo

    dynamo.config.cache_size_limit = max(int(dynamo.config.cache_size_limit), 64)
    if hasattr(dynamo.config, "accumulated_cache_size_limit"):
        dynamo.config.accumulated_cache_size_limit = max(int(dynamo.config.accumulated_cache_size_limit), 512)
    if getattr(unet, "_sonic_compiled", False):
        return 0
    transformer = torch.compile(sonic_transformer_forward, mode=mode, dynamic=False)
    count = 0
    blocks = list(unet.down_blocks) + [unet.mid_block] + list(unet.up_blocks)
    for block in blocks:
        for resnet in block.resnets:
            resnet.compile(mode=mode, dynamic=False)
            count += 1
        for attn in getattr(block, "attentions", None) or ():
            attn.__dict__["sonic_forward"] = transformer  # networks._transformer picks it up
            count += 1
    unet._sonic_compiled = True
    return count
