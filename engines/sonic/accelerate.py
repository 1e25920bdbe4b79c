"""torch.compile for the Sonic UNet by regions: every resnet and every transformer of the UNet is compiled
(the same code for blocks of the same shapes), so the compile is shared by the full call, the faster mode's
shallow call (the same first and last blocks) and any batch of windows, instead of one whole-graph compile per
call shape. The math is the module's own (inductor fuses the normalisations and activations with their
neighbours): frames equal to eager FP16 within FP16 rounding (benchmarks/gpu_sonic_e2e.py measures it).
channels_last() puts the convolutions' weights in the layout cuDNN computes in (NHWC), so activations stay in
it from conv_in on: no layout copies around each convolution, and the transformers' token views are free."""
from __future__ import annotations

import torch

from .networks import sonic_transformer_forward

__all__ = ["channels_last", "compile_decoder", "compile_regions", "sonic_transformer_forward"]


def channels_last(module: torch.nn.Module, on: bool = True) -> int:
    """Every Conv2d weight of `module` in channels_last (Conv3d: channels_last_3d), or back to contiguous with
    on=False; the number of convolutions changed. Same values: only the memory order (and so cuDNN's kernels
    and summation order) changes."""
    count = 0
    for m in module.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)):
            fmt = torch.contiguous_format
            if on:
                fmt = torch.channels_last if isinstance(m, torch.nn.Conv2d) else torch.channels_last_3d
            m.weight.data = m.weight.data.contiguous(memory_format=fmt)
            count += 1
    return count


def _raise_cache_limits() -> None:
    """Dynamo's per-function cache raised so every block shape (about 20 in SVD-XT, per layout) keeps its code."""
    import torch._dynamo as dynamo

    dynamo.config.cache_size_limit = max(int(dynamo.config.cache_size_limit), 64)
    if hasattr(dynamo.config, "accumulated_cache_size_limit"):
        dynamo.config.accumulated_cache_size_limit = max(int(dynamo.config.accumulated_cache_size_limit), 512)


def compile_regions(unet, mode: str | None = None) -> int:
    """Compile `unet`'s resnets and transformers in place (idempotent); the number of regions compiled."""
    _raise_cache_limits()
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


def compile_decoder(vae, mode: str | None = None) -> bool:
    """Compile the temporal VAE's decoder in place (idempotent; one graph per chunk shape); True if compiled now."""
    _raise_cache_limits()
    if getattr(vae, "_sonic_compiled", False):
        return False
    vae.decoder.compile(mode=mode, dynamic=False)
    vae._sonic_compiled = True
    return True
