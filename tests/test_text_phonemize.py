"""End to end: language detection, chunking limits, mixed text, errors, speed."""
import time

import pytest

from digital_human.text import (
    EmptyTextError, NothingSpeakableError, UnsupportedLanguageError, detect_language, load_vocab,
    phonemize, split_by_script,
)
from digital_human.text.chunking import (
    PAUSE_CLAUSE_S, PAUSE_PARAGRAPH_S, PAUSE_SENTENCE_S, split_sentences,
)


def test_detect_language():
    assert detect_language("Hello there, how are you?") == "en"
    assert detect_language("今天天气很好，我们去公园吧。") == "zh"
    assert detect_language("我用iPhone打电话") == "zh"
    assert detect_language("My friend 王伟 lives in Shanghai now.") == "en"
    assert detect_language("12345") == "en"


@pytest.mark.parametrize("text, found", [
    ("Привет, как дела? Это тест.", "Cyrillic"),
    ("مرحبا بكم في العالم", "Arabic"),
    ("今日はいい天気ですね。", "Japanese"),
    ("안녕하세요 반갑습니다", "Korean"),
])
def test_unsupported_language(text, found):
    with pytest.raises(UnsupportedLanguageError, match=found) as e:
        phonemize(text)
    assert "'en'" in str(e.value) and "'zh'" in str(e.value)


def test_split_by_script():
    assert split_by_script("我用iPhone打电话。") == [("zh", "我用"), ("en", "iPhone"), ("zh", "打电话。")]


def test_sentences_and_pauses():
    chunks = split_sentences("First one. Second one!\nThird\n\nNew paragraph? 中文句子。第二句")
    assert [c.text for c in chunks] == ["First one.", "Second one!", "Third", "New paragraph?",
                                        "中文句子。", "第二句"]
    assert [c.pause_after_s for c in chunks] == [PAUSE_SENTENCE_S, PAUSE_SENTENCE_S, PAUSE_PARAGRAPH_S,
                                                 PAUSE_SENTENCE_S, PAUSE_SENTENCE_S, 0.0]


def test_english_paragraph():
    chunks = phonemize("Hello there! Dr. Smith paid $12.50 on 2024-03-15.")
    assert [c.text for c in chunks] == [
        "Hello there!",
        "Doctor Smith paid twelve dollars and fifty cents on March fifteenth, twenty twenty-four."]
    assert chunks[0].phonemes == "həlˈO ðˈɛɹ!" and chunks[0].lang == "en"
    assert chunks[0].pause_after_s == PAUSE_SENTENCE_S and chunks[-1].pause_after_s == 0.0


def test_mixed_zh_en():
    (chunk,) = phonemize("我用iPhone打电话。")
    assert chunk.lang == "zh"
    assert chunk.phonemes == "wo↓jʊ↘ŋ ˈI fˈOn ta↓tjɛ↘nxwa↘."


def test_long_text_chunks_under_limit():
    vocab = load_vocab()
    clause = "this clause is part of a really long sentence that keeps going without any full stop"
    chunks = phonemize(", ".join([clause] * 30) + ".")
    assert len(chunks) > 1
    assert all(0 < len(c.phonemes) <= 510 for c in chunks)
    assert all(c.pause_after_s == PAUSE_CLAUSE_S for c in chunks[:-1])
    zh = phonemize("，".join(["我们今天在北京开了一个很长很长的会议讨论人工智能的未来发展"] * 40) + "。")
    assert len(zh) > 1 and all(0 < len(c.phonemes) <= 510 for c in zh)
    zh_no_commas = phonemize("我们今天在北京开了一个很长很长的会议讨论人工智能的未来发展" * 20)
    assert len(zh_no_commas) > 1 and all(len(c.phonemes) <= 510 for c in zh_no_commas)
    for c in chunks + zh + zh_no_commas:
        assert set(c.phonemes) <= set(vocab)


def test_unknown_characters_dropped_and_listed():
    chunks = phonemize("Hello ☃ world 😀.")
    assert chunks[0].phonemes == "həlˈO wˈɜɹld." and chunks[0].unknown == ["☃", "😀"]


@pytest.mark.parametrize("text", ["", "   \n\t "])
def test_empty_text(text):
    with pytest.raises(EmptyTextError):
        phonemize(text)


@pytest.mark.parametrize("text", ["😀😀 !!", "☃ ★ ♥"])
def test_nothing_speakable(text):
    with pytest.raises(NothingSpeakableError, match="nothing speakable"):
        phonemize(text)


def test_bad_lang_argument():
    with pytest.raises(ValueError, match="lang must be"):
        phonemize("hello", lang="fr")


def test_speed_200_words():
    text = ("Speech synthesis has come a long way since the first mechanical talking machines. "
            "Early electronic systems, built in 1939, needed a trained operator to play the voice. "
            "By the 1980s, rule based synthesizers could read any English text aloud. "
            "Today a price of $12.50 and a date such as 2024-03-15 are read correctly. ") * 4
    text += "今天是2024年3月15日，我们讨论人工智能的未来发展。" * 5
    phonemize("warm up 你好")  # lexicon and jieba load once per process
    t = time.perf_counter()
    chunks = phonemize(text)
    elapsed = time.perf_counter() - t
    assert len(text.split()) >= 200 and chunks
    assert elapsed < 2.0, f"phonemize took {elapsed:.2f} s for ~200 words"
