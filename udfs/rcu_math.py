"""Mathematics in a step hidden from spaCy and given back: LaTeX and bare math commands found (`math_spans`),
each replaced by one placeholder token (`mask_math`), the masked texts parsed with the sentence starts a display
equation or a list line sets (`parse_masked`), and spans of the parse mapped back to the original text
(`restored_span`). Used by the steps job around the RCU extraction of udfs.rcu.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

# LaTeX in a step (`\\(18 - 6 = 12\\)`, `$x$`, `\\[ ... \\]`, `$$ ... $$`, a bare `\\frac{1}{2}`) is replaced by one
# placeholder token before spaCy sees the text, so neither the sentence splitter nor the clause rules can cut inside
# it (a "." in `-12. \\]` or `\\frac{5.7}{99}`), and the parser reads it as what it is in the sentence: a relation is
# an equation token (the clause rules treat "=" in a token as an equation, a claim without a verb), anything else a
# number. Units are found on the masked text and mapped back to the original characters.
MATH_RELATION = "1=1"
MATH_TERM = "7"
_RELATION = re.compile(r"=|<|>|\\(?:le|ge|leq|geq|neq|ne|approx|equiv|sim|simeq|cong|propto|Rightarrow|implies|iff|to)(?![a-zA-Z])")
_DISPLAY_OPEN = (("\\[", "\\]"), ("$$", "$$"))
_COMMAND = re.compile(r"\\[a-zA-Z]+")


@dataclass(frozen=True)
class Masked:
    """A text with its mathematics replaced; `spans`: (original start, end, masked start, end) of each replacement,
    in order; `display`: masked (start, end) of the display ones (they end their sentence when text follows)."""

    original: str
    text: str
    spans: tuple[tuple[int, int, int, int], ...] = ()
    display: tuple[tuple[int, int], ...] = ()

    def to_original(self, pos: int) -> int:
        """A masked offset -> the original one; inside a placeholder -> the end of its mathematics."""
        shift = 0
        for _o0, o1, m0, m1 in self.spans:
            if pos <= m0:
                break
            if pos <= m1:
                return o1
            shift = o1 - m1
        return pos + shift

    def restore(self, start: int, end: int) -> str:
        """The original text of the masked range [start, end)."""
        return self.original[self.to_original(start) : self.to_original(end)]


def _braced_end(text: str, i: int) -> int:
    """End of the balanced {...} group opening at text[i] == "{", or -1."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "\\":
            continue
        if text[j] == "{" and (j == 0 or text[j - 1] != "\\"):
            depth += 1
        elif text[j] == "}" and text[j - 1] != "\\":
            depth -= 1
            if depth == 0:
                return j + 1
    return -1


def _inline_dollar_end(text: str, i: int) -> int:
    """End of `$...$` math opening at i, or -1: Pandoc's rule, so a currency "$5 and $10" is not mathematics.

    The opening "$" has a non-space right after it; the closing one is the next unescaped "$", with a non-space
    right before it and no digit right after it, on the same paragraph."""
    if i + 1 >= len(text) or text[i + 1].isspace() or text[i + 1] == "$":
        return -1
    j = i + 1
    while j < len(text):
        if text[j] == "$" and text[j - 1] != "\\":
            break
        j += 1
    else:
        return -1
    if text[j - 1].isspace() or (j + 1 < len(text) and text[j + 1].isdigit()) or "\n\n" in text[i:j]:
        return -1
    return j + 1


def math_spans(text: str) -> list[tuple[int, int, bool]]:
    """(start, end, display?) of the mathematics in a text, in order, not overlapping."""
    out: list[tuple[int, int, bool]] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch not in "\\$":
            i += 1
            continue
        end, display = -1, False
        for opening, closing in _DISPLAY_OPEN:
            if text.startswith(opening, i):
                at = text.find(closing, i + len(opening))
                end, display = (at + len(closing), True) if at >= 0 else (-1, False)
                break
        else:
            if text.startswith("\\(", i):
                at = text.find("\\)", i + 2)
                end = at + 2 if at >= 0 else -1
            elif ch == "$" and (i == 0 or text[i - 1] != "\\"):
                end = _inline_dollar_end(text, i)
            elif ch == "\\" and (m := _COMMAND.match(text, i)) and m.end() < n and text[m.end()] == "{":
                # a bare command with its arguments: \\frac{1}{2}, \\boxed{84}
                end = m.end()
                while end < n and text[end] == "{" and (close := _braced_end(text, end)) > 0:
                    end = close
        if end > i:
            out.append((i, end, display))
            i = end
        else:
            i += 1
    return out


def mask_math(text: str) -> Masked:
    """The text with each piece of mathematics replaced by one placeholder token (see MATH_RELATION)."""
    found = math_spans(text)
    if not found:
        return Masked(text, text)
    parts: list[str] = []
    spans: list[tuple[int, int, int, int]] = []
    display: list[tuple[int, int]] = []
    pos = length = 0
    for start, end, is_display in found:
        parts.append(text[pos:start])
        length += start - pos
        token = MATH_RELATION if _RELATION.search(text, start, end) else MATH_TERM
        # a placeholder touching a word would merge with it into one token ("\\( k \\)-th" -> "7-th" is fine,
        # "is\\(x\\)" is not): pad with spaces there
        before = " " if start > 0 and text[start - 1].isalnum() else ""
        after = " " if end < len(text) and text[end].isalnum() else ""
        if before:  # a space that is not in the original: an empty replacement of its own
            spans.append((start, start, length, length + 1))
        m0 = length + len(before)
        spans.append((start, end, m0, m0 + len(token) + len(after)))  # the space after maps to the end
        if is_display:
            display.append((m0, m0 + len(token)))
        parts.append(before + token + after)
        length += len(before) + len(token) + len(after)
        pos = end
    parts.append(text[pos:])
    return Masked(text, "".join(parts), tuple(spans), tuple(display))


def parse_masked(nlp: Any, masks: Iterable[Masked], batch_size: int = 64) -> Iterator[Any]:
    """spaCy docs of masked texts, in order. A display equation followed by text ends its sentence there, and so does
    a line break before a list item ("- ") or a capital; the parser is told so before it runs (spaCy keeps a
    sentence start set on the doc)."""

    def docs() -> Iterator[Any]:
        for m in masks:
            doc = nlp.make_doc(m.text)
            ends = {e for _, e in m.display}
            for tok in doc[1:]:
                prev = doc[tok.i - 1]
                if tok.is_space:
                    continue
                if prev.idx + len(prev.text) in ends and not tok.is_punct:
                    tok.is_sent_start = True
                elif "\n" in m.text[prev.idx : tok.idx] and tok.text[:1].isupper():
                    tok.is_sent_start = True  # a new line that opens a sentence
                elif "\n" in m.text[prev.idx : tok.idx] and tok.text in ("-", "*", "•") and tok.i + 1 < len(doc):
                    # a list item: its text starts the sentence (the bullet stays behind, an edge of no unit)
                    doc[tok.i + 1].is_sent_start = True
            yield doc

    return nlp.pipe(docs(), batch_size=batch_size)


def restored_span(mask: Masked, span: Any) -> tuple[str, int]:
    """(original text without edge whitespace, its original start) of a doc or span of a masked text."""
    start = span.start_char if hasattr(span, "start_char") else 0
    text = span.text
    lead = len(text) - len(text.lstrip())
    stripped = text.strip()
    a = mask.to_original(start + lead)
    b = mask.to_original(start + lead + len(stripped))
    return mask.original[a:b], a
