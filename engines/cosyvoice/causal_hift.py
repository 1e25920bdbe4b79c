"""CosyVoice 3's causal HiFT vocoder (CausalHiFTGenerator): mel [1, 80, T] at 50 Hz -> 24 kHz waveform.

Written for this pack from the published architecture; parameter names follow the released `hift.pt`.
Differences from CosyVoice 2's HiFT (hift.py), all kept from the release:
- every convolution is causal (left zero padding), except the input convolution and the F0 predictor's
  first one, which look 4 and 3 frames ahead (right zero padding at the end of an utterance);
- upsampling is nearest-neighbour repeat then a causal convolution (not a transposed convolution);
- the F0 predictor runs in float64 (the release does so: its causal F0 is precision-sensitive);
- the sine source uses fixed random tensors instead of fresh draws: start phases [1, 9], noise for 300 s of
  audio [1, 7.2 M, 9] and the noise branch [1, 7.2 M, 1], all drawn when the release builds its model. They
  come from torch's default generator after the flow's constructor reseeds it with 0; `fixed_source_noise`
  replays that sequence of draws (same shapes, same torch ops) on a private generator, so the vocoder is
  deterministic: the same mel gives the same waveform whatever the seed.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from .hift import HiFTConfig, Snake

NOISE_SECONDS = 300  # the release draws its fixed source noise for 300 s at 24 kHz


class CausalConv(nn.Conv1d):
    """Conv1d padded with (kernel - 1) * dilation zeros on the left ('left') or right ('right')."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, side: str = "left") -> None:
        super().__init__(cin, cout, kernel, dilation=dilation)
        self.pad = (kernel - 1) * dilation
        self.side = side

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(x, (self.pad, 0) if self.side == "left" else (0, self.pad))
        return super().forward(x)


class CausalDown(nn.Conv1d):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int) -> None:
        super().__init__(cin, cout, kernel, stride)
        self.pad = stride - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.pad, 0)))


class CausalUp(nn.Conv1d):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int) -> None:
        super().__init__(cin, cout, kernel)
        self.stride_up = stride
        self.pad = kernel - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=float(self.stride_up), mode="nearest")
        return super().forward(F.pad(x, (self.pad, 0)))


class CausalResBlock(nn.Module):
    def __init__(self, channels: int, kernel: int, dilations: list[int]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(weight_norm(CausalConv(channels, channels, kernel, d)) for d in dilations)
        self.convs2 = nn.ModuleList(weight_norm(CausalConv(channels, channels, kernel)) for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = c2(a2(c1(a1(x)))) + x
        return x


class CausalF0Predictor(nn.Module):
    def __init__(self, cin: int, channels: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [weight_norm(CausalConv(cin, channels, 4, side="right")), nn.ELU()]
        for _ in range(4):
            layers += [weight_norm(CausalConv(channels, channels, 3)), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, 1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:  # [B, 80, T] -> f0 [B, T]
        return torch.abs(self.classifier(self.condnet(mel).transpose(1, 2)).squeeze(-1))


@dataclass
class FixedNoise:
    start: torch.Tensor   # [1, harmonics + 1], start phases (the fundamental's is 0)
    sine: torch.Tensor    # [1, samples, harmonics + 1]
    branch: torch.Tensor  # [1, samples, 1], the noise branch (unused by the waveform; kept for parity checks)
    devices: dict = field(default_factory=dict)


_NOISE: dict[tuple, FixedNoise] = {}
_NOISE_LOCK = threading.Lock()


def _replay_init(gen: torch.Generator, shapes: list[tuple[str, tuple[int, ...]]]) -> None:
    """Consume the generator as torch's default initialisers do for these parameters (uniform_ for
    Linear/Conv weights and biases, normal_ for Embedding): same shapes, same ops, so the same draws."""
    for kind, shape in shapes:
        dummy = torch.empty(shape)
        if kind == "normal":
            dummy.normal_(generator=gen)
        else:
            dummy.uniform_(generator=gen)


def fixed_source_noise(flow_vocab: int, flow_input: int, spk_dim: int, cfg: HiFTConfig,
                       noise_frames: int = 50 * 300) -> FixedNoise:
    """The causal HiFT's construction-time random tensors, as the release's model build draws them.

    Order after the flow decoder's seed-0 reset: its noise (randn [1, 80, 15000]); the flow's token
    embedding (normal) and x-vector projection (uniform); the F0 predictor's five convolutions and
    classifier (uniform); then the sine generator's start phases and noise (rand), the source merge
    layer (uniform) and the noise branch (rand). Cached per shape set for the process."""
    harmonics = cfg.nb_harmonics + 1
    samples = NOISE_SECONDS * cfg.sampling_rate
    key = (flow_vocab, flow_input, spk_dim, cfg.in_channels, cfg.f0_channels, harmonics, samples, noise_frames)
    with _NOISE_LOCK:
        if key in _NOISE:
            return _NOISE[key]
        gen = torch.Generator().manual_seed(0)
        torch.randn(1, 80, noise_frames, generator=gen)
        f0c, cin = cfg.f0_channels, cfg.in_channels
        _replay_init(gen, [("normal", (flow_vocab, flow_input)), ("uniform", (80, spk_dim)), ("uniform", (80,)),
                           ("uniform", (f0c, cin, 4)), ("uniform", (f0c,))]
                     + [("uniform", (f0c, f0c, 3)), ("uniform", (f0c,))] * 4
                     + [("uniform", (1, f0c)), ("uniform", (1,))])
        start = torch.rand(1, harmonics, generator=gen)
        start[:, 0] = 0
        sine = torch.rand(1, samples, harmonics, generator=gen)
        _replay_init(gen, [("uniform", (1, harmonics)), ("uniform", (1,))])
        branch = torch.rand(1, samples, 1, generator=gen)
        _NOISE[key] = FixedNoise(start, sine, branch)
        return _NOISE[key]


class CausalHiFT(nn.Module):
    def __init__(self, cfg: HiFTConfig, noise: FixedNoise, look_right: int = 4) -> None:
        super().__init__()
        if cfg.sampling_rate == 22050:
            raise ValueError("the 22.05 kHz HiFT (CosyVoice 1) uses another sine source; only 24 kHz is supported")
        self.cfg, self.noise, self.look_right = cfg, noise, look_right
        base, rates = cfg.base_channels, list(cfg.upsample_rates)
        self.upsample_total = int(np.prod(rates)) * cfg.hop_len
        self.m_source = nn.Module()
        self.m_source.l_linear = nn.Linear(cfg.nb_harmonics + 1, 1)
        self.conv_pre = weight_norm(CausalConv(cfg.in_channels, base, look_right + 1, side="right"))
        self.ups = nn.ModuleList(weight_norm(CausalUp(base // 2 ** i, base // 2 ** (i + 1), k, u))
                                 for i, (u, k) in enumerate(zip(rates, cfg.upsample_kernel_sizes)))
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        cum = np.cumprod([1] + rates[::-1][:-1])[::-1]
        for i, (u, k, d) in enumerate(zip(cum, cfg.source_resblock_kernel_sizes, cfg.source_resblock_dilation_sizes)):
            ch, u = base // 2 ** (i + 1), int(u)
            self.source_downs.append(CausalConv(cfg.n_fft + 2, ch, 1) if u == 1 else CausalDown(cfg.n_fft + 2, ch, u * 2, u))
            self.source_resblocks.append(CausalResBlock(ch, k, list(d)))
        self.resblocks = nn.ModuleList(
            CausalResBlock(base // 2 ** (i + 1), k, list(d))
            for i in range(len(rates)) for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes))
        self.conv_post = weight_norm(CausalConv(base // 2 ** len(rates), cfg.n_fft + 2, 7))
        n = np.arange(cfg.n_fft)
        self.register_buffer("window", torch.from_numpy((0.5 - 0.5 * np.cos(2 * np.pi * n / cfg.n_fft)).astype(np.float32)),
                             persistent=False)
        self.f0_predictor = CausalF0Predictor(cfg.in_channels, cfg.f0_channels)

    def _noise(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed start phases and sine noise on `device` (one copy per device, shared by copies of the module)."""
        key = str(device)
        if key not in self.noise.devices:
            self.noise.devices[key] = (self.noise.start.to(device), self.noise.sine.to(device))
        return self.noise.devices[key]

    def source(self, f0: torch.Tensor) -> torch.Tensor:
        """f0 [B, T] (frames) -> merged excitation [B, 1, T * upsample_total] (SineGen2 + merge, causal)."""
        cfg, up = self.cfg, self.upsample_total
        f0_audio = F.interpolate(f0[:, None], scale_factor=float(up), mode="nearest").transpose(1, 2)  # [B, L, 1]
        samples = f0_audio.shape[1]
        if samples > self.noise.sine.shape[1]:
            raise ValueError(f"{samples / cfg.sampling_rate:.0f} s of audio in one piece exceeds the vocoder's "
                             f"{NOISE_SECONDS} s; synthesize shorter text")
        start, sine_noise = self._noise(f0.device)
        harmonics = torch.arange(1, cfg.nb_harmonics + 2, device=f0.device, dtype=f0_audio.dtype)
        rad = (f0_audio * harmonics / cfg.sampling_rate) % 1
        rad[:, 0, :] = rad[:, 0, :] + start
        rad = F.interpolate(rad.transpose(1, 2), scale_factor=1 / up, mode="linear").transpose(1, 2)
        phase = torch.cumsum(rad, dim=1) * 2 * np.pi
        phase = F.interpolate(phase.transpose(1, 2) * up, scale_factor=float(up), mode="nearest").transpose(1, 2)
        sines = torch.sin(phase) * cfg.nsf_alpha
        uv = (f0_audio > cfg.nsf_voiced_threshold).float()
        noise_amp = uv * cfg.nsf_sigma + (1 - uv) * cfg.nsf_alpha / 3
        sines = sines * uv + noise_amp * sine_noise[:, :samples]
        return torch.tanh(self.m_source.l_linear(sines.to(self.m_source.l_linear.weight.dtype))).transpose(1, 2)

    def _decode(self, mel: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        spec = torch.view_as_real(torch.stft(source.squeeze(1).float(), cfg.n_fft, cfg.hop_len, cfg.n_fft,
                                             window=self.window, return_complex=True))
        s_stft = torch.cat([spec[..., 0], spec[..., 1]], dim=1)
        x = self.conv_pre(mel)
        kernels = len(cfg.resblock_kernel_sizes)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, cfg.lrelu_slope))
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](s_stft))
            xs = self.resblocks[i * kernels](x)
            for j in range(1, kernels):
                xs += self.resblocks[i * kernels + j](x)
            x = xs / kernels
        x = self.conv_post(F.leaky_relu(x)).float()
        half = cfg.n_fft // 2 + 1
        magnitude = torch.clip(torch.exp(x[:, :half, :]), max=1e2)
        phase = torch.sin(x[:, half:, :])
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        wave = torch.istft(spec, cfg.n_fft, cfg.hop_len, cfg.n_fft, window=self.window)
        return torch.clamp(wave, -cfg.audio_limit, cfg.audio_limit)

    @torch.inference_mode()
    def inference(self, mel: torch.Tensor, half: bool = False, **_: object) -> torch.Tensor:
        """mel [1, 80, T] -> waveform [1, T * 480]; deterministic (fixed source noise). half (CUDA only): the
        upsampler's convolutions under FP16 autocast; F0 (float64) and the sine source stay full precision."""
        f0_net = self.f0_predictor
        if next(f0_net.parameters()).dtype != torch.float64:
            f0_net.to(torch.float64)  # the release's precision for the causal F0 (its weights load as float32)
        f0 = f0_net(mel.to(torch.float64)).to(mel.dtype)
        source = self.source(f0)
        with torch.autocast("cuda", dtype=torch.float16, enabled=half and mel.device.type == "cuda"):
            return self._decode(mel, source)


def without_weight_norm_causal(hift: CausalHiFT) -> CausalHiFT:
    """A copy with every weight-norm parametrization folded (see hift.without_weight_norm)."""
    from torch.nn.utils import parametrize

    folded = CausalHiFT(hift.cfg, hift.noise, hift.look_right).to(next(hift.conv_pre.parameters()).device)
    state = {k: v.float() if k.startswith("f0_predictor.") else v for k, v in hift.state_dict().items()}
    folded.load_state_dict(state)
    # the F0 predictor folds in float64, as the reference computes its weight-normed weights at inference: a
    # float32 fold differs by rounding, which the sine source's phase (a sum over the utterance) amplifies
    folded.f0_predictor.to(torch.float64)
    folded.eval()
    for module in folded.modules():
        if parametrize.is_parametrized(module, "weight"):
            parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
    return folded
