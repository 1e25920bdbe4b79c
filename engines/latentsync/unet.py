"""LatentSync's UNet3DConditionModel (AnimateDiff-style: Stable Diffusion 1.5's UNet run per frame, with
whisper cross-attention and temporal self-attention "motion modules"), written from its config so the
release's `latentsync_unet.pt` loads strictly (same parameter names and shapes).

Why not diffusers' own 3D/motion UNet (diffusers 0.32 `UNetMotionModel`, `UNet3DConditionModel`): their
parameter names differ (motion modules hold `transformer_blocks.N.attn1/attn2`, not `attention_blocks`/`norms`/
`pos_encoder.pe`), and so does the arithmetic: LatentSync's ResNet blocks apply torch GroupNorm to the 5-D
(batch, channels, frames, h, w) tensor, so their statistics span all frames of a 16-frame window, where
diffusers' blocks normalise frame by frame. Reused from diffusers: the timestep embedding (`Timesteps`,
`TimestepEmbedding`) and the GEGLU feed-forward (`FeedForward`), whose names and maths are the reference's.

The unconditional half of a classifier-free-guidance batch attends to all-zero audio: its cross-attention
keys/values are zero (the projections have no bias), so the attention returns to_out's bias. `forward(...,
uncond_rows=n)` uses that for the first n rows instead of attending (same value, no attention work).
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _frames_to_batch(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    b, c, f, h, w = x.shape
    return x.permute(0, 2, 1, 3, 4).reshape(b * f, c, h, w), f


def _batch_to_frames(x: torch.Tensor, f: int) -> torch.Tensor:
    bf, c, h, w = x.shape
    return x.reshape(bf // f, f, c, h, w).permute(0, 2, 1, 3, 4)


class FrameConv(nn.Conv2d):
    """A 2-D convolution applied to each frame of a (b, c, f, h, w) tensor (the reference's InflatedConv3d)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        y, f = _frames_to_batch(x)
        return _batch_to_frames(super().forward(y), f)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, temb: int, groups: int, eps: float, scale: float = 1.0):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin, eps=eps)   # over (channels/group, frames, h, w): not per frame
        self.conv1 = FrameConv(cin, cout, 3, padding=1)
        self.time_emb_proj = nn.Linear(temb, cout)
        self.norm2 = nn.GroupNorm(groups, cout, eps=eps)
        self.conv2 = FrameConv(cout, cout, 3, padding=1)
        self.conv_shortcut = FrameConv(cin, cout, 1) if cin != cout else None
        self.scale = scale

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time_emb_proj(F.silu(temb))[:, :, None, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        return (x + h) / self.scale


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int, context_dim: int | None = None):
        super().__init__()
        inner = heads * head_dim
        self.heads = heads
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(context_dim or dim, inner, bias=False)
        self.to_v = nn.Linear(context_dim or dim, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Identity()])  # [1] was the reference's Dropout
        # fuse_projections' [Wq; Wk; Wv]: a buffer, so that it moves with .to(); not persistent: not in the state dict
        self.register_buffer("qkv_weight", None, persistent=False)

    def fuse_projections(self) -> bool:
        """Self-attention's q/k/v as one projection of the stacked weights (one GEMM instead of three, the same
        products) for every later call without a context. to_q / to_k / to_v then hold row slices of the stacked
        weight (no second copy in memory; the state dict keeps its keys and values). Once per module: a second call
        keeps the first's tensor (compiled functions and CUDA graphs captured since read its address). Returns False
        where the keys come from another input's width (cross-attention: nothing to stack)."""
        if self.to_k.in_features != self.to_q.in_features:
            return False
        if self.qkv_weight is not None:
            return True
        weight = torch.cat([self.to_q.weight, self.to_k.weight, self.to_v.weight]).detach()
        self.register_buffer("qkv_weight", weight, persistent=False)
        rows = 0
        for linear in (self.to_q, self.to_k, self.to_v):
            n = linear.out_features
            linear.weight = nn.Parameter(weight[rows:rows + n], requires_grad=False)
            rows += n
        return True

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        b, n, _ = x.shape
        if context is None and self.qkv_weight is not None:
            q, k, v = F.linear(x, self.qkv_weight).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
            return self.to_out[0](self._attend(q, k, v).transpose(1, 2).reshape(b, n, -1))
        ctx = x if context is None else context
        q = self.to_q(x).view(b, n, self.heads, -1).transpose(1, 2)
        k = self.to_k(ctx).view(b, ctx.shape[1], self.heads, -1).transpose(1, 2)
        v = self.to_v(ctx).view(b, ctx.shape[1], self.heads, -1).transpose(1, 2)
        out = self._attend(q, k, v).transpose(1, 2).reshape(b, n, -1)
        return self.to_out[0](out)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)


class SpatialBlock(nn.Module):
    """BasicTransformerBlock: self-attention over a frame's pixels, cross-attention to its audio window, GEGLU."""

    def __init__(self, dim: int, heads: int, head_dim: int, context_dim: int, audio: bool):
        super().__init__()
        from diffusers.models.attention import FeedForward

        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = Attention(dim, heads, head_dim)
        self.norm2 = nn.LayerNorm(dim) if audio else None
        self.attn2 = Attention(dim, heads, head_dim, context_dim) if audio else None
        self.ff = FeedForward(dim, activation_fn="geglu")
        self.norm3 = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None, uncond_rows: int, repeat: int = 1) -> torch.Tensor:
        """repeat: x holds one batch row of `repeat` equal ones (LatentSyncUNet.forward's shared_rows): the
        self-attention runs once, then the rows part at the audio cross-attention."""
        x = self.attn1(self.norm1(x)) + x
        if repeat > 1:
            x = x.repeat(repeat, 1, 1)
        if self.attn2 is not None and context is not None:
            n = self.norm2(x)
            if uncond_rows:  # zero audio: keys and values are 0, the attention is to_out's bias (module doc)
                cond = self.attn2(n[uncond_rows:], context[uncond_rows:])
                bias = self.attn2.to_out[0].bias.to(x.dtype).expand(uncond_rows, x.shape[1], -1)
                x = x + torch.cat([bias, cond])
            else:
                x = self.attn2(n, context) + x
        return self.ff(self.norm3(x)) + x


class SpatialTransformer(nn.Module):
    """Transformer3DModel: per-frame GroupNorm, 1x1 conv in, one block, 1x1 conv out, residual."""

    def __init__(self, channels: int, heads: int, groups: int, context_dim: int, audio: bool):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels, eps=1e-6)
        self.proj_in = nn.Conv2d(channels, channels, 1)
        self.transformer_blocks = nn.ModuleList([SpatialBlock(channels, heads, channels // heads, context_dim, audio)])
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None, uncond_rows: int, repeat: int = 1) -> torch.Tensor:
        """repeat: x is one batch row standing for `repeat` equal rows (see SpatialBlock)."""
        y, f = _frames_to_batch(x)
        bf, c, h, w = y.shape
        t = self.proj_in(self.norm(y)).permute(0, 2, 3, 1).reshape(bf, h * w, c)
        for k, block in enumerate(self.transformer_blocks):
            t = block(t, context, uncond_rows * f, repeat if k == 0 else 1)
        if repeat > 1:
            y, bf = y.repeat(repeat, 1, 1, 1), bf * repeat
        t = self.proj_out(t.reshape(bf, h, w, c).permute(0, 3, 1, 2))
        return _batch_to_frames(t + y, f)


class TemporalAttention(Attention):
    """Self-attention across the frames of each pixel, with the sinusoidal frame-position table `pos_encoder.pe`.

    short_kernel (set by set_short_attention): the attention through engines/latentsync/short_attention.py's
    Triton kernel for sequences of <= 16 frames where it can run (CUDA with Triton), else torch's SDPA. Why: SDPA
    pads the 16 frames to its 64/128-row tiles; on an H200 the kernel took 0.15 ms where SDPA took 1.05 ms for one
    call at 64x64 latents (2026-12-03), and a UNet step makes 40 such calls."""

    short_kernel = False

    def __init__(self, dim: int, heads: int, head_dim: int, max_len: int, position: bool):
        super().__init__(dim, heads, head_dim)
        self.pos_encoder = _PositionTable(dim, max_len) if position else None

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.short_kernel:
            from . import short_attention as short

            if q.shape[2] <= short.MAX_FRAMES and short.available(q.device):
                return short.short_attention(q, k, v)
        return F.scaled_dot_product_attention(q, k, v)

    def forward(self, x: torch.Tensor, frames: int) -> torch.Tensor:  # type: ignore[override]
        bf, s, c = x.shape
        t = x.reshape(bf // frames, frames, s, c).permute(0, 2, 1, 3).reshape(-1, frames, c)
        if self.pos_encoder is not None:
            t = t + self.pos_encoder.pe[:, :frames].to(t.dtype)
        t = super().forward(t)
        return t.reshape(bf // frames, s, frames, c).permute(0, 2, 1, 3).reshape(bf, s, c)


class _PositionTable(nn.Module):
    def __init__(self, dim: int, max_len: int):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div = torch.exp(torch.arange(0, dim, 2) * (-math.log(10000.0) / dim))
        pe = torch.zeros(1, max_len, dim)
        pe[0, :, 0::2] = torch.sin(position * div)
        pe[0, :, 1::2] = torch.cos(position * div)
        self.register_buffer("pe", pe)  # saved in the release's checkpoint: loaded and checked like a weight


class TemporalBlock(nn.Module):
    def __init__(self, dim: int, heads: int, kinds: list[str], max_len: int, position: bool):
        super().__init__()
        from diffusers.models.attention import FeedForward

        if any(k != "Temporal_Self" for k in kinds):
            raise ValueError(f"motion module attention_block_types {kinds}: only Temporal_Self is released")
        self.attention_blocks = nn.ModuleList([TemporalAttention(dim, heads, dim // heads, max_len, position)
                                               for _ in kinds])
        self.norms = nn.ModuleList([nn.LayerNorm(dim) for _ in kinds])
        self.ff = FeedForward(dim, activation_fn="geglu")
        self.ff_norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, frames: int) -> torch.Tensor:
        for attn, norm in zip(self.attention_blocks, self.norms):
            x = attn(norm(x), frames) + x
        return self.ff(self.ff_norm(x)) + x


class MotionModule(nn.Module):
    """VanillaTemporalModule: `temporal_transformer` (per-frame GroupNorm, linear in, blocks, linear out, residual)."""

    def __init__(self, channels: int, kw: dict[str, Any]):
        super().__init__()
        self.temporal_transformer = _TemporalTransformer(channels, kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.temporal_transformer(x)


class _TemporalTransformer(nn.Module):
    def __init__(self, channels: int, kw: dict[str, Any]):
        super().__init__()
        heads = int(kw.get("num_attention_heads", 8))
        inner = heads * (channels // heads // int(kw.get("temporal_attention_dim_div", 1)))
        self.norm = nn.GroupNorm(32, channels, eps=1e-6)
        self.proj_in = nn.Linear(channels, inner)
        self.transformer_blocks = nn.ModuleList([
            TemporalBlock(inner, heads, list(kw.get("attention_block_types", ("Temporal_Self", "Temporal_Self"))),
                          int(kw.get("temporal_position_encoding_max_len", 24)),
                          bool(kw.get("temporal_position_encoding", False)))
            for _ in range(int(kw.get("num_transformer_block", 2)))])
        self.proj_out = nn.Linear(inner, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, f = _frames_to_batch(x)
        bf, c, h, w = y.shape
        t = self.proj_in(self.norm(y).permute(0, 2, 3, 1).reshape(bf, h * w, c))
        for block in self.transformer_blocks:
            t = block(t, f)
        t = self.proj_out(t).reshape(bf, h, w, c).permute(0, 3, 1, 2)
        return _batch_to_frames(t + y, f)


class _Sampler(nn.Module):
    def __init__(self, channels: int, down: bool, padding: int = 1):
        super().__init__()
        self.down = down
        self.conv = FrameConv(channels, channels, 3, stride=2 if down else 1, padding=padding)

    def forward(self, x: torch.Tensor, size: Any = None) -> torch.Tensor:
        if not self.down:
            x = F.interpolate(x, size=size, mode="nearest") if size is not None else \
                F.interpolate(x, scale_factor=(1.0, 2.0, 2.0), mode="nearest")
        return self.conv(x)


class Stage(nn.Module):
    """One down or up block: resnets, optional spatial transformers and motion modules, optional sampler."""

    def __init__(self, resnets: list[ResnetBlock], attentions: list[nn.Module] | None,
                 motions: list[nn.Module] | None, sampler: _Sampler | None, down: bool):
        super().__init__()
        self.resnets = nn.ModuleList(resnets)
        if attentions is not None:
            self.attentions = nn.ModuleList(attentions)
        self.motion_modules = nn.ModuleList(motions) if motions is not None else None
        if sampler is not None:
            if down:
                self.downsamplers = nn.ModuleList([sampler])
            else:
                self.upsamplers = nn.ModuleList([sampler])
        self.down = down

    def layers(self):
        attns = getattr(self, "attentions", None)
        for i, resnet in enumerate(self.resnets):
            yield (resnet, attns[i] if attns is not None else None,
                   self.motion_modules[i] if self.motion_modules is not None else None)


class LatentSyncUNet(nn.Module):
    """UNet3DConditionModel of a configs/unet/*.yaml `model:` section (only what the released configs use)."""

    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        from diffusers.models.embeddings import TimestepEmbedding, Timesteps

        if cfg.get("resnet_time_scale_shift", "default") != "default" or cfg.get("use_inflated_groupnorm", False):
            raise ValueError("only the released UNet configuration (default time embedding, 5-D GroupNorm) is supported")
        if cfg.get("mid_block_type", "UNetMidBlock3DCrossAttn") != "UNetMidBlock3DCrossAttn" \
                or cfg.get("use_linear_projection", False) or cfg.get("class_embed_type") is not None:
            raise ValueError("unsupported LatentSync UNet configuration (mid block / projection / class embedding)")
        ch = [int(c) for c in cfg["block_out_channels"]]
        groups, eps = int(cfg.get("norm_num_groups", 32)), float(cfg.get("norm_eps", 1e-5))
        heads = cfg.get("attention_head_dim", 8)
        heads = [int(heads)] * len(ch) if isinstance(heads, int) else [int(h) for h in heads]
        ctx = int(cfg["cross_attention_dim"])
        audio = bool(cfg.get("add_audio_layer", False))
        layers = int(cfg.get("layers_per_block", 2))
        motion = bool(cfg.get("use_motion_module", False))
        res_set = set(cfg.get("motion_module_resolutions", (1, 2, 4, 8)))
        mkw = dict(cfg.get("motion_module_kwargs", {}))
        temb = ch[0] * 4
        self.add_audio_layer = audio
        self.in_channels, self.out_channels = int(cfg["in_channels"]), int(cfg.get("out_channels", 4))

        self.conv_in = FrameConv(self.in_channels, ch[0], 3, padding=1)
        self.time_proj = Timesteps(ch[0], bool(cfg.get("flip_sin_to_cos", True)), float(cfg.get("freq_shift", 0)))
        self.time_embedding = TimestepEmbedding(ch[0], temb)

        def spatial(c: int, h: int) -> SpatialTransformer:
            return SpatialTransformer(c, h, groups, ctx, audio)

        self.down_blocks = nn.ModuleList()
        cout = ch[0]
        for i, kind in enumerate(cfg["down_block_types"]):
            cin, cout = cout, ch[i]
            cross = kind == "CrossAttnDownBlock3D"
            mm = motion and (2 ** i in res_set) and not cfg.get("motion_module_decoder_only", False)
            last = i == len(ch) - 1
            self.down_blocks.append(Stage(
                [ResnetBlock(cin if j == 0 else cout, cout, temb, groups, eps) for j in range(layers)],
                [spatial(cout, heads[i]) for _ in range(layers)] if cross else None,
                [MotionModule(cout, mkw) for _ in range(layers)] if mm else None,
                None if last else _Sampler(cout, True, int(cfg.get("downsample_padding", 1))), True))
        self.mid_block = Stage(
            [ResnetBlock(ch[-1], ch[-1], temb, groups, eps, float(cfg.get("mid_block_scale_factor", 1)))
             for _ in range(2)],
            [spatial(ch[-1], heads[-1])],
            [MotionModule(ch[-1], mkw)] if motion and cfg.get("motion_module_mid_block", False) else None, None, True)
        self.up_blocks = nn.ModuleList()
        rch, rheads = ch[::-1], heads[::-1]
        cout = rch[0]
        for i, kind in enumerate(cfg["up_block_types"]):
            prev, cout = cout, rch[i]
            cin = rch[min(i + 1, len(ch) - 1)]
            cross = kind == "CrossAttnUpBlock3D"
            mm = motion and (2 ** (3 - i) in res_set)
            last = i == len(ch) - 1
            self.up_blocks.append(Stage(
                [ResnetBlock((prev if j == 0 else cout) + (cin if j == layers else cout), cout, temb, groups, eps)
                 for j in range(layers + 1)],
                [spatial(cout, rheads[i]) for _ in range(layers + 1)] if cross else None,
                [MotionModule(cout, mkw) for _ in range(layers + 1)] if mm else None,
                None if last else _Sampler(cout, False), False))
        self.conv_norm_out = nn.GroupNorm(groups, ch[0], eps=eps)
        self.conv_out = FrameConv(ch[0], self.out_channels, 3, padding=1)

    def fuse_projections(self) -> int:
        """Every self-attention's q/k/v as one projection (Attention.fuse_projections: the spatial blocks' attn1 and
        the motion modules' temporal attention); returns how many. Call after the weights are loaded and moved."""
        return sum(1 for m in self.modules() if isinstance(m, Attention) and m.fuse_projections())

    def set_short_attention(self, on: bool) -> int:
        """The motion modules' temporal attention through the short-sequence kernel (TemporalAttention) or SDPA, for
        every later call of this UNet (eager or compiled after this); returns the modules switched."""
        modules = [m for m in self.modules() if isinstance(m, TemporalAttention)]
        for m in modules:
            m.short_kernel = bool(on)
        return len(modules)

    def time_embed(self, t: torch.Tensor, rows: int, dtype: torch.dtype) -> torch.Tensor:
        """The timestep embedding [rows, C] (a function of t only: computed once per denoising step)."""
        t = t.reshape(-1)[:1].expand(rows)
        return self.time_embedding(self.time_proj(t).to(dtype))

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor | float | int,
                encoder_hidden_states: torch.Tensor | None = None, uncond_rows: int = 0,
                emb: torch.Tensor | None = None, deep_cache: dict | None = None, reuse: bool = False,
                shared_rows: bool = False) -> torch.Tensor:
        """sample (b, 13, f, h, w); encoder_hidden_states (b*f, 50, 384) audio windows (frames of batch row 0
        first); uncond_rows: the first n batch rows have all-zero audio (their cross-attention is a constant).
        deep_cache: a dict that keeps the feature entering the last up block (DeepCache's branch 0); reuse: run
        only conv_in, the first down block and the last up block on that kept feature (an approximation: the
        optional faster mode, pipeline.py). shared_rows: every batch row of `sample` (and of emb) is the same
        (the guidance batch: the same latents and conditions, only the audio differs), so everything before the
        first audio cross-attention - conv_in, the first ResNet block, the first transformer's self-attention -
        runs on one row (the same values: nothing there mixes rows)."""
        rows = sample.shape[0]
        if emb is None:
            t = timestep if torch.is_tensor(timestep) else torch.tensor([timestep], device=sample.device)
            emb = self.time_embed(t.to(sample.device), rows, sample.dtype)
        ctx = encoder_hidden_states
        # latents not divisible by the upsampling factor: each upsampler takes its skip's size (as the reference)
        odd = any(s % 2 ** (len(self.up_blocks) - 1) for s in sample.shape[-2:])
        share = shared_rows and rows > 1 and self.add_audio_layer and hasattr(self.down_blocks[0], "attentions")
        x = self.conv_in(sample[:1] if share else sample)
        skips = [x.expand(rows, -1, -1, -1, -1) if share else x]
        if reuse:
            if deep_cache is None or "x" not in deep_cache:
                raise ValueError("reuse=True needs a deep_cache filled by a full step")
            x = self._down_layers(self.down_blocks[0], x, emb, ctx, uncond_rows, skips, rows if share else 1)
            return self._up(self.up_blocks[-1], deep_cache["x"], skips, emb, ctx, uncond_rows, odd)
        for i, stage in enumerate(self.down_blocks):
            x = self._down_layers(stage, x, emb, ctx, uncond_rows, skips, rows if share and i == 0 else 1)
            if hasattr(stage, "downsamplers"):
                x = stage.downsamplers[0](x)
                skips.append(x)
        mid = self.mid_block
        x = mid.resnets[0](x, emb)
        for k, resnet in enumerate(mid.resnets[1:]):
            x = mid.attentions[k](x, ctx, uncond_rows)
            if mid.motion_modules is not None:
                x = mid.motion_modules[k](x)
            x = resnet(x, emb)
        for stage in self.up_blocks[:-1]:
            x = self._up_stage(stage, x, skips, emb, ctx, uncond_rows, odd)
        if deep_cache is not None:
            deep_cache["x"] = x
        return self._up(self.up_blocks[-1], x, skips, emb, ctx, uncond_rows, odd)

    def _down_layers(self, stage: Stage, x: torch.Tensor, emb: torch.Tensor, ctx: torch.Tensor | None,
                     uncond_rows: int, skips: list, repeat: int = 1) -> torch.Tensor:
        """A down block's layers (not its downsampler). repeat > 1 (the first block only): x is one row of
        `repeat` equal rows; the first ResNet block and the first transformer's self-attention run on it, the rows
        part at the audio."""
        for j, (resnet, attn, motion) in enumerate(stage.layers()):
            if j == 0 and repeat > 1:
                x = resnet(x, emb[:1])
                x = attn(x, ctx, uncond_rows, repeat)
            else:
                x = resnet(x, emb)
                if attn is not None:
                    x = attn(x, ctx, uncond_rows)
            if motion is not None:
                x = motion(x)
            skips.append(x)
        return x

    def _up_stage(self, stage: Stage, x: torch.Tensor, skips: list, emb: torch.Tensor, ctx: torch.Tensor | None,
                  uncond_rows: int, odd: bool) -> torch.Tensor:
        for resnet, attn, motion in stage.layers():
            x = resnet(torch.cat([x, skips.pop()], dim=1), emb)
            if attn is not None:
                x = attn(x, ctx, uncond_rows)
            if motion is not None:
                x = motion(x)
        if hasattr(stage, "upsamplers"):
            size = skips[-1].shape[2:] if odd else None
            x = stage.upsamplers[0](x, size)
        return x

    def _up(self, stage: Stage, x: torch.Tensor, skips: list, emb: torch.Tensor, ctx: torch.Tensor | None,
            uncond_rows: int, odd: bool) -> torch.Tensor:
        """The last up block and the output head."""
        x = self._up_stage(stage, x, skips, emb, ctx, uncond_rows, odd)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


def expected_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every parameter and buffer name -> shape of the UNet a config describes (built on the meta device)."""
    with torch.device("meta"):
        net = LatentSyncUNet(cfg)
    return {k: tuple(v.shape) for k, v in net.state_dict().items()}
