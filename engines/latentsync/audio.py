"""LatentSync's speech features: whisper tiny's encoder (the release's `whisper/tiny.pt`, OpenAI's format) and
the per-video-frame windows its UNet cross-attends to (the reference's latentsync/whisper/audio2feature.py).

- log-mel as whisper computes it (400-point Hann STFT, hop 160, the last frame dropped, 80 Slaney mel bands,
  log10 clamped at 1e-10, floored at the whole clip's maximum - 8, then (x + 4) / 4);
- the clip in 30-s segments (3000 mel frames, zero-padded), each through the encoder; kept per encoder
  position: the input embedding and every block's output (5 x 384 for tiny), the first (segment frames / 2);
- the window of output frame i: positions int(i * 50 / fps) - 4 .. + 5 (clamped to the clip), 10 x 5 x 384
  flattened to (50, 384).
The mel filterbank is transformers' Slaney filterbank (the one whisper's mel_filters.npz was made from with
librosa; benchmarks/latentsync_parity.py measures the difference).
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

SAMPLE_RATE = 16000
N_FFT, HOP, N_MELS, SEGMENT = 400, 160, 80, 3000


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.attn = nn.Module()
        self.attn.query = nn.Linear(dim, dim)
        self.attn.key = nn.Linear(dim, dim, bias=False)
        self.attn.value = nn.Linear(dim, dim)
        self.attn.out = nn.Linear(dim, dim)
        self.attn_ln = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, dim * 4), nn.GELU(), nn.Linear(dim * 4, dim))
        self.mlp_ln = nn.LayerNorm(dim)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        h = self.attn_ln(x)
        q, k, v = (p(h).view(b, n, self.heads, -1).transpose(1, 2)
                   for p in (self.attn.query, self.attn.key, self.attn.value))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        x = x + self.attn.out(a)
        return x + self.mlp(self.mlp_ln(x))


class WhisperEncoder(nn.Module):
    """whisper's AudioEncoder (names as OpenAI's checkpoint: `encoder.*`), returning every block's states."""

    def __init__(self, n_mels: int, n_ctx: int, dim: int, heads: int, layers: int):
        super().__init__()
        self.conv1 = nn.Conv1d(n_mels, dim, 3, padding=1)
        self.conv2 = nn.Conv1d(dim, dim, 3, stride=2, padding=1)
        self.register_buffer("positional_embedding", torch.zeros(n_ctx, dim))
        self.blocks = nn.ModuleList([_Block(dim, heads) for _ in range(layers)])
        self.ln_post = nn.LayerNorm(dim)  # in the file; the features LatentSync reads are taken before it

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel (b, 80, 3000) -> (b, 1500, layers + 1, dim): the embedding and each block's output."""
        x = F.gelu(self.conv1(mel))
        x = F.gelu(self.conv2(x)).permute(0, 2, 1)
        x = x + self.positional_embedding.to(x.dtype)
        states = [x]
        for block in self.blocks:
            x = block(x)
            states.append(x)
        return torch.stack(states, dim=2)


def load_whisper(path: Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> WhisperEncoder:
    """The encoder of whisper/tiny.pt ({"dims", "model_state_dict"}), every encoder key and shape checked;
    the decoder's weights (unused) are not loaded."""
    from .files import LatentSyncWeightsError, check_state_dict, read_checkpoint, tensors_of

    ckpt = read_checkpoint(path)
    dims = ckpt.get("dims")
    need = ("n_mels", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer")
    if not isinstance(dims, dict) or any(k not in dims for k in need):
        raise LatentSyncWeightsError(f"{path} has no whisper `dims` ({', '.join(need)}); use the release's tiny.pt")
    if int(dims["n_audio_state"]) != 384 or int(dims["n_mels"]) != N_MELS:
        raise LatentSyncWeightsError(f"{path} is not whisper tiny (n_audio_state {dims['n_audio_state']}, n_mels "
                                     f"{dims['n_mels']}; the released configs need 384 and 80)")
    state = tensors_of(ckpt, "model_state_dict", path)
    with torch.device("meta"):
        net = WhisperEncoder(*(int(dims[k]) for k in need))
    enc = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
    check_state_dict(enc, {k: tuple(v.shape) for k, v in net.state_dict().items()}, path, "whisper tiny encoder")
    unknown = [k for k in state if not k.startswith(("encoder.", "decoder."))]
    if unknown:
        raise LatentSyncWeightsError(f"{path} holds keys outside encoder./decoder. ({', '.join(unknown[:5])})")
    net = WhisperEncoder(*(int(dims[k]) for k in need))
    net.load_state_dict(enc, strict=True)
    return net.to(device=device, dtype=dtype).eval()


@lru_cache(maxsize=2)
def mel_filters() -> torch.Tensor:
    """(80, 201) Slaney mel filterbank of whisper (0-8 kHz at 16 kHz)."""
    return torch.from_numpy(_mel_filters().copy())


@lru_cache(maxsize=1)
def _mel_filters() -> np.ndarray:
    """Made once per process: the first call imports transformers (about a second, which every request paid when
    the filters were made per call)."""
    from transformers.audio_utils import mel_filter_bank

    fb = mel_filter_bank(num_frequency_bins=N_FFT // 2 + 1, num_mel_filters=N_MELS, min_frequency=0.0,
                         max_frequency=SAMPLE_RATE / 2, sampling_rate=SAMPLE_RATE, norm="slaney", mel_scale="slaney")
    return np.asarray(fb, np.float32).T.copy()


def log_mel(wave: np.ndarray | torch.Tensor, filters: torch.Tensor | None = None) -> torch.Tensor:
    """(80, T // 160) whisper log-mel of 16-kHz mono float audio."""
    audio = torch.as_tensor(np.asarray(wave, np.float32))
    stft = torch.stft(audio, N_FFT, HOP, window=torch.hann_window(N_FFT), return_complex=True)
    mags = stft[:, :-1].abs() ** 2
    spec = (mel_filters() if filters is None else filters) @ mags
    log = torch.clamp(spec, min=1e-10).log10()
    log = torch.maximum(log, log.max() - 8.0)
    return (log + 4.0) / 4.0


@torch.no_grad()
def whisper_features(encoder: WhisperEncoder, wave: np.ndarray, filters: torch.Tensor | None = None) -> torch.Tensor:
    """(positions, 5, 384) float32 on the CPU: 50 per second of 16-kHz `wave` (module doc)."""
    p = next(encoder.parameters())
    mel = log_mel(wave, filters)
    out = []
    for seek in range(0, mel.shape[1], SEGMENT):
        seg = mel[:, seek:seek + SEGMENT]
        keep = (min(seek + SEGMENT, mel.shape[1]) - seek) // 2
        seg = F.pad(seg, (0, SEGMENT - seg.shape[1]))
        states = encoder(seg[None].to(device=p.device, dtype=p.dtype))[0]
        out.append(states[:keep].float().cpu())
    return torch.cat(out) if out else torch.zeros(0, 5, 384)


def frame_window(features: torch.Tensor, i: int, fps: float, left: int = 2, right: int = 2) -> torch.Tensor:
    """(10 * 5, 384) audio window of video frame i (audio_feat_length [left, right] = [2, 2])."""
    n = len(features)
    centre = int(i * 50 / fps)
    idx = np.clip(np.arange(centre - left * 2, centre + (right + 1) * 2), 0, n - 1)
    return features[torch.from_numpy(idx)].reshape(-1, features.shape[-1])


def frame_windows(features: torch.Tensor, frames: range | list[int], fps: float,
                  feat_length: tuple[int, int] = (2, 2)) -> torch.Tensor:
    """(len(frames), 50, 384) windows of several video frames."""
    return torch.stack([frame_window(features, i, fps, *feat_length) for i in frames])
