"""udfs.options: prompt-shared option scores equal a direct torch computation and separate scoring (float32
rounding: tests/tolerance.py)."""

from __future__ import annotations

import sys

import pytest
import torch
from bos_tokenizer import with_bos
from pyspark import cloudpickle
from tolerance import loglik_approx

from udfs import options as O

cloudpickle.register_pickle_by_value(sys.modules[__name__])

PROMPTS = [
    "Which statement is sarcastic?\nOptions:\n(A) He is generous\n(B) He is terrible\n[ANSWER] ",
    "Natalia sold clips to 48 of her friends in April. How many clips?",
    "x",
    "",
    "The sun is a kind of star. Earth orbits the sun. Options: (A) True (B) False (C) Yes (D) No.",
]
OPTIONS = [
    ["(A)", "(B)"],
    ["72", "seventy two clips", "", "48"],  # an empty option scores 0
    ["yes"],
    ["True", "False"],
    ["(A)", "(B)", "(C)", "(D)", "(E) none of these options at all"],
]
PREFIXES = ["", "She sold 24 in May.\n[ANSWER] ", "because\n[ANSWER] ", "", "Earth orbits a star. [ANSWER] "]


def _load(kind: str, path, scale: float = 0.05):
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    cls = AutoModelForCausalLM if kind == "causal" else AutoModelForSeq2SeqLM
    model = cls.from_pretrained(path).eval()
    # The random tiny heads give ~40 nats per token; scaled down they give a few nats per token, as trained
    # LMs do (test_score_options_unscaled_heads_match_separate keeps the unscaled ones).
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)
    return model, AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def models(tiny_models):
    return {
        "causal": _load("causal", tiny_models["tiny-gpt2"]),
        "seq2seq": _load("seq2seq", tiny_models["tiny-t5"]),
    }


def direct(model, tok, family: str, prompt: str, prefix: str, option: str) -> float:
    """One option, one unpadded sequence, no cache: the log-prob of its tokens written out."""
    opt = tok(option, add_special_tokens=False)["input_ids"]
    if not opt:
        return 0.0
    with torch.no_grad():
        if family == "causal":
            ctx = tok(prompt + prefix, add_special_tokens=False)["input_ids"] or [tok.eos_token_id]
            logits = model(torch.tensor([ctx + opt])).logits[0]
            logp = torch.log_softmax(logits.double(), -1)
            return sum(float(logp[len(ctx) - 1 + j, t]) for j, t in enumerate(opt))
        enc = tok(prompt)["input_ids"]
        pre = tok(prefix, add_special_tokens=False)["input_ids"] if prefix else []
        labels = torch.tensor([pre + opt])
        logits = model(input_ids=torch.tensor([enc]), labels=labels).logits[0]
        logp = torch.log_softmax(logits.double(), -1)
        return sum(float(logp[len(pre) + j, t]) for j, t in enumerate(opt))


@pytest.mark.parametrize("family", ["causal", "seq2seq"])
@pytest.mark.parametrize("with_prefix", [False, True])
def test_score_options_equals_direct_torch(models, family, with_prefix):
    model, tok = models[family]
    prefixes = PREFIXES if with_prefix else [""] * len(PROMPTS)
    got = O.score_options(model, tok, family, PROMPTS, OPTIONS, prefixes, batch_size=2)
    assert [len(g) for g in got] == [len(o) for o in OPTIONS]
    for prompt, prefix, opts, scores in zip(PROMPTS, prefixes, OPTIONS, got, strict=True):
        for option, s in zip(opts, scores, strict=True):
            want = direct(model, tok, family, prompt, prefix, option)
            assert s.sum_logprob == loglik_approx(want)
            assert s.n_tokens == len(tok(option, add_special_tokens=False)["input_ids"])
            assert s.n_bytes == len(option.encode())
            assert s.per_token == (s.sum_logprob / s.n_tokens if s.n_tokens else 0.0)
            assert not s.truncated
    assert got[1][2].sum_logprob == 0.0 and got[1][2].n_tokens == 0


@pytest.mark.parametrize("move_space", [False, True])
def test_score_options_with_a_bos_tokenizer_reads_the_bos_first(models, move_space):
    """A Gemma-like tokenizer: each context is read after its BOS, as lm-evaluation-harness feeds Gemma."""
    model, tok = models["causal"]
    got = O.score_options(model, with_bos(tok), "causal", PROMPTS, OPTIONS, PREFIXES, batch_size=2,
                          move_space=move_space)  # fmt: skip
    # The plain tokenizer on texts that start with the BOS string: the same ids, written out.
    want = O.score_options(model, tok, "causal", [tok.bos_token + p for p in PROMPTS], OPTIONS, PREFIXES,
                           batch_size=1, move_space=move_space)  # fmt: skip
    for a, b in zip(got, want, strict=True):
        assert [x.sum_logprob for x in a] == loglik_approx([y.sum_logprob for y in b])
    for prompt, prefix, opts, scores in zip(PROMPTS, PREFIXES, OPTIONS, got, strict=True):
        for option, s in zip(opts, scores, strict=True):
            if not move_space:
                assert s.sum_logprob == loglik_approx(direct(model, tok, "causal", tok.bos_token + prompt, prefix, option))


@pytest.mark.parametrize("family", ["causal", "seq2seq"])
def test_score_options_equals_separate_loglik_score(models, family):
    model, tok = models[family]
    shared = O.score_options(model, tok, family, PROMPTS, OPTIONS, batch_size=3)
    separate = O.score_options_separately(model, tok, family, PROMPTS, OPTIONS, batch_size=3)
    for a, b in zip(shared, separate, strict=True):
        for x, y in zip(a, b, strict=True):
            assert x.sum_logprob == loglik_approx(y.sum_logprob)
            assert (x.n_tokens, x.n_bytes) == (y.n_tokens, y.n_bytes)


def test_score_options_causal_prefix_equals_separate(models):
    model, tok = models["causal"]
    shared = O.score_options(model, tok, "causal", PROMPTS, OPTIONS, PREFIXES, batch_size=4)
    separate = O.score_options_separately(model, tok, "causal", PROMPTS, OPTIONS, PREFIXES, batch_size=1)
    flat = [(x.sum_logprob, y.sum_logprob) for a, b in zip(shared, separate, strict=True) for x, y in zip(a, b, strict=True)]
    assert [x for x, _ in flat] == loglik_approx([y for _, y in flat])


@pytest.mark.parametrize("family", ["causal", "seq2seq"])
def test_score_options_unscaled_heads_match_separate(tiny_models, family):
    name = "tiny-gpt2" if family == "causal" else "tiny-t5"
    model, tok = _load(family, tiny_models[name], 1.0)
    shared = O.score_options(model, tok, family, PROMPTS, OPTIONS, batch_size=2)
    separate = O.score_options_separately(model, tok, family, PROMPTS, OPTIONS, batch_size=2)
    for a, b in zip(shared, separate, strict=True):
        for x, y in zip(a, b, strict=True):
            assert x.sum_logprob == loglik_approx(y.sum_logprob)  # sums of up to ~330 nats


@pytest.mark.parametrize("family", ["causal", "seq2seq"])
def test_score_options_batch_size_invariant(models, family):
    model, tok = models[family]
    one = O.score_options(model, tok, family, PROMPTS, OPTIONS, PREFIXES if family == "causal" else None, batch_size=1)
    many = O.score_options(model, tok, family, PROMPTS, OPTIONS, PREFIXES if family == "causal" else None, batch_size=16)
    for a, b in zip(one, many, strict=True):
        assert [s.sum_logprob for s in a] == loglik_approx([s.sum_logprob for s in b])


class _Rows:
    """Counts rows the prompt passes see: encoder rows (seq2seq) or cache-less transformer rows (causal)."""

    def __init__(self) -> None:
        self.rows = 0

    def __call__(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if kwargs.get("cache") is None and kwargs.get("past_key_values") is None:
            self.rows += ids.shape[0]


@pytest.mark.parametrize("family", ["causal", "seq2seq"])
def test_score_options_encodes_each_prompt_once(models, family):
    model, tok = models[family]
    counter = _Rows()
    target = model.get_encoder() if family == "seq2seq" else model.transformer
    handle = target.register_forward_pre_hook(counter, with_kwargs=True)
    try:
        O.score_options(model, tok, family, PROMPTS, OPTIONS, batch_size=2)
    finally:
        handle.remove()
    if family == "seq2seq":
        assert counter.rows == len(PROMPTS)  # 5 prompts, 14 options
    else:  # a one-token context ("x", and "" read as BOS) has nothing to share: its options run whole
        short = [i for i, p in enumerate(PROMPTS) if len(tok(p, add_special_tokens=False)["input_ids"]) < 2]
        assert len(short) == 2
        assert counter.rows == len(PROMPTS) - len(short) + sum(len(OPTIONS[i]) for i in short)

    counter.rows = 0
    handle = target.register_forward_pre_hook(counter, with_kwargs=True)
    try:
        O.score_options_separately(model, tok, family, PROMPTS, OPTIONS, batch_size=2)
    finally:
        handle.remove()
    assert counter.rows == sum(len(o) for o in OPTIONS)  # without sharing: once per option


def test_seq2seq_projects_cross_attention_once_per_prompt(models, monkeypatch):
    """The prompt's cross-attention keys are projected once per example, not once per option row; the scores
    equal those of rows that project them again."""
    model, tok = models["seq2seq"]
    projected: list[int] = []
    keys = model.get_decoder().block[0].layer[1].EncDecAttention.k
    handle = keys.register_forward_hook(lambda module, args, out: projected.append(args[0].shape[0]))
    try:
        shared = O.score_options(model, tok, "seq2seq", PROMPTS, OPTIONS, PREFIXES, batch_size=2)
    finally:
        handle.remove()
    assert sum(projected) == len(PROMPTS)  # 5 prompts; 14 option rows read the cache

    monkeypatch.setattr(O, "_cross_keys", lambda *args: None)
    again = O.score_options(model, tok, "seq2seq", PROMPTS, OPTIONS, PREFIXES, batch_size=2)
    for a, b in zip(shared, again, strict=True):
        assert [s.sum_logprob for s in a] == loglik_approx([s.sum_logprob for s in b])


def test_score_options_truncates_shared_prompt_from_left(models):
    model, tok = models["causal"]
    long_prompt = "Natalia sold clips to her friends. " * 40
    got = O.score_options(model, tok, "causal", [long_prompt], [["72", "seventy two"]], max_length=32)
    assert all(s.truncated for s in got[0])
    # Cut to fit the longest option: both options see the same last tokens of the prompt.
    opt_len = max(len(tok(o, add_special_tokens=False)["input_ids"]) for o in ["72", "seventy two"])
    ctx = tok(long_prompt, add_special_tokens=False)["input_ids"][-(32 - opt_len) :]
    text = tok.decode(ctx)
    assert got[0][0].sum_logprob == loglik_approx(direct(model, tok, "causal", text, "", "72"))


# --- Spark plumbing with fake scorers -----------------------------------------------------------------------


def _fake_factory():
    calls = []

    def scorer(prompts, options, prefixes):
        calls.append(len(prompts))
        if any(p == "boom" for p in prompts):
            raise RuntimeError("cannot score boom")
        # -(len(prompt) + len(prefix)) - len(option): every part of the input shows in the number.
        return [
            [O.OptionScore(-float(len(p) + len(x) + len(o)), len(o), len(o.encode())) for o in opts]
            for p, x, opts in zip(prompts, prefixes, options, strict=True)
        ]

    return scorer


def test_group_rows_consecutive_runs():
    assert O.group_rows(["a", "a", "b", "a"], ["", "", "", ""]) == [(0, 2), (2, 3), (3, 4)]
    assert O.group_rows(["a", "a"], ["x", "y"]) == [(0, 1), (1, 2)]
    assert O.group_rows([], []) == []


def test_score_rows_retries_and_flags_only_the_failing_example():
    out = O.score_rows(_fake_factory(), ["p", "p", "boom", "q"], ["", "", "", "z"], ["a", "bb", "c", "d"], "quarantine")
    assert out["sum_logprob"].tolist()[:2] == [-2.0, -3.0]
    assert out["error"].tolist()[2].startswith("RuntimeError")
    assert out["sum_logprob"].tolist()[3] == -3.0  # "q" + "z" + "d"
    with pytest.raises(RuntimeError):
        O.score_rows(_fake_factory(), ["boom"], [""], ["a"], "fail")


def test_options_udf_scores_exploded_rows(spark):
    from pyspark.sql import functions as F

    rows = [("e1", "p1", "", 0, "a"), ("e1", "p1", "", 1, "bbb"), ("e2", "prompt2", "xy", 0, "c")]
    df = spark.createDataFrame(rows, "key string, prompt string, prefix string, idx int, option string")
    udf = O.options_udf(_fake_factory)
    out = (
        df.repartition(1).sortWithinPartitions("key", "idx")
        .withColumn("s", udf("prompt", "prefix", "option"))
        .select("key", "idx", F.col("s.sum_logprob").alias("score"), F.col("s.n_tokens").alias("n"), F.col("s.error").alias("err"))
        .orderBy("key", "idx")
        .collect()
    )
    assert [(r.key, r.idx, r.score, r.n, r.err) for r in out] == [
        ("e1", 0, -3.0, 1, None),
        ("e1", 1, -5.0, 3, None),
        ("e2", 0, -10.0, 1, None),
    ]
