"""Write 32-bit float WAV files with the standard library only.

VideoMux hands ffmpeg the speech as a float WAV (exact samples, no 16-bit rounding). Writing it
needs no soundfile/libsndfile: the format is a 44-byte RIFF header (WAVE_FORMAT_IEEE_FLOAT) plus
interleaved little-endian float32 samples, so the mux path runs where only ffmpeg is available.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

WAVE_FORMAT_IEEE_FLOAT = 3


def write_float_wav(path: str | Path, wave: np.ndarray, sample_rate: int) -> Path:
    """wave [channels, samples] (or [samples]) float -> IEEE-float WAV at `path`."""
    data = np.asarray(wave, dtype=np.float32)
    if data.ndim == 1:
        data = data[None]
    if data.ndim != 2 or data.shape[0] < 1:
        raise ValueError(f"wave must be [channels, samples] or [samples], got shape {np.shape(wave)}")
    if int(sample_rate) <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    channels, sr = data.shape[0], int(sample_rate)
    payload = np.ascontiguousarray(data.T).astype("<f4").tobytes()  # interleaved frames
    block = 4 * channels
    if len(payload) + 36 > 0xFFFFFFFF:
        raise ValueError("audio too long for a WAV file (over 4 GiB)")
    header = b"".join([
        b"RIFF", struct.pack("<I", 36 + len(payload)), b"WAVE",
        b"fmt ", struct.pack("<IHHIIHH", 16, WAVE_FORMAT_IEEE_FLOAT, channels, sr, sr * block, block, 32),
        b"data", struct.pack("<I", len(payload)),
    ])
    path = Path(path)
    with open(path, "wb") as f:
        f.write(header)
        f.write(payload)
    return path
