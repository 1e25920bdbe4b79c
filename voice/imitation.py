"""Voice imitation: find a Kokoro style vector whose speech sounds like the reference speaker.

Kokoro's 256-dim style splits into a timbre half (dims 0-127, read by the decoder/vocoder) and a
prosody half (dims 128-255, read by the duration/pitch predictor). DESIGN.md records that moving
the timbre half towards the speaker, scored by GE2E similarity, raised similarity on unseen text,
while touching the prosody half or rewriting spectra hurt intelligibility. So this search:

1. scores every bundled voice (the "best bundled voice" baseline),
2. tries timbre blends of the best voice with the runners-up,
3. runs a (1+lambda) evolution strategy on the timbre half only, with per-dimension step sizes
   taken from the spread of the bundled voices and the offset clamped to their range, so the
   result stays inside the space the decoder was trained on (keeps words intelligible).

The scorer is a callable (style pack -> similarity) so the search is independent of which backend
synthesizes and embeds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

TIMBRE = slice(0, 128)


@dataclass
class ImitationResult:
    base_voice: str
    timbre_offset: np.ndarray  # [128], added to the base voice's timbre half at every length row
    similarity: float  # GE2E cosine of the probe speech to the reference
    base_similarity: float  # best bundled voice on the same probe
    voice_scores: dict[str, float] = field(default_factory=dict)
    evaluations: int = 0
    history: list[float] = field(default_factory=list)

    def apply(self, base_pack: np.ndarray, strength: float = 1.0) -> np.ndarray:
        """The imitated voice pack ([rows, 1, 256]); strength 0 = base voice, 1 = full imitation."""
        return apply_offset(base_pack, self.timbre_offset * float(strength))


def apply_offset(pack: np.ndarray, offset: np.ndarray) -> np.ndarray:
    out = np.array(pack, dtype=np.float32, copy=True)
    out[..., TIMBRE] += offset.astype(np.float32)
    return out


def timbre_statistics(voices: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-dim spread, min and max of the bundled voices' timbre halves (averaged over length rows)."""
    timbres = np.stack([np.asarray(v, np.float32).reshape(-1, 256)[:, TIMBRE].mean(axis=0) for v in voices.values()])
    spread = timbres.std(axis=0) + 1e-3
    return spread, timbres.min(axis=0), timbres.max(axis=0)


def imitate(voices: dict[str, np.ndarray], score: Callable[[np.ndarray], float], budget: int = 24,
            seed: int = 0, population: int = 4, progress: Callable[[int, int], None] | None = None) -> ImitationResult:
    """Search the timbre offset that maximises `score(pack)`; uses at most `budget` score calls."""
    if not voices:
        raise ValueError("voice imitation needs at least one bundled voice")
    rng = np.random.default_rng(seed)
    calls = 0

    def evaluate(pack: np.ndarray) -> float:
        nonlocal calls
        calls += 1
        value = float(score(pack))
        if progress:
            progress(calls, max(budget, len(voices)))
        return value

    voice_scores = {name: evaluate(pack) for name, pack in voices.items()}
    ranked = sorted(voice_scores, key=voice_scores.get, reverse=True)
    base_name = ranked[0]
    base = np.asarray(voices[base_name], np.float32)
    base_timbre = base.reshape(-1, 256)[:, TIMBRE].mean(axis=0)
    spread, low, high = timbre_statistics(voices)
    # The offset may move each dim anywhere inside the bundled voices' range, plus a small margin.
    lo_bound, hi_bound = (low - 0.25 * spread) - base_timbre, (high + 0.25 * spread) - base_timbre

    best_offset = np.zeros(128, np.float32)
    best = voice_scores[base_name]
    history = [best]

    for other in ranked[1:3]:  # blends towards the runners-up: cheap, stay on the voice manifold
        if calls >= budget:
            break
        other_timbre = np.asarray(voices[other], np.float32).reshape(-1, 256)[:, TIMBRE].mean(axis=0)
        offset = 0.5 * (other_timbre - base_timbre)
        value = evaluate(apply_offset(base, offset))
        if value > best:
            best, best_offset = value, offset.astype(np.float32)
        history.append(best)

    sigma = 0.5
    while calls + 1 <= budget:
        children = []
        for _ in range(min(population, budget - calls)):
            step = rng.standard_normal(128).astype(np.float32) * spread * sigma
            child = np.clip(best_offset + step, lo_bound, hi_bound).astype(np.float32)
            children.append((evaluate(apply_offset(base, child)), child))
        value, child = max(children, key=lambda pair: pair[0])
        if value > best:
            best, best_offset = value, child
            sigma = min(sigma * 1.3, 1.5)
        else:
            sigma = max(sigma * 0.7, 0.05)
        history.append(best)

    return ImitationResult(base_voice=base_name, timbre_offset=best_offset, similarity=best,
                           base_similarity=voice_scores[base_name], voice_scores=voice_scores,
                           evaluations=calls, history=history)
