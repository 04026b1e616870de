"""udfs.sampling: seeded k samples + a separate greedy decode per question, answers parsed from chains."""

from __future__ import annotations

import pytest
import torch

from udfs import sampling as S

PROMPTS = [
    "Q: Janet has 3 apples and buys 4 more. How many apples does she have?\nA: Let's think step by step.\n",
    "Q: A robe takes 2 bolts of blue fiber and half that much white fiber.\nA: Let's think step by step.\n",
]
NAMES = {"causal": "tiny-gpt2", "seq2seq": "tiny-t5"}


def _load(tiny_models, family: str):
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    cls = AutoModelForCausalLM if family == "causal" else AutoModelForSeq2SeqLM
    path = tiny_models[NAMES[family]]
    return cls.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def test_final_answer_hand_derived():
    ind = ["answer is", "A:"]
    assert S.final_answer("3 + 4 = 7. So the answer is 7.", ind) == "7"
    assert S.final_answer("She has $1,000. The answer is $1,200.50 dollars", ind) == "1200.5"
    assert S.final_answer("2 + 2 = 4 and 4 * 3 = 12", ind) == "12"  # no indicator: the text's last number
    assert S.final_answer("The answer is 5 then A: 6", ind) == "6"  # the LAST indicator wins
    assert S.final_answer("the answer is yes", ind) == "yes"  # no number: the text after it
    assert S.final_answer("", ind) is None and S.final_answer(None, ind) is None
    assert S.gold_answer("IGNORE. 16 - 3 = 13\nA: 18", "A:") == "18"
    assert S.gold_answer("no marker", "A:") is None
    assert S.prompt_for("Q: {question}\nA:", "  How many?\n") == "Q: How many?\nA:"


CODE_CHAIN = """1. She pays 3 * $3 = $9 for parking.
2. So she makes $90 - $9 = $81, which is $81 / 18 = $4.5 per hour.

Let's confirm this with Python code.
```python
pay = 6 * 15
print(pay - 3 * 3)
```
```output
81
```
"""


def test_final_rule_reads_boxed_then_prose_outside_code():
    ind = ["answer is", "A:"]
    # Plain prose: both rules agree.
    for text in ["3 + 4 = 7. So the answer is 7.", "2 + 2 = 4 and 4 * 3 = 12", "the answer is yes"]:
        assert S.final_answer(text, ind, "final") == S.final_answer(text, ind, "last_number")
    # A code block and the model's own ```output: the rule before reads the output block, `final` the prose.
    assert S.final_answer(CODE_CHAIN, ind, "last_number") == "81"
    assert S.final_answer(CODE_CHAIN, ind, "final") == "4.5"
    # A block left open by the token limit runs to the end.
    assert S.final_answer("So 5 + 7 = 12.\n```python\nx = 12 * 3\nprint(x", ind, "final") == "12"
    # \\boxed{} wins over anything after it, nested braces kept, thousands separators read.
    assert S.final_answer(CODE_CHAIN + "She makes \\(\\boxed{1,080}\\) dollars; 3 more.", ind, "final") == "1080"
    assert S.final_answer("\\boxed{} then \\boxed{\\text{18}}", ind, "final") == "18"
    # Only code: no number in the prose, so the whole text's last number (as before) rather than nothing.
    assert S.final_answer("```python\nprint(6 * 7)\n```\n```output\n42\n```", ind, "final") == "42"
    assert S.final_answer(None, ind, "final") is None
    with pytest.raises(ValueError, match="answer rule"):
        S.final_answer("1", ind, "first_number")


@pytest.mark.parametrize("family", ["causal", "seq2seq"])
def test_draw_seeded_and_greedy_is_plain_generate(tiny_models, family):
    torch.set_num_threads(1)
    model, tok = _load(tiny_models, family)
    args = dict(k=3, temperature=1.0, top_p=1.0, max_new_tokens=12)
    first = S.draw(model, tok, family, PROMPTS, seed=7, **args)
    again = S.draw(model, tok, family, list(reversed(PROMPTS)), seed=7, **args)[::-1]
    other = S.draw(model, tok, family, PROMPTS, seed=8, **args)
    texts = [[g.text for g in d.samples] for d in first]
    # Same seed: the same chains, whatever the order (and company) the questions come in.
    assert texts == [[g.text for g in d.samples] for d in again]
    assert texts != [[g.text for g in d.samples] for d in other]
    # k draws, not one draw copied (the tiny models are peaked: some questions draw the same text k times).
    assert any(len(set(t)) > 1 for t in texts)
    for prompt, drawn in zip(PROMPTS, first, strict=True):
        # Independent greedy decode: transformers' own generate on the unpadded prompt.
        ids = tok(prompt, return_tensors="pt", add_special_tokens=(family == "seq2seq"))["input_ids"]
        out = model.generate(input_ids=ids, do_sample=False, max_new_tokens=12, pad_token_id=tok.eos_token_id)
        new = out[0, ids.shape[1]:] if family == "causal" else out[0, 1:]
        assert drawn.greedy.text == tok.decode(new, skip_special_tokens=True)


def test_rows_of_keeps_greedy_apart():
    from udfs.generate import Generation

    drawn = S.Drawn([Generation("so the answer is 7", 5, False), Generation("12", 1, False)],
                    Generation("A: 8", 2, True))
    rows = S.rows_of(drawn, ["answer is", "A:"])
    assert [(r["sample_idx"], r["greedy"], r["answer"]) for r in rows] == [(0, False, "7"), (1, False, "12"),
                                                                         (None, True, "8")]
    assert rows[-1]["truncated"] is True and rows[0]["n_tokens"] == 5
    # A decode cut inside a multi-byte character ends in U+FFFD: dropped; one inside the text is kept (quarantined).
    cut = S.Drawn([Generation("costs 5 \u20ac\ufffd", 4, False), Generation("a \ufffd b 3", 4, False)],
                  Generation("7", 1, False))
    assert [r["text"] for r in S.rows_of(cut, ["answer is"])] == ["costs 5 \u20ac", "a \ufffd b 3", "7"]


def test_draw_same_chains_on_any_batching(tiny_models):
    model, tok = _load(tiny_models, "causal")
    args = dict(k=4, temperature=0.7, top_p=1.0, seed=5, max_new_tokens=10)
    wide = S.draw(model, tok, "causal", PROMPTS, batch_size=64, **args)
    narrow = S.draw(model, tok, "causal", PROMPTS, batch_size=3, max_tokens=60, **args)
    alone = [S.draw(model, tok, "causal", [p], batch_size=1, **args)[0] for p in PROMPTS]
    assert wide == narrow == alone
