"""TTS text frontend: normalisation, language detection, chunking and G2P to Kokoro phonemes.

    from digital_human.text import phonemize
    for chunk in phonemize("Hello there. 你好！"):
        chunk.phonemes, chunk.pause_after_s
"""
from .language import SUPPORTED, UnsupportedLanguageError, detect_language, split_by_script
from .phonemize import EmptyTextError, NothingSpeakableError, PhonemeChunk, phonemize
from .tokens import MAX_PHONEMES, load_vocab, tokenize

__all__ = [
    "SUPPORTED", "MAX_PHONEMES", "EmptyTextError", "NothingSpeakableError", "PhonemeChunk",
    "UnsupportedLanguageError", "detect_language", "load_vocab", "phonemize", "split_by_script",
    "tokenize",
]
