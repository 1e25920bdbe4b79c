"""Word error rate and text normalisation of the voice benchmark (benchmarks/asr.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not part of the pack

from benchmarks.asr import corpus_wer, edit_distance, normalize_text, number_to_words, wer  # noqa: E402


def test_normalisation_lowercases_strips_punctuation_and_spells_numbers():
    assert normalize_text("Hello, World! It's 7 o'clock.") == ["hello", "world", "it's", "seven", "o'clock"]
    assert normalize_text("We sold 1,250 boats") == ["we", "sold", "one", "thousand", "two", "hundred", "fifty", "boats"]
    assert normalize_text("\u2018Quoted\u2019 don\u2019t") == ["quoted", "don't"]


@pytest.mark.parametrize("n, words", [
    (0, "zero"), (13, "thirteen"), (40, "forty"), (99, "ninety nine"), (101, "one hundred one"),
    (2024, "two thousand twenty four"), (3_000_005, "three million five"),
])
def test_number_to_words(n, words):
    assert number_to_words(n) == words.split()


def test_edit_distance_counts_substitutions_insertions_deletions():
    assert edit_distance("a b c".split(), "a b c".split()) == 0
    assert edit_distance("a b c".split(), "a x c".split()) == 1  # substitution
    assert edit_distance("a b c".split(), "a c".split()) == 1  # deletion
    assert edit_distance("a b c".split(), "a b b c".split()) == 1  # insertion
    assert edit_distance("a b c".split(), []) == 3
    assert edit_distance([], "a b".split()) == 2


def test_wer_known_values():
    ref = "Some call me nature, others call me mother nature."
    assert wer(ref, "some call me nature others call me mother nature") == 0.0
    # the recogniser's actual output on spk_en_03: one substitution in nine words
    assert wer(ref, "someone call me nature others call me mother nature") == pytest.approx(1 / 9)
    assert wer("one two", "one two three four") == pytest.approx(1.0)  # insertions can push WER to >= 1


def test_corpus_wer_weights_by_reference_length():
    refs = ["a b c d", "e f"]
    hyps = ["a b c d", "x y"]
    assert corpus_wer(refs, hyps) == pytest.approx(2 / 6)


def test_wer_rejects_empty_reference():
    with pytest.raises(ValueError, match="reference"):
        wer("?!", "anything")
    with pytest.raises(ValueError):
        corpus_wer(["a"], [])
