"""CosyVoice 3 flow decoder: speech tokens (+ prompt mel, x-vector) -> 80-band mel with a DiT estimator.

Written for this pack from the published architecture (Fun-CosyVoice3-0.5B, Apache-2.0); parameter names
follow the released `flow.pt` (CausalMaskedDiffWithDiT) so it loads with strict key and shape checks:

    tokens -> embedding (80 wide) -> pre-lookahead convs (80 -> 1024 -> 80, residual) -> 2x repeat = mu
    -> conditional flow matching (the same Euler / cosine grid / classifier-free guidance / fixed noise as
    CosyVoice 2: flow.CFMDecoder, flow.FastCFM) with a 22-block diffusion transformer estimator.

DiT details kept from the release: adaptive layer norm (zero-init style) conditioned on the time step,
a causal depthwise-conv position embedding, tanh-GELU feed-forward, and rotary position embedding on the
first head's 64 channels only (the release applies its rotary table to the projected query/key before
splitting heads, so only channels 0..63 rotate; pairs are interleaved). Only the offline (full-context)
attention is implemented.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .flow import MEL_BINS, CFMDecoder, FastCFM, PreLookahead


def sinusoids(t: torch.Tensor, dim: int, scale: float = 1000) -> torch.Tensor:
    half = dim // 2
    freq = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1)))
    arg = scale * t.float().unsqueeze(1) * freq.unsqueeze(0)
    return torch.cat((arg.sin(), arg.cos()), dim=-1)


class TimeEmbedding(nn.Module):
    def __init__(self, dim: int, freq_dim: int = 256) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.time_mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        # sinusoids of t * 1000 in float32 even for a half-precision copy (fp16 has 0.5 steps at 1000)
        return self.time_mlp(sinusoids(t, self.freq_dim).to(self.time_mlp[0].weight.dtype))


class CausalConvPosition(nn.Module):
    """Two grouped convolutions (kernel 31, left padding only) with Mish: each frame sees its past."""

    def __init__(self, dim: int, kernel: int = 31, groups: int = 16) -> None:
        super().__init__()
        self.kernel = kernel
        self.conv1 = nn.Sequential(nn.Conv1d(dim, dim, kernel, groups=groups), nn.Mish())
        self.conv2 = nn.Sequential(nn.Conv1d(dim, dim, kernel, groups=groups), nn.Mish())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D]
        y = self.conv1(F.pad(x.transpose(1, 2), (self.kernel - 1, 0)))
        y = self.conv2(F.pad(y, (self.kernel - 1, 0)))
        return y.transpose(1, 2)


class InputEmbedding(nn.Module):
    def __init__(self, mel_dim: int, mu_dim: int, spk_dim: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(mel_dim * 2 + mu_dim + spk_dim, dim)
        self.conv_pos_embed = CausalConvPosition(dim)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, mu: torch.Tensor, spks: torch.Tensor) -> torch.Tensor:
        h = self.proj(torch.cat([x, cond, mu, spks[:, None].expand(-1, x.shape[1], -1)], dim=-1))
        return self.conv_pos_embed(h) + h


class RotaryTable(nn.Module):
    """inv_freq is a persistent buffer in the release's flow.pt (loaded from the file like a weight)."""

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)))

    def forward(self, length: int) -> torch.Tensor:
        t = torch.arange(length, device=self.inv_freq.device).type_as(self.inv_freq)
        freqs = t[:, None] * self.inv_freq[None]
        return torch.stack((freqs, freqs), dim=-1).flatten(-2)  # [T, dim], each angle twice (interleaved pairs)


def apply_rotary(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate the first freqs.shape[-1] channels of x [B, T, C] in interleaved pairs; the rest pass."""
    dim, dtype = freqs.shape[-1], x.dtype
    head, rest = x[..., :dim].float(), x[..., dim:]
    pairs = head.unflatten(-1, (-1, 2))
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    head = head * freqs.cos() + rotated * freqs.sin()
    return torch.cat((head.to(dtype), rest), dim=-1)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        inner = heads * head_dim
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(dim, inner)
        self.to_v = nn.Linear(dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])

    def forward(self, x: torch.Tensor, keep: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        """keep [B, T] bool (valid frames): masked keys are ignored and masked rows zeroed, as the release."""
        b, n, _ = x.shape
        q = apply_rotary(self.to_q(x), freqs)
        k = apply_rotary(self.to_k(x), freqs)
        v = self.to_v(x)
        split = lambda y: y.view(b, n, self.heads, self.head_dim).transpose(1, 2)  # noqa: E731
        out = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=keep[:, None, None, :])
        out = self.to_out[0](out.transpose(1, 2).reshape(b, n, -1))
        return out * keep[..., None].to(out.dtype)


class AdaNorm(nn.Module):
    """LayerNorm without affine, scaled and shifted by `chunks` vectors made from the time embedding."""

    def __init__(self, dim: int, chunks: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim * chunks)
        self.chunks = chunks

    def forward(self, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.linear(F.silu(t)).chunk(self.chunks, dim=1)


def _norm(x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], eps=1e-6)


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int) -> None:
        super().__init__()
        inner = dim * mult
        # keys ff.ff.0.0 / ff.ff.2 as the release (its dropout layer sits at index 1)
        self.ff = nn.Sequential(nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")), nn.Identity(),
                                nn.Linear(inner, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x)


class DiTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int, ff_mult: int) -> None:
        super().__init__()
        self.attn_norm = AdaNorm(dim, 6)
        self.attn = Attention(dim, heads, head_dim)
        self.ff = FeedForward(dim, ff_mult)

    def forward(self, x: torch.Tensor, t: torch.Tensor, keep: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.attn_norm(t)
        h = _norm(x) * (1 + scale_msa[:, None]) + shift_msa[:, None]
        x = x + gate_msa[:, None] * self.attn(h, keep, freqs)
        h = _norm(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        return x + gate_mlp[:, None] * self.ff(h)


class DiT(nn.Module):
    """The estimator: velocity for (x, mask, mu, t, spks, cond), the interface of flow.Estimator."""

    def __init__(self, dim: int = 1024, depth: int = 22, heads: int = 16, head_dim: int = 64, ff_mult: int = 2,
                 mel_dim: int = MEL_BINS, mu_dim: int = MEL_BINS, spk_dim: int = MEL_BINS) -> None:
        super().__init__()
        self.time_embed = TimeEmbedding(dim)
        self.input_embed = InputEmbedding(mel_dim, mu_dim, spk_dim, dim)
        self.rotary_embed = RotaryTable(head_dim)
        self.transformer_blocks = nn.ModuleList(DiTBlock(dim, heads, head_dim, ff_mult) for _ in range(depth))
        self.norm_out = AdaNorm(dim, 2)
        self.proj_out = nn.Linear(dim, mel_dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, mu: torch.Tensor, t: torch.Tensor,
                spks: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        t = self.time_embed(t)
        h = self.input_embed(x.transpose(1, 2), cond.transpose(1, 2), mu.transpose(1, 2), spks)
        freqs = self.rotary_embed(h.shape[1])
        keep = mask[:, 0].bool()
        for block in self.transformer_blocks:
            h = block(h, t, keep, freqs)
        scale, shift = self.norm_out(t)
        h = _norm(h) * (1 + scale[:, None]) + shift[:, None]
        return self.proj_out(h).transpose(1, 2)


@dataclass(frozen=True)
class DiTFlowConfig:
    vocab_size: int = 6561
    input_size: int = 80
    spk_embed_dim: int = 192
    token_mel_ratio: int = 2
    pre_lookahead_len: int = 3
    pre_lookahead_channels: int = 1024
    dim: int = 1024
    depth: int = 22
    heads: int = 16
    head_dim: int = 64
    ff_mult: int = 2
    cfg_rate: float = 0.7
    timesteps: int = 10


class DiTFlow(nn.Module):
    """CausalMaskedDiffWithDiT, offline inference."""

    def __init__(self, cfg: DiTFlowConfig) -> None:
        super().__init__()
        if cfg.input_size != MEL_BINS:
            raise ValueError(f"flow input_size {cfg.input_size}: CosyVoice 3's token embedding is the mel width (80)")
        self.cfg = cfg
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, MEL_BINS)
        self.pre_lookahead_layer = PreLookahead(cfg.input_size, cfg.pre_lookahead_len, cfg.pre_lookahead_channels)
        self.decoder = CFMDecoder(DiT(cfg.dim, cfg.depth, cfg.heads, cfg.head_dim, cfg.ff_mult), cfg.cfg_rate)

    @torch.inference_mode()
    def inference(self, token: torch.Tensor, prompt_token: torch.Tensor, prompt_feat: torch.Tensor,
                  embedding: torch.Tensor, solver: FastCFM | None = None) -> torch.Tensor:
        """token/prompt_token [1, N] ints, prompt_feat [1, 2*Np, 80], embedding [1, 192] -> mel [1, 80, 2N]."""
        spks = self.spk_embed_affine_layer(F.normalize(embedding.float(), dim=1))
        tokens = torch.cat([prompt_token, token], dim=1).long()
        h = self.pre_lookahead_layer(self.input_embedding(torch.clamp(tokens, min=0)))
        h = h.repeat_interleave(self.cfg.token_mel_ratio, dim=1)
        prompt_frames = prompt_feat.shape[1]
        cond = torch.zeros(1, h.shape[1], MEL_BINS, dtype=h.dtype, device=h.device)
        cond[:, :prompt_frames] = prompt_feat
        mask = torch.ones(1, 1, h.shape[1], dtype=h.dtype, device=h.device)
        mu = h.transpose(1, 2).contiguous()
        mel = (solver or self.decoder)(mu, mask, spks, cond.transpose(1, 2), steps=self.cfg.timesteps)
        return mel[:, :, prompt_frames:]
