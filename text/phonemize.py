"""Text -> list of phoneme chunks ready for Kokoro: the one entry point of the text frontend.

Pipeline: check input -> detect language -> normalise (numbers, dates, units ...) -> split into
sentences -> phonemise each script run with its own G2P -> re-split any sentence longer than
the model limit -> keep only symbols in Kokoro's vocabulary, reporting what was dropped.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .chunking import split_oversized, split_sentences
from .g2p_en import g2p_en
from .g2p_zh import g2p_zh
from .language import SUPPORTED, UnsupportedLanguageError, detect_language, split_by_script
from .normalize_en import normalize_en
from .normalize_zh import normalize_zh
from .tokens import MAX_PHONEMES, load_vocab


class EmptyTextError(ValueError):
    """The text is empty or only whitespace."""


class NothingSpeakableError(ValueError):
    """After normalisation nothing is left that can be spoken (only emoji, symbols ...)."""


@dataclass
class PhonemeChunk:
    text: str            # the normalised text this chunk speaks
    phonemes: str        # Kokoro phonemes, every char in the vocabulary, len <= MAX_PHONEMES
    lang: str            # 'en' or 'zh'
    pause_after_s: float  # silence to insert after this chunk
    unknown: list[str] = field(default_factory=list)   # dropped input chars / symbols
    guessed: list[str] = field(default_factory=list)   # English words not in the lexicon


_NORMALIZERS = {"en": normalize_en, "zh": normalize_zh}
_SPEAKABLE = re.compile(r"[^\s;:,.!?—…\"“”()]")


def _g2p_piece(text: str, primary: str) -> tuple[str, list[str], list[str]]:
    """Phonemise normalised text; Han runs use the Mandarin G2P, the rest the English one."""
    parts, unknown, guessed = [], [], []
    for lang, run in split_by_script(text):
        if lang == "zh":
            if primary != "zh":
                run = normalize_zh(run)
            ps, unk = g2p_zh(run)
            guess: list[str] = []
        else:
            if primary != "en":  # English words inside Chinese: abbreviations, symbols
                run = normalize_en(run)
            ps, unk, guess = g2p_en(run)
        parts.append(ps)
        unknown += unk
        guessed += guess
    out = re.sub(r"\s+", " ", " ".join(p for p in parts if p)).strip()
    out = re.sub(r" ([,.!?;:…”)])", r"\1", out)
    return out, unknown, guessed


def primary_language(text: str, lang: str) -> str:
    """The language `text` is read in ('en'/'zh'), after the checks every engine shares: a non-empty
    str and a supported `lang` ('auto' = detected; unsupported scripts are refused either way)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not text.strip():
        raise EmptyTextError("text is empty; type the sentence(s) the voice should speak")
    if lang not in ("auto", *SUPPORTED):
        raise ValueError(f"lang must be 'auto', 'en' or 'zh', got {lang!r}")
    detected = detect_language(text)  # also refuses unsupported scripts when lang is given
    return detected if lang == "auto" else lang


def phonemize(text: str, lang: str = "auto", max_phonemes: int = MAX_PHONEMES) -> list[PhonemeChunk]:
    """Turn text into speakable Kokoro phoneme chunks.

    lang: 'auto' (detect), 'en' or 'zh' (how numbers etc. are read; Han characters are always
    read as Mandarin and Latin words as English). Raises EmptyTextError,
    UnsupportedLanguageError, NothingSpeakableError (all ValueError).
    """
    primary = primary_language(text, lang)
    normalised = _NORMALIZERS[primary](text)
    vocab = load_vocab()

    cache: dict[str, tuple[str, list[str], list[str]]] = {}

    def g2p(piece: str) -> tuple[str, list[str], list[str]]:
        if piece not in cache:
            cache[piece] = _g2p_piece(piece, primary)
        return cache[piece]

    chunks: list[PhonemeChunk] = []
    all_unknown: list[str] = []
    for sent in split_sentences(normalised):
        pieces = split_oversized(sent.text, lambda s: len(g2p(s)[0]), max_phonemes, sent.pause_after_s)
        for piece in pieces:
            ps, unknown, guessed = g2p(piece.text)
            unknown = list(unknown)
            kept = "".join(c for c in ps if c in vocab)
            unknown += [c for c in ps if c not in vocab]
            all_unknown += unknown
            if not _SPEAKABLE.search(kept):
                # Nothing to say here: keep the pause on the previous chunk, if any.
                if chunks:
                    chunks[-1].pause_after_s = max(chunks[-1].pause_after_s, piece.pause_after_s)
                    chunks[-1].unknown += unknown
                continue
            for j, start in enumerate(range(0, len(kept), max_phonemes)):
                # Only a single unbreakable word can still be too long; cut it hard.
                part = kept[start:start + max_phonemes].strip()
                last = start + max_phonemes >= len(kept)
                chunks.append(PhonemeChunk(
                    text=piece.text, phonemes=part, lang=_chunk_lang(piece.text, primary),
                    pause_after_s=piece.pause_after_s if last else 0.0,
                    unknown=unknown if j == 0 else [], guessed=list(guessed) if j == 0 else []))
    if not chunks:
        shown = "".join(dict.fromkeys(all_unknown))[:40]
        raise NothingSpeakableError(
            f"nothing speakable in the text {text[:60]!r}"
            + (f" (dropped characters: {shown!r})" if shown else "")
            + "; write words, not only symbols or emoji")
    chunks[-1].pause_after_s = 0.0
    return chunks


def _chunk_lang(text: str, primary: str) -> str:
    try:
        return detect_language(text)
    except UnsupportedLanguageError:
        return primary
