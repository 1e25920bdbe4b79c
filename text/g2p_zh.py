"""Mandarin G2P: Han text -> Kokoro v1.0 Mandarin phonemes.

Kokoro v1.0's Chinese voices were trained on misaki's ZHG2P "legacy" output (jieba words,
pypinyin TONE3 syllables, pinyin -> IPA with tone arrows ↓ ↗ ↘ →). We call misaki's own
pinyin->IPA conversion (misaki, Apache-2.0, imported without its English/spaCy parts) so the
symbols match training exactly, and do the word segmentation and punctuation ourselves so that
unknown characters are reported instead of passing through.
"""
from __future__ import annotations

import logging
import re
from functools import lru_cache

# Chinese punctuation -> the ASCII/curly punctuation Kokoro knows (as misaki maps it).
_PUNCT = {
    "、": ",", "，": ",", "。": ".", "．": ".", "！": "!", "：": ":", "；": ";", "？": "?",
    "«": "“", "»": "”", "《": "“", "》": "”", "「": "“", "」": "”", "『": "“", "』": "”",
    "【": "“", "】": "”", "（": "(", "）": ")", "…": "…", "—": "—", "～": "—", "·": " ",
    ",": ",", ".": ".", "!": "!", "?": "?", ";": ";", ":": ":", "(": "(", ")": ")",
    "\"": "\"", "“": "“", "”": "”", "'": "", "‘": "“", "’": "”",
}
_HAN_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3007]+")


@lru_cache(maxsize=1)
def _backend():
    try:
        import jieba
        from misaki.zh import ZHG2P
    except ImportError as e:  # name the packages, not just the module
        raise ImportError(
            "Mandarin text needs the packages misaki, jieba, pypinyin, cn2an and ordered-set: "
            "pip install 'misaki==0.9.4' jieba pypinyin cn2an ordered-set"
        ) from e
    jieba.setLogLevel(logging.WARNING)  # jieba prints its dictionary build to stderr otherwise
    return jieba, ZHG2P


@lru_cache(maxsize=20000)
def _word_ipa(word: str) -> tuple[str, tuple[str, ...]]:
    """Phonemes of one jieba word, and the characters that could not be read."""
    _, zhg2p = _backend()
    try:
        # misaki's legacy path drops U+032F (non-syllabic mark); Kokoro's vocab lacks it.
        return zhg2p.word2ipa(word).replace("\u032f", ""), ()
    except Exception:  # a rare char pypinyin has no reading for: go char by char
        out, unknown = [], []
        for ch in word:
            try:
                out.append(zhg2p.word2ipa(ch).replace("\u032f", ""))
            except Exception:
                unknown.append(ch)
        return "".join(out), tuple(unknown)


def g2p_zh(text: str) -> tuple[str, list[str]]:
    """Phonemise a Chinese run (Han characters and punctuation).

    Returns (phonemes, unknown characters). Non-Han letters should not reach here; split mixed
    text with language.split_by_script first.
    """
    jieba, _ = _backend()
    parts: list[str] = []
    unknown: list[str] = []
    pos = 0
    for m in _HAN_RUN.finditer(text):
        parts.append(_punct(text[pos:m.start()], unknown))
        words = [w for w in jieba.lcut(m.group(0), cut_all=False) if w.strip()]
        ipa = []
        for w in words:
            p, unk = _word_ipa(w)
            unknown.extend(unk)
            if p:
                ipa.append(p)
        parts.append(" ".join(ipa))
        pos = m.end()
    parts.append(_punct(text[pos:], unknown))
    out = "".join(parts)
    out = re.sub(r"\s+", " ", out)
    out = re.sub(r" ([,.!?;:…”)])", r"\1", out)
    out = re.sub(r"([,.!?;:…”)])(?=[^\s,.!?;:…”)\"])", r"\1 ", out)
    return out.strip(), unknown


def _punct(s: str, unknown: list[str]) -> str:
    out = []
    for c in s:
        if c.isspace():
            out.append(" ")
        elif c in _PUNCT:
            out.append(_PUNCT[c])
        else:
            unknown.append(c)
    return "".join(out)
