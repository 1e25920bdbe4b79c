"""Voice imitation: find a Kokoro voice (style vector + pitch) whose speech sounds like the reference.

Kokoro's 256-dim style splits into a timbre half (dims 0-127, read by the decoder/vocoder) and a
prosody half (dims 128-255, read by the duration/pitch predictor). DESIGN.md records that moving
the timbre half towards the speaker, scored by GE2E similarity, raised similarity on unseen text,
while touching the prosody half or rewriting spectra hurt intelligibility. The pack also grafts a
pitch control onto the graph (engines/kokoro/controls.py): the predicted F0 contour is scaled
before the vocoder, which shifts pitch cleanly. So this search:

1. keeps the bundled voices that reach the speaker's median pitch with a modest pitch shift (the
   pitch constraint below) and scores each at that pitch (the "best bundled voice" baseline),
2. takes the best-scoring one as the base voice,
3. tries the formant scale (formant.py: vocal-tract length, which no bundled voice may match) a
   step down and up, and a further step in the direction that won (on a female base voice at most
   x1.035 up: higher formants made its English unintelligible, formant.HIGH_VOICE_FORMANT_MAX),
4. tries timbre blends of the best voice with the runners-up,
5. runs a (1+lambda) evolution strategy on (timbre half, log pitch scale, log formant scale), with
   per-dimension step sizes from the spread of the bundled voices and the offset clamped to their
   range, so the result stays inside the space the decoder was trained on (keeps words intelligible),
   and the pitch held near the speaker's; it stops early when PATIENCE generations bring nothing.

The scorer is a callable (voice pack, f0 scale, formant scale) -> similarity, so the search is
independent of which backend synthesizes and embeds. A scorer may also offer score_many(candidates)
-> similarities; the search then hands it every group of candidates whose choice does not depend on
each other's scores (the bundled voices, the two first formant steps, the blends, an ES generation)
and reads the scores back in order, so a parallel scorer (clone.ProbeScorer on a CPU) evaluates the
same candidates and the search picks the same voice as with one score call at a time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .formant import FORMANT_RANGE, clip_formant

TIMBRE = slice(0, 128)
F0_RANGE = (0.7, 1.45)  # search range without a pitch target; beyond it Kokoro's vocoder starts to sound strained
F0_STEP = 0.06  # ES step of log(f0 scale) at sigma 1
# Pitch target (issue 18): the fitted voice's median F0 must stay within +-15 % of the speaker's. GE2E
# barely hears pitch, so v4 let a male speaker end on a female voice at 250 Hz (a 121 Hz speaker) or
# drop a 132 Hz man to 99 Hz. With a target the pitch is a constraint, not a search variable:
# - base voices are those that reach the speaker's pitch within PITCH_COMFORT (the bundled female
#   voices sit at 233-328 Hz on the probe, the male jm_kumo at 88 Hz, so this also keeps the sex
#   whenever one voice of it is near); with none in it, the voice needing the smallest shift, within
#   PITCH_HARD;
# - the candidates are scored AT the matched pitch, and the ES moves the pitch only within
#   x/÷ PITCH_SEARCH_TOL of it (pitch measurement error ~1-3 %), so the fit lands well inside +-15 %.
PITCH_COMFORT = (0.68, 1.5)
PITCH_HARD = (0.6, 1.7)  # with the formant range (0.86-1.16) Kokoro is asked for 0.52-1.98
PITCH_SEARCH_TOL = 1.06
# Formant line search: first steps x/÷ FORMANT_LINE_STEP, then one more step the same way when one
# won. On the v3 fits, the best probe score moved the formants by 0-12 % (mostly up for the
# speakers whose base voice is a Japanese voice); ES steps in log formant are this big at sigma 1.
FORMANT_LINE_STEP = 1.07
FORMANT_STEP = 0.04
# Early stop: the ES gives up after this many generations in a row without a better voice (its step
# has shrunk to 0.7^3 = 1/3 by then); part of the first-use time budget (issue 18: fit <= 60 s).
PATIENCE = 3
# Syntheses per fit. v4 used 24 (budget 40 gained nothing: +0.080 vs +0.078 held-out); v5 16 plus the
# early stop. v6 14, with the probe spoken faster (clone.SEARCH_SPEED): together they bring a
# first-use fit under a minute on the 2-core CPU (issue 18), see RESULTS_voice.md.
DEFAULT_BUDGET = 14

Scorer = Callable[[np.ndarray, float, float], float]  # (voice pack, f0 scale, formant scale) -> similarity
Candidate = tuple[np.ndarray, float, float]  # (voice pack, f0 scale, formant scale)


def score_batch(score: Scorer, candidates: list[Candidate]) -> list[float]:
    """[score(*c) for c in candidates], through score.score_many when the scorer has it."""
    many = getattr(score, "score_many", None)
    if many is not None and len(candidates) > 1:
        values = list(many(candidates))
        if len(values) != len(candidates):
            raise ValueError(f"score_many returned {len(values)} scores for {len(candidates)} candidates")
        return [float(v) for v in values]
    return [float(score(*c)) for c in candidates]


@dataclass
class ImitationResult:
    base_voice: str
    timbre_offset: np.ndarray  # [128], added to the base voice's timbre half at every length row
    f0_scale: float
    similarity: float  # GE2E cosine of the probe speech to the reference
    base_similarity: float  # best bundled voice, unchanged, on the same probe
    voice_scores: dict[str, float] = field(default_factory=dict)
    evaluations: int = 0
    history: list[float] = field(default_factory=list)
    formant_scale: float = 1.0

    def apply(self, base_pack: np.ndarray, strength: float = 1.0) -> np.ndarray:
        """The imitated voice pack ([rows, 1, 256]); strength 0 = base voice, 1 = full imitation."""
        return apply_offset(base_pack, self.timbre_offset * float(strength))


def apply_offset(pack: np.ndarray, offset: np.ndarray) -> np.ndarray:
    out = np.array(pack, dtype=np.float32, copy=True)
    out[..., TIMBRE] += offset.astype(np.float32)
    return out


def timbre_statistics(voices: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-dim spread, min and max of the bundled voices' timbre halves (averaged over length rows)."""
    timbres = np.stack([_timbre(v) for v in voices.values()])
    spread = timbres.std(axis=0) + 1e-3
    return spread, timbres.min(axis=0), timbres.max(axis=0)


def _timbre(pack: np.ndarray) -> np.ndarray:
    return np.asarray(pack, np.float32).reshape(-1, 256)[:, TIMBRE].mean(axis=0)


def pitch_candidates(pitch_match: dict[str, float], voices: list[str]) -> list[str]:
    """The bundled voices that may be the base for a speaker, given the f0 scale each needs (see PITCH_*)."""
    known = {name: r for name, r in pitch_match.items() if name in voices and np.isfinite(r) and r > 0}
    comfortable = [n for n, r in known.items() if PITCH_COMFORT[0] <= r <= PITCH_COMFORT[1]]
    if comfortable:
        return comfortable
    reachable = [n for n, r in known.items() if PITCH_HARD[0] <= r <= PITCH_HARD[1]]
    pool = reachable or list(known)
    if not pool:
        return list(voices)
    nearest = min(abs(np.log(known[n])) for n in pool)
    return [n for n in pool if abs(np.log(known[n])) <= nearest + 1e-6]


def imitate(voices: dict[str, np.ndarray], score: Scorer, budget: int = DEFAULT_BUDGET,
            seed: int = 0, population: int = 4, progress: Callable[[int, int], None] | None = None,
            pitch_match: dict[str, float] | None = None, search_formant: bool = True,
            patience: int = PATIENCE,
            formant_limits: dict[str, tuple[float, float]] | None = None) -> ImitationResult:
    """Search the voice that maximises `score(pack, f0_scale, formant_scale)` within `budget` score calls.

    pitch_match: per bundled voice, the f0 scale that brings its median pitch to the speaker's. With
    it the pitch is a constraint (see PITCH_*): only voices that reach the speaker's pitch are scored
    (at that pitch), and the search keeps the pitch within PITCH_SEARCH_TOL of it. None: every voice
    is scored at its own pitch and the pitch is searched from 1.0 within F0_RANGE.
    search_formant: False keeps the formant scale at 1 (the scorer then always gets 1.0).
    patience: generations in a row without improvement after which the ES stops early.
    formant_limits: per bundled voice, the (low, high) formant scales allowed on it as the base voice
    (formant.formant_range: a female voice's formants rise at most x1.035); default formant.FORMANT_RANGE.
    """
    if not voices:
        raise ValueError("voice imitation needs at least one bundled voice")
    rng = np.random.default_rng(seed)
    calls = 0
    if pitch_match:
        candidates = pitch_candidates(pitch_match, list(voices))
        centre = {n: float(np.clip(pitch_match.get(n, 1.0), *PITCH_HARD)) for n in candidates}
    else:
        candidates, centre = list(voices), {n: 1.0 for n in voices}
    total = max(budget, len(candidates))

    def evaluate_many(batch: list[Candidate]) -> list[float]:
        nonlocal calls
        values = score_batch(score, batch)
        for _ in values:
            calls += 1
            if progress:
                progress(min(calls, total), total)
        return values

    voice_scores = dict(zip(candidates, evaluate_many([(voices[n], centre[n], 1.0) for n in candidates])))
    ranked = sorted(candidates, key=voice_scores.get, reverse=True)
    base_name = ranked[0]
    base = np.asarray(voices[base_name], np.float32)
    best, best_f0 = voice_scores[base_name], centre[base_name]
    if pitch_match:
        f0_lo, f0_hi = best_f0 / PITCH_SEARCH_TOL, best_f0 * PITCH_SEARCH_TOL
    else:
        f0_lo, f0_hi = F0_RANGE
    history = [best]
    best_formant = 1.0
    limits = (formant_limits or {}).get(base_name, FORMANT_RANGE)
    if search_formant:
        best, best_formant = _formant_line_search(
            lambda formants: evaluate_many([(base, best_f0, f) for f in formants]), best, lambda: budget - calls,
            history, limits)

    base_timbre = _timbre(base)
    spread, low, high = timbre_statistics(voices)
    # The offset may move each dim anywhere inside the bundled voices' range, plus a small margin.
    lo_bound, hi_bound = (low - 0.25 * spread) - base_timbre, (high + 0.25 * spread) - base_timbre

    best_offset = np.zeros(128, np.float32)
    # blends towards the runners-up: cheap, stay on the voice manifold
    blends = [0.5 * (_timbre(voices[other]) - base_timbre) for other in ranked[1:3]][:max(0, budget - calls)]
    for offset, value in zip(blends, evaluate_many([(apply_offset(base, o), best_f0, best_formant)
                                                    for o in blends])):
        if value > best:
            best, best_offset = value, offset.astype(np.float32)
        history.append(best)

    sigma = 0.5
    formant_step = FORMANT_STEP if search_formant else 0.0
    stalled = 0
    while calls + 1 <= budget and stalled < patience:
        brood = []  # drawn before any is scored: the scores never steer the draws within a generation
        for _ in range(min(population, budget - calls)):
            step = rng.standard_normal(128).astype(np.float32) * spread * sigma
            child = np.clip(best_offset + step, lo_bound, hi_bound).astype(np.float32)
            child_f0 = float(np.clip(best_f0 * float(np.exp(rng.standard_normal() * F0_STEP * sigma)), f0_lo, f0_hi))
            child_formant = clip_formant(best_formant * float(np.exp(rng.standard_normal() * formant_step * sigma)),
                                         limits)
            brood.append((child, child_f0, child_formant))
        values = evaluate_many([(apply_offset(base, c), f0, fm) for c, f0, fm in brood])
        children = [(v, c, f0, fm) for v, (c, f0, fm) in zip(values, brood)]
        value, child, child_f0, child_formant = max(children, key=lambda item: item[0])
        if value > best:
            best, best_offset, best_f0, best_formant = value, child, child_f0, child_formant
            sigma = min(sigma * 1.3, 1.5)
            stalled = 0
        else:
            sigma = max(sigma * 0.7, 0.05)
            stalled += 1
        history.append(best)
    if progress and calls < total:  # stopped early: the bar still ends full
        progress(total, total)

    return ImitationResult(base_voice=base_name, timbre_offset=best_offset, f0_scale=best_f0, similarity=best,
                           base_similarity=max(voice_scores.values()), voice_scores=voice_scores,
                           evaluations=calls, history=history, formant_scale=best_formant)


def _formant_line_search(score_at: Callable[[list[float]], list[float]], best: float,
                         calls_left: Callable[[], int], history: list[float],
                         limits: tuple[float, float] = FORMANT_RANGE) -> tuple[float, float]:
    """(best score, formant scale): one step down and up from 1 (scored together), then further along
    the winner, within `limits` (a step the limits bring back to 1 is not scored again).
    score_at(formant scales) -> their scores.

    A line search before the ES because the formant scale moves the score more per step than any
    single timbre dim, and the ES's random steps in 130 dims rarely isolate it.
    """
    best_formant = 1.0
    wanted = [f for f in dict.fromkeys(clip_formant(f, limits) for f in (1 / FORMANT_LINE_STEP, FORMANT_LINE_STEP))
              if f != 1.0]
    steps = wanted[:max(0, calls_left())]
    for formant, value in zip(steps, score_at(steps) if steps else []):
        if value > best:
            best, best_formant = value, formant
        history.append(best)
    if len(steps) < len(wanted):  # the budget ran out
        return best, best_formant
    if best_formant != 1.0 and calls_left() > 0:
        further = clip_formant(best_formant * (FORMANT_LINE_STEP if best_formant > 1 else 1 / FORMANT_LINE_STEP),
                               limits)
        if further != best_formant:
            value = score_at([further])[0]
            if value > best:
                best, best_formant = value, further
            history.append(best)
    return best, best_formant
