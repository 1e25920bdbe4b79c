"""Mandarin text normalisation: digits and symbols -> Han characters.

Numbers are read with cn2an (MIT); the patterns around them (dates, times, money, units, phone
numbers) decide *how* they are read: years and phone numbers digit by digit, amounts as
cardinals. Latin words are left alone so the English G2P can read them inside Chinese sentences.
"""
from __future__ import annotations

import re
import unicodedata

_DIGITS = "零一二三四五六七八九"
_CURRENCY_PREFIX = {"¥": "元", "￥": "元", "$": "美元", "US$": "美元", "€": "欧元", "£": "英镑",
                    "₩": "韩元", "₹": "卢比", "HK$": "港元"}
_CURRENCY_SUFFIX = {"USD": "美元", "EUR": "欧元", "GBP": "英镑", "CNY": "元", "RMB": "元",
                    "JPY": "日元", "HKD": "港元"}
# Units only expand right after a number.
_UNITS = {
    "km/h": "千米每小时", "kph": "千米每小时", "mph": "英里每小时", "m/s": "米每秒",
    "km": "千米", "cm": "厘米", "mm": "毫米", "m": "米", "kg": "千克", "mg": "毫克", "g": "克",
    "t": "吨", "ml": "毫升", "mL": "毫升", "L": "升", "l": "升", "°C": "摄氏度", "℃": "摄氏度",
    "°F": "华氏度", "℉": "华氏度", "°": "度", "KB": "KB", "MB": "MB", "GB": "GB", "TB": "TB",
    "kHz": "千赫兹", "MHz": "兆赫兹", "GHz": "吉赫兹", "Hz": "赫兹", "kW": "千瓦", "W": "瓦",
    "V": "伏", "ms": "毫秒", "min": "分钟", "h": "小时", "s": "秒", "lb": "磅", "mi": "英里",
    "ft": "英尺", "in": "英寸",
}
_SYMBOLS = {"&": "和", "+": "加", "=": "等于", "@": "艾特", "×": "乘", "÷": "除以", "~": "到",
            "%": "百分之", "#": "号", "/": "每", "*": " ", "_": " ", "|": "，"}

_NUM = r"\d+(?:,\d{3})*(?:\.\d+)?"


def cardinal(s: str) -> str:
    """'2024' -> '两千零二十四', '-3.5' -> '负三点五', '1,000' -> '一千'."""
    import cn2an  # imported when a number is read: 0.2 s that English-only runs need not pay

    s = s.replace(",", "")
    out = cn2an.an2cn(s, "low")
    # Spoken Mandarin says 两 before a leading 百/千/万/亿 (两千, 两万), 二 elsewhere.
    return re.sub(r"^(负?)二(?=[百千万亿])", r"\g<1>两", out)


def digits(s: str, phone: bool = False) -> str:
    """'2024' -> '二零二四'; phone=True reads 1 as 幺, as people do for phone numbers."""
    table = _DIGITS.replace("一", "幺") if phone else _DIGITS
    return "".join(table[int(c)] for c in s if c.isdigit())


def _date(m: re.Match) -> str:
    y, mo, d = m.group(1), int(m.group(2)), int(m.group(3))
    if not (1 <= mo <= 12 and 1 <= d <= 31):
        return m.group(0)
    return f"{digits(y)}年{cardinal(str(mo))}月{cardinal(str(d))}日"


def _time(m: re.Match) -> str:
    h, mi, sec = int(m.group(2)), int(m.group(3)), m.group(4)
    ampm = (m.group(5) or "").lower().replace(".", "").replace(" ", "")
    if h > 24 or mi > 59:
        return m.group(0)
    prefix = m.group(1) or ""
    if ampm:
        prefix += "上午" if ampm.startswith("a") else "下午"
        if h > 12:
            h -= 12
    hour = "两" if h == 2 else cardinal(str(h))
    out = f"{prefix}{hour}点"
    if mi:
        out += ("零" if mi < 10 else "") + cardinal(str(mi)) + "分"
    if sec and int(sec):
        out += cardinal(str(int(sec))) + "秒"
    return out


def _money(m: re.Match) -> str:
    sign, sym, amt = m.group(1), m.group(2), m.group(3)
    if "." in amt:  # 12.50 -> 十二点五, not 十二点五零
        amt = amt.rstrip("0").rstrip(".")
    return ("负" if sign else "") + cardinal(amt) + _CURRENCY_PREFIX[sym]


def _unit(m: re.Match) -> str:
    return cardinal(m.group(1)) + _UNITS[m.group(2)]


def _plain(m: re.Match) -> str:
    s = m.group(0)
    body = s.lstrip("-")
    if "." not in body and "," not in body and len(body) > 1 and body.startswith("0"):
        return ("负" if s.startswith("-") else "") + digits(body)  # codes such as 007
    return cardinal(s)


_RE_DATE = re.compile(r"(\d{4})\s*[年\-/.]\s*(\d{1,2})\s*[月\-/.]\s*(\d{1,2})\s*[日号]?")
_RE_YEAR = re.compile(r"(\d{2,4})\s*年")
_RE_MONTH_DAY = re.compile(r"(\d{1,2})\s*月\s*(\d{1,2})\s*([日号])")
_RE_TIME = re.compile(r"(上午|下午|晚上|早上|中午|凌晨)?(\d{1,2}):(\d{2})(?::(\d{2}))?(?:\s*([AaPp]\.?\s?[Mm]\.?)(?![A-Za-z]))?")
_RE_MONEY = re.compile(rf"(-)?(HK\$|US\$|[$¥￥€£₩₹])\s?({_NUM})")
_RE_MONEY_SUFFIX = re.compile(rf"(-?{_NUM})\s?(USD|EUR|GBP|CNY|RMB|JPY|HKD)(?![A-Za-z])")
_RE_PHONE = re.compile(
    r"(?<!\d)(?<!\d[.,])(?:\+\d{1,3}[\s-]?)?(?:\(\d{2,4}\)\s?|\d{2,4}[\s-])\d{3,4}(?:[\s-]\d{3,4})+(?!\d|[.,]\d)"
    r"|(?<!\d)(?<!\d[.,])\+?\d{11,}(?!\d|[.,]\d)"
)
_RE_PERCENT = re.compile(rf"(-?)({_NUM})\s?[%％]")
_RE_FRACTION = re.compile(r"(?<![\d/])(\d{1,4})/(\d{1,4})(?![\d/])")
_RE_RANGE = re.compile(rf"(?<![\d-])({_NUM})\s?[-–~～]\s?({_NUM})(?![\d-])")
_RE_UNIT = re.compile(
    rf"(-?{_NUM})\s?({'|'.join(re.escape(k) for k in sorted(_UNITS, key=len, reverse=True))})(?![A-Za-z])"
)
_RE_NUMBER = re.compile(rf"-?{_NUM}")


def _phone(m: re.Match) -> str:
    raw = m.group(0)
    return ("加" if raw.startswith("+") else "") + "，".join(
        digits(g, phone=True) for g in re.findall(r"\d+", raw))


def normalize_zh(text: str) -> str:
    """Spell out numbers and symbols the way a Mandarin reader says them."""
    # NFKC turns full-width digits and letters into ASCII; full-width punctuation also becomes
    # ASCII, which the G2P maps back to Kokoro's punctuation anyway.
    text = unicodedata.normalize("NFKC", text).replace("...", "…")  # NFKC splits the ellipsis
    text = text.replace("−", "-").replace("—", "—")
    text = _RE_DATE.sub(_date, text)
    text = _RE_YEAR.sub(lambda m: digits(m.group(1)) + "年", text)
    text = _RE_MONTH_DAY.sub(lambda m: f"{cardinal(m.group(1))}月{cardinal(m.group(2))}{m.group(3)}", text)
    text = _RE_TIME.sub(_time, text)
    text = _RE_MONEY.sub(_money, text)
    text = _RE_MONEY_SUFFIX.sub(lambda m: cardinal(m.group(1)) + _CURRENCY_SUFFIX[m.group(2)], text)
    text = _RE_PHONE.sub(_phone, text)
    text = _RE_PERCENT.sub(lambda m: ("负" if m.group(1) else "") + "百分之" + cardinal(m.group(2)), text)
    text = _RE_FRACTION.sub(lambda m: f"{cardinal(m.group(2))}分之{cardinal(m.group(1))}", text)
    text = _RE_RANGE.sub(lambda m: f"{m.group(1)}到{m.group(2)}", text)
    text = _RE_UNIT.sub(_unit, text)
    text = re.sub(r"第\s*(\d+)", lambda m: "第" + cardinal(m.group(1)), text)
    text = _RE_NUMBER.sub(_plain, text)
    for sym, spoken in _SYMBOLS.items():
        text = text.replace(sym, spoken)
    return re.sub(r"[ \t]+", " ", text).strip()
