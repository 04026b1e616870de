"""The CoT Collection protocol's model-side rules, against hand-derived values: EOS scored for seq2seq options,
lm-evaluation-harness's whitespace move for causal options, the rationale cut, CoT answer extraction, the
>= 8-token rationale, the official source round trip. Each test fails on the behaviour before issue #18."""

from __future__ import annotations

import math

import pytest
import torch
from tolerance import loglik_approx

from udfs import cot_prompt, cot_text
from udfs import generate as G
from udfs import options as O

NAMES = {"causal": "tiny-gpt2", "seq2seq": "tiny-t5"}


def _load(tiny_models, family: str):
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    cls = AutoModelForCausalLM if family == "causal" else AutoModelForSeq2SeqLM
    path = tiny_models[NAMES[family]]
    return cls.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def _constant_head(model, probs: dict[int, float]):
    """An LM head whose next-token distribution is `probs` at every position, whatever the context.

    Weights zero, bias log p (others -1e4: exp underflows to 0 in float32), so every log-prob below is a sum of
    log p terms written out by hand.
    """
    weight = model.get_output_embeddings().weight
    head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(-1e4)
        for token, p in probs.items():
            head.bias[token] = math.log(p)
    model.set_output_embeddings(head)
    return model


# ---- EOS: the official code scores T5's </s> after every option -------------------------------------------


def test_seq2seq_options_score_eos_when_asked(tiny_models):
    model, tok = _load(tiny_models, "seq2seq")
    a = tok("a", add_special_tokens=False)["input_ids"][0]
    _constant_head(model, {a: 0.75, tok.eos_token_id: 0.25})
    prompts, options = ["Q?\n[ANSWER] "], [["a", "aa", ""]]
    with_eos = O.score_options(model, tok, "seq2seq", prompts, options, eos=True)[0]
    without = O.score_options(model, tok, "seq2seq", prompts, options, eos=False)[0]
    # a</s>: 3/4 * 1/4; aa</s>: (3/4)^2 * 1/4; "" is </s> alone: 1/4.
    assert [s.sum_logprob for s in with_eos] == loglik_approx([math.log(3 / 16), math.log(9 / 64), math.log(1 / 4)])
    assert [s.n_tokens for s in with_eos] == [2, 3, 1]
    assert [s.n_bytes for s in with_eos] == [1, 2, 0]  # bytes of the option text, EOS is no text
    # Before: EOS never scored, the empty option scored 0 (it outranked every real option).
    assert [s.sum_logprob for s in without] == loglik_approx([math.log(3 / 4), math.log(9 / 16), 0.0])
    assert [s.n_tokens for s in without] == [1, 2, 0]


def test_seq2seq_eos_after_cot_prefix(tiny_models):
    # CoT: the decoder reads rationale + "\n[ANSWER] " first; only option + </s> are scored.
    model, tok = _load(tiny_models, "seq2seq")
    a = tok("a", add_special_tokens=False)["input_ids"][0]
    _constant_head(model, {a: 0.5, tok.eos_token_id: 0.5})
    got = O.score_options(model, tok, "seq2seq", ["Q"], [["a"]], ["a a a\n[ANSWER] "], eos=True)[0][0]
    assert got.sum_logprob == loglik_approx(math.log(0.25))
    assert got.n_tokens == 2


# ---- causal: whitespace moves into the option (lm-evaluation-harness) ---------------------------------------


def test_causal_move_space_scores_the_option_with_its_leading_space(tiny_models):
    model, tok = _load(tiny_models, "causal")
    plain, spaced = (tok(x, add_special_tokens=False)["input_ids"] for x in ("A", " A"))
    assert len(plain) == len(spaced) == 1
    _constant_head(model, {spaced[0]: 0.75, plain[0]: 0.25})
    moved = O.score_options(model, tok, "causal", ["Q\n[ANSWER] "], [["A"]], move_space=True)[0][0]
    kept = O.score_options(model, tok, "causal", ["Q\n[ANSWER] "], [["A"]], move_space=False)[0][0]
    assert moved.sum_logprob == loglik_approx(math.log(0.75))  # " A"
    assert kept.sum_logprob == loglik_approx(math.log(0.25))  # "A" after a lone " " token
    assert moved.n_bytes == kept.n_bytes == 1
    # EOS is never scored for a causal LM, asked or not (lm-evaluation-harness; no official causal code).
    assert O.score_options(model, tok, "causal", ["Q "], [["A"]], eos=True, move_space=True)[0][0].n_tokens == 1


# ---- text rules ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "generated, rationale",
    [
        # The model's own answer stays in the scored context (the old cut at "So the answer is" dropped it).
        ("Each box has 9. 9*2=18. So the answer is 18.", "Each box has 9. 9*2=18. So the answer is 18."),
        ("The answer is (A) because it is red.", "The answer is (A) because it is red."),  # was ""
        ("  It is red.\n[ANSWER] (A) [ANSWER] (B)", "It is red."),  # first [ANSWER], stripped
        ("[ANSWER] (A)", ""),
        ("no marker at all  ", "no marker at all"),
    ],
)
def test_rationale_cut_at_answer_marker_only(generated, rationale):
    from jobs.cot.settings import CotSettings

    assert cot_text.rationale_of(generated, CotSettings().indicators) == rationale
    # official remain_rationale, written out
    assert generated.split("[ANSWER]", 1)[0].strip() == rationale


@pytest.mark.parametrize(
    "generated, answer",
    [
        ("9*2=18.\n[ANSWER] 18", "18"),
        ("first [ANSWER] 12 then\n[ANSWER]  18 \n", "18"),  # the LAST marker
        ("So the answer is 18.", "So the answer is 18."),  # no marker: the whole output
        ("The answer is 7 [ANSWER] (C)", "(C)"),
    ],
)
def test_cot_generation_answer_is_text_after_last_marker(generated, answer):
    from jobs.cot.settings import CotSettings

    cfg = CotSettings()
    assert cot_text.extract_answer(generated, cfg.indicators, cfg.answer_until) == answer
    assert generated.rsplit("[ANSWER]", 1)[-1].strip() == answer  # official, written out


# ---- the >= 8-token rationale and the official generation settings ----------------------------------------


@pytest.mark.parametrize("family", ["causal", "seq2seq"])
def test_rationale_has_at_least_eight_tokens_with_official_settings(tiny_models, family):
    from jobs.cot.model_udfs import generator_options
    from jobs.cot.settings import CotSettings

    model, tok = _load(tiny_models, family)
    letter = tok("a", add_special_tokens=False)["input_ids"][0]
    # EOS first by far, "a" second: a free model stops at once; the rationale generator must not.
    _constant_head(model, {tok.eos_token_id: 0.9, letter: 0.1})
    opts = {**generator_options(CotSettings())["rationale"], "max_new_tokens": 20}
    got = G.generate(model, tok, family, ["Q1\n\nLet's think step by step.\n", "Q2"], **opts)
    assert [g.n_tokens for g in got] == [8, 8]
    assert G.generate(model, tok, family, ["Q1"], max_new_tokens=20)[0].n_tokens == 0


# ---- the source as the official code feeds it ---------------------------------------------------------------


def test_official_prompt_strips_truncates_from_the_right_and_appends_suffix(tiny_models):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_models["tiny-t5"])
    suffix = "\n[ANSWER] "
    n_suffix = len(tok.encode(suffix, add_special_tokens=False))
    short = "  Is it red?\nOptions:\n(A) yes\n(B) no \n"
    long = " ".join(f"w{i}" for i in range(400))
    (p_short, cut_short), (p_long, cut_long) = cot_prompt.official_prompts(tok, [short, long], suffix, 64)
    assert p_short == short.strip() + suffix and not cut_short
    # 64 - len(suffix) tokens including T5's </s>: the START of the source is kept.
    kept = tok.encode(long, max_length=64 - n_suffix, truncation=True)
    assert kept[-1] == tok.eos_token_id and len(kept) == 64 - n_suffix
    assert p_long == tok.decode(kept[:-1]) + suffix and cut_long
    assert p_long.startswith("w0 w1 w2")
    assert len(tok(p_long)["input_ids"]) <= 64 + 1  # the re-encoded prompt fits (a merge may differ by one)
