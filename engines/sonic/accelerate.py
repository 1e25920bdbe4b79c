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


def decode(vae, z: torch.Tensor, num_frames: int, frames_per_call: int = 0) -> torch.Tensor:
    """vae.decode(z, num_frames).sample. With a compiled decoder (compile_decoder) one shape serves every call:
    a call of whole chunks shorter than `frames_per_call` is padded with zero latents whose frames are dropped
    (the decoder mixes frames within a chunk only, so the real chunks' frames are the same), and a call of any
    other shape than the first compiled one (the clip's short last chunk) runs eager instead of compiling again."""
    if not getattr(vae, "_sonic_compiled", False):
        return vae.decode(z, num_frames=num_frames).sample
    n = z.shape[0]
    if frames_per_call > n and n % num_frames == 0 and frames_per_call % num_frames == 0:
        z = torch.cat([z, z.new_zeros((frames_per_call - n, *z.shape[1:]))])
    shape = (tuple(z.shape), z.dtype, z.device, int(num_frames))
    if getattr(vae, "_sonic_decode_shape", None) is None:
        vae._sonic_decode_shape = shape  # the first call's shape is the one compiled
    if shape == vae._sonic_decode_shape:
        return vae.decode(z, num_frames=num_frames).sample[:n]
    with torch.compiler.set_stance("force_eager"):
        return vae.decode(z, num_frames=num_frames).sample[:n]


def fast_path(nets, *, unet_layout: bool = False, vae_layout: bool = True, decoder: bool = True) -> list[str]:
    """The product's compiled path (sonic_frames with compile_unet; benchmarks/gpu_sonic_e2e.py times it):
    the UNet's regions compiled (`unet_layout`: its convolutions channels_last first - off: on an H200 the 25-step
    latents took 35.1 s with it vs 34.0 s without, GroupNorm being 2x slower in NHWC; RESULTS_sonic.md); with
    `decoder`, the temporal VAE's convolutions channels_last and its decoder compiled (3.7 -> 2.0 s a video).
    Idempotent; what it did now, for the run's warnings."""
    done = []
    parts = [(nets.unet, unet_layout, compile_regions, "UNet")]
    if decoder:
        parts.append((nets.vae, vae_layout, compile_decoder, "VAE decoder"))
    for module, layout, compile_fn, name in parts:
        if getattr(module, "_sonic_compiled", False):
            continue
        if layout and channels_last(module):
            done.append(f"{name} channels_last")
        compile_fn(module)
        done.append(f"{name} compiled")
    return done


def _temporal_conv_forward(conv: torch.nn.Conv3d, x: torch.Tensor) -> torch.Tensor:
    """A (3,1,1) Conv3d over [B, C, F, H, W] as a (3,1) Conv2d over [B, C, F, H*W] on the same memory (the same
    weights and sums; cuDNN's 2-D NHWC kernels instead of its 3-D ones). Other layouts run the Conv3d."""
    b, c, f, h, w = x.shape
    if not x.is_contiguous(memory_format=torch.channels_last_3d):
        return conv._conv_forward(x, conv.weight, conv.bias)
    flat = x.flatten(3)  # a view: H and W are adjacent in channels_last_3d memory
    out = torch.nn.functional.conv2d(flat, conv.weight[..., 0], conv.bias, padding=(conv.padding[0], 0))
    return out.unflatten(3, (h, w))


def temporal_convs_as_2d(module: torch.nn.Module, on: bool = True) -> int:
    """Every (3,1,1) Conv3d of `module` (the temporal resnets' convolutions) runs as _temporal_conv_forward
    (on=False: as a Conv3d again); the number changed. The weights and state-dict keys stay the Conv3d's."""
    import types

    count = 0
    for m in module.modules():
        if isinstance(m, torch.nn.Conv3d) and tuple(m.kernel_size) == (3, 1, 1) and tuple(m.stride) == (1, 1, 1) \
                and m.groups == 1 and tuple(m.padding) == (1, 0, 0):
            if on:
                m.forward = types.MethodType(_temporal_conv_forward, m)
            else:
                m.__dict__.pop("forward", None)
            count += 1
    return count
