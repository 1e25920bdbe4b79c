"""CosyVoice 3's text-token additions: the special tokens the release's tokenizer adds to Qwen2's vocabulary.

They are interoperability data (their order fixes their ids: <|endofprompt|> must be 151646, as the release's
LM checks), not code. CosyVoice 2's 19 tokens come first; CosyVoice 3 adds <|endofsystem|>, the ARPAbet phones
(vowels with stress 0/1/2) and pinyin initials/finals with tones, which its users write inline for
pronunciation control ("[j][ǐ]").
"""
from __future__ import annotations

from .engine import SPECIAL_TOKENS as V2_SPECIAL_TOKENS

_ARPA_VOWELS = "AA AE AH AO AW AY EH ER EY IH IY OW OY UH UW".split()
_ARPA_CONSONANTS = "B CH D DH F G HH JH K L M N NG P R S SH T TH V W Y Z ZH".split()
_PINYIN = """
a ai an ang ao b c ch d e ei en eng f g h i ian in ing iu ià iàn iàng iào iá ián iáng iáo iè ié iòng
ióng iù iú iā iān iāng iāo iē iě iōng iū iǎ iǎn iǎng iǎo iǒng iǔ j k l m n o ong ou p q r s sh t u
uang ue un uo uà uài uàn uàng uá uái uán uáng uè ué uì uí uò uó uā uāi uān uāng uē uě uī uō uǎ uǎi
uǎn uǎng uǐ uǒ vè w x y z zh à ài àn àng ào á ái án áng áo è èi èn èng èr é éi én éng ér ì ìn ìng í
ín íng ò òng òu ó óng óu ù ùn ú ún ā āi ān āng āo ē ēi ēn ēng ě ěi ěn ěng ěr ī īn īng ō ōng ōu ū ūn
ǎ ǎi ǎn ǎng ǎo ǐ ǐn ǐng ǒ ǒng ǒu ǔ ǔn ǘ ǚ ǜ
""".split()


def _arpabet() -> list[str]:
    out: list[str] = []
    for phone in sorted(_ARPA_VOWELS + _ARPA_CONSONANTS):
        out.append(f"[{phone}]")
        if phone in _ARPA_VOWELS:
            out += [f"[{phone}{stress}]" for stress in "012"]
    return out


SPECIAL_TOKENS_V3 = {
    **{k: v for k, v in V2_SPECIAL_TOKENS.items() if k != "additional_special_tokens"},
    "additional_special_tokens": [*V2_SPECIAL_TOKENS["additional_special_tokens"], "<|endofsystem|>", *_arpabet(),
                                  *(f"[{p}]" for p in _PINYIN)],
}
ENDOFPROMPT = "<|endofprompt|>"
SYSTEM_PROMPT = "You are a helpful assistant."  # the release's prompts start with it
