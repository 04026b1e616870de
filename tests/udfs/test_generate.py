"""udfs.generate: batched generation (left padding), min_new_tokens, stop strings, seeded sampling, UDF plumbing."""

from __future__ import annotations

import sys

import pytest
import torch
from pyspark import cloudpickle

from udfs import generate as G

cloudpickle.register_pickle_by_value(sys.modules[__name__])

PROMPTS = [
    "Natalia sold clips to 48 of her friends in April.\n\nLet's think step by step.\n",
    "x",
    "The sun is a kind of star. Earth orbits",
]
NAMES = {"causal": "tiny-gpt2", "seq2seq": "tiny-t5"}


def _load(tiny_models, family: str):
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    cls = AutoModelForCausalLM if family == "causal" else AutoModelForSeq2SeqLM
    path = tiny_models[NAMES[family]]
    return cls.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def _forced_head(model, tok, first: int, second: int | None = None):
    """Replace the LM head: logits prefer `first` by far, then `second`, the rest are impossible-ish."""
    weight = model.get_output_embeddings().weight
    head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(-20.0)
        head.bias[first] = 10.0
        if second is not None:
            head.bias[second] = 5.0
    model.set_output_embeddings(head)
    return model


@pytest.mark.parametrize("family", ["causal", "seq2seq"])
def test_generate_min_new_tokens_enforced_when_model_emits_eos_first(tiny_models, family):
    model, tok = _load(tiny_models, family)
    letter = tok("a", add_special_tokens=False)["input_ids"][0]
    _forced_head(model, tok, tok.eos_token_id, letter)
    free = G.generate(model, tok, family, PROMPTS, max_new_tokens=20, min_new_tokens=0)
    assert [g.n_tokens for g in free] == [0, 0, 0]  # the model ends at once
    held = G.generate(model, tok, family, PROMPTS, max_new_tokens=20, min_new_tokens=8)
    # EOS is kept away for 8 tokens, then it wins again: exactly 8 tokens of the runner-up.
    assert [g.n_tokens for g in held] == [8, 8, 8]
    assert [g.text for g in held] == [tok.decode([letter] * 8)] * 3


@pytest.mark.parametrize("family", ["causal", "seq2seq"])
def test_generate_stop_string_never_before_min_new_tokens(tiny_models, family):
    model, tok = _load(tiny_models, family)
    letter = tok("a", add_special_tokens=False)["input_ids"][0]
    _forced_head(model, tok, letter)  # "aaaa..." for ever
    text = tok.decode([letter])
    early = G.generate(model, tok, family, PROMPTS[:2], max_new_tokens=30, stop_strings=[text * 2])
    assert [g.n_tokens for g in early] == [2, 2]
    late = G.generate(model, tok, family, PROMPTS[:2], max_new_tokens=30, min_new_tokens=8, stop_strings=[text * 2])
    assert [g.n_tokens for g in late] == [8, 8]
    none = G.generate(model, tok, family, PROMPTS[:2], max_new_tokens=12, stop_strings=["never"])
    assert [g.n_tokens for g in none] == [12, 12]


@pytest.mark.parametrize("family", ["causal", "seq2seq"])
def test_generate_batched_equals_one_by_one(tiny_models, family):
    model, tok = _load(tiny_models, family)
    batched = G.generate(model, tok, family, PROMPTS, max_new_tokens=10, min_new_tokens=8, batch_size=3)
    single = [G.generate(model, tok, family, [p], max_new_tokens=10, min_new_tokens=8)[0] for p in PROMPTS]
    assert batched == single  # left padding (causal) and masks change nothing
    assert all(g.n_tokens >= 8 for g in batched)


def test_generate_sampling_is_seeded(tiny_models):
    model, tok = _load(tiny_models, "causal")
    kw = dict(max_new_tokens=12, min_new_tokens=8, do_sample=True, top_p=0.8)
    a = G.generate(model, tok, "causal", PROMPTS, seed=1, **kw)
    b = G.generate(model, tok, "causal", PROMPTS, seed=1, **kw)
    c = G.generate(model, tok, "causal", PROMPTS, seed=2, **kw)
    assert a == b
    assert a != c


def test_generate_truncates_long_prompt_from_left(tiny_models):
    model, tok = _load(tiny_models, "causal")
    long_prompt = "Natalia sold clips. " * 200
    out = G.generate(model, tok, "causal", [long_prompt, "x"], max_new_tokens=8, max_length=64)
    assert [g.truncated for g in out] == [True, False]
    # The kept prompt is the last 64 - 8 tokens: same output as giving those tokens directly.
    kept = tok.decode(tok(long_prompt, add_special_tokens=False)["input_ids"][-56:])
    assert out[0].text == G.generate(model, tok, "causal", [kept], max_new_tokens=8, max_length=64)[0].text


def _fake_factory():
    def run(prompts):
        if "boom" in prompts:
            raise RuntimeError("generation failed")
        return [G.Generation(p.upper(), len(p), False) for p in prompts]

    return run


def test_generate_frame_quarantine_retries_row_by_row():
    out = G.generate_frame(_fake_factory(), ["ab", "boom", "c"], "quarantine")
    assert out["text"].tolist()[0] == "AB" and out["text"].tolist()[2] == "C"
    assert out["text"].isna().tolist() == [False, True, False]
    assert out["error"].tolist()[1].startswith("RuntimeError")
    with pytest.raises(RuntimeError):
        G.generate_frame(_fake_factory(), ["boom"], "fail")


def test_generate_udf_runs_in_spark(spark):
    df = spark.createDataFrame([("ab",), ("xyz",)], "prompt string")
    out = df.select(G.generate_udf(_fake_factory)("prompt").alias("g")).select("g.*").orderBy("n_tokens").collect()
    assert [(r.text, r.n_tokens, r.truncated, r.error) for r in out] == [("AB", 2, False, None), ("XYZ", 3, False, None)]
