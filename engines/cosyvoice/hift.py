"""HiFT vocoder of CosyVoice 2 (HiFi-GAN upsampler + neural source filter + 16-point iSTFT head).

Written for this pack from the published architecture; parameter names follow the released
`hift.pt` (weight-normed convolutions use torch's parametrization, and the older `weight_g` /
`weight_v` naming is accepted by the loader). mel [1, 80, T] at 50 Hz -> waveform at 24 kHz.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm


class Snake(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.unsqueeze(0).unsqueeze(-1)
        return x + (1.0 / (alpha + 1e-9)) * torch.pow(torch.sin(x * alpha), 2)


class ResBlock(nn.Module):
    def __init__(self, channels: int, kernel: int, dilations: list[int]) -> None:
        super().__init__()
        pad = lambda d: (kernel * d - d) // 2  # noqa: E731
        self.convs1 = nn.ModuleList(weight_norm(nn.Conv1d(channels, channels, kernel, dilation=d, padding=pad(d)))
                                    for d in dilations)
        self.convs2 = nn.ModuleList(weight_norm(nn.Conv1d(channels, channels, kernel, padding=pad(1)))
                                    for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = c2(a2(c1(a1(x)))) + x
        return x


class F0Predictor(nn.Module):
    def __init__(self, cin: int, channels: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(5):
            layers += [weight_norm(nn.Conv1d(cin if i == 0 else channels, channels, 3, padding=1)), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, 1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:  # [B, 80, T] -> f0 [B, T]
        return torch.abs(self.classifier(self.condnet(mel).transpose(1, 2)).squeeze(-1))


class SineSource(nn.Module):
    """Harmonic sine excitation from F0 (phase integrated at frame rate), merged to one channel."""

    def __init__(self, sample_rate: int, upsample: int, harmonics: int, amp: float, noise_std: float,
                 voiced_threshold: float) -> None:
        super().__init__()
        self.sample_rate, self.upsample, self.harmonics = sample_rate, upsample, harmonics
        self.amp, self.noise_std, self.voiced_threshold = amp, noise_std, voiced_threshold
        self.l_linear = nn.Linear(harmonics + 1, 1)

    def forward(self, f0: torch.Tensor, generator: torch.Generator | None,
                draws: "SourceDraws | None" = None) -> torch.Tensor:
        """f0 [B, L, 1] at audio rate -> excitation [B, L, 1]. Random draws: start phases, then noise
        (from `generator`, or taken from `draws` made beforehand by draw_source with the same generator)."""
        mult = torch.arange(1, self.harmonics + 2, dtype=torch.float32, device=f0.device).view(1, 1, -1)
        fn = f0 * mult
        rad = (fn / self.sample_rate) % 1
        if draws is not None and tuple(draws.start.shape) != (fn.shape[0], fn.shape[2]):
            raise ValueError(f"source draws for {tuple(draws.start.shape)} (batch, harmonics), need "
                             f"{(fn.shape[0], fn.shape[2])}")
        start = (draws.start if draws is not None
                 else torch.rand(fn.shape[0], fn.shape[2], generator=generator)).to(fn.device)
        start[:, 0] = 0
        rad[:, 0, :] = rad[:, 0, :] + start
        rad = F.interpolate(rad.transpose(1, 2), scale_factor=1 / self.upsample, mode="linear").transpose(1, 2)
        phase = torch.cumsum(rad, dim=1) * 2 * np.pi
        phase = F.interpolate(phase.transpose(1, 2) * self.upsample, scale_factor=self.upsample,
                              mode="linear").transpose(1, 2)
        sines = torch.sin(phase) * self.amp
        uv = (f0 > self.voiced_threshold).type(torch.float32)
        noise_amp = uv * self.noise_std + (1 - uv) * self.amp / 3
        # Drawn into a tensor laid out like `sines` (transposed, non-contiguous), as the released code's
        # randn_like does: torch fills such tensors with another algorithm than contiguous ones, and
        # the same seed must give the same excitation.
        if draws is None:
            draw = torch.empty_strided(sines.shape, sines.stride(), dtype=sines.dtype).normal_(generator=generator)
        else:
            draw = draws.noise
            # the same values only if drawn into the same shape and layout (the fill order follows the layout)
            if draw.shape != sines.shape or draw.stride() != sines.stride():
                raise ValueError(f"source noise drawn as {tuple(draw.shape)}/{draw.stride()}, "
                                 f"the excitation is {tuple(sines.shape)}/{sines.stride()}")
        # drawn on the CPU: the same on every device (a pinned draw is copied without blocking the host)
        noise = noise_amp * draw.to(sines.device, non_blocking=draw.is_pinned())
        sines = sines * uv + noise
        return torch.tanh(self.l_linear(sines))


@dataclass(frozen=True)
class SourceDraws:
    """The sine source's random numbers for one utterance, drawn ahead of HiFT (draw_source)."""

    start: torch.Tensor  # [B, harmonics + 1] start phases (CPU)
    noise: torch.Tensor  # [B, samples, harmonics + 1] standard normal, laid out like the excitation (CPU)


def draw_source(generator: torch.Generator | None, frames: int, batch: int = 1, harmonics: int = 8,
                samples_per_frame: int = 480, pin: bool = False) -> SourceDraws:
    """The draws SineSource.forward makes for a mel of `frames` frames, in its order (start phases, then
    noise) from the same generator, so that the values and the generator's state after are the same.

    Why: the noise is drawn on the CPU into a non-contiguous tensor (SineSource.forward says why), which
    torch fills with a serial per-element loop: ~50 ms for 10 s of audio, most of HiFT's time on a GPU.
    Drawn beforehand (engine.CosyVoice2Runtime: in a thread while the GPU runs the flow), it costs nothing
    on the critical path. pin: page-locked, so the copy to the GPU does not block the host."""
    channels, samples = harmonics + 1, frames * samples_per_frame
    start = torch.rand(batch, channels, generator=generator)
    if pin and torch.cuda.is_available():  # copied to the device without a sync (hift_graph's copy-in)
        start = start.pin_memory()
    # the excitation's layout: [B, channels, samples] contiguous, viewed as [B, samples, channels]
    draw = torch.empty(batch, channels, samples).transpose(1, 2)
    if pin and torch.cuda.is_available():
        draw = draw.pin_memory()
    draw.normal_(generator=generator)
    return SourceDraws(start=start, noise=draw)


@dataclass(frozen=True)
class HiFTConfig:
    in_channels: int = 80
    base_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1
    nsf_sigma: float = 0.003
    nsf_voiced_threshold: float = 10
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    n_fft: int = 16
    hop_len: int = 4
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5),) * 3
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5),) * 3
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    f0_channels: int = 512


class HiFT(nn.Module):
    def __init__(self, cfg: HiFTConfig) -> None:
        super().__init__()
        if cfg.sampling_rate == 22050:
            raise ValueError("the 22.05 kHz HiFT (CosyVoice 1) uses another sine source; only 24 kHz is supported")
        self.cfg = cfg
        base, rates = cfg.base_channels, list(cfg.upsample_rates)
        self.upsample_total = int(np.prod(rates)) * cfg.hop_len
        self.m_source = SineSource(cfg.sampling_rate, self.upsample_total, cfg.nb_harmonics, cfg.nsf_alpha,
                                   cfg.nsf_sigma, cfg.nsf_voiced_threshold)
        self.conv_pre = weight_norm(nn.Conv1d(cfg.in_channels, base, 7, 1, padding=3))
        self.ups = nn.ModuleList(
            weight_norm(nn.ConvTranspose1d(base // 2 ** i, base // 2 ** (i + 1), k, u, padding=(k - u) // 2))
            for i, (u, k) in enumerate(zip(rates, cfg.upsample_kernel_sizes)))
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        cum = np.cumprod([1] + rates[::-1][:-1])[::-1]
        for i, (u, k, d) in enumerate(zip(cum, cfg.source_resblock_kernel_sizes, cfg.source_resblock_dilation_sizes)):
            ch, u = base // 2 ** (i + 1), int(u)
            conv = (nn.Conv1d(cfg.n_fft + 2, ch, 1, 1) if u == 1
                    else nn.Conv1d(cfg.n_fft + 2, ch, u * 2, u, padding=u // 2))
            self.source_downs.append(conv)
            self.source_resblocks.append(ResBlock(ch, k, list(d)))
        self.resblocks = nn.ModuleList(
            ResBlock(base // 2 ** (i + 1), k, list(d))
            for i in range(len(rates)) for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes))
        self.conv_post = weight_norm(nn.Conv1d(base // 2 ** len(rates), cfg.n_fft + 2, 7, 1, padding=3))
        n = np.arange(cfg.n_fft)
        # Periodic Hann computed in float64 and rounded once, like scipy.signal.get_window.
        self.register_buffer("window", torch.from_numpy((0.5 - 0.5 * np.cos(2 * np.pi * n / cfg.n_fft)).astype(np.float32)),
                             persistent=False)
        self.f0_predictor = F0Predictor(cfg.in_channels, cfg.f0_channels)

    def _decode(self, mel: torch.Tensor, source: torch.Tensor, istft: Any = None, stft: Any = None) -> torch.Tensor:
        """istft: torch.istft's stand-in with its positional signature; stft: (signal [B, L], n_fft, hop, window) ->
        the real and imaginary rows [B, 2 * (n_fft // 2 + 1), frames] (hift_graph's, for CUDA graphs: no host sync,
        no cuFFT plan); None = torch's."""
        cfg = self.cfg
        if stft is not None:
            s_stft = stft(source.squeeze(1), cfg.n_fft, cfg.hop_len, self.window)
        else:
            spec = torch.view_as_real(torch.stft(source.squeeze(1), cfg.n_fft, cfg.hop_len, cfg.n_fft,
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
        x = self.conv_post(F.leaky_relu(x)).float()  # the iSTFT head in float32 (no-op on the FP32 path)
        half = cfg.n_fft // 2 + 1
        magnitude = torch.clip(torch.exp(x[:, :half, :]), max=1e2)
        phase = torch.sin(x[:, half:, :])
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        wave = (istft or torch.istft)(spec, cfg.n_fft, cfg.hop_len, cfg.n_fft, window=self.window)
        return torch.clamp(wave, -cfg.audio_limit, cfg.audio_limit)

    @torch.inference_mode()
    def inference(self, mel: torch.Tensor, generator: torch.Generator | None = None,
                  half: bool = False, draws: SourceDraws | None = None) -> torch.Tensor:
        """mel [1, 80, T] -> waveform [1, T * 480]. `generator` drives the source's random phases/noise;
        draws: those random numbers made beforehand (draw_source(generator, T, ...)), then `generator` is unused.

        half (CUDA only): the upsampler's convolutions under FP16 autocast. F0 and the sine source stay
        float32: their phase is integrated over the whole utterance, where FP16 rounding would drift."""
        f0 = self.f0_predictor(mel)
        f0_audio = F.interpolate(f0[:, None], scale_factor=float(self.upsample_total), mode="nearest").transpose(1, 2)
        source = self.m_source(f0_audio, generator, draws).transpose(1, 2)
        with torch.autocast("cuda", dtype=torch.float16, enabled=half and mel.device.type == "cuda"):
            return self._decode(mel, source)


def without_weight_norm(hift: HiFT) -> HiFT:
    """A copy of `hift` with every weight-norm parametrization folded into a plain weight.

    Why: a parametrized convolution recomputes g * v / |v| on every call (~70 extra kernels per
    utterance); the folded weight is the same value computed once."""
    from torch.nn.utils import parametrize

    # a fresh module loaded from the state dict (deepcopy of parametrized modules shares their state)
    folded = HiFT(hift.cfg).to(next(hift.parameters()).device)
    folded.load_state_dict(hift.state_dict())
    folded.eval()
    for module in folded.modules():
        if parametrize.is_parametrized(module, "weight"):
            parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
    return folded


def canonical_hift_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Accept both weight-norm namings (old `weight_g/weight_v`, new parametrizations) and a
    `generator.` prefix (a HiFi-GAN training checkpoint)."""
    out = {}
    for key, value in state.items():
        key = key.removeprefix("generator.")
        if key.endswith(".weight_g"):
            key = key[: -len("weight_g")] + "parametrizations.weight.original0"
        elif key.endswith(".weight_v"):
            key = key[: -len("weight_v")] + "parametrizations.weight.original1"
        out[key] = value
    return out
