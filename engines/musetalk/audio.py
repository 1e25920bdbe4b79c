"""MuseTalk 1.5's audio conditioning: whisper-tiny encoder states, one window per video frame.

The 16 kHz speech is cut into 30 s segments; each becomes an 80-bin log-mel (whisper's own feature
extractor, from the release's preprocessor_config.json) and goes through the encoder. All hidden
states (the embedding output and every layer: 5 for tiny) are kept and stacked, at 50 states per
second. After trimming the padding of the last segment, 2 x ceil(50 / fps) zero states are put in
front (and enough at the end), and video frame i takes the 10 states starting at floor(i x 50 / fps),
flattened to [10 x layers, 384]: the 0.2 s around the frame, from every encoder depth. Before the
UNet's cross-attention a fixed sinusoidal position code is added.

Deliberate difference: the reference truncates fps to an integer (29.97 -> 29, which drifts the audio
against the video); the runtime uses the real fps. Frame counts follow the shared driver's clock.
"""
from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

SAMPLE_RATE = 16000
AUDIO_FPS = 50            # whisper encoder states per second
SEGMENT_SECONDS = 30      # whisper's input length
PAD_LEFT = 2              # MuseTalk's audio_padding_length_left / right (video frames each side)
PAD_RIGHT = 2
POSITION_DIM = 384
POSITION_LEN = 5000


def resample_16k(wave: np.ndarray, rate: int) -> np.ndarray:
    """Mono float32 at 16 kHz (soxr, as librosa.load(sr=16000) does for the reference)."""
    wave = np.asarray(wave, np.float32)
    if int(rate) == SAMPLE_RATE:
        return wave
    import soxr  # what librosa.resample(res_type="soxr_hq") calls, without librosa's import (~1 s; absent on some hosts)

    out = np.asarray(soxr.resample(wave, int(rate), SAMPLE_RATE, quality="soxr_hq"), np.float32)
    n = int(math.ceil(len(wave) * SAMPLE_RATE / int(rate)))  # librosa's fix_length to ceil(len x ratio)
    return out[:n] if len(out) >= n else np.concatenate([out, np.zeros(n - len(out), np.float32)])


def feature_extractor(whisper_dir: Any) -> Any:
    """whisper's log-mel extractor with the release's preprocessor_config.json (local files only); kept per
    folder and file time (live mode asks for it once per speech piece)."""
    from pathlib import Path

    config = Path(whisper_dir) / "preprocessor_config.json"
    try:
        stamp = config.stat().st_mtime_ns
    except OSError:
        stamp = None
    key = (str(whisper_dir), stamp)
    with _EXTRACTORS_LOCK:
        hit = _EXTRACTORS.get(key)
    if hit is None:
        from transformers import WhisperFeatureExtractor

        hit = WhisperFeatureExtractor.from_pretrained(str(whisper_dir), local_files_only=True)
        with _EXTRACTORS_LOCK:
            _EXTRACTORS.clear()  # one release at a time
            _EXTRACTORS[key] = hit
    return hit


_EXTRACTORS: dict = {}
_EXTRACTORS_LOCK = threading.Lock()


def _short_mel_usable(extractor: Any) -> bool:
    """Whether log_mel can stand in for this extractor: the torch log-mel of whisper's recipe (no dither, no
    normalisation; the attributes it reads)."""
    return (all(hasattr(extractor, a) for a in ("n_fft", "hop_length", "n_samples", "mel_filters"))
            and not getattr(extractor, "dither", 0.0) and not getattr(extractor, "do_normalize", False))


def log_mel(extractor: Any, wave16k: np.ndarray, device: Any = "cpu") -> Any:
    """torch [1, bins, n_samples / hop] float32 on `device`: the extractor's log-mel of `wave16k` (at most one
    30-s segment) zero-padded to 30 s, computed over the speech only. Why: whisper pads every call to 30 s, and
    a live speech piece is ~0.3-1 s, so 97 % of the STFT and mel work was of zeros, whose frames are known: a
    frame whose window holds only zeros has power 0, i.e. log10(1e-10) before the clamp to max - 8. The STFT
    runs over the speech plus n_fft zeros (every frame that reaches into the speech sees the same samples as in
    the padded signal; reflect padding at the ends: the same start, zeros at the end); equal to the extractor's
    output up to float rounding (tests/test_musetalk_audio_mel.py)."""
    import torch

    n_fft, hop, n_samples = int(extractor.n_fft), int(extractor.hop_length), int(extractor.n_samples)
    wave16k = np.asarray(wave16k, np.float32)
    if len(wave16k) > n_samples:
        raise ValueError(f"log_mel takes at most {n_samples} samples (one whisper segment), got {len(wave16k)}")
    frames = n_samples // hop  # the extractor keeps n_samples / hop frames (its last STFT frame dropped)
    used = min(frames, len(wave16k) // hop + n_fft // hop + 2)  # frames whose window may reach the speech
    short = np.zeros(min(n_samples, used * hop + n_fft), np.float32)
    short[:len(wave16k)] = wave16k
    x = torch.from_numpy(short).to(device)
    window = torch.hann_window(n_fft, device=x.device)
    stft = torch.stft(x, n_fft, hop, window=window, return_complex=True)[..., :used]
    filters = torch.from_numpy(np.asarray(extractor.mel_filters, np.float32)).to(x.device)
    floor = torch.tensor(1e-10, dtype=torch.float32).log10().item()  # a zero frame's value, as the extractor's
    mel = torch.full((filters.shape[1], frames), floor, dtype=torch.float32, device=x.device)
    mel[:, :used] = torch.clamp(filters.T @ (stft.abs() ** 2), min=1e-10).log10()
    mel = torch.maximum(mel, mel.max() - 8.0)
    return ((mel + 4.0) / 4.0)[None]


def _takes_device(extractor: Any) -> bool:
    """Whether this transformers version's extractor computes its STFT on a given device."""
    import inspect

    try:
        return "device" in inspect.signature(extractor.__call__).parameters
    except (TypeError, ValueError):
        return False


def encoder_states(encoder: Any, extractor: Any, wave16k: np.ndarray) -> Any:
    """torch [1, T50, layers, 384] encoder hidden states of every 30 s segment, concatenated and trimmed
    to floor(seconds x 50) (the zero padding of the last segment removed)."""
    import torch

    param = next(encoder.parameters())
    seg = SEGMENT_SECONDS * SAMPLE_RATE
    parts = []
    with torch.inference_mode():
        for start in range(0, max(len(wave16k), 1), seg):
            # on CUDA the log-mel's STFT runs there too (whisper's extractor takes a device): each call pads to 30 s,
            # and live mode calls it per speech piece (0.3-0.46 s a call on the loaded 2-core CPU of 2026-12-02)
            # one segment's log-mel over its speech only (log_mel), on the encoder's device
            if _short_mel_usable(extractor) and getattr(extractor, "n_samples", 0) == seg:
                mel = log_mel(extractor, wave16k[start:start + seg], param.device)
            else:
                extra = {"device": param.device.type} if param.device.type == "cuda" and _takes_device(extractor) \
                    else {}
                mel = extractor(wave16k[start:start + seg], return_tensors="pt", sampling_rate=SAMPLE_RATE,
                                **extra).input_features
            hidden = encoder(mel.to(param.device, param.dtype), output_hidden_states=True).hidden_states
            parts.append(torch.stack(hidden, dim=2))
    states = torch.cat(parts, dim=1)
    return states[:, :int(math.floor(len(wave16k) / SAMPLE_RATE * AUDIO_FPS))]


class FrameWindows:
    """Per-frame windows of the zero-padded encoder states, cut on demand (`windows(start, stop)`), so a
    long clip holds its states (~0.4 MB per second) rather than every frame's window (3.8 MB per second).

    Frame i takes states [floor(i x 50/fps) .. + window) of the padded sequence, window =
    2 x (pad_left + pad_right + 1) = 10, flattened to [window x layers, 384]."""

    def __init__(self, states: Any, fps: float, n_frames: int, pad_left: int = PAD_LEFT,
                 pad_right: int = PAD_RIGHT) -> None:
        import torch

        step = AUDIO_FPS / float(fps)
        per = int(math.ceil(step))
        self.window = 2 * (pad_left + pad_right + 1)
        self.starts = np.floor(np.arange(n_frames) * step).astype(np.int64)
        right = per * 3 * pad_right
        if n_frames:  # the driver's clock (ceil) may need a little more than the reference's floor
            right = max(right, int(self.starts.max()) + self.window - (per * pad_left + states.shape[1]))
        shape = tuple(states.shape[2:])
        self.padded = torch.cat([states.new_zeros((1, per * pad_left) + shape), states,
                                 states.new_zeros((1, right) + shape)], dim=1)[0]
        self.n_frames = n_frames

    def __len__(self) -> int:
        return self.n_frames

    def __call__(self, start: int, stop: int) -> Any:
        import torch

        from .pipeline import upload

        index = self.starts[start:stop, None] + np.arange(self.window)[None, :]
        clips = self.padded[upload(torch.from_numpy(index), self.padded.device)]  # [k, window, layers, 384]
        return clips.reshape(len(index), self.window * clips.shape[2], clips.shape[3])


def frame_windows(states: Any, fps: float, n_frames: int, pad_left: int = PAD_LEFT,
                  pad_right: int = PAD_RIGHT) -> Any:
    """torch [n_frames, window x layers, 384]: every frame's window (see FrameWindows)."""
    return FrameWindows(states, fps, n_frames, pad_left, pad_right)(0, n_frames)


def position_table(dim: int = POSITION_DIM, length: int = POSITION_LEN) -> Any:
    """MuseTalk's fixed sinusoidal code [1, length, dim] (sin on even, cos on odd channels)."""
    import torch

    table = torch.zeros(length, dim)
    position = torch.arange(0, length, dtype=torch.float).unsqueeze(1)
    freq = torch.exp(torch.arange(0, dim, 2).float() * (-math.log(10000.0) / dim))
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq)
    return table.unsqueeze(0)


def audio_windows(encoder: Any, extractor: Any, wave: np.ndarray, rate: int, fps: float,
                  n_frames: int) -> FrameWindows:
    """Per-frame whisper windows (without the position code) of speech `wave` at `rate`."""
    return FrameWindows(encoder_states(encoder, extractor, resample_16k(wave, rate)), fps, n_frames)
