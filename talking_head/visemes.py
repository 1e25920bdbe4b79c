"""Phone timings -> a viseme track: the mouth shape each output frame should show.

What the mouth does is largely fixed by the phones: lips meet on p/b/m, round on o/u/w, spread on
i/e, the jaw drops on open vowels. This module turns (phone, start_s, end_s[, confidence]) into per
frame targets for the parameters `portrait` drives (jaw_open, lip_open, width, round, each 0..1 like
portrait/speech_drive.MouthParams) plus `closure` (1 = lips meet) and a `confidence`.

Phones come in two alphabets, detected per list (or named by `alphabet=`):
  * the TTS's own symbols (voice/phone_timing.py): one IPA character per phone as the Kokoro text
    frontend writes it (misaki English with its one-letter diphthongs A I O W Y Q and the flap T,
    Mandarin IPA with tone arrows folded away), and
  * ARPAbet (audio/phone_align.py, CMUdict style, stress digits allowed), with SIL for silence.
Each phone maps to one of 14 visemes (diphthongs to two, their first part taking 55 % of the time).

Coarticulation is dominance blending in the manner of Cohen & Massaro (1993): every segment pulls
each parameter towards its target with a dominance that is its full strength inside the segment and
decays exponentially outside it (faster after it than before: anticipation reaches further than
carry-over), and each parameter is the dominance-weighted mean of all targets. Consonants whose
mouth is free (t, k, h) have low dominance, so they take their shape from the neighbouring vowels;
shape (width/round) and opening (jaw/lips) have separate dominances, so rounding spreads ahead over
consonants ("st(r)ew") while their own jaw still rises. Bilabial closure is not blended but set: on
every frame whose time lies inside a p/b/m the lips meet, and a bilabial shorter than a frame
closes the frame nearest its middle, so no closure is ever skipped.

Frame clock (vision/lipsync_metrics.py, portrait/speech_drive.py): frame i shows time i / fps, and
its continuous parameters are the mean over its own interval [t_i - 0.5/fps, t_i + 0.5/fps].
Time between phones, before the first and after the last is silence (mouth at rest).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

GRID_S = 0.005  # resolution of the continuous curves before the per-frame mean
ANTICIPATION_S = 0.060  # opening dominance decays over this before a segment ...
CARRYOVER_S = 0.040     # ... and over this after it
SHAPE_ANTICIPATION_S = 0.090  # lip shape (rounding, spreading) is planned further ahead
SHAPE_CARRYOVER_S = 0.050
REACH = 6.0  # dominance is computed out to REACH time constants (exp(-6) = 0.25 % is negligible)
DIPHTHONG_SPLIT = 0.55  # share of a diphthong's time spent on its first part


@dataclass(frozen=True)
class Viseme:
    """Target mouth of one class and how strongly it imposes it (Cohen-Massaro's alpha)."""
    name: str
    jaw: float
    lip: float
    width: float
    round: float
    open_dominance: float   # weight of the jaw/lip targets
    shape_dominance: float  # weight of the width/round targets
    closure: bool = False   # lips meet (bilabials)


# Targets in portrait's 0..1 units. Openings: open vowels 1, mid vowels about half, close vowels and
# most consonants a quarter; sibilants and labiodentals nearly shut (teeth together / lip on teeth).
VISEMES: tuple[Viseme, ...] = (
    Viseme("SIL", 0.00, 0.00, 0.00, 0.00, 0.60, 0.30),
    Viseme("PBM", 0.10, 0.00, 0.10, 0.10, 0.70, 0.20, closure=True),  # closure itself is set, not blended
    Viseme("FV", 0.12, 0.08, 0.25, 0.00, 0.90, 0.50),
    Viseme("TD", 0.25, 0.30, 0.30, 0.00, 0.35, 0.15),   # t d n l, flap, th (tongue, not lips, shapes them)
    Viseme("SZ", 0.10, 0.15, 0.45, 0.00, 0.80, 0.40),   # s z ts: teeth close
    Viseme("SH", 0.15, 0.25, 0.00, 0.70, 0.70, 0.80),   # sh zh ch j: lips protrude
    Viseme("KG", 0.30, 0.30, 0.20, 0.00, 0.20, 0.10),   # k g ng h: shaped by the vowel around them
    Viseme("R", 0.25, 0.25, 0.00, 0.55, 0.50, 0.70),
    Viseme("OO", 0.15, 0.20, 0.00, 1.00, 0.70, 1.00),   # u, w: small round opening
    Viseme("EE", 0.25, 0.30, 1.00, 0.00, 0.70, 0.90),   # i, y-glide: spread
    Viseme("EH", 0.55, 0.60, 0.60, 0.00, 0.80, 0.70),
    Viseme("AA", 1.00, 1.00, 0.30, 0.00, 0.90, 0.60),
    Viseme("OH", 0.60, 0.55, 0.00, 0.75, 0.80, 0.90),
    Viseme("UH", 0.45, 0.50, 0.20, 0.00, 0.60, 0.30),   # schwa and other central vowels
)
VISEME_INDEX = {v.name: i for i, v in enumerate(VISEMES)}
SILENCE = VISEME_INDEX["SIL"]

# Kokoro / misaki / espeak IPA, one character per phone (voice/phone_timing.py folds the marks away)
_IPA_GROUPS = {
    "PBM": "pbm",
    "FV": "fvʋɸβ",
    "TD": "tdnlɾTɽɖʈɳθð",
    "SZ": "szʦʣɕʑʨʥ",
    "SH": "ʃʒʧʤʂʐ",
    "KG": "kgɡŋhxɣχʁɴçʝɰʔɦɟcq",
    "R": "ɹɻrɚɝ",
    "OO": "uʊwɥyøɵœ",
    "EE": "iɪjɨᵻ",
    "EH": "eɛ",
    "AA": "aɑæɒʌ",
    "OH": "oɔ",
    "UH": "əɜᵊɐɤɯ",
}
IPA_VISEMES: dict[str, tuple[str, ...]] = {c: (name,) for name, chars in _IPA_GROUPS.items() for c in chars}
# misaki's one-letter diphthongs: A eɪ, I aɪ, O oʊ, W aʊ, Y ɔɪ, Q əʊ (British "go")
IPA_VISEMES.update({"A": ("EH", "EE"), "I": ("AA", "EE"), "O": ("OH", "OO"), "W": ("AA", "OO"),
                    "Y": ("OH", "EE"), "Q": ("UH", "OO")})

ARPABET_VISEMES: dict[str, tuple[str, ...]] = {
    "AA": ("AA",), "AE": ("AA",), "AH": ("UH",), "AO": ("OH",), "AW": ("AA", "OO"), "AY": ("AA", "EE"),
    "EH": ("EH",), "ER": ("R",), "EY": ("EH", "EE"), "IH": ("EE",), "IY": ("EE",), "OW": ("OH", "OO"),
    "OY": ("OH", "EE"), "UH": ("OO",), "UW": ("OO",),
    "B": ("PBM",), "P": ("PBM",), "M": ("PBM",), "F": ("FV",), "V": ("FV",),
    "D": ("TD",), "T": ("TD",), "N": ("TD",), "L": ("TD",), "DH": ("TD",), "TH": ("TD",),
    "S": ("SZ",), "Z": ("SZ",), "CH": ("SH",), "JH": ("SH",), "SH": ("SH",), "ZH": ("SH",),
    "G": ("KG",), "K": ("KG",), "NG": ("KG",), "HH": ("KG",), "R": ("R",), "W": ("OO",), "Y": ("EE",),
}
ARPABET_SILENCE = frozenset({"SIL", "SP", "SPN", "NSN", "PAU", "", "<SIL>", "H#", "BRTH", "NOISE"})
_NEUTRAL = ("UH",)  # unknown symbols: a mid mouth, with the confidence halved
UNKNOWN_CONFIDENCE = 0.5


@dataclass
class VisemeTrack:
    """Per output frame (frame i at time i / fps): targets in portrait's units, closure and confidence."""
    jaw_open: np.ndarray    # float32 [N] 0..1
    lip_open: np.ndarray    # float32 [N] 0..1 (0 where closure is 1)
    width: np.ndarray       # float32 [N] 0..1
    round: np.ndarray       # float32 [N] 0..1
    closure: np.ndarray     # float32 [N]: 1 on frames inside a bilabial (lips meet), else 0
    confidence: np.ndarray  # float32 [N] 0..1: how far the phones behind the frame are to be believed
    viseme: np.ndarray      # int64 [N] index into VISEMES of the most dominant segment at t_i
    fps: float

    def __len__(self) -> int:
        return len(self.jaw_open)


@dataclass(frozen=True)
class _Segment:
    viseme: int
    start: float
    end: float
    confidence: float


def _fields(phone: Any) -> tuple[str, float, float, float]:
    """(label, start, end, confidence) of a tuple (label, start, end[, conf]) or an object with
    label/start/end[/confidence] (audio/phone_align.Phone)."""
    if hasattr(phone, "label"):
        return str(phone.label), float(phone.start), float(phone.end), float(getattr(phone, "confidence", 1.0))
    label, start, end = phone[0], phone[1], phone[2]
    return str(label), float(start), float(end), float(phone[3]) if len(phone) > 3 else 1.0


def _arpabet(label: str) -> str:
    return re.sub(r"\d", "", label.strip().upper())


def detect_alphabet(labels: Iterable[str]) -> str:
    """"arpabet" when every label is ARPAbet (digits stripped) or a silence label and at least one has
    two or more letters (the TTS writes single characters); otherwise "ipa"."""
    labels = list(labels)
    arpa = [_arpabet(x) for x in labels]
    if arpa and all(a in ARPABET_VISEMES or a in ARPABET_SILENCE for a in arpa) and any(len(a) >= 2 for a in arpa):
        return "arpabet"
    return "ipa"


def visemes_of(label: str, alphabet: str) -> tuple[tuple[str, ...], bool]:
    """(viseme names, known) of one phone label; silence gives ("SIL",)."""
    if alphabet == "arpabet":
        key = _arpabet(label)
        if key in ARPABET_SILENCE:
            return ("SIL",), True
        names = ARPABET_VISEMES.get(key)
    else:
        key = label.strip()
        if not key or key.upper() in ARPABET_SILENCE:
            return ("SIL",), True
        names = IPA_VISEMES.get(key) or (IPA_VISEMES.get(key[0]) if len(key) > 1 else None)
    return (names, True) if names else (_NEUTRAL, False)


def segments(phones: Sequence[Any], alphabet: str = "auto") -> list[_Segment]:
    """Time-ordered segments covering the phones; diphthongs split in two; gaps are left to silence."""
    rows = sorted((_fields(p) for p in phones), key=lambda r: r[1])
    if alphabet == "auto":
        alphabet = detect_alphabet(r[0] for r in rows)
    if alphabet not in ("ipa", "arpabet"):
        raise ValueError(f"alphabet must be 'auto', 'ipa' or 'arpabet', got {alphabet!r}")
    out: list[_Segment] = []
    for label, start, end, conf in rows:
        if not (np.isfinite(start) and np.isfinite(end)) or end <= start:
            continue
        names, known = visemes_of(label, alphabet)
        conf = float(np.clip(conf, 0.0, 1.0)) * (1.0 if known else UNKNOWN_CONFIDENCE)
        if len(names) == 2:
            mid = start + DIPHTHONG_SPLIT * (end - start)
            out += [_Segment(VISEME_INDEX[names[0]], start, mid, conf), _Segment(VISEME_INDEX[names[1]], mid, end, conf)]
        else:
            out.append(_Segment(VISEME_INDEX[names[0]], start, end, conf))
    return out


def _with_silences(segs: list[_Segment], horizon: float) -> list[_Segment]:
    """Fill gaps (and before / after everything) with silence segments, so a pause pulls the mouth shut.
    A silence carries the lower confidence of the phones around it: a pause is only as sure as they are."""
    out: list[_Segment] = []
    t = -1e3
    prev_conf = segs[0].confidence if segs else 0.0
    for s in segs:
        if s.start > t + 1e-6:
            out.append(_Segment(SILENCE, t, s.start, min(prev_conf, s.confidence)))
        out.append(s)
        t, prev_conf = max(t, s.end), s.confidence
    out.append(_Segment(SILENCE, t, max(horizon, t) + 1e3, prev_conf))
    return out


def _dominance(grid: np.ndarray, seg: _Segment, alpha: float, before_s: float, after_s: float) -> tuple[slice, np.ndarray]:
    """alpha inside the segment, alpha * exp(-distance / tau) outside (tau = before_s ahead of it,
    after_s behind it), on the part of the grid where it is not negligible."""
    lo = np.searchsorted(grid, seg.start - REACH * before_s)
    hi = np.searchsorted(grid, seg.end + REACH * after_s, side="right")
    t = grid[lo:hi]
    d = np.where(t < seg.start, (seg.start - t) / before_s, np.where(t > seg.end, (t - seg.end) / after_s, 0.0))
    return slice(lo, hi), alpha * np.exp(-d)


def _frame_means(curve: np.ndarray, grid: np.ndarray, times: np.ndarray, fps: float) -> np.ndarray:
    """Mean of a grid curve over each frame's interval [t - 0.5/fps, t + 0.5/fps]."""
    integral = np.concatenate([[0.0], np.cumsum((curve[1:] + curve[:-1]) * 0.5 * np.diff(grid))])
    half = 0.5 / fps
    lo = np.interp(times - half, grid, integral)
    hi = np.interp(times + half, grid, integral)
    return (hi - lo) / (2 * half)


def viseme_track(phones: Sequence[Any], fps: float, n_frames: int, alphabet: str = "auto") -> VisemeTrack:
    """The viseme track of `n_frames` output frames at `fps` from phone timings (see module doc).
    No phones at all gives silence with confidence 0 (nothing is known)."""
    if fps <= 0 or n_frames <= 0:
        raise ValueError(f"viseme_track needs fps > 0 and n_frames > 0, got fps={fps}, n_frames={n_frames}")
    times = np.arange(n_frames) / float(fps)
    segs = segments(phones, alphabet)
    horizon = float(times[-1]) + 1.0 / fps
    grid = np.arange(-1.0 / fps - GRID_S, horizon + GRID_S, GRID_S)
    all_segs = _with_silences(segs, horizon)
    targets = np.array([[v.jaw, v.lip, v.width, v.round] for v in VISEMES], np.float64)
    weighted = np.zeros((4, len(grid)))
    weights = np.zeros((2, len(grid)))  # opening, shape
    conf_num = np.zeros(len(grid))
    best = np.full(len(grid), -1.0)
    best_id = np.full(len(grid), SILENCE, np.int64)
    for seg in all_segs:
        v = VISEMES[seg.viseme]
        sl, d_open = _dominance(grid, seg, v.open_dominance, ANTICIPATION_S, CARRYOVER_S)
        sl2, d_shape = _dominance(grid, seg, v.shape_dominance, SHAPE_ANTICIPATION_S, SHAPE_CARRYOVER_S)
        weighted[0:2, sl] += d_open * targets[seg.viseme, 0:2, None]
        weights[0, sl] += d_open
        weighted[2:4, sl2] += d_shape * targets[seg.viseme, 2:4, None]
        weights[1, sl2] += d_shape
        conf_num[sl] += d_open * seg.confidence
        win = d_open > best[sl]
        best[sl] = np.where(win, d_open, best[sl])
        best_id[sl] = np.where(win, seg.viseme, best_id[sl])
    w = np.maximum(weights, 1e-12)
    curves = [weighted[0] / w[0], weighted[1] / w[0], weighted[2] / w[1], weighted[3] / w[1], conf_num / w[0]]
    jaw, lip, width, rnd, conf = (np.clip(_frame_means(c, grid, times, fps), 0.0, 1.0) for c in curves)
    viseme = best_id[np.clip(np.searchsorted(grid, times), 0, len(grid) - 1)]
    closure = _closures(segs, times, fps)
    lip = np.where(closure > 0, 0.0, lip)
    jaw = np.where(closure > 0, np.minimum(jaw, VISEMES[VISEME_INDEX["PBM"]].jaw), jaw)
    viseme = np.where(closure > 0, VISEME_INDEX["PBM"], viseme)
    if not segs:
        conf = np.zeros(n_frames)
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    return VisemeTrack(f32(jaw), f32(lip), f32(width), f32(rnd), f32(closure), f32(conf),
                       np.asarray(viseme, np.int64), float(fps))


def _closures(segs: list[_Segment], times: np.ndarray, fps: float) -> np.ndarray:
    """1 on frames whose time is inside a bilabial; a bilabial that holds no frame time closes the
    frame nearest its middle (a closure between two frames must still be seen)."""
    closure = np.zeros(len(times))
    for s in segs:
        if not VISEMES[s.viseme].closure:
            continue
        inside = (times >= s.start) & (times < s.end)
        if inside.any():
            closure[inside] = 1.0
        else:
            i = int(round(0.5 * (s.start + s.end) * fps))
            if 0 <= i < len(times):
                closure[i] = 1.0
    return closure


# --- as a network input (the `clone` generator's viseme conditioning) -------------------------------
FEATURE_NAMES = ("jaw_open", "lip_open", "width", "round", "closure", "confidence")


def frame_features(track: VisemeTrack | None, n_frames: int) -> np.ndarray:
    """float32 [n_frames, len(FEATURE_NAMES)]: the track's per-frame targets, closure and confidence.
    None (no phones known) is all zeros: confidence 0 tells a network to rely on the audio alone."""
    out = np.zeros((int(n_frames), len(FEATURE_NAMES)), np.float32)
    if track is not None:
        k = min(len(track), int(n_frames))
        for j, name in enumerate(FEATURE_NAMES):
            out[:k, j] = getattr(track, name)[:k]
    return out


def feature_windows(features: np.ndarray, frames: int) -> np.ndarray:
    """float32 [N, frames * F]: for every frame the features of the `frames` frames centred on it (an odd
    count; the edges repeat the first/last frame), flattened time-major. A network sees the coming and
    the past mouth shapes the way the mel window shows it the coming and past sound."""
    if frames < 1 or frames % 2 == 0:
        raise ValueError(f"a viseme window is an odd number of frames >= 1, got {frames}")
    feats = np.asarray(features, np.float32)
    if feats.ndim != 2 or len(feats) == 0:
        raise ValueError(f"features must be [frames, channels] with at least one frame, got {feats.shape}")
    half = frames // 2
    idx = np.clip(np.arange(len(feats))[:, None] + np.arange(-half, half + 1)[None, :], 0, len(feats) - 1)
    return np.ascontiguousarray(feats[idx].reshape(len(feats), -1))
