"""The imitation search itself, on a scorer with a known optimum (the real scorer needs the models)."""
import numpy as np

from digital_human.voice.imitation import apply_offset, imitate, timbre_statistics


def _voices(rng):
    return {f"v{i}": rng.standard_normal((510, 1, 256)).astype(np.float32) * 0.1 + i * 0.05 for i in range(5)}


def test_search_beats_best_bundled_voice_and_respects_budget():
    rng = np.random.default_rng(0)
    voices = _voices(rng)
    spread, low, high = timbre_statistics(voices)
    target = (low + high) / 2 + 0.3 * spread  # a timbre between the bundled voices

    def score(pack, f0):
        timbre = pack.reshape(-1, 256)[:, :128].mean(axis=0)
        return float(-np.linalg.norm((timbre - target) / spread) - 5 * abs(np.log(f0 / 1.2)))

    result = imitate(voices, score, budget=40, seed=1, pitch_match={name: 1.2 for name in voices})
    assert result.evaluations <= 40
    assert result.similarity > result.base_similarity
    assert result.base_similarity == max(result.voice_scores.values())
    assert np.all(np.diff(result.history) >= 0)  # best-so-far never gets worse
    assert abs(result.f0_scale - 1.2) < 0.08  # pitch matching found the target pitch


def test_offset_touches_only_timbre_half_and_strength_scales_it():
    rng = np.random.default_rng(2)
    pack = rng.standard_normal((510, 1, 256)).astype(np.float32)
    offset = np.ones(128, np.float32)
    moved = apply_offset(pack, offset)
    assert np.allclose(moved[..., 128:], pack[..., 128:])
    assert np.allclose(moved[..., :128] - pack[..., :128], 1.0)
    voices = _voices(rng)
    result = imitate(voices, lambda p, f0: float(p[..., :128].mean()), budget=12)
    half = result.apply(voices[result.base_voice], strength=0.5)
    assert np.allclose(half[..., :128] - voices[result.base_voice][..., :128], result.timbre_offset * 0.5, atol=1e-6)
