"""Which language is this text, and where do Chinese and Latin runs start and stop.

Only English and Mandarin are supported (the phoneme sets Kokoro v1.0 was trained on that we can
produce offline). Text written mostly in another script is refused with a clear error instead of
being read out as silence or garbage.
"""
from __future__ import annotations

import unicodedata

SUPPORTED = ("en", "zh")


class UnsupportedLanguageError(ValueError):
    """The text is written in a language the TTS cannot speak."""


def _is_han(c: str) -> bool:
    o = ord(c)
    return (0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2A6DF
            or 0xF900 <= o <= 0xFAFF or o == 0x3007)  # 〇


# Script of a letter -> the language we name in the error. Ranges are Unicode blocks.
_OTHER_SCRIPTS = (
    (0x3040, 0x30FF, "Japanese (kana)"), (0x31F0, 0x31FF, "Japanese (kana)"),
    (0xFF66, 0xFF9F, "Japanese (kana)"),
    (0xAC00, 0xD7AF, "Korean (Hangul)"), (0x1100, 0x11FF, "Korean (Hangul)"),
    (0x3130, 0x318F, "Korean (Hangul)"),
    (0x0400, 0x052F, "Cyrillic (e.g. Russian)"), (0x0370, 0x03FF, "Greek"),
    (0x0590, 0x05FF, "Hebrew"), (0x0600, 0x06FF, "Arabic"), (0x0750, 0x077F, "Arabic"),
    (0x0900, 0x097F, "Devanagari (e.g. Hindi)"), (0x0E00, 0x0E7F, "Thai"),
    (0x0980, 0x09FF, "Bengali"), (0x0A80, 0x0AFF, "Gujarati"), (0x0B80, 0x0BFF, "Tamil"),
    (0x10A0, 0x10FF, "Georgian"), (0x0530, 0x058F, "Armenian"),
)


def script_of(c: str) -> str:
    """'han', 'latin', 'digit', or the name of another script; 'other' for punctuation/symbols."""
    if _is_han(c):
        return "han"
    if c.isdigit():
        return "digit"
    o = ord(c)
    if c.isalpha():
        if o < 0x250 or 0x1E00 <= o <= 0x1EFF or 0xFF21 <= o <= 0xFF5A:
            return "latin"
        for lo, hi, name in _OTHER_SCRIPTS:
            if lo <= o <= hi:
                return name
        return unicodedata.name(c, "unknown script").split(" ")[0].capitalize()
    if 0x3040 <= o <= 0x30FF:  # the kana prolonged sound mark is not alpha
        return "Japanese (kana)"
    return "other"


def detect_language(text: str) -> str:
    """Return 'zh' or 'en' for the main language of `text`.

    Han characters count about three Latin letters each (one syllable), so a Chinese sentence
    with a brand name stays 'zh' and an English sentence quoting one Chinese name stays 'en'.
    Raises UnsupportedLanguageError when letters of another script dominate, e.g. Japanese
    (any real amount of kana), Korean, Russian or Arabic.
    """
    counts: dict[str, int] = {}
    for c in text:
        s = script_of(c)
        counts[s] = counts.get(s, 0) + 1
    han, latin = counts.get("han", 0), counts.get("latin", 0)
    others = {k: v for k, v in counts.items() if k not in ("han", "latin", "digit", "other")}
    kana = others.get("Japanese (kana)", 0)
    # Japanese mixes Han and kana; even a few kana among Han means it is not Chinese.
    if kana and kana >= 0.1 * (han + kana):
        _refuse("Japanese (kana)")
    weight_supported = han * 3 + latin
    if others:
        name, n = max(others.items(), key=lambda kv: kv[1])
        if n * (3 if name.startswith(("Japanese", "Korean")) else 1) > weight_supported:
            _refuse(name)
    if han * 3 >= latin and han > 0:
        return "zh"
    return "en"


def _refuse(found: str) -> None:
    raise UnsupportedLanguageError(
        f"text looks like {found}, which this TTS cannot speak; supported languages are "
        f"English ('en') and Mandarin Chinese ('zh'). Translate the text or pick another voice model."
    )


def split_by_script(text: str) -> list[tuple[str, str]]:
    """Cut text into ('zh', run) and ('en', run) pieces.

    Han characters form 'zh' runs; everything else ('en') is read by the English G2P.
    Punctuation and spaces join the run before them so a Chinese comma stays with the Chinese
    clause it ends; a run of only punctuation at the start joins the first real run.
    """
    runs: list[list[str]] = []  # [lang, text]
    pending = ""
    for c in text:
        s = script_of(c)
        lang = "zh" if s == "han" else "en" if s in ("latin", "digit") else None
        if lang is None:  # neutral char: attach to the current run
            if runs:
                runs[-1][1] += c
            else:
                pending += c
            continue
        if runs and runs[-1][0] == lang:
            runs[-1][1] += c
        else:
            runs.append([lang, pending + c])
            pending = ""
    if pending:
        if runs:
            runs[-1][1] += pending
        else:
            runs.append(["en", pending])
    return [(lang, t) for lang, t in runs]
