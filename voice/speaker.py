"""DH_SPEAKER: who is speaking, as the TTS and the metrics need it.

A `SpeakerProfile` holds the GE2E utterance embedding (L2-normalised mean of the per-segment
embeddings), the per-segment embeddings (to spot clips that mix speakers), a content hash of the
prepared waveform (the cache key), pitch statistics, and the slots voice imitation fills later
(style vector, extras, reference transcript). It saves to `.npz` without pickle so voices can be
shared as files.
"""
from __future__ import annotations

import copy
import hashlib
import itertools
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..atomic_file import atomic_path

log = logging.getLogger(__name__)

EMBED_DIM = 256
ENCODER_ID = "ge2e-resemblyzer-0.1.4"
FORMAT_VERSION = 1

# Segment-agreement threshold, measured on /work/shared/data/audio with GE2E: within one speaker's
# clip the lowest pairwise cosine of 3 s segments was 0.71 (5 s segments: 0.87); between different
# speakers segment pairs average 0.48-0.52 (95th percentile 0.55-0.63). A mixed clip has many
# cross-speaker pairs, so its minimum falls well below 0.6, while a single speaker stays above it.
DISAGREE_THRESHOLD = 0.6
MIN_SPEECH_SECONDS = 3.0
# 20 s of speech gives a stable pitch median/IQR (pitch.py).
PITCH_MAX_SECONDS = 20.0

_EXTRA_PREFIX = "extras/"
_STR_KEYS = ("content_hash", "reference_text", "name", "encoder")
_FLOAT_KEYS = ("speech_seconds", "pitch_hz_median", "pitch_hz_iqr")


@dataclass
class SpeakerProfile:
    """The DH_SPEAKER value passed between nodes."""

    embedding: np.ndarray                    # [256] float32, L2-normalised
    segment_embeddings: np.ndarray           # [S, 256] float32, each L2-normalised
    content_hash: str                        # sha256 of the prepared waveform + sample rate
    speech_seconds: float
    pitch_hz_median: float = float("nan")    # NaN when no voiced frame was found
    pitch_hz_iqr: float = float("nan")
    reference_text: str = ""                 # transcript of the reference clip, when the user gives it
    style: np.ndarray | None = None          # TTS style vector found by voice imitation
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    name: str = ""
    encoder: str = ENCODER_ID                # embeddings from different encoders are not comparable

    def __post_init__(self) -> None:
        self.embedding = np.asarray(self.embedding, dtype=np.float32).reshape(-1)
        if self.embedding.shape != (EMBED_DIM,) or not np.all(np.isfinite(self.embedding)):
            raise ValueError(f"speaker embedding must be {EMBED_DIM} finite values, got shape "
                             f"{self.embedding.shape}")
        seg = np.asarray(self.segment_embeddings, dtype=np.float32)
        if seg.ndim == 1 and seg.size == 0:
            seg = seg.reshape(0, EMBED_DIM)
        if seg.ndim != 2 or seg.shape[1] != EMBED_DIM:
            raise ValueError(f"segment_embeddings must be [S, {EMBED_DIM}], got {seg.shape}")
        self.segment_embeddings = seg
        if self.style is not None:
            self.style = np.asarray(self.style, dtype=np.float32)

    def segment_agreement(self) -> tuple[float, float]:
        """(min, mean) pairwise cosine of the segment embeddings; (nan, nan) with fewer than 2."""
        seg = self.segment_embeddings
        if len(seg) < 2:
            return float("nan"), float("nan")
        unit = seg / np.maximum(np.linalg.norm(seg, axis=1, keepdims=True), 1e-12)
        sims = [float(unit[i] @ unit[j]) for i, j in itertools.combinations(range(len(unit)), 2)]
        return min(sims), float(np.mean(sims))

    def copy(self) -> "SpeakerProfile":
        return copy.deepcopy(self)

    def summary(self) -> str:
        lo, mean = self.segment_agreement()
        text = (f"{self.name or 'speaker'}: {self.speech_seconds:.1f} s speech, "
                f"{len(self.segment_embeddings)} segments")
        if not math.isnan(lo):
            text += f", segment cosine min {lo:.2f} mean {mean:.2f}"
        if not math.isnan(self.pitch_hz_median):
            text += f", pitch {self.pitch_hz_median:.0f} Hz (IQR {self.pitch_hz_iqr:.0f})"
        return text

    # --- serialisation --------------------------------------------------------------------------
    def to_arrays(self) -> dict[str, np.ndarray]:
        arrays: dict[str, np.ndarray] = {
            "format_version": np.array(FORMAT_VERSION, dtype=np.int64),
            "embedding": self.embedding,
            "segment_embeddings": self.segment_embeddings,
            "warnings": np.array(self.warnings, dtype=np.str_).reshape(-1),
        }
        for key in _STR_KEYS:
            arrays[key] = np.array(getattr(self, key), dtype=np.str_)
        for key in _FLOAT_KEYS:
            arrays[key] = np.array(getattr(self, key), dtype=np.float64)
        if self.style is not None:
            arrays["style"] = self.style
        for key, value in self.extras.items():
            arrays[_EXTRA_PREFIX + key] = np.asarray(value)
        for key, value in arrays.items():
            if value.dtype == object:
                raise TypeError(f"speaker field '{key}' holds Python objects; only numeric/str arrays "
                                "can be saved (no pickle)")
        return arrays

    def save_npz(self, path: str | Path) -> Path:
        """Write to `path` (atomically: a crash never leaves a half-written voice file)."""
        path = Path(path)
        with atomic_path(path) as tmp, open(tmp, "wb") as handle:  # a handle: np.savez adds no suffix
            np.savez(handle, **self.to_arrays())
        return path

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], source: str = "arrays") -> "SpeakerProfile":
        version = int(arrays["format_version"]) if "format_version" in arrays else None
        if version != FORMAT_VERSION:
            raise ValueError(f"{source} is not a speaker file of format {FORMAT_VERSION} "
                             f"(found {version}); extract the speaker again")
        missing = [k for k in ("embedding", "segment_embeddings", *_STR_KEYS, *_FLOAT_KEYS)
                   if k not in arrays]
        if missing:
            raise ValueError(f"{source} lacks speaker fields {missing}; extract the speaker again")
        return cls(
            embedding=arrays["embedding"],
            segment_embeddings=arrays["segment_embeddings"],
            style=arrays["style"] if "style" in arrays else None,
            extras={k[len(_EXTRA_PREFIX):]: np.asarray(v) for k, v in arrays.items()
                    if k.startswith(_EXTRA_PREFIX)},
            warnings=[str(w) for w in np.asarray(arrays.get("warnings", np.array([], np.str_))).reshape(-1)],
            **{k: str(arrays[k][()]) for k in _STR_KEYS},
            **{k: float(arrays[k]) for k in _FLOAT_KEYS},
        )

    @classmethod
    def load_npz(cls, path: str | Path) -> "SpeakerProfile":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"speaker file {path} does not exist; save one with "
                                    "ExtractSpeakerEmbedding first")
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
        except ValueError as exc:  # pickled object arrays end up here: refuse them
            raise ValueError(f"{path} is not a plain speaker .npz ({exc})") from exc
        profile = cls.from_arrays(arrays, source=str(path))
        if profile.encoder != ENCODER_ID:
            raise ValueError(f"{path} was made with speaker encoder '{profile.encoder}', this pack uses "
                             f"'{ENCODER_ID}'; extract the speaker again from the audio")
        return profile


# --- extraction ------------------------------------------------------------------------------------
def content_hash(waveform: np.ndarray, sample_rate: int) -> str:
    """sha256 of the float32 little-endian samples and the sample rate (the cache key)."""
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(waveform, dtype="<f4").tobytes())
    digest.update(f"|sr={int(sample_rate)}".encode())
    return digest.hexdigest()


def _read_prepared(prepared: Any) -> tuple[np.ndarray, int, list[tuple[int, int]], float]:
    missing = [a for a in ("waveform", "sample_rate", "segments", "speech_seconds") if not hasattr(prepared, a)]
    if missing:
        raise TypeError(f"prepared audio lacks {missing}; pass the output of audio.prepare "
                        "(LoadReferenceAudio)")
    wav = np.asarray(prepared.waveform, dtype=np.float32)
    if wav.ndim != 1 or wav.size == 0:
        raise ValueError(f"prepared waveform must be non-empty mono 1-D, got shape {wav.shape}")
    if not np.all(np.isfinite(wav)):
        raise ValueError("prepared waveform contains NaN/Inf samples; decode the audio again")
    sr = int(prepared.sample_rate)
    if sr <= 0:
        raise ValueError(f"sample_rate must be positive, got {prepared.sample_rate}")
    segments: list[tuple[int, int]] = []
    for raw in prepared.segments:
        start, end = int(raw[0]), int(raw[1])
        start, end = max(0, start), min(len(wav), end)
        if end > start:
            segments.append((start, end))
    if not segments:
        raise ValueError("the reference audio has no speech segments; give a clip with at least "
                         f"{MIN_SPEECH_SECONDS:.0f} s of clear speech")
    return wav, sr, segments, float(prepared.speech_seconds)


def _pitch_stats(segments16k: list[np.ndarray]) -> tuple[float, float]:
    """Median and IQR of F0 over voiced frames (pitch.py's listener estimator on at most 20 s of speech)."""
    f0 = _speech_f0(segments16k, 16000)
    if f0.size < 10:
        return float("nan"), float("nan")
    q25, q50, q75 = np.percentile(f0, [25, 50, 75])
    return float(q50), float(q75 - q25)


def _speech_f0(pieces: list[np.ndarray], sample_rate: int) -> np.ndarray:
    from .pitch import listener_f0

    budget = int(PITCH_MAX_SECONDS * sample_rate)
    picked, total = [], 0
    for seg in pieces:
        if total >= budget:
            break
        picked.append(seg[: budget - total])
        total += len(picked[-1])
    f0_all = [listener_f0(seg, sample_rate) for seg in picked]
    return np.concatenate(f0_all) if f0_all else np.zeros(0)


def reference_pitch(wave: np.ndarray, sample_rate: int, segments: Any = None) -> float:
    """Median listener F0 (Hz) of a reference clip's speech (its `segments` when known, else the whole
    clip), on at most PITCH_MAX_SECONDS of it, as the profile measures it; NaN when under 10 voiced frames."""
    wave = np.asarray(wave, np.float32).reshape(-1)
    spans = [(max(0, int(a)), min(len(wave), int(b))) for a, b in (segments or [(0, len(wave))])]
    f0 = _speech_f0([wave[a:b] for a, b in spans if b > a], int(sample_rate))
    return float(np.median(f0)) if f0.size >= 10 else float("nan")


def extract_speaker_profile(prepared: Any, run_fn: Callable[[np.ndarray], np.ndarray] | None = None,
                            cache: "bool | Any" = True, name: str = "",
                            reference_text: str = "") -> SpeakerProfile:
    """Embed every speech segment of a prepared reference clip and summarise the speaker.

    `prepared`: any object with waveform (1-D float32), sample_rate, segments ([start, end) sample
    indices) and speech_seconds (audio.prepare.PreparedAudio). `run_fn`: mels [B,160,40] ->
    [B,256] (defaults to the engine loader's GE2E runner). `cache`: True (the shared memory + disk
    cache), False, or an `EmbeddingCache`.
    """
    from ..engines import speaker_encoder as se
    from .embedding_cache import EmbeddingCache, default_cache

    wav, sr, segments, speech_seconds = _read_prepared(prepared)
    key = content_hash(wav, sr)
    # (not `cache or None`: an empty cache has len 0 and would read as False)
    store: EmbeddingCache | None = default_cache() if cache is True else (None if cache is False else cache)
    if store is not None:
        hit = store.get(key)
        if hit is not None:
            return _with_labels(hit, name, reference_text)

    import librosa  # only on a cache miss: importing it costs ~0.7 s of a cached run's startup

    # Resample once, then map the segment bounds: cheaper and identical at the joins.
    wav16 = wav if sr == se.SAMPLE_RATE else librosa.resample(wav, orig_sr=sr, target_sr=se.SAMPLE_RATE)
    scale = se.SAMPLE_RATE / sr
    pieces = []
    for start, end in segments:
        a, b = int(round(start * scale)), min(len(wav16), int(round(end * scale)))
        if b > a:
            pieces.append(wav16[a:b])
    batches = []
    for i, piece in enumerate(pieces):
        try:
            batches.append(se.partial_mels(piece))
        except ValueError as exc:  # e.g. a digitally silent segment
            raise ValueError(f"speech segment {i} of the reference cannot be embedded: {exc}") from exc
    run_fn = run_fn or se.default_run_fn()
    partials = se.run_batched(np.concatenate(batches), run_fn)
    bounds = np.cumsum([0] + [len(b) for b in batches])
    seg_emb = np.stack([se.l2_normalize(partials[lo:hi].mean(axis=0))
                        for lo, hi in zip(bounds[:-1], bounds[1:])])
    pitch_median, pitch_iqr = _pitch_stats(pieces)

    profile = SpeakerProfile(
        embedding=se.l2_normalize(seg_emb.mean(axis=0)), segment_embeddings=seg_emb,
        content_hash=key, speech_seconds=speech_seconds, pitch_hz_median=pitch_median,
        pitch_hz_iqr=pitch_iqr, warnings=[str(w) for w in getattr(prepared, "warnings", [])],
    )
    inherited = len(profile.warnings)  # audio preparation already logged its own warnings
    if speech_seconds < MIN_SPEECH_SECONDS:
        profile.warnings.append(f"only {speech_seconds:.1f} s of speech: the voice match will be weak; "
                                f"give at least {MIN_SPEECH_SECONDS:.0f} s (10 s or more is better)")
    lo, _ = profile.segment_agreement()
    if lo < DISAGREE_THRESHOLD:
        profile.warnings.append(f"segments disagree (min cosine {lo:.2f}): the clip may contain several speakers")
    for warning in profile.warnings[inherited:]:
        log.warning("speaker profile: %s", warning)
    if store is not None:
        store.put(profile)
    return _with_labels(profile, name, reference_text)


def _with_labels(profile: SpeakerProfile, name: str, reference_text: str) -> SpeakerProfile:
    # Labels are per request, not part of the cached audio analysis: hand out a copy.
    out = profile.copy()
    if name:
        out.name = name
    if reference_text:
        out.reference_text = reference_text
    return out
