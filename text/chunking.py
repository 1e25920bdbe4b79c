"""Split long text into pieces Kokoro can speak in one pass, with the pause after each.

Sentences are the natural unit (Kokoro's prosody is sentence-shaped). A sentence whose phonemes
exceed the model limit is split at clause punctuation, then, as a last resort, between words.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

PAUSE_SENTENCE_S = 0.35
PAUSE_PARAGRAPH_S = 0.6
PAUSE_CLAUSE_S = 0.15   # a comma split we forced because the sentence was too long
PAUSE_WORD_S = 0.05     # a split inside a clause: keep it short so the phrase still flows


@dataclass(frozen=True)
class TextChunk:
    text: str
    pause_after_s: float


# Sentence ends: . ! ? (not inside numbers or after a single capital initial), CJK ends anywhere.
_SENT_END = re.compile(
    r"(?:(?<!\b[A-Z])[.!?]+[\"”’)]*(?=\s|$)|[!?]+[\"”’)]*|[。！？；…]+[\"”’」』)）]*)"
)
_CLAUSE_END = re.compile(r"[,;:，、；：—]+\s*")


def split_sentences(text: str) -> list[TextChunk]:
    """Sentences with PAUSE_SENTENCE_S after each, PAUSE_PARAGRAPH_S at paragraph breaks.

    A single newline ends a sentence; a blank line ends a paragraph. The last piece gets 0 s.
    """
    out: list[TextChunk] = []
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    for pi, para in enumerate(paragraphs):
        lines = [ln for ln in para.split("\n") if ln.strip()]
        pieces: list[str] = []
        for line in lines:
            start = 0
            for m in _SENT_END.finditer(line):
                pieces.append(line[start:m.end()])
                start = m.end()
            pieces.append(line[start:])
        pieces = [p.strip() for p in pieces if p.strip()]
        pieces = _merge_punct_only(pieces)
        for i, p in enumerate(pieces):
            last_in_para = i == len(pieces) - 1
            pause = PAUSE_PARAGRAPH_S if last_in_para else PAUSE_SENTENCE_S
            out.append(TextChunk(p, pause))
    if out:
        out[-1] = TextChunk(out[-1].text, 0.0)
    return out


def _merge_punct_only(pieces: list[str]) -> list[str]:
    """Glue pieces without any letter or digit (a stray '!!' or '”') to the previous one."""
    merged: list[str] = []
    for p in pieces:
        if merged and not any(c.isalnum() for c in p):
            merged[-1] += p
        else:
            merged.append(p)
    return merged


def split_oversized(text: str, measure: Callable[[str], int], max_len: int,
                    pause_after_s: float) -> list[TextChunk]:
    """Split one sentence so that measure(piece) <= max_len for every piece.

    `measure` returns the phoneme length of a piece of text. Clause splits get PAUSE_CLAUSE_S,
    word splits PAUSE_WORD_S; the last piece keeps the sentence's own pause.
    """
    if measure(text) <= max_len:
        return [TextChunk(text, pause_after_s)]
    clauses = [c for c in re.split(r"(?<=[,;:，、；：—])\s*", text) if c.strip()]
    pieces: list[tuple[str, float]] = []
    for clause in clauses:
        if measure(clause) <= max_len:
            pieces.append((clause, PAUSE_CLAUSE_S))
        else:
            words = _split_words(clause, measure, max_len)
            pieces += [(w, PAUSE_WORD_S) for w in words[:-1]] + [(words[-1], PAUSE_CLAUSE_S)]
    # Greedily re-join neighbours while they fit: fewer, longer chunks sound more natural.
    out: list[TextChunk] = []
    cur, cur_pause = "", 0.0
    for piece, pause in pieces:
        joined = f"{cur} {piece}".strip() if cur and _needs_space(cur, piece) else cur + piece
        if cur and measure(joined) > max_len:
            out.append(TextChunk(cur.strip(), cur_pause))
            cur = piece
        else:
            cur = joined
        cur_pause = pause
    out.append(TextChunk(cur.strip(), pause_after_s))
    return out


def _needs_space(a: str, b: str) -> bool:
    return a[-1].isascii() or b[0].isascii()


def _split_words(clause: str, measure: Callable[[str], int], max_len: int) -> list[str]:
    """Cut a clause between words (spaces; single characters for Chinese) to fit max_len."""
    units = clause.split() if " " in clause.strip() else list(clause)
    sep = " " if " " in clause.strip() else ""
    out: list[str] = []
    cur = ""
    for u in units:
        cand = f"{cur}{sep}{u}" if cur else u
        if cur and measure(cand) > max_len:
            out.append(cur)
            cur = u
        else:
            cur = cand
    if cur:
        out.append(cur)
    return out


# --- live mode: a short first piece -------------------------------------------------------------------------
FIRST_PIECE_WORDS = 6      # a first sentence up to this many words is spoken whole
FIRST_PIECE_MIN_WORDS = 3  # never fewer words before the cut (prosody needs a phrase), nor after it
# a cut before these words falls between phrases ("The package will arrive | on Monday morning")
_PHRASE_STARTS = frozenset("and but or so because if when while which that who on in at to for with from "
                           "after before until about by".split())


def split_first_piece(chunks: list[TextChunk], max_words: int = FIRST_PIECE_WORDS,
                      min_words: int = FIRST_PIECE_MIN_WORDS) -> list[TextChunk]:
    """`chunks` with the first one cut short, so the speech can start after the synthesis of a few words (live
    mode: the time to the first audio grows with the first piece's length). A first sentence of more than
    `max_words` words is cut at its first clause mark (comma, semicolon, colon, dash) with at least `min_words`
    words on each side, else before the first phrase-starting word (a preposition or conjunction) in the same
    range, else after `max_words - 2` words; the cut gets PAUSE_CLAUSE_S at a clause mark, PAUSE_WORD_S inside a
    clause. Text without spaces (Chinese) is cut at its first clause mark only. Later chunks are unchanged."""
    if not chunks:
        return chunks
    first, rest = chunks[0], list(chunks[1:])
    words = first.text.split()
    if len(words) <= max_words or len(words) < 2 * min_words:
        return _split_cjk_first(first, min_words) + rest if len(words) == 1 else chunks
    limit = len(words) - min_words  # the cut falls after word index cut-1, cut in [min_words, limit]
    cut, pause = None, PAUSE_WORD_S
    for i in range(min_words, min(limit, max_words + 2) + 1):
        if _CLAUSE_END.fullmatch(words[i - 1][-1:]):
            cut, pause = i, PAUSE_CLAUSE_S
            break
    if cut is None:
        cut = next((i for i in range(min_words, min(limit, max_words) + 1)
                    if words[i].lower().strip("\"'“‘(") in _PHRASE_STARTS), None)
    if cut is None:
        cut = min(max(min_words, max_words - 2), limit)
    return [TextChunk(" ".join(words[:cut]), pause), TextChunk(" ".join(words[cut:]), first.pause_after_s)] + rest


def _split_cjk_first(chunk: TextChunk, min_chars: int) -> list[TextChunk]:
    """A first sentence without spaces (Chinese): cut at its first clause mark after min_chars * 2 characters."""
    text = chunk.text
    for m in _CLAUSE_END.finditer(text):
        if m.end() >= 2 * min_chars and len(text) - m.end() >= 2 * min_chars:
            return [TextChunk(text[:m.end()].strip(), PAUSE_CLAUSE_S), TextChunk(text[m.end():].strip(),
                                                                                 chunk.pause_after_s)]
    return [chunk]
