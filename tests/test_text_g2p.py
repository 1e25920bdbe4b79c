"""G2P: lexicon words give misaki's phonemes, everything lands in Kokoro's vocabulary."""
import pytest

from digital_human.text import load_vocab, tokenize
from digital_human.text.g2p_en import arpabet_to_misaki, g2p_en, oov_backend
from digital_human.text.g2p_zh import g2p_zh


@pytest.fixture(scope="module")
def vocab():
    return load_vocab()


@pytest.mark.parametrize("word, expected", [
    ("hello", "həlˈO"),
    ("world", "wˈɜɹld"),
    ("water", "wˈɔTəɹ"),          # American flap, written T as Kokoro v1.0 saw it
    ("walked", "wˈɔkt"),          # -ed after a voiceless stem
    ("cats", "kˈæts"),
    ("talking", "tˈɔkɪŋ"),
    ("GPU", "ʤˌipˌijˈu"),         # acronym spelled, last letter stressed
])
def test_lexicon_words(word, expected):
    assert g2p_en(word)[0] == expected


def test_context_rules():
    assert g2p_en("the apple")[0].startswith("ði ")
    assert g2p_en("the cat")[0].startswith("ðə ")
    assert g2p_en("I want to live here.")[0] == "ˌI wˈɑnt tə lˈɪv hˈɪɹ."
    assert "lˈIv" in g2p_en("The live show.")[0]
    assert "ɹˈɛd" in g2p_en("I have read it.")[0]


def test_punctuation_kept():
    ps = g2p_en('Hello, "world" (ok)… yes!')[0]
    assert ps == 'həlˈO, "wˈɜɹld" (ˌOkˈA)… jˈɛs!'


def test_oov_word(vocab):
    ps, unknown, guessed = g2p_en("The blorptastic zyxx.")
    assert guessed == ["blorptastic", "zyxx"] and not unknown
    assert len(ps) > len("ðə .") + 6 and set(ps) <= set(vocab)
    if oov_backend() == "neural":
        assert arpabet_to_misaki(["HH", "AH0", "L", "OW1"]) == "həlˈO"


def test_unknown_symbols_reported():
    ps, unknown, _ = g2p_en("hi ☃ there")
    assert unknown == ["☃"] and ps == "hˈI ðˈɛɹ"


def test_english_sentences_in_vocab(vocab):
    for s in ["The quick brown fox jumps over the lazy dog.",
              "She sells seashells by the seashore; they're quite expensive!",
              "Kokoro speaks Mandarin on a GPU with OpenAI and ComfyUI."]:
        ps, unknown, _ = g2p_en(s)
        assert ps and not unknown
        assert set(ps) <= set(vocab), set(ps) - set(vocab)


def test_zh_sentence(vocab):
    ps, unknown = g2p_zh("你好，世界！")
    assert ps == "ni↓xau↓, ʂɨ↘ʨje↘!" and unknown == []
    ps, _ = g2p_zh("我爱北京天安门。人工智能正在改变我们的生活。")
    assert set(ps) <= set(vocab) and "↘" in ps


def test_tokenize_drops_and_reports(vocab):
    dropped = []
    ids = tokenize("həlˈO☃", vocab, dropped=dropped)
    assert dropped == ["☃"] and len(ids) == 5 and ids[0] == vocab["h"]


def test_missing_vocab_says_run_setup(monkeypatch, tmp_path):
    from digital_human.engines.kokoro import assets
    from digital_human.text import tokens

    monkeypatch.setenv("DIGITAL_HUMAN_MODELS", str(tmp_path))
    monkeypatch.setattr(assets, "DATA_PACKAGE", "no-such-kokoro-pkg")
    tokens._cached_vocab.cache_clear()
    try:
        with pytest.raises(assets.KokoroAssetError, match="digital_human setup"):
            tokens.load_vocab()
    finally:
        monkeypatch.undo()
        tokens._cached_vocab.cache_clear()


def test_spelling_fallback_without_neural_model(monkeypatch, vocab):
    from digital_human.text import g2p_en as mod
    monkeypatch.setattr(mod, "_oov_model", lambda: None)
    mod._guess.cache_clear()
    try:
        assert mod.oov_backend() == "spelling"
        ps, _, guessed = mod.g2p_en("zyxx")
        assert guessed == ["zyxx"] and ps == "zˌiwˌIˌɛksˈɛks" and set(ps) <= set(vocab)
    finally:
        monkeypatch.undo()
        mod._guess.cache_clear()
