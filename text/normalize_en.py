"""English text normalisation: numbers, dates, times, money, units and abbreviations -> words.

The G2P after this step only knows words and punctuation, so every digit and symbol that is
spoken must be spelled out here. Number words are produced by our own small speller (American
style, no "and"), because the usual library for this (num2words) is LGPL.
"""
from __future__ import annotations

import re
import unicodedata

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
         "fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (10**3, "thousand"))
_ORDINAL_WORDS = {
    "one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
    "nine": "ninth", "twelve": "twelfth",
}
_MONTHS = ("January February March April May June July August September October November "
           "December").split()


# ---------------------------------------------------------------- number words
def _below_1000(n: int) -> str:
    parts = []
    if n >= 100:
        parts.append(f"{_ONES[n // 100]} hundred")
        n %= 100
    if n >= 20:
        parts.append(_TENS[n // 10] + (f"-{_ONES[n % 10]}" if n % 10 else ""))
    elif n or not parts:
        parts.append(_ONES[n])
    return " ".join(parts)


def cardinal(n: int) -> str:
    """12345 -> 'twelve thousand three hundred forty-five' (American, no 'and')."""
    if n < 0:
        return "minus " + cardinal(-n)
    if n >= 10**15:  # nobody says these; reading digits is clearer than 'quadrillion'
        return digits(str(n))
    parts = []
    for value, name in _SCALES:
        if n >= value:
            parts.append(f"{_below_1000(n // value)} {name}")
            n %= value
    if n or not parts:
        parts.append(_below_1000(n))
    return " ".join(parts)


def ordinal(n: int) -> str:
    """21 -> 'twenty-first'."""
    words = cardinal(n)
    head, sep, last = max(words.rpartition(" "), words.rpartition("-"), key=lambda t: len(t[0]))
    if last in _ORDINAL_WORDS:
        last = _ORDINAL_WORDS[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return head + sep + last


def year(n: int) -> str:
    """1984 -> 'nineteen eighty-four', 2005 -> 'two thousand five', 2024 -> 'twenty twenty-four'."""
    if not 1000 <= n <= 9999 or (2000 <= n <= 2009) or n % 1000 == 0:
        return cardinal(n)
    hi, lo = divmod(n, 100)
    if lo == 0:
        return f"{cardinal(hi)} hundred"
    return f"{cardinal(hi)} {'oh ' if lo < 10 else ''}{cardinal(lo)}"


def digits(s: str) -> str:
    """'1380' -> 'one three eight zero' (phone numbers, codes)."""
    return " ".join(_ONES[int(c)] for c in s if c.isdigit())


def decimal(s: str) -> str:
    """'-3.14' -> 'minus three point one four'; '.5' -> 'point five'."""
    neg = s.startswith("-")
    s = s.lstrip("-").replace(",", "")
    whole, _, frac = s.partition(".")
    out = cardinal(int(whole)) if whole else ""
    if frac:
        out = (out + " point " + digits(frac)).strip()
    return ("minus " + out) if neg else out


def _plural(word: str, amount_is_one: bool) -> str:
    if amount_is_one or word.endswith("s") or word in ("yen", "yuan", "renminbi"):
        return word
    if word.endswith("y") and not word.endswith(("ay", "ey", "oy")):
        return word[:-1] + "ies"
    if word.endswith("inch"):
        return word + "es"
    if word.endswith("foot"):
        return word[:-4] + "feet"
    return word + "s"


# ---------------------------------------------------------------- rule tables
# Abbreviations that end in a period; matched case-sensitively as whole words.
_ABBREVIATIONS = {
    "Dr.": "Doctor", "Mr.": "Mister", "Mrs.": "Missus", "Ms.": "Miz", "Prof.": "Professor",
    "Jr.": "Junior", "Sr.": "Senior", "St.": "Saint", "Mt.": "Mount", "vs.": "versus",
    "etc.": "et cetera", "e.g.": "for example", "i.e.": "that is", "approx.": "approximately",
    "Inc.": "Incorporated", "Ltd.": "Limited", "Corp.": "Corporation", "Dept.": "Department",
    "Jan.": "January", "Feb.": "February", "Mar.": "March", "Apr.": "April", "Aug.": "August",
    "Sep.": "September", "Sept.": "September", "Oct.": "October", "Nov.": "November",
    "Dec.": "December", "a.m.": "A M", "p.m.": "P M", "U.S.": "U S", "U.K.": "U K",
}
# Units only expand right after a number (5 km), so 'm' or 'in' elsewhere stay words.
_UNITS = {
    "km/h": "kilometer per hour", "kph": "kilometer per hour", "mph": "mile per hour",
    "m/s": "meter per second", "km": "kilometer", "cm": "centimeter", "mm": "millimeter",
    "m": "meter", "kg": "kilogram", "g": "gram", "mg": "milligram", "lb": "pound",
    "lbs": "pounds", "oz": "ounce", "mi": "mile", "ft": "foot", "in": "inch", "ml": "milliliter",
    "mL": "milliliter", "l": "liter", "L": "liter", "°C": "degree Celsius", "°F": "degree Fahrenheit",
    "℃": "degree Celsius", "℉": "degree Fahrenheit", "°": "degree", "KB": "kilobyte",
    "MB": "megabyte", "GB": "gigabyte", "TB": "terabyte", "kHz": "kilohertz", "MHz": "megahertz",
    "GHz": "gigahertz", "Hz": "hertz", "kW": "kilowatt", "W": "watt", "V": "volt",
    "ms": "millisecond", "min": "minute", "h": "hour", "hr": "hour", "hrs": "hours", "s": "second",
    "sec": "second",
}
_CURRENCY_PREFIX = {"$": ("dollar", "cent"), "US$": ("dollar", "cent"), "€": ("euro", "cent"),
                    "£": ("pound", "penny"), "¥": ("yuan", None), "￥": ("yuan", None),
                    "₩": ("won", None), "₹": ("rupee", None)}
_CURRENCY_SUFFIX = {"元": "yuan", "块": "yuan", "USD": "dollar", "EUR": "euro", "GBP": "pound",
                    "CNY": "yuan", "RMB": "yuan", "JPY": "yen"}
_SYMBOLS = {"&": " and ", "+": " plus ", "=": " equals ", "@": " at ", "×": " times ",
            "÷": " divided by ", "~": " about ", "#": " number ", "/": " slash ", "%": " percent ",
            "_": " ", "*": " ", "^": " ", "|": ", ", "<": " less than ", ">": " greater than "}
_FRACTIONS = {(1, 2): "one half", (1, 3): "one third", (2, 3): "two thirds",
              (1, 4): "one quarter", (3, 4): "three quarters"}

_NUM = r"\d+(?:,\d{3})*(?:\.\d+)?"


def _num_words(s: str) -> str:
    return decimal(s) if "." in s else cardinal(int(s.replace(",", "")))


def _money(m: re.Match) -> str:
    sign, sym, amount, scale = m.group("sign"), m.group("sym"), m.group("amt"), m.group("scale")
    major, minor = _CURRENCY_PREFIX[sym]
    prefix = "minus " if sign else ""
    if scale:  # $1.5 million -> one point five million dollars
        return f"{prefix}{_num_words(amount)} {scale} {_plural(major, False)}"
    whole, _, cents = amount.replace(",", "").partition(".")
    whole_n = int(whole or 0)
    if minor and cents and len(cents) <= 2:
        cents_n = int(cents.ljust(2, "0"))
        parts = []
        if whole_n:
            parts.append(f"{cardinal(whole_n)} {_plural(major, whole_n == 1)}")
        if cents_n:
            unit = "pence" if minor == "penny" and cents_n != 1 else _plural(minor, cents_n == 1)
            parts.append(f"{cardinal(cents_n)} {unit}")
        if not parts:
            parts.append(f"zero {_plural(major, False)}")
        return prefix + " and ".join(parts)
    words = _num_words(amount)
    return f"{prefix}{words} {_plural(major, words == 'one')}"


def _money_suffix(m: re.Match) -> str:
    amount, unit = m.group(1), _CURRENCY_SUFFIX[m.group(2)]
    words = _num_words(amount.lstrip("-"))
    return ("minus " if amount.startswith("-") else "") + f"{words} {_plural(unit, words == 'one')}"


def _date_iso(m: re.Match) -> str:
    y, mo, d = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if not (1 <= mo <= 12 and 1 <= d <= 31):
        return m.group(0)
    return f"{_MONTHS[mo - 1]} {ordinal(d)}, {year(y)}"


def _time(m: re.Match) -> str:
    h, mi, ampm = int(m.group(1)), int(m.group(2)), (m.group(3) or "")
    if h > 24 or mi > 59:
        return m.group(0)
    ampm = ampm.lower().replace(".", "").replace(" ", "")
    if mi == 0:
        spoken = cardinal(h) if ampm else f"{cardinal(h)} o'clock" if h <= 12 else f"{cardinal(h)} hundred"
    elif mi < 10:
        spoken = f"{cardinal(h)} oh {cardinal(mi)}"
    else:
        spoken = f"{cardinal(h)} {cardinal(mi)}"
    if ampm:
        spoken += " " + " ".join(ampm.upper())
    return spoken


def _phone(m: re.Match) -> str:
    raw = m.group(0)
    out = "plus " if raw.lstrip().startswith("+") else ""
    groups = re.findall(r"\d+", raw)
    return out + ", ".join(digits(g) for g in groups)


def _unit(m: re.Match) -> str:
    amount, unit = m.group(1), m.group(2)
    words = _num_words(amount.lstrip("-"))
    if amount.startswith("-"):
        words = "minus " + words
    name = _UNITS[unit]
    first, _, rest = name.partition(" ")
    return f"{words} {_plural(first, words == 'one')}{(' ' + rest) if rest else ''}"


def _ordinal_match(m: re.Match) -> str:
    return ordinal(int(m.group(1).replace(",", "")))


def _plain_number(m: re.Match) -> str:
    s = m.group(0)
    neg = s.startswith("-")
    body = s.lstrip("-")
    if "." not in body and "," not in body:
        if len(body) > 1 and body.startswith("0"):  # 007, 0800: codes, read digit by digit
            return ("minus " if neg else "") + digits(body)
        if len(body) == 4 and not neg and 1100 <= int(body) <= 2099:
            return year(int(body))
    words = _num_words(body)
    return ("minus " if neg else "") + words


def _unit_pattern() -> re.Pattern:
    keys = sorted(_UNITS, key=len, reverse=True)
    alt = "|".join(re.escape(k) for k in keys)
    # The unit must not run on into a longer word ("5 min" yes, "5 minutes" handled as words).
    return re.compile(rf"(-?{_NUM})\s?({alt})(?![A-Za-z0-9])")


_RE_UNIT = _unit_pattern()
_RE_MONEY = re.compile(
    rf"(?P<sign>-)?(?P<sym>US\$|[$€£¥￥₩₹])\s?(?P<amt>{_NUM})(?:\s?(?P<scale>thousand|million|billion|trillion)\b)?"
)
_RE_MONEY_SUFFIX = re.compile(rf"(-?{_NUM})\s?(元|块|USD|EUR|GBP|CNY|RMB|JPY)(?![A-Za-z])")
_RE_ISO_DATE = re.compile(r"\b(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})\b")
_RE_MONTH_DAY = re.compile(rf"\b({'|'.join(_MONTHS)})\s+(\d{{1,2}})(?:st|nd|rd|th)?\b(,?\s+(\d{{4}})\b)?")
_RE_DAY_MONTH = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?({'|'.join(_MONTHS)})\b(,?\s+(\d{{4}})\b)?")
# "p.m." keeps its final period when it also ends the sentence.
_RE_TIME = re.compile(r"\b(\d{1,2}):(\d{2})(?::\d{2})?(?:\s*([AaPp]\.?\s?[Mm](?:\.(?=\s+[a-z]))?)(?![A-Za-z]))?")
_RE_TIME_AMPM = re.compile(r"\b(\d{1,2})\s*([AaPp])\.?\s?[Mm](?:\.(?=\s+[a-z]))?(?![A-Za-z])")
_RE_PHONE = re.compile(
    r"(?<!\d)(?<!\d[.,])(?:\+\d{1,3}[\s-]?)?(?:\(\d{2,4}\)\s?|\d{2,4}[\s-])\d{3,4}(?:[\s-]\d{3,4})+(?!\d|[.,]\d)"
    r"|(?<!\d)(?<!\d[.,])\+?\d{10,}(?!\d|[.,]\d)"
)
_RE_PERCENT = re.compile(rf"(-?{_NUM})\s?%")
_RE_ORDINAL = re.compile(r"\b(\d+(?:,\d{3})*)(?:st|nd|rd|th)\b")
_RE_DECADE = re.compile(r"\b(\d{2})?(\d)0['’]?s\b")
_RE_FRACTION = re.compile(r"(?<![\d/])(\d{1,3})/(\d{1,3})(?![\d/])")
_RE_RANGE = re.compile(rf"(?<![\d-])({_NUM})\s?[-–~]\s?({_NUM})(?![\d-])")
_RE_NUMBER = re.compile(rf"(?<![\w.])-?{_NUM}|\d+")


def _month_day(m: re.Match) -> str:
    out = f"{m.group(1)} {ordinal(int(m.group(2)))}"
    return out + (f", {year(int(m.group(4)))}" if m.group(4) else "")


def _day_month(m: re.Match) -> str:
    out = f"the {ordinal(int(m.group(1)))} of {m.group(2)}"
    return out + (f", {year(int(m.group(4)))}" if m.group(4) else "")


def _decade(m: re.Match) -> str:
    century, decade = m.group(1), int(m.group(2))
    tens = {0: "zeros", 1: "tens"}.get(decade) or _TENS[decade][:-1] + "ies"
    if century is None:
        return tens
    if decade:
        return f"{cardinal(int(century))} {tens}"
    full = int(century) * 100
    return f"{cardinal(full)}s" if full % 1000 == 0 else f"{cardinal(int(century))} hundreds"


def _fraction(m: re.Match) -> str:
    a, b = int(m.group(1)), int(m.group(2))
    if (a, b) in _FRACTIONS:
        return _FRACTIONS[(a, b)]
    if b == 0:
        return f"{cardinal(a)} slash zero"
    return f"{cardinal(a)} over {cardinal(b)}"


def normalize_en(text: str) -> str:
    """Spell out everything an English reader would say aloud; keep punctuation for prosody."""
    text = unicodedata.normalize("NFKC", text).replace("...", "…")  # NFKC splits the ellipsis
    text = text.replace("’", "'").replace("‘", "'").replace("–", "-").replace("−", "-")
    for abbr, full in _ABBREVIATIONS.items():
        text = re.sub(rf"(?<![\w.]){re.escape(abbr)}(?=\s|$|[,;:!?)])", full, text)
    text = re.sub(r"\bNo\.\s?(?=\d)", "number ", text)
    text = _RE_ISO_DATE.sub(_date_iso, text)
    text = _RE_MONTH_DAY.sub(_month_day, text)
    text = _RE_DAY_MONTH.sub(_day_month, text)
    text = _RE_TIME.sub(_time, text)
    text = _RE_TIME_AMPM.sub(lambda m: f"{cardinal(int(m.group(1)))} {m.group(2).upper()} M", text)
    text = _RE_MONEY.sub(_money, text)
    text = _RE_MONEY_SUFFIX.sub(_money_suffix, text)
    text = _RE_PHONE.sub(_phone, text)
    text = _RE_PERCENT.sub(lambda m: f"{decimal(m.group(1)) if '.' in m.group(1) else _plain_signed(m.group(1))} percent", text)
    text = _RE_DECADE.sub(_decade, text)  # before units: the 's' of 1990s is not 'seconds'
    text = _RE_UNIT.sub(_unit, text)
    text = _RE_ORDINAL.sub(_ordinal_match, text)
    text = _RE_FRACTION.sub(_fraction, text)
    text = _RE_RANGE.sub(lambda m: f"{m.group(1)} to {m.group(2)}", text)
    text = _RE_NUMBER.sub(_plain_number, text)
    for sym, spoken in _SYMBOLS.items():
        text = text.replace(sym, spoken)
    # A dash between spaces is a pause, not 'minus'.
    text = re.sub(r"\s+-+\s+|--+", " — ", text)
    return re.sub(r"[ \t]+", " ", text).strip()


def _plain_signed(s: str) -> str:
    return ("minus " if s.startswith("-") else "") + cardinal(int(s.lstrip("-").replace(",", "")))
