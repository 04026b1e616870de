"""udfs.rcu math masking (issue 31): LaTeX spans, placeholders, offsets back to the original; and, through the steps
job's core (`explode_records`, no Spark), a LaTeX-heavy paragraph step's units against hand-written ones."""

from __future__ import annotations

import pytest

from jobs.infra.config import Settings
from jobs.receval import steps as J
from schemas import chains as C
from schemas import steps as S
from udfs import rcu_math


@pytest.mark.parametrize(
    "text,spans",
    [
        (r"so \(18 - 6 = 12\) left", [(3, 18, False)]),
        (r"we get: \[ x = 4 \] Then", [(8, 19, True)]),
        ("we have $$x + y = 100.$$ and $x$", [(8, 24, True), (29, 32, False)]),
        (r"it is \frac{1}{2}. Next", [(6, 17, False)]),  # a bare command with its arguments
        (r"a profit of $\boxed{\$96}$ if", [(12, 26, False)]),  # an escaped dollar inside
        # currency, not mathematics: the closing "$" needs a non-space before it and no digit after it
        ("$500 + $1500 = $2000", []),
        ("($25 * x) - ($5 * x)", []),
        ("costs 3.5 dollars", []),
        (r"unclosed \( x + 1", []),
    ],
)
def test_math_spans(text, spans):
    assert rcu_math.math_spans(text) == spans


def test_mask_replaces_math_by_one_token_and_maps_offsets_back():
    text = r"Since \( \sqrt{20} \approx 4.47 \), we get $x$.Next \[ y \]"
    m = rcu_math.mask_math(text)
    # a relation becomes an equation token, anything else a number; a placeholder touching a word gets a space
    assert m.text == "Since 1=1, we get 7.Next 7"
    assert m.display == ((len(m.text) - 1, len(m.text)),)
    assert m.restore(0, len(m.text)) == text
    assert m.restore(6, 9) == r"\( \sqrt{20} \approx 4.47 \)"
    assert m.restore(11, 19) == "we get $x$"
    assert m.restore(0, 5) == "Since"
    padded = rcu_math.mask_math(r"is\(x=1\)now")
    assert padded.text == "is 1=1 now"
    assert [padded.to_original(i) for i in (2, 3, 6, 7)] == [2, 2, 9, 9]  # the pads map to the math's edges
    assert padded.restore(3, 6) == r"\(x=1\)" and padded.restore(7, 10) == "now"


def test_text_without_math_is_unchanged():
    m = rcu_math.mask_math("She has 3.5 apples. So she has $4.")
    assert m.text == m.original and m.spans == () and m.restore(0, 5) == "She h"


@pytest.fixture(scope="module")
def opts() -> J.Options:
    return J.Options.from_settings(Settings())


def _step(opts: J.Options, text: str) -> dict:
    record = {c: None for c in J._INPUT} | {C.CHAIN_ID: "p", C.STEPS: [text], C.CONTEXT: r"Find \(x\). It is 3.5 m."}
    [out] = J.explode_records([record], opts)
    assert out.get("error") is None, out
    return out


def test_latex_paragraph_step_units(opts):
    # ProcessBench math-666/2: periods inside math, an instruction, a definition, display equations kept with the
    # clause that introduces them, a heading before a colon, and a display that ends its sentence.
    text = (
        r"Then, find the new radius of the circle. Let the new radius be \(r'\). We know that the area of the circle "
        r"with the new radius is \(16.0\pi\), so we have: \[ \pi (r')^2 = 16\pi. \] Dividing both sides by \(\pi\), "
        r"we get: \[ (r')^2 = 16 \] Taking the square root of both sides: \[ r' = 4 \]"
    )
    [step] = _step(opts, text)["steps"]
    assert step[S.STEP_TEXT] == text
    assert step[S.PREMISE_RCUS] == [
        r"Let the new radius be \(r'\)",
        r"We know that the area of the circle with the new radius is \(16.0\pi\)",
        r"we have: \[ \pi (r')^2 = 16\pi. \]",
        r"Dividing both sides by \(\pi\), we get: \[ (r')^2 = 16 \]",
    ]
    assert step[S.CONCLUSION_RCU] == r"\[ r' = 4 \]"


def test_latex_steps_keep_math_whole_and_context_sentences_restored(opts):
    out = _step(opts, r"So, the value of \(c\) is \(\boxed{\frac{625}{4}}\). Thus \(x = 3.5\) and \(\frac{1}{2}.\)")
    [step] = out["steps"]
    assert step[S.PREMISE_RCUS] == [r"the value of \(c\) is \(\boxed{\frac{625}{4}}\)"]
    assert step[S.CONCLUSION_RCU] == r"\(x = 3.5\) and \(\frac{1}{2}.\)"
    assert out[S.CONTEXT_SENTENCES] == [r"Find \(x\).", "It is 3.5 m."]


def test_currency_is_not_math_and_list_items_are_sentences(opts):
    text = (
        "Next, let's calculate the cost of the shoes:\n- The original price of the shoes is $40.\n"
        "- 40% of $40 is $16.\n- Therefore, the discounted price of the shoes is $40 - $16 = $24."
    )
    [step] = _step(opts, text)["steps"]
    assert step[S.PREMISE_RCUS] == ["The original price of the shoes is $40", "40% of $40 is $16"]
    assert step[S.CONCLUSION_RCU] == "the discounted price of the shoes is $40 - $16 = $24"
