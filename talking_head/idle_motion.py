"""Idle motion of a talking photo: blinks, head sway and speech-timed nods, one value set per output frame.

Why: a photo animated only at the mouth reads as a frozen mask; people blink every few seconds and
never hold the head still while they talk. This module only decides *when and how much* (a small
table of numbers per frame, deterministic per seed); head_warp.py turns it into pixels.

Human figures the constants follow:
  * spontaneous blinks: ~15-20 a minute in conversation, irregular but never in quick succession
    (gamma-distributed intervals with a refractory gap); the lids are more than half shut for
    100-150 ms, and close faster than they open (30% of the blink closing, 20% shut, 50% opening);
  * the head drifts slowly (sub-second to seconds) by a few pixels and 1-2 degrees of roll, a little
    more while speaking than in pauses;
  * speakers dip the head on stressed syllables (a "beat" nod): the dip starts with the stress's
    loudness onset, bottoms out ~0.2 s later and recovers over ~0.5 s; not on every syllable.
Units: translations in inter-ocular distances (iod, outer eye corners; a 512-px portrait has an iod
of ~100-140 px, so 0.02 iod is 2-3 px), roll in radians, scale as a factor.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .portrait.speech_drive import speech_features

BLINKS_PER_MINUTE = 17.0
BLINK_SHAPE = 3.0          # gamma shape of the intervals: irregular, but rarely closer than ~1 s
BLINK_MIN_GAP_S = 0.8      # refractory: no blink starts sooner than this after the last one
# lid away from open, start to end; the lids are more than half shut for 60% of it (108-144 ms), as the
# face mesh measures real blinks on the sample clip talk_en_male_01a (3-5 frames at 30 fps)
BLINK_DURATION_S = (0.18, 0.24)
BLINK_CLOSE, BLINK_SHUT = 0.30, 0.20  # shares of a blink spent closing and shut (the rest, 50%: opening)
FIRST_BLINK_S = 0.5        # the first frames stay the photo's own eyes (thumbnails, video start)

SWAY_SIGMA_S = 0.7         # time scale of the drift (Gaussian-filtered noise)
SWAY_TX, SWAY_TY = 0.020, 0.010   # std of the drift, iod (side-to-side, up-down)
ROLL_STD = np.deg2rad(0.7)
ROLL_MAX = np.deg2rad(2.0)
SCALE_STD = 0.004          # the head leaning in and out a little
QUIET_SHARE = 0.6          # drift amplitude in pauses, relative to while speaking
EASE_IN_S = 0.5            # the motion grows from the photo's own pose over this time

NOD_DEPTH = 0.045          # iod, dip of the strongest nod
NOD_DOWN_S, NOD_UP_S = 0.20, 0.50
NOD_MIN_GAP_S = 1.2        # a nod on a stressed syllable, not on every syllable
NOD_MIN_RISE = 0.30        # loudness rise (0..1 scale of speech_features' level) that counts as stress
RISE_WINDOW_S = 0.25       # ... measured from the lowest level in this window before the peak


@dataclass
class IdleMotion:
    """Per output frame i (time i / fps): lid closure and head pose offsets, float32 [N] each."""
    fps: float
    blink: np.ndarray        # 0 = open (the photo's own lids) .. 1 = shut
    roll: np.ndarray         # radians, positive = clockwise in the image
    tx: np.ndarray           # iod, along the eye line (subject's left = image right is positive)
    ty: np.ndarray           # iod, down the face; nods are positive (the face dips)
    scale: np.ndarray        # factor about the neck pivot
    blink_times: np.ndarray  # seconds: the instants the lids are shut (on the frame grid)
    nod_times: np.ndarray    # seconds: the stress onsets the nods start at

    def __len__(self) -> int:
        return len(self.blink)

    def still(self, i: int) -> bool:
        """Frame i shows the photo as it is (no blink, no pose offset)."""
        return (self.blink[i] == 0 and self.roll[i] == 0 and self.tx[i] == 0 and self.ty[i] == 0
                and self.scale[i] == 1)


def _smoothstep(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


def blink_schedule(duration_s: float, fps: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(shut instants s, blink durations s). The shut instant lands on a frame: at 25 fps a 120 ms
    blink spans three frames, and one sampled between frames would read as a twitch, not a blink."""
    mean = 60.0 / BLINKS_PER_MINUTE
    times: list[float] = []
    t = FIRST_BLINK_S + rng.uniform(0.0, mean)  # a random phase: not every video blinks at the same time
    while t < duration_s:
        times.append(t)
        t += max(BLINK_MIN_GAP_S, rng.gamma(BLINK_SHAPE, mean / BLINK_SHAPE))
    shut = np.round(np.asarray(times) * fps) / fps
    lengths = rng.uniform(*BLINK_DURATION_S, size=len(shut))
    return shut, lengths


def blink_curve(times: np.ndarray, shut: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Lid closure 0..1 at `times` for blinks shut at `shut` lasting `lengths` (s)."""
    out = np.zeros(len(times), np.float64)
    for tc, d in zip(shut, lengths):
        close, hold = BLINK_CLOSE * d, BLINK_SHUT * d
        t0, t_open = tc - hold / 2 - close, tc + hold / 2
        sel = (times > t0) & (times < t_open + (1 - BLINK_CLOSE - BLINK_SHUT) * d)
        if not sel.any():
            continue
        t = times[sel]
        closing = _smoothstep((t - t0) / close)
        opening = 1.0 - _smoothstep((t - t_open) / ((1 - BLINK_CLOSE - BLINK_SHUT) * d))
        out[sel] = np.maximum(out[sel], np.where(t < tc - hold / 2, closing, np.where(t <= t_open, 1.0, opening)))
    return out


def _gaussian(x: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian filter (sigma in samples) with mirrored ends, same length."""
    if sigma <= 0 or len(x) < 2:
        return x.astype(np.float64)
    r = int(np.ceil(3 * sigma))
    k = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma) ** 2)
    return np.convolve(np.pad(x.astype(np.float64), r, mode="reflect" if len(x) > r else "edge"),
                       k / k.sum(), mode="valid")


def smooth_noise(n: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Unit-variance low-pass noise [n] (white noise filtered by a Gaussian of `sigma` samples):
    filtered from a longer draw so both ends are as random as the middle."""
    r = int(np.ceil(3 * max(sigma, 1e-3)))
    k = np.exp(-0.5 * (np.arange(-r, r + 1) / max(sigma, 1e-3)) ** 2)
    k /= np.sqrt((k ** 2).sum())
    return np.convolve(rng.standard_normal(n + 2 * r), k, mode="valid")


def stress_onsets(level: np.ndarray, hop_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(onset times s, strengths 0..1) of stressed syllables from a 10 ms loudness curve (0..1):
    loudness peaks that rise by NOD_MIN_RISE or more above the quietest point of the RISE_WINDOW_S
    before them, strongest first kept NOD_MIN_GAP_S apart. The onset is where the rise is half done
    (the vowel's attack, which is what a listener hears as the beat)."""
    e = _gaussian(level, 0.03 / hop_s)
    w = max(1, int(round(RISE_WINDOW_S / hop_s)))
    padded = np.concatenate([np.full(w, e[0]), e])
    low = np.lib.stride_tricks.sliding_window_view(padded, w + 1)[:, :].min(axis=1)[: len(e)]
    rise = e - low
    peak = np.zeros(len(e), bool)
    peak[1:-1] = (e[1:-1] >= e[:-2]) & (e[1:-1] > e[2:])
    cand = np.flatnonzero(peak & (rise >= NOD_MIN_RISE))
    chosen: list[int] = []
    for j in cand[np.argsort(-rise[cand], kind="stable")]:
        if all(abs(j - c) * hop_s >= NOD_MIN_GAP_S for c in chosen):
            chosen.append(int(j))
    chosen.sort()
    onsets, strengths = [], []
    for j in chosen:
        half = low[j] + 0.5 * rise[j]
        k = j
        while k > 0 and e[k - 1] > half:
            k -= 1
        # linear interpolation between the samples around the half-rise crossing
        frac = 0.0 if k == 0 else float((half - e[k - 1]) / max(e[k] - e[k - 1], 1e-9))
        onsets.append((k - 1 + frac) * hop_s if k > 0 else 0.0)
        strengths.append(min(1.0, float(rise[j]) / 0.6))
    return np.asarray(onsets), np.asarray(strengths)


def nod_curve(times: np.ndarray, onsets: np.ndarray, strengths: np.ndarray) -> np.ndarray:
    """Head dip (iod) at `times`: each nod goes down from its onset for NOD_DOWN_S, then back up
    over NOD_UP_S; overlapping nods take the deeper one."""
    out = np.zeros(len(times), np.float64)
    for t0, s in zip(onsets, strengths):
        d = times - t0
        dip = np.where(d < NOD_DOWN_S, _smoothstep(d / NOD_DOWN_S), 1.0 - _smoothstep((d - NOD_DOWN_S) / NOD_UP_S))
        out = np.maximum(out, NOD_DEPTH * (0.5 + 0.5 * s) * np.where(d >= 0, dip, 0.0))
    return out


def idle_motion(wave: np.ndarray, sample_rate: int, fps: float, n_frames: int, seed: int = 0) -> IdleMotion:
    """The idle-motion track of `n_frames` output frames at `fps` for speech `wave` (mono float)."""
    if fps <= 0 or n_frames < 0:
        raise ValueError(f"idle_motion needs fps > 0 and n_frames >= 0, got fps={fps}, n_frames={n_frames}")
    # one independent stream per part, so e.g. a longer clip does not reshuffle the blinks it shares
    blink_rng, sway_rng = (np.random.default_rng([int(seed), part]) for part in (1, 2))
    times = np.arange(n_frames) / float(fps)
    shut, lengths = blink_schedule(n_frames / float(fps), fps, blink_rng)
    blink = blink_curve(times, shut, lengths)

    feats = speech_features(np.asarray(wave, np.float64).reshape(-1), int(sample_rate))
    level, hop_s = feats["level"], float(feats["hop_s"])
    t_level = np.arange(len(level)) * hop_s
    speaking = np.interp(times, t_level, _gaussian((level > 0.2).astype(np.float64), 0.5 / hop_s))
    amp = (QUIET_SHARE + (1 - QUIET_SHARE) * np.clip(speaking * 2.0, 0.0, 1.0)) * _smoothstep(times / EASE_IN_S)
    sigma = SWAY_SIGMA_S * fps
    tx, ty, roll, scale = (smooth_noise(n_frames, sigma, sway_rng) for _ in range(4))
    onsets, strengths = stress_onsets(level, hop_s)
    nods = nod_curve(times, onsets, strengths)
    return IdleMotion(fps=float(fps), blink=blink.astype(np.float32),
                      roll=np.clip(roll * ROLL_STD * amp, -ROLL_MAX, ROLL_MAX).astype(np.float32),
                      tx=(tx * SWAY_TX * amp).astype(np.float32),
                      ty=(ty * SWAY_TY * amp + nods).astype(np.float32),
                      scale=(1.0 + scale * SCALE_STD * amp).astype(np.float32),
                      blink_times=shut, nod_times=onsets)
