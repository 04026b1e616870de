"""A symbolic check of a step's arithmetic: every claim `<expression> = <number>` in a step, both sides evaluated
exactly (fractions.Fraction) and compared at the precision the claim is written at. Pure Python: no Spark, no
model, no eval() (a tokenizer, a recursive-descent parser and an evaluator over its tree).

One concern, one file (1,000+ lines): the model-free arithmetic check behind `arith_valid` / `arith_errors`, with
`check_step` its one entry point. Its four stages (tokens, contextual resolution, exact evaluation, claims) share
one token vocabulary (NUM, LP, UNIT, BREAK, ...) and decide together what is a claim: a reading rule in one is
tuned against the others on one test set (tests/udfs/test_arith.py), and no stage is used on its own by the jobs.

What is read
  Plain text and LaTeX in one pass (math delimiters `\\( \\)`, `\\[ \\]`, `$ $`, `$$ $$` end a run of math like
  punctuation; `$` before a digit is a currency sign): numbers with thousands separators (`14,000`, `14{,}000`),
  `+ - * / ^ ×  · ÷ \\times \\cdot \\div`, `\\frac` `\\dfrac` `\\tfrac` (`\\frac12` too), `\\sqrt` (exact roots
  only), `\\binom`, `n!`, `%` / `\\%` / "percent", "x" / "times" / "of" / "plus" / "minus" / "divided by" between
  numbers, mod, implicit products (`2(3+4)`, `(2)(3)`), mixed numbers (`2 1/2`, `2\\frac{1}{2}`: both readings are
  tried), numbers in other bases (`1011_2`), currency signs, units (`\\text{...}`, words after a number,
  `pounds/book`, `miles per hour`), degrees. Chains `a = b = c` give one claim per neighbouring pair of sides;
  `\\approx`, `≈` and "approximately" after `=` mark an approximate claim. A running computation
  (`3 + 4 = 7 * 2 = 14`: the value written, then multiplied or divided) holds when it starts with exactly the value.
  A quotient and a remainder (`17 \\div 5 = 3 \\text{ remainder } 2`, `17 / 5 = 3 R 2`) hold when 17 = 5 * 3 + 2
  and the remainder is below the divisor.

Which pairs are claims (the rest is skipped, never flagged)
  - Both sides evaluate: a side with an unknown (a letter, `\\pi`, a function, `...`) is skipped, so are
    equations with unknowns, lists of roots and malformed LaTeX; so is a chain that ends in a modulus
    (`\\pmod{17}`, `(mod 17)`: its `=` are congruences).
  - At least one side computes something (an operator), or the pair continues a checked chain with the same
    units on both sides (`3 * 4 = 12 = 13`): `5 m = 500 cm`, `1.5 hours = 90 minutes` are conversions.
  - A lone number right after a word opens a label, not a claim (`Adam's age in 8 years = 20`); so does a lone
    number that the other side computes with, when the pair fails (`Discount on $2.40 = 0.25 * $2.40`); a lone
    number with a unit before a computation without that unit is a conversion (`2 hours = 2 * 60 = 120 minutes`);
    a sum of terms in different units (`3 feet + 6 inches`) is skipped.

When a claim holds
  Exactly equal; or the written number is the value rounded or truncated at its last written decimal
  (`10/3 = 3.33`, `2/3 = 0.66`); or, for an integer written against a non-integer value, within 1 (a rounded,
  floored or ceiled count: `194 / 11 = 17`); a percentage may be written as its number (`15/60 * 100 = 25%`); an
  approximate claim also holds within 1 % (relative). A decimal with two or more places on either side may be a
  rounded intermediate (`0.33 * 30 = 10`): it stands for the interval of one unit in its last place around it,
  and the claim holds when some value of that interval does.

Limits (never a crash): huge powers, factorials and numbers are not evaluated (skipped); every failure inside one
claim skips that claim; a step is read up to MAX_CHARS characters (the ingest job caps fields far above that and
quarantines text that is not UTF-8; the chain's own truncation rules apply before this).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

MAX_CHARS = 20_000  # a step is checked up to here (a step longer than this is in practice not prose)
MAX_CLAIMS = 200  # per step
MAX_SIDE_TOKENS = 400
MAX_BITS = 4_096  # numerator or denominator larger than this: not evaluated
MAX_EXPONENT = 1_000
MAX_FACTORIAL = 300
APPROX_RELATIVE = Fraction(1, 100)

# ------------------------------------------------------------------------------------------------ tokens
NUM, OP, LP, RP, PCT, FACT, FRAC, SQRT, BINOM, EQ, UNIT, WORD, TEXT, VAR, CUR, BREAK, WBREAK, NL, AMP, ELLIPSIS, \
    SUBSCRIPT = (
        "num", "op", "lp", "rp", "pct", "fact", "frac", "sqrt", "binom", "eq", "unit", "word", "text", "var", "cur",
        "break", "wbreak", "nl", "amp", "ellipsis", "sub")
HARD = "hard"  # a BREAK's value when it ends a sentence or a formula (punctuation, relations, math delimiters)


@dataclass
class Tok:
    kind: str
    start: int
    end: int
    value: object = None  # NUM: Fraction; OP: symbol; WORD/TEXT/UNIT: text; EQ: approx flag; SUBSCRIPT: content
    decimals: int = 0  # NUM: digits after the point
    raw: str = ""  # NUM: the digits as written (without separators)
    approx: bool = False  # NUM followed by an ellipsis (a truncated non-terminating decimal)
    based: bool = False  # NUM written in another base (1011_2): reading it is a conversion, checked like a sum


# Words that end a run of math rather than name a unit (`12 and 12 + 2`, `30 more`).
STOPWORDS = frozenset("""
a an the and or but so then than that this these those there here is are was were be been being am it its
in on at to for from by with without into onto of off out over under about as if when while since because
after before each every per which who whom whose what where how why not no nor more less fewer most least
total totals gives give giving makes make equals equal means mean we you he she they i let lets let's
has have had will would can could should must may might do does did now also only just still yet again
therefore thus hence giving get gets got find found left right first second third next last all both
""".split()) - {"per", "left"}

REMAINDER_WORDS = frozenset({"r", "rem", "remainder"})  # `17 / 5 = 3 R 2`, `3 \text{ remainder } 2`
APPROX_WORDS = frozenset({"approximately", "approx", "about", "roughly", "around", "nearly", "almost"})
WORD_OPS = {"times": "*", "plus": "+", "minus": "-", "mod": "mod", "modulo": "mod"}

_LATEX_OPS = {"times": "*", "cdot": "*", "ast": "*", "div": "/", "bmod": "mod", "mod": "mod"}
_LATEX_IGNORE = frozenset("""left right big Big bigg Bigg bigl bigr Bigl Bigr biggl biggr Biggl Biggr displaystyle
textstyle scriptstyle limits nolimits boxed fbox hline nonumber notag degree circ mathstrut strut phantom""".split())
_LATEX_SIZES = frozenset("left big Big bigg Bigg bigl Bigl biggl Biggl".split())  # before a bracket
_LATEX_BREAK = frozenset("""quad qquad neq ne le leq ge geq lt gt ll gg leqslant geqslant Rightarrow rightarrow
Longrightarrow longrightarrow implies to iff Leftrightarrow Leftarrow leftarrow therefore because equiv cong in
notin subset subseteq supset cup cap mid nmid propto perp parallel land lor wedge vee setminus not colon and text
newline""".split())
_LATEX_APPROX = frozenset({"approx", "simeq", "sim", "thickapprox", "doteq"})
_LATEX_TEXT = frozenset({"text", "textbf", "textit", "textrm", "textsf", "texttt", "mathrm", "mbox", "textnormal",
                         "emph"})
# Commands whose argument is a symbol (a vector, a point, a function name): an unknown, argument and all.
_LATEX_SYMBOL = frozenset({"mathbf", "mathit", "mathsf", "mathcal", "mathbb", "bold", "boldsymbol", "vec", "hat",
                           "bar", "overline", "underline", "tilde", "dot", "ddot", "widehat", "overrightarrow",
                           "operatorname", "angle", "triangle"})
# Units written attached to a number (`5kg`, `3rd`); any other attached word is a product of unknowns (`3ab`).
ATTACHED_UNITS = frozenset("""kg mg km cm mm mi ft yd lb lbs oz hr hrs min mins sec secs ms ml mph kph st nd rd th pm
am gb mb kb tb kw kwh""".split())
ORDINALS = frozenset({"st", "nd", "rd", "th"})  # 1st, 6th: positions, not quantities
_LATEX_ELLIPSIS = frozenset({"ldots", "cdots", "dots", "dotsc", "dotsb", "vdots", "ddots"})

_VULGAR = {"½": "1/2", "⅓": "1/3", "⅔": "2/3", "¼": "1/4", "¾": "3/4", "⅕": "1/5", "⅛": "1/8"}
_PRE = [
    (re.compile(r"<<[^<>]{0,200}>>"), " "),  # GSM-8K calculator annotations: tool markup
    # A matrix, array or case split is one opaque value (its rows are not equations of the step).
    (re.compile(r"\\begin\{([pbBvV]?matrix|smallmatrix|array|cases)\}.*?\\end\{\1\}", re.DOTALL), r" \\opaque "),
    (re.compile(r"\\begin\{[A-Za-z*]*\}(\{[^{}]*\})?|\\end\{[A-Za-z*]*\}"), " "),
    # A parenthesised label after a space (`8 (math and science) + 4`): no digit, no operator, a word.
    (re.compile(r"(?<=\s)\((?=[^()]*[A-Za-z]{3})[A-Za-z][A-Za-z ,'’&/.\-]*\)"), " "),
    (re.compile(r"\\(?:left|right)\s*\."), " "),
    (re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°"), " "),  # degrees
    (re.compile(r"\\(?:label|tag)\{[^{}]*\}"), " "),
    (re.compile(r"\\([dtc]?frac|[dt]?binom)\s*(\d)\s*(\d)"), r"\\\1{\2}{\3}"),  # \frac12
    (re.compile(r"\\([dtc]?frac|[dt]?binom)\s*(\{[^{}]*\})\s*(\d)"), r"\\\1\2{\3}"),  # \frac{1}2
    (re.compile(r",\\!"), ","),
    (re.compile(r"(?<=\d)\{,\}(?=\d{3})"), ","),  # 14{,}000
    (re.compile(r"(?<![\d*])\*\*|\*\*(?![\d(])|__"), " "),  # markdown bold
    (re.compile(r"(?<=\d)\*\*(?=[\d(])"), "^"),  # 2**3
    (re.compile(r"(?m)^[ \t]*(?:\d{1,2}[.)]|[-*•]|#+)[ \t]+"), " "),  # list markers, headings
]
_SUPERSCRIPTS = str.maketrans({"²": "^2", "³": "^3", "−": "-", "–": " – ", "×": "*", "·": "*", "⋅": "*", "∙": "*",
                               "÷": "/", "≈": "≈", "…": "…"})

_TOKEN = re.compile(
    r"""(?P<ws>[ \t\r\f\v~]+)
    |(?P<nl>\n)
    |(?P<cmd>\\[A-Za-z]+)
    |(?P<esc>\\[()\[\]{}%$,;:!\ &\\|#_])
    |(?P<num>(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)
    |(?P<word>[A-Za-z]+(?:['’][A-Za-z]+)?)
    |(?P<ell>\.\.\.+|…)
    |(?P<sub>_(?:\{[^{}]*\}|\(\d+\)|\d+|[A-Za-z]))
    |(?P<sym><=|>=|!=|:=|==|[=≈+\-*/^%()\[\]{}!$€£¥₹&√π'])
    |(?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)


class NotEvaluable(Exception):
    """A side that does not evaluate to a number (an unknown, an unparsable or a too large expression)."""


def _preprocess(text: str) -> str:
    text = text[:MAX_CHARS]
    for ch, rep in _VULGAR.items():
        if ch in text:
            text = text.replace(ch, f" {rep}")
    text = text.translate(_SUPERSCRIPTS)
    for pattern, rep in _PRE:
        text = pattern.sub(rep, text)
    return text


def _brace_group(text: str, i: int) -> tuple[str, int] | None:
    """The balanced `{...}` starting at text[i] (after spaces): (content, index after it), or None."""
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, min(len(text), i + 2_000)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j], j + 1
    return None


def tokenize(text: str, offset: int = 0) -> list[Tok]:
    """Raw tokens of (preprocessed) text; `offset` shifts positions (text inside \\text{...})."""
    out: list[Tok] = []
    pos, n = 0, len(text)
    sized: int | None = None  # where a `\left` (`\bigl`, ...) before the next token starts
    while pos < n:
        m = _TOKEN.match(text, pos)
        if m is None:  # cannot happen: `other` matches any character
            break
        kind, s, e = m.lastgroup, m.start() + offset, m.end() + offset
        g = m.group()
        pos = m.end()
        if kind == "ws":
            continue
        opened_at, sized = sized, None
        if kind == "nl":
            out.append(Tok(NL, s, e))
        elif kind == "num":
            raw = g.replace(",", "")
            dec = len(raw.split(".", 1)[1]) if "." in raw else 0
            out.append(Tok(NUM, s, e, Fraction(raw), dec, raw))
        elif kind == "word":
            low = g.lower().replace("’", "'")
            if len(g) == 1 and g not in "aAI":
                out.append(Tok(WORD if low == "x" else VAR, s, e, low))
            elif len(g) == 1:  # a / A / I: an article or pronoun before a word, else a variable
                nxt = re.match(r"\s*[A-Za-z]", text[pos:pos + 20])
                out.append(Tok(WORD if nxt else VAR, s, e, low))
            elif out and out[-1].end == s and (low not in ATTACHED_UNITS or low in ORDINALS) \
                    and (out[-1].kind == NUM or out[-1].kind == RP and text[m.start() - 1] == "}"):
                # 3ab, 5AD, \frac{1}{2}xy: a product with unknowns (in LaTeX, letters after a group are symbols);
                # 6th: a position
                out.append(Tok(VAR, s, e, low))
            elif g.isupper() and len(g) <= 3:
                out.append(Tok(VAR, s, e, low))  # AB, OP: points and segments
            else:
                out.append(Tok(WORD, s, e, low))
        elif kind == "ell":
            out.append(Tok(ELLIPSIS, s, e))
        elif kind == "sub":
            out.append(Tok(SUBSCRIPT, s, e, g[1:].strip("{}()")))
        elif kind == "esc":
            c = g[1]
            if c in "()[]":
                out.append(Tok(BREAK, s, e, HARD))  # math delimiters
            elif c == "{":
                out.append(Tok(LP, s if opened_at is None else opened_at, e))
            elif c == "}":
                out.append(Tok(RP, s, e))
            elif c == "%":
                out.append(Tok(PCT, s, e))
            elif c == "$":
                out.append(Tok(CUR, s, e))
            elif c == "\\":
                out.append(Tok(NL, s, e))
            elif c == "&":
                out.append(Tok(AMP, s, e))
            elif c in "|#_":
                out.append(Tok(VAR, s, e))
            # \, \; \: \! \  : spacing
        elif kind == "cmd":
            name = g[1:]
            if name in _LATEX_TEXT:
                group = _brace_group(text, pos)
                if group is None:
                    out.append(Tok(VAR, s, e))
                    continue
                content, after = group
                inner_start = text.index("{", pos) + 1
                pos = after
                stripped = content.strip()
                if re.search(r"\d", content):
                    out.extend(tokenize(content, offset + inner_start))
                elif len(stripped) == 1 and stripped.isalpha():
                    out.append(Tok(VAR, s, after + offset, stripped.lower()))
                elif stripped.lower() in STOPWORDS or not stripped:
                    out.append(Tok(BREAK if stripped else WORD, s, after + offset, stripped.lower()))
                else:
                    out.append(Tok(TEXT, s, after + offset, stripped.lower()))
            elif name in ("frac", "dfrac", "tfrac", "cfrac"):
                out.append(Tok(FRAC, s, e))
            elif name in ("binom", "dbinom", "tbinom"):
                out.append(Tok(BINOM, s, e))
            elif name == "sqrt":
                out.append(Tok(SQRT, s, e))
            elif name in _LATEX_OPS:
                out.append(Tok(OP, s, e, _LATEX_OPS[name]))
            elif name in _LATEX_APPROX:
                out.append(Tok(EQ, s, e, True))
            elif name in _LATEX_ELLIPSIS:
                out.append(Tok(ELLIPSIS, s, e))
            elif name in _LATEX_IGNORE:
                sized = s if name in _LATEX_SIZES else None
            elif name in _LATEX_BREAK:
                out.append(Tok(BREAK, s, e, HARD))
            elif name in _LATEX_SYMBOL:
                group = _brace_group(text, pos)
                if group is not None:
                    pos = group[1]
                out.append(Tok(VAR, s, (group[1] if group else pos) + offset, name))
            else:  # \pi, \alpha, \sin, \log, \overline, \pm, ...: an unknown
                out.append(Tok(VAR, s, e, name))
        elif kind == "sym":
            if g in ("=", "==", ":="):
                out.append(Tok(EQ, s, e, False))
            elif g == "≈":
                out.append(Tok(EQ, s, e, True))
            elif g in "+-*/^":
                out.append(Tok(OP, s, e, g))
            elif g in "([{":
                # `\left(` is one bracket: a claim's text starts at `\left`, not at `(`
                out.append(Tok(LP, s if opened_at is None else opened_at, e, g))
            elif g in ")]}":
                out.append(Tok(RP, s, e))
            elif g == "%":
                out.append(Tok(PCT, s, e))
            elif g == "!":
                # n! only where an expression goes on (`5! = 120`, `5!/3!`) or a formula ends (`\[ 11! = 11 \times
                # 10! \]`: inside math, `!` is a factorial): "= 12!" in prose ends a sentence.
                nxt = re.match(r"\s*([=+\-*/)}^&]|\\(?:times|cdot|div|right|frac)|\\[)\]\\]|\$(?![\d.]))",
                               text[pos:pos + 12])
                out.append(Tok(FACT if nxt and out and out[-1].kind in (NUM, RP) and out[-1].end == s else BREAK,
                               s, e))
            elif g == "$":
                if re.match(r"\d|\.\d", text[pos:pos + 2]):
                    out.append(Tok(CUR, s, e))
                else:
                    out.append(Tok(BREAK, s, e, HARD))
            elif g in "€£¥₹":
                out.append(Tok(CUR, s, e))
            elif g == "&":
                out.append(Tok(AMP, s, e))
            elif g == "√":
                out.append(Tok(SQRT, s, e))
            elif g in "π'":
                out.append(Tok(VAR, s, e, g))  # pi; a prime (f'(2))
            else:  # <= >= !=
                out.append(Tok(BREAK, s, e, HARD))
        else:
            out.append(Tok(BREAK, s, e, HARD if g in ".,;:?<>≤≥≠\n" else None))
    return out


# ---------------------------------------------------------------------------------- contextual resolution
_OPERAND_END = (NUM, RP, PCT, FACT)
_OPERAND_START = (NUM, LP, FRAC, SQRT, BINOM, CUR)
_UNIT_AFTER = (NUM, RP, PCT, UNIT)


def _resolve(raw: list[Tok]) -> list[Tok]:
    """Words, subscripts, line breaks and ellipses read in context: operators between numbers, units after
    them, breaks elsewhere."""
    out: list[Tok] = []
    n = len(raw)

    def nxt(i: int, skip_nl: bool = False) -> Tok | None:
        j = i + 1
        while skip_nl and j < n and raw[j].kind in (NL, AMP):
            j += 1
        return raw[j] if j < n else None

    def prev() -> Tok | None:
        return out[-1] if out else None

    i = 0
    while i < n:
        t = raw[i]
        p = prev()
        k = t.kind
        if k in (WORD, TEXT, VAR) and t.value in REMAINDER_WORDS and p is not None and p.kind == NUM \
                and p.decimals == 0 and len(out) >= 2 and out[-2].kind == EQ \
                and i + 1 < n and raw[i + 1].kind == NUM and raw[i + 1].decimals == 0:
            out.append(Tok(OP, t.start, t.end, "rem"))  # `= 3 R 2`: a quotient and a remainder
        elif (k == WORD and t.value in ("mod", "modulo") or k == OP and t.value == "mod") and p is not None \
                and p.kind == LP:
            out.append(Tok(VAR, t.start, t.end, "pmod"))  # `(mod 17)`, `(\bmod 17)`: as `\pmod{17}`
        elif k == WORD:
            w = t.value
            after = nxt(i)
            between = p is not None and p.kind in _OPERAND_END and after is not None and after.kind in _OPERAND_START
            if w in ("x", "times") and between and not (w == "x" and p.kind == PCT):
                out.append(Tok(OP, t.start, t.end, "*"))
            elif w in WORD_OPS and between:
                out.append(Tok(OP, t.start, t.end, WORD_OPS[w]))
            elif w in ("divided", "multiplied") and p is not None and p.kind in _OPERAND_END and after is not None \
                    and after.kind == WORD and after.value == "by" and i + 2 < n and raw[i + 2].kind in _OPERAND_START:
                out.append(Tok(OP, t.start, after.end, "/" if w == "divided" else "*"))
                i += 1
            elif w == "of" and between and p.kind in (NUM, RP, PCT):
                out.append(Tok(OP, t.start, t.end, "*"))
            elif w in ("percent", "pct") and p is not None and p.kind == NUM:
                out.append(Tok(PCT, t.start, t.end))
            elif w in APPROX_WORDS and p is not None and p.kind == EQ:
                p.value = True
            elif w == "per" and p is not None and p.kind in _UNIT_AFTER and after is not None \
                    and after.kind in (WORD, TEXT) and after.value not in STOPWORDS:
                out.append(Tok(UNIT, t.start, after.end, after.value))
                i += 1
            elif p is not None and p.kind in _UNIT_AFTER and w not in STOPWORDS and w != "x":
                out.append(Tok(UNIT, t.start, t.end, w))
            elif w == "x":
                out.append(Tok(VAR, t.start, t.end, w))
            else:
                out.append(Tok(WBREAK, t.start, t.end, w))
        elif k == TEXT:
            out.append(Tok(UNIT if p is not None and p.kind in _UNIT_AFTER else WBREAK, t.start, t.end, t.value))
        elif k == OP and t.value == "/" and p is not None and p.kind in (NUM, UNIT, RP, PCT) and i + 1 < n \
                and raw[i + 1].kind in (WORD, TEXT) and raw[i + 1].value not in STOPWORDS \
                and len(raw[i + 1].value) > 1:
            out.append(Tok(UNIT, t.start, raw[i + 1].end, raw[i + 1].value))  # pounds/book
            i += 1
        elif k in (NL, AMP):
            # A line break or alignment mark inside a chain of `=` (aligned displays) continues it.
            following = nxt(i, skip_nl=True)
            continues = (p is not None and p.kind in (EQ, OP)) or (following is not None and following.kind == EQ)
            if not continues:
                out.append(Tok(BREAK, t.start, t.end, HARD))
        elif k == SUBSCRIPT:
            if p is not None and p.kind == NUM and p.end == t.start and p.decimals == 0 and t.value.isdigit():
                base = int(t.value)
                digits = p.raw
                if 2 <= base <= 36 and all(int(c, 36) < base for c in digits):
                    out[-1] = Tok(NUM, p.start, t.end, Fraction(int(digits, base)), 0, str(int(digits, base)),
                                  based=base != 10)
                else:
                    out[-1] = Tok(VAR, p.start, t.end)
            else:
                out.append(Tok(VAR, t.start, t.end))
        elif k == ELLIPSIS:
            following = nxt(i)
            if p is not None and p.kind == NUM and p.decimals > 0 and (following is None or following.kind in (
                    EQ, BREAK, NL, WBREAK, WORD, TEXT, RP)):
                p.approx = True  # 3.333...: a truncated non-terminating decimal
            else:
                out.append(Tok(VAR, t.start, t.end))
        else:
            out.append(t)
        i += 1
    return out


# ----------------------------------------------------------------------------------------- evaluation
@dataclass(frozen=True)
class Val:
    """An exact value and the interval it may stand for (equal to it unless a rounded decimal took part)."""

    v: Fraction
    lo: Fraction
    hi: Fraction

    @property
    def exact(self) -> bool:
        return self.lo == self.hi


def _exact(v: Fraction) -> Val:
    _check_size(v)
    return Val(v, v, v)


def _check_size(v: Fraction) -> None:
    if v.numerator.bit_length() > MAX_BITS or v.denominator.bit_length() > MAX_BITS:
        raise NotEvaluable("number too large")


def _literal(t: Tok) -> Val:
    v = t.value
    if t.decimals >= 2 or t.approx:
        u = Fraction(1, 10 ** t.decimals)
        return Val(v, v - u, v + u)
    return Val(v, v, v)


def _add(a: Val, b: Val) -> Val:
    return Val(a.v + b.v, a.lo + b.lo, a.hi + b.hi)


def _neg(a: Val) -> Val:
    return Val(-a.v, -a.hi, -a.lo)


def _mul(a: Val, b: Val) -> Val:
    products = (a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi)
    out = Val(a.v * b.v, min(products), max(products))
    _check_size(out.v)
    return out


def _div(a: Val, b: Val) -> Val:
    if b.v == 0 or b.lo <= 0 <= b.hi:
        raise NotEvaluable("division by zero")
    inv = Val(1 / b.v, 1 / b.hi, 1 / b.lo)
    return _mul(a, inv)


def _int_root(n: int, k: int) -> int | None:
    if n < 0:
        if k % 2 == 0:
            return None
        r = _int_root(-n, k)
        return None if r is None else -r
    if k == 2:
        r = math.isqrt(n)
    else:
        r = round(n ** (1.0 / k)) if n.bit_length() < 1000 else None
        if r is None:
            return None
        for c in (r - 1, r, r + 1):
            if c >= 0 and c ** k == n:
                return c
        return None
    return r if r * r == n else None


def _root(a: Val, k: int) -> Val:
    if not a.exact:
        raise NotEvaluable("root of a rounded value")
    num, den = _int_root(a.v.numerator, k), _int_root(a.v.denominator, k)
    if num is None or den is None:
        raise NotEvaluable("irrational root")
    return _exact(Fraction(num, den))


def _pow(a: Val, b: Val) -> Val:
    if not b.exact:
        raise NotEvaluable("rounded exponent")
    e = b.v
    if e.denominator != 1:
        if e.denominator > 12:
            raise NotEvaluable("root index")
        return _pow(_root(a, e.denominator), _exact(Fraction(e.numerator)))
    n = e.numerator
    if abs(n) > MAX_EXPONENT or (a.v != 0 and abs(n) * max(a.v.numerator.bit_length(), a.v.denominator.bit_length())
                                 > MAX_BITS):
        raise NotEvaluable("power too large")
    if n < 0:
        return _div(_exact(Fraction(1)), _pow(a, _exact(Fraction(-n))))
    ends = (a.lo ** n, a.hi ** n)
    lo, hi = min(ends), max(ends)
    if n % 2 == 0 and a.lo < 0 < a.hi:
        lo = Fraction(0)
    return Val(a.v ** n, lo, hi)


def _factorial(a: Val) -> Val:
    if not a.exact or a.v.denominator != 1 or not 0 <= a.v <= MAX_FACTORIAL:
        raise NotEvaluable("factorial")
    return _exact(Fraction(math.factorial(int(a.v))))


def _binom(a: Val, b: Val) -> Val:
    if not (a.exact and b.exact) or a.v.denominator != 1 or b.v.denominator != 1 or not 0 <= a.v <= 10_000:
        raise NotEvaluable("binomial")
    return _exact(Fraction(math.comb(int(a.v), int(b.v)) if b.v >= 0 else 0))


def _mod(a: Val, b: Val) -> Val:
    if not (a.exact and b.exact) or a.v.denominator != 1 or b.v.denominator != 1 or b.v == 0:
        raise NotEvaluable("mod")
    return _exact(Fraction(int(a.v) % int(b.v)))


class _Parser:
    """Recursive descent over one side's tokens (units and currency signs already removed):

    expr   := term (('+' | '-') term)*
    term   := factor (('*' | '/' | 'mod') factor | factor starting with '(' \\frac \\sqrt \\binom)*
    factor := ('-' | '+') factor | power
    power  := postfix ('^' factor)?
    postfix:= atom ('%' | '!')*
    atom   := number | mixed number | '(' expr ')' | \\frac g g | \\sqrt['[' expr ']'] g | \\binom g g
    """

    def __init__(self, toks: Sequence[Tok], mixed: bool) -> None:
        self.t = toks
        self.i = 0
        self.mixed = mixed
        self.used_mixed = False

    def peek(self, k: int = 0) -> Tok | None:
        j = self.i + k
        return self.t[j] if j < len(self.t) else None

    def take(self) -> Tok:
        tok = self.peek()
        if tok is None:
            raise NotEvaluable("unexpected end")
        self.i += 1
        return tok

    def parse(self) -> Val:
        v = self.expr()
        if self.i != len(self.t):
            raise NotEvaluable("trailing tokens")
        return v

    def expr(self) -> Val:
        v = self.term()
        while (t := self.peek()) is not None and t.kind == OP and t.value in "+-" and t.value != "":
            self.i += 1
            rhs = self.term()
            v = _add(v, rhs if t.value == "+" else _neg(rhs))
        return v

    def term(self) -> Val:
        v = self.factor()
        while (t := self.peek()) is not None:
            if t.kind == OP and t.value in ("*", "/", "mod"):
                self.i += 1
                rhs = self.factor()
                v = _mul(v, rhs) if t.value == "*" else _div(v, rhs) if t.value == "/" else _mod(v, rhs)
            elif t.kind in (LP, FRAC, SQRT, BINOM):
                v = _mul(v, self.factor())  # implicit product: 2(3 + 4), (2)(3), 2\sqrt{9}
            else:
                break
        return v

    def factor(self) -> Val:
        t = self.peek()
        if t is not None and t.kind == OP and t.value in "+-":
            self.i += 1
            v = self.factor()
            return _neg(v) if t.value == "-" else v
        return self.power()

    def power(self) -> Val:
        base = self.postfix()
        t = self.peek()
        if t is not None and t.kind == OP and t.value == "^":
            self.i += 1
            return _pow(base, self.factor())
        return base

    def postfix(self) -> Val:
        v = self.atom()
        while (t := self.peek()) is not None and t.kind in (PCT, FACT):
            self.i += 1
            v = _mul(v, _exact(Fraction(1, 100))) if t.kind == PCT else _factorial(v)
        return v

    def group(self) -> Val:
        t = self.peek()
        if t is not None and t.kind == LP:
            self.i += 1
            v = self.expr()
            if self.take().kind != RP:
                raise NotEvaluable("unbalanced")
            return v
        if t is not None and t.kind == NUM:
            self.i += 1
            return _literal(t)
        raise NotEvaluable("group expected")

    def atom(self) -> Val:
        t = self.take()
        if t.kind == NUM:
            v = _literal(t)
            if self.mixed and t.decimals == 0 and t.value >= 0:
                mixed = self._mixed_fraction()
                if mixed is not None:
                    self.used_mixed = True
                    return _add(v, mixed)
            return v
        if t.kind == LP:
            v = self.expr()
            if self.take().kind != RP:
                raise NotEvaluable("unbalanced")
            return v
        if t.kind == FRAC:
            return _div(self.group(), self.group())
        if t.kind == BINOM:
            return _binom(self.group(), self.group())
        if t.kind == SQRT:
            index = 2
            a, b, c = self.peek(), self.peek(1), self.peek(2)
            if a is not None and a.kind == LP and a.value == "[" and b is not None and b.kind == NUM \
                    and b.decimals == 0 and c is not None and c.kind == RP:  # \sqrt[3]{27}
                index = int(b.value)
                self.i += 3
                if not 2 <= index <= 12:
                    raise NotEvaluable("root index")
            return _root(self.group(), index)
        raise NotEvaluable(f"unexpected {t.kind}")

    def _mixed_fraction(self) -> Val | None:
        """After an integer: `1/2` (plain text) or `\\frac{1}{2}` with numerator < denominator, or None."""
        a, b, c = self.peek(), self.peek(1), self.peek(2)
        if a is not None and a.kind == NUM and a.decimals == 0 and b is not None and b.kind == OP and b.value == "/" \
                and c is not None and c.kind == NUM and c.decimals == 0 and 0 < a.value < c.value:
            after = self.peek(3)
            if after is None or not (after.kind == OP and after.value == "^"):
                self.i += 3
                return _exact(a.value / c.value)
        if a is not None and a.kind == FRAC:
            toks = self.t[self.i + 1:self.i + 7]
            kinds = [x.kind for x in toks]
            if kinds == [LP, NUM, RP, LP, NUM, RP] and toks[1].decimals == 0 and toks[4].decimals == 0 \
                    and 0 < toks[1].value < toks[4].value:
                self.i += 7
                return _exact(toks[1].value / toks[4].value)
        return None


def evaluate(tokens: Sequence[Tok]) -> list[Val]:
    """The values a side's tokens can mean: one, or two where an integer before a fraction reads as a mixed
    number or as a product. NotEvaluable when none parses."""
    if len(tokens) > MAX_SIDE_TOKENS:
        raise NotEvaluable("side too long")
    if any(t.kind not in (NUM, OP, LP, RP, PCT, FACT, FRAC, SQRT, BINOM) for t in tokens):
        raise NotEvaluable("unknown")
    p = _Parser(tokens, mixed=True)
    first = p.parse()
    if not p.used_mixed:
        return [first]
    try:
        return [first, _Parser(tokens, mixed=False).parse()]
    except NotEvaluable:
        return [first]


# ---------------------------------------------------------------------------------------- claims
@dataclass(frozen=True)
class Equation:
    """One checked equation: its text, both sides' values and whether it holds at its written precision."""

    text: str
    left: Fraction
    right: Fraction
    holds: bool
    approx: bool = False
    computed_right: bool = False  # the right side is the computation, the left the written number (`7 = 2^3`)
    divisor: int | None = None  # a division with a remainder (`17 / 5 = 3 R 2`): both values are over it

    def explain(self) -> str:
        """`18 - 6 = 13 (is 12)`: the claim and what its computed side really is (`17 / 5 = 3 R 1 (is 3 R 2)`)."""
        if self.divisor:
            quotient, remainder = divmod(int(self.left * self.divisor), self.divisor)
            return f"{self.text} (is {quotient} R {remainder})"
        return f"{self.text} (is {format_value(self.right if self.computed_right else self.left)})"


@dataclass(frozen=True)
class StepCheck:
    claims: tuple[Equation, ...] = ()

    @property
    def checked(self) -> int:
        return len(self.claims)

    @property
    def failed(self) -> tuple[Equation, ...]:
        return tuple(c for c in self.claims if not c.holds)

    @property
    def errors(self) -> int:
        return len(self.failed)

    @property
    def valid(self) -> float | None:
        """Share of the checkable equations that hold; None when the step has none."""
        return None if not self.claims else (self.checked - self.errors) / self.checked

    @property
    def detail(self) -> str | None:
        """The failing equations with their real values (`18 - 6 = 13 (is 12)`), `; `-joined; None if none."""
        failed = self.failed
        return "; ".join(c.explain() for c in failed) if failed else None


def format_value(v: Fraction) -> str:
    """12, -0.25, 10/3 ≈ 3.33333: exact where short, else the fraction and six significant digits."""
    if v.denominator == 1:
        return str(v.numerator)
    den = v.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    if den == 1:
        s = f"{float(v):.10f}".rstrip("0").rstrip(".") if abs(v) < 10 ** 12 else f"{float(v):.6g}"
        if Fraction(s) == v:
            return s
    approx = f"{float(v):.6g}"
    return f"{v.numerator}/{v.denominator} ≈ {approx}" if v.denominator < 10_000 else f"≈ {approx}"


@dataclass
class _Side:
    toks: list[Tok]  # the side's tokens, units and currency included
    expr: list[Tok] = field(default_factory=list)  # what the parser reads
    units: frozenset[str] = frozenset()
    has_op: bool = False
    literal: Tok | None = None  # a lone number (maybe negative, maybe a percentage)
    fraction: bool = False  # a lone proper fraction of two integers (`3/4`, `\\frac{3}{4}`)
    computes: bool = False  # an operation other than a lone fraction or a base-written number
    negative: bool = False
    percent: bool = False
    mixed_units: bool = False
    values: list[Val] | None = None

    @property
    def simple(self) -> bool:
        """A lone number or fraction, possibly with units: a quantity, not a computation."""
        return self.literal is not None or self.fraction

    def evaluate(self) -> list[Val] | None:
        if self.values is None:
            try:
                self.values = evaluate(self.expr) if self.expr else []
            except (NotEvaluable, ZeroDivisionError, OverflowError, ValueError):
                self.values = []
        return self.values or None


def _unit_key(word: str) -> str:
    word = word.strip().lower()
    return word[:-1] if word.endswith("s") and len(word) > 3 else word


def _side(toks: list[Tok]) -> _Side:
    side = _Side(toks)
    expr = [t for t in toks if t.kind not in (UNIT, CUR)]
    side.expr = expr
    units: list[str] = []
    term_units: set[str] = set()
    last_num = False
    depth = 0
    additive = False
    for t in toks:
        if t.kind == UNIT and last_num:
            first = t.value.split()[0] if t.value else ""
            if first and first != "per":
                units.append(_unit_key(first))
                if depth == 0:
                    term_units.add(_unit_key(first))
        last_num = t.kind in (NUM, PCT, RP)  # a unit after a bracket is its group's (`\frac{1}{2} cup`)
        if t.kind == LP:
            depth += 1
        elif t.kind == RP:
            depth -= 1
        elif t.kind == OP and t.value in "+-" and depth == 0:
            additive = True
    side.units = frozenset(units)
    side.mixed_units = additive and len(term_units) > 1
    ops = [t for i, t in enumerate(expr) if t.kind in (FRAC, SQRT, BINOM, FACT)
           or (t.kind == OP and not (i == 0 and t.value in "+-"))]
    side.has_op = bool(ops)
    core = expr
    if core and core[0].kind == OP and core[0].value in "+-":
        side.negative = core[0].value == "-"
        core = core[1:]
    if core and core[-1].kind == PCT:
        side.percent = True
        core = core[:-1]
    if len(core) == 1 and core[0].kind == NUM:
        side.literal = core[0]
    kinds = [t.kind for t in core]
    nums = [t for t in core if t.kind == NUM]
    side.fraction = (kinds == [NUM, OP, NUM] and core[1].value == "/" or kinds == [FRAC, LP, NUM, RP, LP, NUM, RP]) \
        and all(t.decimals == 0 for t in nums) and nums[0].value < nums[1].value  # a proper fraction: a number
    side.computes = side.has_op and not side.fraction or any(t.kind == NUM and t.based for t in core)
    return side


def _holds_literal(v: Fraction, lit: Tok, scale: Fraction, negative: bool, approx: bool,
                   integer_slack: bool = True) -> bool:
    """Is `v` the number `lit` (times `scale`, negated) as written: exactly, rounded or truncated at its last
    written decimal, or for an integer against a non-integer value within 1; approximate claims within 1 %."""
    r = lit.value * scale * (-1 if negative else 1)
    if v == r:
        return True
    unit = Fraction(1, 10 ** lit.decimals) * scale
    diff = abs(v - r)
    if lit.decimals > 0 or lit.approx:
        if diff <= unit / 2:
            return True
        if (r == 0 or (r > 0) == (v > 0)) and abs(r) <= abs(v) < abs(r) + unit:
            return True  # truncated
    elif integer_slack and (v / scale).denominator != 1 and diff < unit:
        return True  # an integer for a non-integer value: rounded, floored or ceiled
    return bool(approx and r != 0 and diff <= APPROX_RELATIVE * abs(r))


def _clamp(x: Fraction, lo: Fraction, hi: Fraction) -> Fraction:
    return lo if x < lo else hi if x > hi else x


def compare(left: _Side, right: _Side, approx: bool) -> tuple[bool, Fraction, Fraction] | None:
    """(holds, left value, right value) of two evaluable sides, or None when one does not evaluate. The
    written number (a lone literal) sets the precision: the right side's, else the left side's."""
    lvals, rvals = left.evaluate(), right.evaluate()
    if not lvals or not rvals:
        return None
    # The written number sets the precision: the right side's, else (a number = an expression) the left side's.
    if right.literal is None and left.literal is not None:
        left, right, lvals, rvals, swapped = right, left, rvals, lvals, True
    else:
        swapped = False
    best = None
    for lv in lvals:
        for rv in rvals:
            ok = _pair_holds(lv, rv, right, approx)
            if best is None or (ok and not best[0]):
                best = (ok, lv.v, rv.v)
    assert best is not None
    ok, lv, rv = best
    if not ok and not swapped and _running(lvals, right, approx):
        # `3 + 4 = 7 * 2 = 14`: a running computation writes the value and goes on computing with it.
        return True, lvals[0].v, right.expr[0].value
    return (ok, rv, lv) if swapped else (ok, lv, rv)


def _running(lvals: list[Val], right: _Side, approx: bool) -> bool:
    """Does the right side start with exactly the left side's value, written as a number, and go on multiplying
    or dividing it? (Not `+`/`-`: `389 - 39 = 350 - 39` and `... = 7 - 2` are wrong sums, measured on MATH.)"""
    expr = right.expr
    if len(expr) < 3 or expr[0].kind != NUM or expr[1].kind != OP or expr[1].value not in ("*", "/"):
        return False
    return any(lv.v == expr[0].value for lv in lvals)


def _pair_holds(lv: Val, rv: Val, right: _Side, approx: bool) -> bool:
    lit = right.literal
    if lit is not None:
        scales = [Fraction(1, 100), Fraction(1)] if right.percent else [Fraction(1)]
        for scale in scales:
            target = lit.value * scale * (-1 if right.negative else 1)
            if _holds_literal(lv.v, lit, scale, right.negative, approx):
                return True
            # A rounded intermediate: some value of its interval must be the written number at its precision
            # (not merely within 1 of an integer, which the exact value alone is allowed).
            if not lv.exact and _holds_literal(_clamp(target, lv.lo, lv.hi), lit, scale, right.negative, approx,
                                               integer_slack=False):
                return True
        return False
    if lv.v == rv.v:
        return True
    if max(lv.lo, rv.lo) <= min(lv.hi, rv.hi):
        return True  # a rounded intermediate on either side
    return bool(approx and rv.v != 0 and abs(lv.v - rv.v) <= APPROX_RELATIVE * abs(rv.v))


def _names_operand(left: _Side, right: _Side) -> bool:
    """Is the left side a lone number that the right side computes with (`2.40 = 0.25 * 2.40`)? Then it names the
    quantity the computation starts from (a price, a count), not its result: `a = f(a, ...)` only holds by chance."""
    lit = left.literal
    return lit is not None and right.computes and any(t.kind == NUM and t.value == lit.value for t in right.expr)


def _is_remainder(side: _Side) -> bool:
    expr = side.expr
    return [t.kind for t in expr] == [NUM, OP, NUM] and expr[1].value == "rem"


def _remainder(left: _Side, right: _Side) -> tuple[bool, Fraction, Fraction] | None:
    """`17 / 5 = 3 R 2` holds when dividend = divisor * quotient + remainder, 0 <= remainder < divisor; the values
    are dividend / divisor and quotient + remainder / divisor. The left side must divide by an integer (`a / d`,
    `a \\div d`, no sum around it); any other is skipped (None)."""
    expr = left.expr
    if len(expr) < 3 or expr[-2].kind != OP or expr[-2].value != "/" or expr[-1].kind != NUM or expr[-1].decimals:
        return None
    depth = 0
    for j, t in enumerate(expr[:-2]):
        depth += (t.kind == LP) - (t.kind == RP)
        if depth == 0 and j > 0 and t.kind == OP and t.value in "+-":
            return None  # `2 + 17 / 5`: the division is not the whole side
    values = evaluate(expr[:-2])
    dividend, divisor = values[0].v, int(expr[-1].value)
    if len(values) > 1 or not values[0].exact or dividend.denominator != 1 or dividend < 0 or divisor <= 0:
        return None
    quotient, remainder = right.expr[0].value, right.expr[2].value
    holds = dividend == divisor * quotient + remainder and 0 <= remainder < divisor
    return holds, dividend / divisor, quotient + remainder / divisor


def _text(source: str, toks: Sequence[Tok], trailing_units: bool = True) -> str:
    """A side as written (whitespace collapsed); without its trailing units for the claim's number side
    (`18 - 6 = 13`, not `= 13 flamingos left`)."""
    if not trailing_units:
        while len(toks) > 1 and toks[-1].kind == UNIT:
            toks = toks[:-1]
    return " ".join(source[toks[0].start:toks[-1].end].split())


def _runs(toks: list[Tok]) -> Iterable[tuple[list[Tok], bool]]:
    """Maximal runs of math tokens, each with whether it follows a soft boundary (a word, `|`, a quote: the run
    may start inside an expression) rather than punctuation, a relation, a formula's edge or the text's start."""
    cur: list[Tok] = []
    soft = False
    for t in toks:
        if t.kind in (BREAK, WBREAK, WORD, TEXT, NL, AMP):
            if cur:
                yield cur, soft
                cur = []
            soft = t.kind in (WBREAK, WORD, TEXT) or (t.kind == BREAK and t.value != HARD)
        elif cur and cur[-1].kind == UNIT and t.kind in (NUM, LP, FRAC, SQRT, BINOM, CUR):
            yield cur, soft  # `138 lines {138}`: a unit ends a quantity; what follows starts anew
            cur, soft = [t], True
        else:
            cur.append(t)
    if cur:
        yield cur, soft


def _split(run: list[Tok], soft: bool) -> tuple[list[list[Tok]], list[bool]]:
    """A run's sides and whether each `=` between them is approximate. A side cut off by the run's edge (the
    run starts with `)` or a binary operator, or with a spaced sign after a soft boundary; it ends with an
    operator or an opening bracket) is emptied: it is part of an expression this reading did not get whole."""
    sides: list[list[Tok]] = [[]]
    approx: list[bool] = []
    for t in run:
        if t.kind == EQ:
            sides.append([])
            approx.append(bool(t.value))
        else:
            sides[-1].append(t)
    first = sides[0]
    if first:
        head = first[0]
        if head.kind == RP or (head.kind == OP and head.value not in "+-"):
            sides[0] = []
        elif head.kind == OP and soft and (len(first) < 2 or first[1].start != head.end):
            sides[0] = []
    last = sides[-1]
    if last and last[-1].kind in (OP, LP, FRAC, SQRT, BINOM):
        sides[-1] = []
    return sides, approx


def claims(text: str) -> list[Equation]:
    """Every checkable equation in a step, in order (see the module docstring for what is checked)."""
    if not text or ("=" not in text and "≈" not in text and "approx" not in text and "simeq" not in text):
        return []
    source = _preprocess(text)
    toks = _resolve(tokenize(source))
    out: list[Equation] = []
    for run, soft in _runs(toks):
        if not any(t.kind == EQ for t in run):
            continue
        if any(t.kind == VAR and t.value == "pmod" for t in run):
            # `4^4 = (4^2)^2 = (-1)^2 = 1 \pmod{17}`: a chain that ends in a modulus is one of congruences. (Not
            # back through `\equiv`: `8^2 = 64 \equiv 13 \pmod{17}` starts with an equality.)
            continue
        sides, approx = _split(run, soft)
        parsed = [_side(s) for s in sides]
        # A lone number right after a word opens a label (`in 8 years = 20`), not a claim.
        if soft and parsed[0].literal is not None and not parsed[0].has_op:
            parsed[0] = _Side([])
        chained = False
        for i in range(len(parsed) - 1):
            left, right = parsed[i], parsed[i + 1]
            was_chained, chained = chained, False
            if not left.toks or not right.toks or left.mixed_units or right.mixed_units:
                continue
            if not (left.computes or right.computes):
                # Two numbers: a conversion or a label (`5 m = 500 cm`) unless the units agree and the pair
                # continues a checked chain (`3 * 4 = 12 = 13`) or reduces a fraction (`\frac{12}{2} = 6`).
                if left.units != right.units or not (was_chained or left.fraction or right.fraction):
                    continue
            elif left.simple and not left.computes and left.units and not (left.units & right.units):
                continue  # 2 hours = 2 * 60: a conversion
            divisor = None
            try:
                if _is_remainder(right):
                    result = _remainder(left, right)
                    divisor = int(left.expr[-1].value)  # what `_remainder` divided by
                else:
                    result = compare(left, right, approx[i])
            except (NotEvaluable, ZeroDivisionError, OverflowError, ValueError, ArithmeticError):
                result = None
            if result is None:
                continue
            holds, lv, rv = result
            if not holds and _names_operand(left, right):
                continue  # `Discount on $2.40 = 0.25 * $2.40`: the number names what is computed from, a label
            out.append(Equation(f"{_text(source, left.toks)} {'≈' if approx[i] else '='} "
                                f"{_text(source, right.toks, trailing_units=False)}",
                                lv, rv, holds, approx[i], right.literal is None and left.literal is not None,
                                divisor))
            chained = True
            if len(out) >= MAX_CLAIMS:
                return out
    return out


def check_step(text: str | None) -> StepCheck:
    """The step's claims; never raises (a text it cannot read has no claims)."""
    if not text:
        return StepCheck()
    try:
        return StepCheck(tuple(claims(text)))
    except Exception:  # noqa: BLE001 - a malformed step is skipped, never a crash of the night
        return StepCheck()
