"""CosyVoice 2 flow-matching decoder: speech tokens (+ prompt mel, speaker x-vector) -> 80-band mel.

Written for this pack from the published architecture (CosyVoice 2, Apache-2.0); parameter names
follow the released `flow.pt` so its state dict loads with strict key and shape checks:

    tokens -> embedding -> UpsampleConformerEncoder (lookahead conv, rel-pos conformer blocks,
    2x nearest upsample, more blocks) -> linear to 80 -> conditional flow matching (Euler steps on a
    cosine time grid, classifier-free guidance) with a causal 1-D U-Net estimator.

Only the offline (non-streaming, full-context) path is implemented: attention sees every frame.
"""
from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

MEL_BINS = 80
NOISE_FRAMES = 50 * 300  # the reference draws one fixed noise tensor this long (seed 0)


# --- text-side encoder ----------------------------------------------------------------------------
def rel_position_table(length: int, dim: int, device: torch.device | str | None = None) -> torch.Tensor:
    """ESPnet relative sinusoids for relative positions length-1 ... -(length-1): [1, 2L-1, dim], made on `device`
    (no host copy: the encoder can be captured in a CUDA graph, flow_encoder.FastEncoder)."""
    position = torch.arange(0, length, dtype=torch.float32, device=device).unsqueeze(1)
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32, device=device) * -(math.log(10000.0) / dim))
    pos = torch.zeros(length, dim, device=device)
    neg = torch.zeros(length, dim, device=device)
    pos[:, 0::2] = torch.sin(position * div)
    pos[:, 1::2] = torch.cos(position * div)
    neg[:, 0::2] = torch.sin(-1 * position * div)
    neg[:, 1::2] = torch.cos(-1 * position * div)
    return torch.cat([torch.flip(pos, [0]), neg[1:]], dim=0).unsqueeze(0)


class LinearInput(nn.Module):
    """Linear -> LayerNorm, scaled by sqrt(dim); returns the relative position table too."""

    def __init__(self, idim: int, odim: int) -> None:
        super().__init__()
        self.out = nn.Sequential(nn.Linear(idim, odim), nn.LayerNorm(odim, eps=1e-5))
        self.odim = odim

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.out(x) * math.sqrt(self.odim)
        return x, rel_position_table(x.shape[1], self.odim, x.device).to(x.dtype)


class RelPosSelfAttention(nn.Module):
    """Transformer-XL style self-attention with learned content/position biases (u, v)."""

    def __init__(self, heads: int, dim: int) -> None:
        super().__init__()
        self.h, self.d_k = heads, dim // heads
        self.linear_q = nn.Linear(dim, dim)
        self.linear_k = nn.Linear(dim, dim)
        self.linear_v = nn.Linear(dim, dim)
        self.linear_out = nn.Linear(dim, dim)
        self.linear_pos = nn.Linear(dim, dim, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(heads, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(heads, self.d_k))

    def forward(self, x: torch.Tensor, pos: torch.Tensor, key_bias: torch.Tensor | None = None) -> torch.Tensor:
        """key_bias: [B, 1, 1, T], 0 for a key to attend, -inf-like for padding (a padded call: FastEncoder)."""
        b, t, _ = x.shape
        q = self.linear_q(x).view(b, t, self.h, self.d_k)               # [B, T, H, D]
        k = self.linear_k(x).view(b, t, self.h, self.d_k).transpose(1, 2)
        v = self.linear_v(x).view(b, t, self.h, self.d_k).transpose(1, 2)
        p = self.linear_pos(pos).view(pos.shape[0], -1, self.h, self.d_k).transpose(1, 2)
        content = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))
        by_pos = torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.transpose(-2, -1))  # [B,H,T,2T-1]
        # Column T-1-i+j of row i holds relative position i-j: pick it directly (exact, no arithmetic).
        rows = torch.arange(t, device=x.device).unsqueeze(1)  # on x's device: no host copy per call on a GPU
        cols = (t - 1) - rows + torch.arange(t, device=x.device).unsqueeze(0)
        by_pos = by_pos[:, :, rows, cols]
        scores = (content + by_pos) / math.sqrt(self.d_k)
        attn = torch.softmax(scores if key_bias is None else scores + key_bias, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).contiguous().view(b, t, self.h * self.d_k)
        return self.linear_out(out)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w_1 = nn.Linear(dim, hidden)
        self.w_2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(F.silu(self.w_1(x)))


class ConformerBlock(nn.Module):
    """Pre-norm attention + feed-forward (the released config has no macaron / conv module)."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.self_attn = RelPosSelfAttention(heads, dim)
        self.feed_forward = FeedForward(dim, hidden)
        self.norm_ff = nn.LayerNorm(dim, eps=1e-12)
        self.norm_mha = nn.LayerNorm(dim, eps=1e-12)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, key_bias: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.norm_mha(x), pos, key_bias)
        return x + self.feed_forward(self.norm_ff(x))


class PreLookahead(nn.Module):
    """Each token sees `lookahead` future tokens (right-padded conv), then a causal conv; residual."""

    def __init__(self, dim: int, lookahead: int, channels: int | None = None) -> None:
        super().__init__()
        self.lookahead = lookahead
        channels = channels or dim  # CosyVoice 2: dim -> dim; CosyVoice 3: 80 -> 1024 -> 80
        self.conv1 = nn.Conv1d(dim, channels, lookahead + 1)
        self.conv2 = nn.Conv1d(channels, dim, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.pad(x.transpose(1, 2), (0, self.lookahead))
        y = F.leaky_relu(self.conv1(y))
        y = self.conv2(F.pad(y, (self.conv2.kernel_size[0] - 1, 0)))
        return y.transpose(1, 2) + x


class Upsample2x(nn.Module):
    def __init__(self, dim: int, stride: int = 2) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(dim, dim, stride * 2 + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T] -> [B, C, 2T]
        y = F.interpolate(x, scale_factor=float(self.stride), mode="nearest")
        return self.conv(F.pad(y, (self.stride * 2, 0)))


class TokenEncoder(nn.Module):
    """UpsampleConformerEncoder: tokens at 25 Hz -> hidden states at 50 Hz (mel frame rate)."""

    def __init__(self, dim: int, heads: int, hidden: int, blocks: int, up_blocks: int = 4,
                 lookahead: int = 3) -> None:
        super().__init__()
        self.embed = LinearInput(dim, dim)
        self.pre_lookahead_layer = PreLookahead(dim, lookahead)
        self.encoders = nn.ModuleList(ConformerBlock(dim, heads, hidden) for _ in range(blocks))
        self.up_layer = Upsample2x(dim)
        self.up_embed = LinearInput(dim, dim)
        self.up_encoders = nn.ModuleList(ConformerBlock(dim, heads, hidden) for _ in range(up_blocks))
        self.after_norm = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, N, dim] token embeddings -> [B, 2N, dim]. valid: [B, N] 1 for a real token, 0 for padding after
        the last one (FastEncoder's padded lengths): the real frames come out as from the unpadded tokens - the
        lookahead conv sees zeros past the last token as it does unpadded, attention ignores padded keys, and the
        upsampling conv only looks left."""
        x, pos = self.embed(x)
        bias = None
        if valid is not None:
            x = x * valid.unsqueeze(-1).to(x.dtype)
            bias = self._key_bias(valid, x.dtype)
        x = self.pre_lookahead_layer(x)
        for block in self.encoders:
            x = block(x, pos, bias)
        x = self.up_layer(x.transpose(1, 2)).transpose(1, 2)
        x, pos = self.up_embed(x)
        if valid is not None:
            # each token's frames (views and a copy: nothing a CUDA graph capture could not hold)
            frames = valid.unsqueeze(-1).expand(-1, -1, self.up_layer.stride).reshape(valid.shape[0], -1)
            bias = self._key_bias(frames, x.dtype)
        for block in self.up_encoders:
            x = block(x, pos, bias)
        return self.after_norm(x)

    @staticmethod
    def _key_bias(valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return ((1.0 - valid.to(dtype)) * -1.0e10)[:, None, None, :]  # exp() of it is 0: padded keys weigh nothing


# --- flow-matching estimator (causal 1-D U-Net with transformer blocks) ---------------------------
class CausalConv1d(nn.Conv1d):
    def __init__(self, cin: int, cout: int, kernel: int) -> None:
        super().__init__(cin, cout, kernel)
        self.left = kernel - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.left, 0)))


class _ChannelsLast(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2)


class CausalBlock(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        # Indices 0 and 2 carry weights (conv, layer norm), as in the released checkpoint.
        self.block = nn.Sequential(CausalConv1d(cin, cout, 3), _ChannelsLast(), nn.LayerNorm(cout),
                                   _ChannelsLast(), nn.Mish())

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.block(x * mask) * mask


class CausalResnet(nn.Module):
    def __init__(self, cin: int, cout: int, time_dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_dim, cout))
        self.block1 = CausalBlock(cin, cout)
        self.block2 = CausalBlock(cout, cout)
        self.res_conv = nn.Conv1d(cin, cout, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.block1(x, mask) + self.mlp(t).unsqueeze(-1)
        return self.block2(h, mask) + self.res_conv(x * mask)


class _GeluProj(nn.Module):
    def __init__(self, dim: int, inner: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x))


class _SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        inner = heads * head_dim
        self.heads, self.head_dim = heads, head_dim
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(dim, inner, bias=False)
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(0.0)])

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        split = lambda y: y.view(b, t, self.heads, self.head_dim).transpose(1, 2)  # noqa: E731
        out = F.scaled_dot_product_attention(split(self.to_q(x)), split(self.to_k(x)), split(self.to_v(x)),
                                             attn_mask=bias)
        return self.to_out[0](out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = _SelfAttention(dim, heads, head_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = nn.Module()
        self.ff.net = nn.ModuleList([_GeluProj(dim, dim * 4), nn.Dropout(0.0), nn.Linear(dim * 4, dim)])

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = self.attn1(self.norm1(x), bias) + x
        h = self.norm3(x)
        for layer in self.ff.net:
            h = layer(h)
        return h + x


class _TimeMLP(nn.Module):
    def __init__(self, cin: int, dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(cin, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


def timestep_sinusoids(t: torch.Tensor, dim: int, scale: float = 1000) -> torch.Tensor:
    half = dim // 2
    freq = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1)))
    arg = scale * t.unsqueeze(1) * freq.unsqueeze(0)
    return torch.cat((arg.sin(), arg.cos()), dim=-1)


class Estimator(nn.Module):
    """Velocity field v(x, t | mu, spk, cond): one down level, mid blocks, one up level."""

    def __init__(self, in_channels: int, out_channels: int, channels: int, n_blocks: int, mid_blocks: int,
                 heads: int, head_dim: int) -> None:
        super().__init__()
        self.in_channels = in_channels
        time_dim = channels * 4
        self.time_mlp = _TimeMLP(in_channels, time_dim)

        def stage(cin: int) -> nn.ModuleList:
            return nn.ModuleList([CausalResnet(cin, channels, time_dim),
                                  nn.ModuleList(TransformerBlock(channels, heads, head_dim) for _ in range(n_blocks))])

        down = stage(in_channels)
        down.append(CausalConv1d(channels, channels, 3))
        self.down_blocks = nn.ModuleList([down])
        self.mid_blocks = nn.ModuleList(stage(channels) for _ in range(mid_blocks))
        up = stage(channels * 2)
        up.append(CausalConv1d(channels, channels, 3))
        self.up_blocks = nn.ModuleList([up])
        self.final_block = CausalBlock(channels, channels)
        self.final_proj = nn.Conv1d(channels, out_channels, 1)

    @staticmethod
    def attention_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[B, 1, T] mask -> the transformers' additive bias [B, 1, T, T] (0 = attend, -1e10 = padding)."""
        keep = mask.bool()
        return ((1.0 - keep.repeat(1, mask.shape[-1], 1).to(dtype)) * -1.0e10).unsqueeze(1)

    @staticmethod
    def _transformers(blocks: nn.ModuleList, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        h = x.transpose(1, 2).contiguous()
        for block in blocks:
            h = block(h, bias)
        return h.transpose(1, 2).contiguous()

    def forward(self, x: torch.Tensor, mask: torch.Tensor, mu: torch.Tensor, t: torch.Tensor,
                spks: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        # sinusoids of t * 1000 in float32 even for a half-precision estimator (fp16 has 0.5 steps at 1000)
        temb = self.time_mlp(timestep_sinusoids(t.float(), self.in_channels).to(x.dtype))
        h = torch.cat([x, mu, spks.unsqueeze(-1).expand(-1, -1, x.shape[-1]), cond], dim=1)
        # one bias for all 14 stages (no stage changes the length): built once, not 14 times (~5 kernels each)
        bias = self.attention_bias(mask, x.dtype)
        resnet, blocks, down = self.down_blocks[0]
        h = self._transformers(blocks, resnet(h, mask, temb), bias)
        skip = h
        h = down(h * mask)
        for resnet, blocks in self.mid_blocks:
            h = self._transformers(blocks, resnet(h, mask, temb), bias)
        resnet, blocks, up = self.up_blocks[0]
        h = torch.cat([h[:, :, :skip.shape[-1]], skip], dim=1)
        h = self._transformers(blocks, resnet(h, mask, temb), bias)
        h = up(h * mask)
        h = self.final_block(h, mask)
        return self.final_proj(h * mask) * mask


class CFMDecoder(nn.Module):
    """Euler ODE solve from fixed noise with classifier-free guidance."""

    def __init__(self, estimator: Estimator, cfg_rate: float = 0.7) -> None:
        super().__init__()
        self.estimator = estimator
        self.cfg_rate = cfg_rate
        # The released runtime starts every utterance from the same noise: torch seed 0, one draw.
        self.noise = torch.randn(1, MEL_BINS, NOISE_FRAMES, generator=torch.Generator().manual_seed(0))

    def forward(self, mu: torch.Tensor, mask: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor,
                steps: int = 10) -> torch.Tensor:
        frames = mu.shape[2]
        if frames > NOISE_FRAMES:
            raise ValueError(f"{frames} mel frames exceed the decoder's {NOISE_FRAMES}; synthesize shorter text")
        return solve_ode(self.estimator, self.noise[:, :, :frames].to(mu), mu, mask, spks, cond, steps, self.cfg_rate)


def solve_ode(estimator: Estimator, x: torch.Tensor, mu: torch.Tensor, mask: torch.Tensor, spks: torch.Tensor,
              cond: torch.Tensor, steps: int, cfg_rate: float) -> torch.Tensor:
    """Euler steps on the cosine grid with classifier-free guidance; x (the noise) stays float32.

    The estimator runs in its own weights' dtype (inputs cast to it, velocities back to float32), so the
    FP32 reference path and a half-precision copy share this code. Rows are independent solves (live mode's
    sessions batched: FlowRowBatcher): the conditioned rows of every solve first, then their unconditioned twins."""
    dtype = next(estimator.parameters()).dtype
    grid = torch.linspace(0, 1, steps + 1, device=mu.device, dtype=mu.dtype)
    grid = 1 - torch.cos(grid * 0.5 * torch.pi)
    t, dt = grid[0].unsqueeze(0), grid[1] - grid[0]
    zeros = torch.zeros_like
    mu2 = torch.cat([mu, zeros(mu)]).to(dtype)
    spks2 = torch.cat([spks, zeros(spks)]).to(dtype)
    cond2 = torch.cat([cond, zeros(cond)]).to(dtype)
    mask2 = torch.cat([mask, mask]).to(dtype)
    for step in range(1, len(grid)):
        rows = x.shape[0]
        v = estimator(torch.cat([x, x]).to(dtype), mask2, mu2, t.expand(2 * rows), spks2, cond2).float()
        v_cond, v_free = v[:rows], v[rows:]
        x = x + dt * ((1.0 + cfg_rate) * v_cond - cfg_rate * v_free)
        t = t + dt
        if step < len(grid) - 1:
            dt = grid[step + 1] - t
    return x.float()


class FastCFM:
    """The decoder's ODE solve with a half-precision estimator copy, padded lengths and CUDA graphs.

    Why: the estimator is ~2,000 small kernels per solve (10 steps x 14 U-Net stages), launch-bound in
    eager mode. Lengths are padded up to a multiple of `bucket` frames with mask 0 (the estimator's mask
    makes padded frames invisible to valid ones: causal convolutions look left, attention ignores masked
    keys), so one captured graph serves every length in a bucket; graphs are kept per padded length for the
    solver's life (a 20-s chunk needs 18; their memory is one shared pool). None is destroyed early: since torch
    2.11 destroying a graph frees the cuBLAS workspace of its capture stream, which the solver's other graphs
    captured too (pytorch issue 193402). Off CUDA it runs the padded solve eagerly.
    """

    def __init__(self, decoder: CFMDecoder, dtype: torch.dtype = torch.float16, bucket: int = 64,
                 cuda_graph: bool | None = None, estimator: nn.Module | None = None, fused: bool = False,
                 compiled: bool = False) -> None:
        """estimator: another solver's `estimator` (the same decoder's copy in `dtype`) to use instead of making
        a copy: live mode's TTS lanes each have a solver (graphs, pool) of their own but one copy of the weights
        (then fused / compiled are that copy's). fused / compiled: fewer kernels per solve (flow_kernels:
        q/k/v as one projection; the blocks compiled by inductor)."""
        import copy

        if estimator is not None and next(estimator.parameters()).dtype != dtype:
            raise ValueError(f"the shared estimator is {next(estimator.parameters()).dtype}, this solver's is {dtype}")
        self.compile_note: str | None = None  # set when a compile failed and the blocks went back to eager
        self._compiled_ok = False  # a solve with compiled blocks has worked (later failures are not the compiler's)
        if estimator is None:
            from .flow_kernels import compile_blocks, fuse_projections

            estimator = copy.deepcopy(decoder.estimator).to(dtype).requires_grad_(False)
            if fused:
                fuse_projections(estimator)
            if compiled:
                compile_blocks(estimator)
        self.estimator = estimator
        self.noise, self.cfg_rate, self.bucket = decoder.noise, decoder.cfg_rate, int(bucket)
        self._noise_on: dict[tuple, torch.Tensor] = {}  # the noise per (device, dtype): a host copy each solve syncs
        device = next(self.estimator.parameters()).device
        self.use_graph = device.type == "cuda" if cuda_graph is None else cuda_graph
        self.graphs: dict[tuple[int, int], tuple[Callable[[], None], dict[str, torch.Tensor], torch.Tensor]] = {}
        self.captures = 0   # graphs captured (prepare's, and any made while serving)
        self.prepared = 0   # frames prepare() covered (0 = none)
        # Every graph allocates from one shared pool: a graph's intermediates are dead once its output is cloned,
        # so the next graph may reuse them (a pool each would hold the sum of a live chunk's 18 buckets).
        # Sharing is safe only if replays never overlap, on the host and on the device: _order.
        self._pool: Any = None
        self._stream: Any = None  # this solver's capture stream (_graph)
        from ..cuda_streams import ReplayOrder

        self._order = ReplayOrder()

    def _graph(self, padded: int, steps: int, inputs: dict[str, torch.Tensor]):
        rows = int(inputs["mu"].shape[0])
        key = (padded, steps) if rows == 1 else (padded, steps, rows)
        if key in self.graphs:
            entry = self.graphs.pop(key)
            self.graphs[key] = entry  # most recently used last
            return entry
        static = {k: v.clone() for k, v in inputs.items()}
        static["x"] = self._noise(rows, padded, inputs["mu"])  # the start noise: a constant the graph never writes
        run = lambda: self._solve(static["x"], static["mu"], static["mask"], static["spks"],  # noqa: E731
                                  static["cond"], steps)
        device = static["x"].device
        if self._pool is None and device.type == "cuda":
            self._pool = torch.cuda.graph_pool_handle()
        if self._stream is None and device.type == "cuda":
            from ..cuda_streams import capture_stream

            self._stream = capture_stream(device)  # a cuBLAS workspace of this solver's own (capture_stream)
        try:
            replay, out = _capture(run, device, pool=self._pool, stream=self._stream)
        except Exception as exc:  # compiled code that ran but could not be captured: eager blocks, captured again
            if not self._compile_failure(exc):
                raise
            self._to_eager(exc)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            replay, out = _capture(run, device, pool=self._pool, stream=self._stream)
        self.captures += 1
        if self.prepared and padded > self.prepared:
            log.warning("[digital_human] CosyVoice 2 flow: a %d-frame solve is longer than the %d frames prepared; "
                        "capturing its graph now", padded, self.prepared)
        self.graphs[key] = (replay, static, out)
        return self.graphs[key]

    @torch.inference_mode()  # as serving's solves (CausalFlow.inference); with autograd on, the warm-up solve
    # kept every step's activations for a backward pass and ran an H200 out of memory (2026-12-03)
    def prepare(self, max_frames: int, steps: int = 10, spk_dim: int = MEL_BINS, rows: tuple[int, ...] = (1,)) -> int:
        """Capture the graphs of every bucket up to `max_frames` now (and keep them all), so that no capture
        happens while serving: live mode's sessions run the talking head on the same GPU from other threads at
        the same time. rows: the row counts to capture each length for (solve_rows; FlowRowBatcher's sizes).
        Returns the number of graphs kept."""
        if not self.use_graph:
            return 0
        device = next(self.estimator.parameters()).device
        top = min(-(-int(max_frames) // self.bucket) * self.bucket, NOISE_FRAMES)
        lengths = list(range(self.bucket, top + 1, self.bucket))
        for count in sorted({max(1, int(r)) for r in rows}, reverse=True):
            for padded in reversed(lengths):  # largest first: the shared pool is sized by the first capture
                z = torch.zeros(count, MEL_BINS, padded, device=device)
                self._graph(padded, steps, {"mu": z, "mask": torch.ones(count, 1, padded, device=device),
                                            "spks": torch.zeros(count, spk_dim, device=device), "cond": z.clone()})
        self.prepared = max(self.prepared, top)
        return len(self.graphs)

    def _solve(self, x: torch.Tensor, mu: torch.Tensor, mask: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor,
               steps: int) -> torch.Tensor:
        """solve_ode with this solver's estimator. Compiled blocks compile at their first call (a graph's warm-up
        call, before its capture); if that fails, the failure is announced, the blocks go back to their eager
        forward and the solve runs again. Other failures (once a compiled solve has worked: an out-of-memory, a
        bad shape) are raised as they are."""
        try:
            out = solve_ode(self.estimator, x, mu, mask, spks, cond, steps, self.cfg_rate)
        except Exception as exc:
            capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
            if capturing or not self._compile_failure(exc):
                raise
            self._to_eager(exc)
            return solve_ode(self.estimator, x, mu, mask, spks, cond, steps, self.cfg_rate)
        self._compiled_ok = True
        return out

    def _compile_failure(self, exc: BaseException) -> bool:
        """Whether `exc` from a solve is the compiled blocks' to answer by going eager: they are compiled, and it is
        the compiler's (dynamo, inductor, Triton), or no compiled solve has worked yet."""
        from .flow_kernels import compiled_blocks

        if not compiled_blocks(self.estimator):
            return False
        from torch._dynamo.exc import TorchDynamoException

        from_compiler = isinstance(exc, TorchDynamoException) or \
            type(exc).__module__.startswith(("torch._inductor", "triton"))
        return from_compiler or not self._compiled_ok

    def _to_eager(self, exc: BaseException) -> None:
        from .flow_kernels import uncompile_blocks

        self.compile_note = (f"CosyVoice 2 flow: the estimator's compiled blocks failed ({type(exc).__name__}: "
                             f"{exc}); they run eagerly")
        log.warning("[digital_human] %s", self.compile_note)
        uncompile_blocks(self.estimator)

    def _noise(self, rows: int, padded: int, like: torch.Tensor) -> torch.Tensor:
        """The start noise of `rows` solves padded to `padded` frames: every row the decoder's one noise, so a
        row's frames start where a solve of that row alone starts."""
        key = (like.device, like.dtype)
        if key not in self._noise_on:  # once: the decoder's noise lives on the host
            self._noise_on[key] = self.noise.to(device=like.device, dtype=like.dtype)
        return self._noise_on[key][:, :, :padded].expand(rows, -1, -1).contiguous()

    @torch.inference_mode()
    def __call__(self, mu: torch.Tensor, mask: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor,
                 steps: int = 10) -> torch.Tensor:
        frames = mu.shape[2]
        padded = -(-frames // self.bucket) * self.bucket
        if padded > NOISE_FRAMES:
            raise ValueError(f"{frames} mel frames exceed the decoder's {NOISE_FRAMES}; synthesize shorter text")
        pad = lambda y: F.pad(y, (0, padded - frames))  # noqa: E731
        return self.solve_rows(pad(mu), pad(mask), spks, pad(cond), steps)[:, :, :frames]

    @torch.inference_mode()
    def solve_rows(self, mu: torch.Tensor, mask: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor,
                   steps: int = 10) -> torch.Tensor:
        """Independent solves as rows of one call: mu/cond [B, 80, P], mask [B, 1, P] (0 past each row's frames),
        spks [B, 80], P a multiple of `bucket`; returns x [B, 80, P] (a copy). Each row's frames are those of its
        solve alone (the mask hides the padding; rounding aside: the attention sums run over P keys)."""
        rows, padded = int(mu.shape[0]), int(mu.shape[2])
        if padded % self.bucket:
            raise ValueError(f"solve_rows takes lengths padded to a multiple of {self.bucket} frames, not {padded}")
        if padded > NOISE_FRAMES:
            raise ValueError(f"{padded} mel frames exceed the decoder's {NOISE_FRAMES}; synthesize shorter text")
        if not self.use_graph:
            return self._solve(self._noise(rows, padded, mu), mu, mask, spks, cond, steps)
        inputs = {"mu": mu, "mask": mask, "spks": spks, "cond": cond}  # the graph holds its own start noise
        with self._order.turn(mu.device):  # one replay at a time: the graphs share their memory pool
            replay, static, out = self._graph(padded, steps, inputs)
            for name, value in inputs.items():
                static[name].copy_(value)
            replay()
            result = out.clone()
        return result


log = logging.getLogger("digital_human.cosyvoice")
_CAPTURE_LOCK = threading.Lock()  # one capture at a time in the process


def capture_graph(run: Callable[[], torch.Tensor], device: torch.device, pool: Any = None,
                  stream: Any = None) -> tuple[Callable[[], None], torch.Tensor]:
    """(replay, out): run() captured into a CUDA graph on `stream` after one warm-up call there (cuDNN/cuBLAS
    plans and workspace are made outside the capture); `pool` (torch.cuda.graph_pool_handle()) shares memory with
    other graphs; `stream`: the owner's capture stream (cuda_streams.capture_stream; None: a new one).
    Thread-local capture mode: other threads may use the GPU meanwhile (live mode's talking head) - in the
    default global mode their calls fail with "operation not permitted when stream is capturing" and invalidate
    this capture (seen on an H200, 2026-12-02)."""
    with _CAPTURE_LOCK:
        if stream is None:
            from ..cuda_streams import capture_stream

            stream = capture_stream(device)
        current = torch.cuda.current_stream(device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            run()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
                out = run()
        finally:  # a capture that fails in capture_end leaves torch.cuda.graph's stream current: back to the caller's
            if torch.cuda.current_stream(device) != current:
                torch.cuda.set_stream(current)
        current.wait_stream(stream)
    return graph.replay, out


_capture = capture_graph  # FastCFM's capture (tests replace it: the CPU has no CUDA graphs)


@dataclass(frozen=True)
class FlowConfig:
    vocab_size: int = 6561
    input_size: int = 512
    spk_embed_dim: int = 192
    token_mel_ratio: int = 2
    pre_lookahead_len: int = 3
    encoder_heads: int = 8
    encoder_units: int = 2048
    encoder_blocks: int = 6
    estimator_in: int = 320
    estimator_channels: int = 256
    estimator_blocks: int = 4
    estimator_mid_blocks: int = 12
    estimator_heads: int = 8
    estimator_head_dim: int = 64
    cfg_rate: float = 0.7
    timesteps: int = 10


class CausalFlow(nn.Module):
    """CausalMaskedDiffWithXvec, offline inference."""

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, MEL_BINS)
        self.encoder = TokenEncoder(cfg.input_size, cfg.encoder_heads, cfg.encoder_units, cfg.encoder_blocks,
                                    lookahead=cfg.pre_lookahead_len)
        self.encoder_proj = nn.Linear(cfg.input_size, MEL_BINS)
        self.decoder = CFMDecoder(Estimator(cfg.estimator_in, MEL_BINS, cfg.estimator_channels, cfg.estimator_blocks,
                                            cfg.estimator_mid_blocks, cfg.estimator_heads, cfg.estimator_head_dim),
                                  cfg.cfg_rate)

    def encode(self, tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [B, N] ints (prompt + speech tokens) -> mu [B, 80, 2N], the decoder's condition (valid: see
        TokenEncoder.forward)."""
        h = self.encoder(self.input_embedding(torch.clamp(tokens, min=0)), valid)
        return self.encoder_proj(h).transpose(1, 2).contiguous()

    @torch.inference_mode()
    def inference(self, token: torch.Tensor, prompt_token: torch.Tensor, prompt_feat: torch.Tensor,
                  embedding: torch.Tensor, solver: Callable[..., torch.Tensor] | None = None,
                  encoder: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """token/prompt_token [1, N] ints, prompt_feat [1, 2*Np, 80], embedding [1, 192] -> mel [1, 80, 2N].

        solver: a FastCFM of this flow's decoder (half precision, CUDA graphs), or a flow_batch.FlowRowBatcher over
        one (live sessions' solves as rows of one); None = the FP32 reference. encoder: a flow_encoder.FastEncoder of
        this flow (`encode` replayed from CUDA graphs per padded length); None = `encode` eagerly."""
        spks = self.spk_embed_affine_layer(F.normalize(embedding.float(), dim=1))
        tokens = torch.cat([prompt_token, token], dim=1).long()
        mu = encoder(tokens) if encoder is not None else self.encode(tokens)
        frames, prompt_frames = mu.shape[2], prompt_feat.shape[1]
        cond = torch.zeros(1, frames, MEL_BINS, dtype=mu.dtype, device=mu.device)
        cond[:, :prompt_frames] = prompt_feat
        mask = torch.ones(1, 1, frames, dtype=mu.dtype, device=mu.device)
        mel = (solver or self.decoder)(mu, mask, spks, cond.transpose(1, 2), steps=self.cfg.timesteps)
        return mel[:, :, prompt_frames:]
