"""Normalisation tables: what the TTS will actually say for numbers, dates, money, units."""
import pytest

from digital_human.text.normalize_en import cardinal, normalize_en, ordinal, year
from digital_human.text.normalize_zh import normalize_zh

EN_CASES = [
    ("I have 3 apples.", "I have three apples."),
    ("It is -5 outside.", "It is minus five outside."),
    ("Pi is 3.14.", "Pi is three point one four."),
    ("Growth was 50% and -3.5%.", "Growth was fifty percent and minus three point five percent."),
    ("1,234,567 people", "one million two hundred thirty-four thousand five hundred sixty-seven people"),
    ("Born in 1984.", "Born in nineteen eighty-four."),
    ("In 2005 and 2024.", "In two thousand five and twenty twenty-four."),
    ("On 2024-03-15.", "On March fifteenth, twenty twenty-four."),
    ("March 5th, 2024", "March fifth, twenty twenty-four"),
    ("5 March 2024", "the fifth of March, twenty twenty-four"),
    ("at 3:45 pm.", "at three forty-five P M."),
    ("Meet at 14:30 or 9:05 or 10:00.", "Meet at fourteen thirty or nine oh five or ten o'clock."),
    ("It costs $12.50.", "It costs twelve dollars and fifty cents."),
    ("$1 or $0.99", "one dollar or ninety-nine cents"),
    ("€5 and £3 and ¥30 and 12元", "five euros and three pounds and thirty yuan and twelve yuan"),
    ("$1.5 million", "one point five million dollars"),
    ("Call 138 0013 8000.", "Call one three eight, zero zero one three, eight zero zero zero."),
    ("Call 555-123-4567", "Call five five five, one two three, four five six seven"),
    ("or 13800138000.", "or one three eight zero zero one three eight zero zero zero."),
    ("Run 5 km at 10 mph.", "Run five kilometers at ten miles per hour."),
    ("70 kg, 1 km, 25°C, 16 GB", "seventy kilograms, one kilometer, twenty-five degrees Celsius, sixteen gigabytes"),
    ("The 1st, 2nd, 3rd, 21st and 100th.", "The first, second, third, twenty-first and one hundredth."),
    ("Dr. Smith and Mr. Jones, e.g. this.", "Doctor Smith and Mister Jones, for example this."),
    ("the 1990s and 80s", "the nineteen nineties and eighties"),
    ("1/2 cup and 5/8", "one half cup and five over eight"),
    ("pages 10-20", "pages ten to twenty"),
    ("007 and No. 5", "zero zero seven and number five"),
    ("R&D at 7am", "R and D at seven A M"),
    ("Wait... what?", "Wait… what?"),
]

ZH_CASES = [
    ("今天是2024年3月15日。", "今天是二零二四年三月十五日。"),
    ("日期2024-03-15", "日期二零二四年三月十五日"),
    ("会议在3月5日下午3:45开始", "会议在三月五日下午三点四十五分开始"),
    ("14:30出发，9:05到达", "十四点三十分出发,九点零五分到达"),
    ("2:00", "两点"),
    ("4:30 pm", "下午四点三十分"),
    ("气温-3.5℃", "气温负三点五摄氏度"),
    ("价格¥30", "价格三十元"),
    ("12元和12.5元", "十二元和十二点五元"),
    ("$12.50和€5", "十二点五美元和五欧元"),
    ("增长了50%", "增长了百分之五十"),
    ("下降-3.5%", "下降负百分之三点五"),
    ("电话138 0013 8000", "电话幺三八，零零幺三，八零零零"),
    ("手机13800138000", "手机幺三八零零幺三八零零零"),
    ("跑了5km，重70kg", "跑了五千米,重七十千克"),
    ("身高180cm，时速100km/h", "身高一百八十厘米,时速一百千米每小时"),
    ("第3名，第21届", "第三名,第二十一届"),
    ("3.14159", "三点一四一五九"),
    ("1/2和3/4", "二分之一和四分之三"),
    ("10-20人", "十到二十人"),
    ("1,234,567人", "一百二十三万四千五百六十七人"),
    ("2000人", "两千人"),
    ("007特工", "零零七特工"),
    ("１２３个", "一百二十三个"),
    ("我用iPhone打电话", "我用iPhone打电话"),
]


@pytest.mark.parametrize("text, expected", EN_CASES)
def test_normalize_en(text, expected):
    assert normalize_en(text) == expected


@pytest.mark.parametrize("text, expected", ZH_CASES)
def test_normalize_zh(text, expected):
    assert normalize_zh(text) == expected


def test_number_words():
    assert cardinal(0) == "zero"
    assert cardinal(115) == "one hundred fifteen"
    assert cardinal(2_000_010) == "two million ten"
    assert ordinal(12) == "twelfth" and ordinal(40) == "fortieth" and ordinal(101) == "one hundred first"
    assert year(1900) == "nineteen hundred" and year(1905) == "nineteen oh five" and year(2000) == "two thousand"
