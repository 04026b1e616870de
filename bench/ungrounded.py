"""`ungrounded_numbers`: a measured definition, not kept in the product (docs/META_EVAL.md: it adds recall but
flags 20 % of GSM8K's and half of MATH's error-free chains). bench/arith_bench.py measures it beside the
arithmetic check (udfs/arith.py), whose reading of numbers it shares.

A number written in a step is grounded when its value (or the same value as a percentage, x100 or /100, or its
negative) is a number of the problem (digits or number words), of an earlier step, a value one of this or an
earlier step's equations computes (either side of a checked equation), an integer from 0 to 10 (counts, step
numbers, small factors), or a common unit constant; the score is how many of the step's numbers are not.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from udfs import arith  # noqa: E402

UNIT_CONSTANTS = frozenset(Fraction(v) for v in (
    12, 16, 20, 24, 25, 30, 31, 36, 50, 52, 60, 90, 100, 180, 360, 365, 1000, 3600, 10 ** 6))
_NUMBER_WORDS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
    "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16,
    "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50,
    "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90, "hundred": 100, "thousand": 1000, "million": 10 ** 6,
    "dozen": 12, "twice": 2, "double": 2, "triple": 3, "thrice": 3, "half": Fraction(1, 2), "halves": Fraction(1, 2),
    "third": Fraction(1, 3), "thirds": Fraction(1, 3), "quarter": Fraction(1, 4), "quarters": Fraction(1, 4),
    "fourth": Fraction(1, 4), "fifth": Fraction(1, 5), "fifths": Fraction(1, 5), "tenth": Fraction(1, 10),
}


def numbers(text: str | None) -> list[Fraction]:
    """The numbers written in a text (digits, read as udfs.arith reads them; a percentage as written)."""
    if not text:
        return []
    try:
        return [t.value for t in arith._resolve(arith.tokenize(arith._preprocess(text))) if t.kind == arith.NUM]
    except Exception:  # noqa: BLE001 - unreadable text has no numbers
        return []


def _word_numbers(text: str) -> set[Fraction]:
    return {Fraction(_NUMBER_WORDS[w]) for w in re.findall(r"[a-z]+", text.lower()) if w in _NUMBER_WORDS}


def _is_grounded(v: Fraction, pool: set[Fraction]) -> bool:
    if v.denominator == 1 and abs(v) <= 10:
        return True
    return any(x in pool or x in UNIT_CONSTANTS for x in (v, -v, v * 100, v / 100))


def ungrounded_counts(problem: str | None, steps: Sequence[str | None]) -> list[int]:
    """Per step, how many of its numbers come from nowhere (the definition above)."""
    pool = set(numbers(problem)) | _word_numbers(problem or "")
    out = []
    for step in steps:
        computed = set()
        for c in arith.check_step(step).claims:
            computed |= {c.left, c.right}
        here = pool | computed
        written = numbers(step)
        out.append(sum(1 for v in written if not _is_grounded(v, here)))
        pool |= set(written) | computed | _word_numbers(step or "")
    return out
