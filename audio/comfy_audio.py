"""ComfyUI AUDIO dict <-> numpy.

ComfyUI's AUDIO is `{"waveform": torch.float32 [B, C, T], "sample_rate": int}` (core LoadAudio /
SaveAudio). torch is imported inside the functions so this module (and the pack) imports
without it.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .decode import AudioInputError

__all__ = ["to_comfy_audio", "from_comfy_audio"]


def to_comfy_audio(wave: np.ndarray, sr: int) -> dict:
    """numpy [T] or [C, T] -> AUDIO dict with a batch of one."""
    import torch

    w = np.asarray(wave, dtype=np.float32)
    if w.ndim == 1:
        w = w[None, :]
    if w.ndim != 2:
        raise ValueError(f"to_comfy_audio: expected [samples] or [channels, samples], got shape "
                         f"{tuple(w.shape)}")
    sr_int = _sample_rate(sr, "to_comfy_audio")
    # copy: the tensor must own writable memory (callers may pass views of read-only buffers)
    return {"waveform": torch.from_numpy(np.array(w, dtype=np.float32, order="C", copy=True)).unsqueeze(0),
            "sample_rate": sr_int}


def from_comfy_audio(audio: Any, batch_index: int = 0) -> tuple[np.ndarray, int]:
    """AUDIO dict -> (float32 [C, T] numpy array of one batch item, sample_rate).

    Accepts a waveform tensor (any float dtype, any device) or numpy array shaped [B, C, T];
    [C, T] is taken as a batch of one, as some custom nodes produce it.
    """
    import torch

    where = "AUDIO input"
    if not isinstance(audio, dict):
        raise AudioInputError(f"{where}: expected ComfyUI AUDIO (a dict with 'waveform' and "
                              f"'sample_rate'), got {type(audio).__name__}. Connect an AUDIO "
                              f"output (e.g. Load Audio).")
    missing = [k for k in ("waveform", "sample_rate") if k not in audio]
    if missing:
        raise AudioInputError(f"{where}: the AUDIO dict lacks {missing} (has {sorted(audio)}). "
                              f"Connect an AUDIO output (e.g. Load Audio).")
    wave = audio["waveform"]
    if isinstance(wave, torch.Tensor):
        w = wave.detach().to("cpu", torch.float32).numpy()
    elif isinstance(wave, np.ndarray):
        w = wave.astype(np.float32, copy=False)
    else:
        raise AudioInputError(f"{where}: 'waveform' must be a tensor [batch, channels, samples], "
                              f"got {type(wave).__name__}.")
    if w.ndim == 2:
        w = w[None]
    if w.ndim != 3:
        raise AudioInputError(f"{where}: 'waveform' must be shaped [batch, channels, samples], "
                              f"got {tuple(w.shape)}.")
    b = w.shape[0]
    if not isinstance(batch_index, (int, np.integer)) or not -b <= batch_index < b:
        raise AudioInputError(f"{where}: batch_index {batch_index!r} is out of range for a batch "
                              f"of {b}.")
    if w.shape[1] == 0 or w.shape[2] == 0:
        raise AudioInputError(f"{where}: the audio is empty (shape {tuple(w.shape)}). Check the "
                              f"node that produced it.")
    sr = _sample_rate(audio["sample_rate"], where)
    return np.ascontiguousarray(w[batch_index]), sr


def _sample_rate(sr: Any, where: str) -> int:
    try:
        import torch

        if isinstance(sr, torch.Tensor) and sr.numel() == 1:
            sr = sr.item()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(sr, bool) or not isinstance(sr, (int, float, np.integer, np.floating)) \
            or not np.isfinite(sr) or sr <= 0 or float(sr) != int(sr):
        raise AudioInputError(f"{where}: 'sample_rate' must be a positive whole number of Hz, got "
                              f"{sr!r}.")
    return int(sr)
