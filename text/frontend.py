"""What every TTS engine shares: validation, language, normalisation and sentence chunking.

Engine-specific tokenisation (Kokoro's G2P, CosyVoice's Qwen BPE) lives with the engine; it only
supplies `measure` (the length of a piece in its own tokens) and its per-chunk limit.
"""
from __future__ import annotations

from typing import Callable

from .chunking import TextChunk, split_oversized, split_sentences
from .phonemize import _NORMALIZERS, primary_language


def text_chunks(text: str, lang: str, measure: Callable[[str], int], max_len: int) -> tuple[str, list[TextChunk]]:
    """(language used, normalised sentence chunks each within max_len of `measure`)."""
    primary = primary_language(text, lang)
    chunks: list[TextChunk] = []
    for sentence in split_sentences(_NORMALIZERS[primary](text)):
        chunks += split_oversized(sentence.text, measure, max_len, sentence.pause_after_s)
    return primary, chunks
