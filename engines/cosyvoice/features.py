"""Audio features of the CosyVoice 2 frontend, computed in torch.

- `prompt_mel`: the flow's 80-band log-mel of the prompt at 24 kHz (n_fft 1920, hop 480, fmax 8 kHz,
  no centring, reflect padding, log of magnitude clamped at 1e-5), as the release's `feat_extractor`.
- `whisper_log_mel`: 128-band Whisper log-mel at 16 kHz, the speech tokenizer's input.
- `kaldi_fbank`: 80-band Kaldi-style filterbank at 16 kHz (25 ms Povey window, pre-emphasis 0.97, DC
  removal, no dither), mean-normalised over time, the speaker embedder's input.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch


@lru_cache(maxsize=8)
def _librosa_mel(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float | None) -> torch.Tensor:
    from librosa.filters import mel

    return torch.from_numpy(mel(sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax)).float()


def prompt_mel(wave24k: torch.Tensor, fmax: float | None = 8000.0) -> torch.Tensor:
    """[1, samples] at 24 kHz -> [1, frames, 80]. fmax: top of the mel bands (CosyVoice 2: 8 kHz;
    CosyVoice 3's feat_extractor has fmax null, i.e. 12 kHz, half the sample rate)."""
    n_fft, hop = 1920, 480
    y = torch.nn.functional.pad(wave24k.unsqueeze(1), ((n_fft - hop) // 2, (n_fft - hop) // 2), mode="reflect")
    spec = torch.view_as_real(torch.stft(y.squeeze(1), n_fft, hop_length=hop, win_length=n_fft,
                                         window=torch.hann_window(n_fft), center=False, return_complex=True))
    spec = torch.sqrt(spec.pow(2).sum(-1) + 1e-9)
    spec = torch.matmul(_librosa_mel(24000, n_fft, 80, 0.0, fmax), spec)
    return torch.log(torch.clamp(spec, min=1e-5)).transpose(1, 2)


def whisper_log_mel(wave16k: torch.Tensor, n_mels: int = 128) -> torch.Tensor:
    """[1, samples] at 16 kHz -> [1, 128, frames] (Whisper's log-mel, no 30 s padding)."""
    n_fft, hop = 400, 160
    stft = torch.stft(wave16k, n_fft, hop, window=torch.hann_window(n_fft), return_complex=True)
    power = stft[..., :-1].abs() ** 2
    filters = _librosa_mel(16000, n_fft, n_mels, 0.0, None)
    log_spec = torch.clamp(filters @ power, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


@lru_cache(maxsize=2)
def _kaldi_mel_banks(n_mels: int, n_fft: int, sr: int) -> torch.Tensor:
    """Triangular filters on the mel scale (Kaldi: 1127 ln(1 + f/700)), 20 Hz .. Nyquist."""
    mel = lambda f: 1127.0 * np.log(1.0 + f / 700.0)  # noqa: E731
    lo, hi = mel(20.0), mel(sr / 2)
    delta = (hi - lo) / (n_mels + 1)
    fft_mel = mel(np.arange(n_fft // 2) * sr / n_fft)
    banks = np.zeros((n_mels, n_fft // 2 + 1))
    for m in range(n_mels):
        left, center, right = lo + m * delta, lo + (m + 1) * delta, lo + (m + 2) * delta
        up = (fft_mel - left) / (center - left)
        down = (right - fft_mel) / (right - center)
        banks[m, : n_fft // 2] = np.maximum(0.0, np.minimum(up, down))
    return torch.from_numpy(banks).float()


def kaldi_fbank(wave16k: torch.Tensor, n_mels: int = 80) -> torch.Tensor:
    """[1, samples] at 16 kHz (float in [-1, 1]) -> [frames, 80] log filterbank, mean-normalised."""
    sr, win, shift = 16000, 400, 160
    x = wave16k.reshape(-1).double()  # float samples in [-1, 1], as the reference feeds torchaudio's fbank
    frames = 1 + (x.numel() - win) // shift
    if frames < 1:
        raise ValueError("reference audio is shorter than one 25 ms frame")
    idx = torch.arange(win).unsqueeze(0) + shift * torch.arange(frames).unsqueeze(1)
    f = x[idx]
    f = f - f.mean(dim=1, keepdim=True)
    f = torch.cat([f[:, :1] - 0.97 * f[:, :1], f[:, 1:] - 0.97 * f[:, :-1]], dim=1)
    povey = (0.5 - 0.5 * torch.cos(2 * math.pi * torch.arange(win, dtype=torch.float64) / (win - 1))) ** 0.85
    f = f * povey
    n_fft = 512
    power = torch.fft.rfft(f, n=n_fft).abs() ** 2
    feats = torch.log(torch.clamp(power.float() @ _kaldi_mel_banks(n_mels, n_fft, sr).T, min=torch.finfo(torch.float32).eps))
    return feats - feats.mean(dim=0, keepdim=True)
