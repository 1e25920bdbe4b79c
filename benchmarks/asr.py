"""Offline English speech recognition and word error rate, for the voice benchmark's intelligibility check.

The recogniser is pocketsphinx 5 (BSD-2-Clause) with the US-English acoustic model, language model
and dictionary that ship inside its PyPI wheel, so nothing is downloaded. Its absolute WER is high
(it is a 2010s HMM recogniser), which is fine here: the benchmark compares the SAME recogniser on
the same sentences spoken by two voices, and only the difference matters.
"""
from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

import numpy as np

ASR_SAMPLE_RATE = 16000

_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
         "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
         "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = [(10**9, "billion"), (10**6, "million"), (1000, "thousand"), (100, "hundred")]


def number_to_words(n: int) -> list[str]:
    """Cardinal number as English words ("101" -> one hundred one), as the recogniser's dictionary spells them."""
    if n < 0:
        return ["minus", *number_to_words(-n)]
    if n < 20:
        return [_ONES[n]]
    if n < 100:
        tens, ones = divmod(n, 10)
        return [_TENS[tens]] + ([_ONES[ones]] if ones else [])
    for value, name in _SCALES:
        if n >= value:
            head, rest = divmod(n, value)
            return number_to_words(head) + [name] + (number_to_words(rest) if rest else [])
    raise AssertionError("unreachable")


def normalize_text(text: str) -> list[str]:
    """Lowercase words without punctuation; digits become words; apostrophes inside words are kept."""
    text = unicodedata.normalize("NFKC", text).lower().replace("\u2019", "'")
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text)  # 1,000 -> 1000
    words: list[str] = []
    for token in re.findall(r"[a-z0-9']+", text):
        token = token.strip("'")
        if not token:
            continue
        # Split letter/digit runs ("3d" -> 3 d) so numbers inside tokens are spelled out too.
        for part in re.findall(r"\d+|[a-z']+", token):
            words.extend(number_to_words(int(part)) if part.isdigit() else [part])
    return words


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    """Word-level Levenshtein distance (substitutions + deletions + insertions)."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate of `hypothesis` against `reference` after normalize_text (may exceed 1)."""
    ref, hyp = normalize_text(reference), normalize_text(hypothesis)
    if not ref:
        raise ValueError("reference transcript has no words after normalisation; give a non-empty sentence")
    return edit_distance(ref, hyp) / len(ref)


def corpus_wer(references: list[str], hypotheses: list[str]) -> float:
    """Total edits / total reference words over several utterances (weights long sentences more)."""
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    refs = [normalize_text(r) for r in references]
    words = sum(len(r) for r in refs)
    if words == 0:
        raise ValueError("references have no words")
    return sum(edit_distance(r, normalize_text(h)) for r, h in zip(refs, hypotheses)) / words


@lru_cache(maxsize=1)
def _decoder():
    try:
        from pocketsphinx import Decoder
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("the WER benchmark needs pocketsphinx: pip install pocketsphinx") from exc
    # Defaults = the wheel's en-us acoustic model, en-us.lm.bin and cmudict; loglevel quiets the C logs.
    return Decoder(samprate=ASR_SAMPLE_RATE, loglevel="FATAL")


def transcribe(waveform: np.ndarray, sample_rate: int) -> str:
    """English transcript of a mono waveform (any rate; resampled to 16 kHz)."""
    wav = np.asarray(waveform, dtype=np.float32)
    if wav.ndim != 1 or wav.size == 0:
        raise ValueError(f"transcribe needs a non-empty mono waveform, got shape {wav.shape}")
    if sample_rate != ASR_SAMPLE_RATE:
        import librosa

        wav = librosa.resample(wav, orig_sr=sample_rate, target_sr=ASR_SAMPLE_RATE)
    peak = float(np.abs(wav).max())
    if peak > 0:  # recogniser's features assume a sensible level; peak-normalise to -1 dBFS
        wav = wav * (0.89 / peak)
    pcm = (np.clip(wav, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
    decoder = _decoder()
    decoder.start_utt()
    decoder.process_raw(pcm, full_utt=True)
    decoder.end_utt()
    hyp = decoder.hyp()
    return hyp.hypstr if hyp is not None else ""
