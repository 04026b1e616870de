"""Text rules of the CoT Collection protocol: prompts, option parsing, answer extraction, EM and numeric match.

Plain Python, no model and no Spark: the job and the loaders share these so the protocol lives in one place.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Literal, get_args

# How a sampled chain's answer is read (udfs.sampling.final_answer); settings type sample.answer_rule with it.
AnswerRule = Literal["final", "last_number"]
ANSWER_RULES: tuple[str, ...] = get_args(AnswerRule)

DIRECT_SUFFIX = "\n[ANSWER] "  # official Direct prompt: source + this
COT_TRIGGER = "\n\nLet's think step by step.\n"  # official CoT prompt: source + this
ANSWER_JOIN = "\n[ANSWER] "  # CoT classification: options follow rationale + this

# "(A) text" lines after "Options:"; BBH writes each on its own line.
_LETTER_LINE = re.compile(r"^\(([A-Z])\)\s?(.*)$")
_DASH_LINE = re.compile(r"^-\s?(.*)$")
_BOXED = re.compile(r"\\boxed\s*\{")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def direct_prompt(source: str, suffix: str = DIRECT_SUFFIX) -> str:
    return source + suffix


def cot_prompt(source: str, trigger: str = COT_TRIGGER) -> str:
    return source + trigger


def parse_options(text: str) -> list[tuple[str | None, str]]:
    """Options listed after the last "Options:" line: [(letter, text)] for "(A) ..." lines, [(None, text)] for "- ...".

    Returns [] when the input has no option block (the caller then uses the task's fixed label set).
    """
    if "Options:" not in text:
        return []
    block = text.rsplit("Options:", 1)[1]
    lettered: list[tuple[str | None, str]] = []
    dashed: list[tuple[str | None, str]] = []
    for line in block.splitlines():
        line = line.strip()
        if not line:
            continue
        if m := _LETTER_LINE.match(line):
            lettered.append((m.group(1), m.group(2).strip()))
        elif m := _DASH_LINE.match(line):
            dashed.append((None, m.group(1).strip()))
        elif lettered:
            # A wrapped option line continues the previous option.
            letter, prev = lettered[-1]
            lettered[-1] = (letter, f"{prev} {line}")
    return lettered or dashed


def normalize_em(text: str | None) -> str:
    """Official CoT Collection normalisation: strip, lowercase, drop "(", ")" and ","."""
    if text is None:
        return ""
    return text.strip().lower().replace("(", "").replace(")", "").replace(",", "")


def exact_match(prediction: str | None, gold: str) -> bool:
    return normalize_em(prediction) == normalize_em(gold)


def parse_number(text: str | None) -> float | None:
    """The last number in the text, thousands separators removed ("$18" -> 18, "2,125." -> 2125); None if none."""
    if not text:
        return None
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def numeric_match(prediction: str | None, gold: str) -> bool | None:
    """Math answers compared as numbers ("18.", "$18", "18" are equal); None when the gold is not a number."""
    if not _is_plain_number(gold):
        return None
    target = parse_number(gold)
    value = parse_number(prediction)
    return value is not None and math.isclose(value, target, rel_tol=0.0, abs_tol=1e-9)


def _is_plain_number(text: str) -> bool:
    return re.fullmatch(r"\s*\$?-?\d[\d,]*(?:\.\d+)?\.?\s*", text) is not None


def boxed_answer(text: str) -> str | None:
    """The content of the last non-empty `\\boxed{...}` in `text` (braces balanced, `\\{` `\\}` literal), stripped;
    None when there is none. The last one: models often box an intermediate result before the final one, and a
    nested box (`\\boxed{x = \\boxed{2}}`) gives the inner one."""
    for match in reversed(list(_BOXED.finditer(text))):
        depth, i = 1, match.end()
        while i < len(text) and depth:
            if text[i] == "\\":  # an escaped character (\{, \}, \\) never opens or closes the box
                i += 2
                continue
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        content = text[match.end() : i - 1].strip() if depth == 0 else ""
        if content:
            return content
    return None


_FENCE = re.compile(r"^[ \t]*```", re.MULTILINE)


def outside_code(text: str) -> str:
    """The text with every fenced code block (```lang ... ```) removed, the fences too; a block left open at the end
    (a generation cut inside it) runs to the end. Chat models' "Let's confirm with Python" blocks and the
    ```output blocks they write themselves are code, not the answer."""
    fences = [m.start() for m in _FENCE.finditer(text)]
    kept, pos = [], 0
    for opening, closing in zip(fences[::2], [*fences[1::2], None], strict=False):
        kept.append(text[pos:opening])
        if closing is None:
            return "".join(kept)
        end = text.find("\n", closing)
        pos = len(text) if end < 0 else end + 1
    kept.append(text[pos:])
    return "".join(kept)


def extract_answer(text: str, indicators: Sequence[str], until: Sequence[str] = ()) -> str:
    """The answer after the LAST occurrence of any indicator; the whole text (stripped) when none occurs.

    `until` (not in the official protocol, off by default) ends the answer at the first of those strings,
    for models that keep writing after the answer (e.g. ["\n"]).
    """
    best_end = -1
    for indicator in indicators:
        pos = text.rfind(indicator)
        if pos >= 0 and pos + len(indicator) > best_end:
            best_end = pos + len(indicator)
    answer = text[best_end:] if best_end >= 0 else text
    answer = answer.strip()
    for stop in until:
        if stop and stop in answer:
            answer = answer[: answer.index(stop)]
    return answer.strip()


def cut_at_indicator(text: str, indicators: Sequence[str]) -> tuple[str, bool]:
    """(text before the FIRST indicator, found): the rationale of a CoT classification generation."""
    first = -1
    for indicator in indicators:
        pos = text.find(indicator)
        if pos >= 0 and (first < 0 or pos < first):
            first = pos
    if first < 0:
        return text, False
    return text[:first], True


def rationale_of(text: str, indicators: Sequence[str] = ("[ANSWER]",)) -> str:
    """The rationale the options are scored after: official `remain_rationale`, `text.split('[ANSWER]', 1)[0].strip()`
    (with several indicators: cut before the first of any of them)."""
    return cut_at_indicator(text, indicators)[0].strip()


def pick_option(options: Sequence[str], scores: Sequence[float]) -> int:
    """Index of the highest score; ties go to the first option (stable, like numpy argmax)."""
    best = 0
    for i, score in enumerate(scores):
        if score > scores[best]:
            best = i
    return best
