"""udfs.loglik: batched target log-likelihoods equal a direct unbatched torch computation."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from pyspark import cloudpickle

from udfs import loglik

# The fake scorer factories below run in Spark's Python workers, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SOURCES = [
    " Therefore,",
    " An animal requires warmth for survival. A thick fur coat keeps an animal warm. Therefore,",
    "Generate entailed sentence: the sun is a kind of star & earth orbits the sun ->",
    "x",
    " She sold 48 / 2 = 24 clips in May. So she sold 48 + 24 = 72 clips altogether. The answer is 72. Therefore,",
    "",
]
TARGETS = [" 72", " the animal survives", " earth orbits a star", " yes it does follow", " 72", " hello"]


@pytest.fixture(scope="module")
def gpt2(tiny_models):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_models["tiny-gpt2"]
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def t5(tiny_models):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    path = tiny_models["tiny-t5"]
    return AutoModelForSeq2SeqLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def direct_causal(model, tok, source: str, target: str) -> list[float]:
    """Log-probs of the target tokens, one unpadded sequence, written out step by step."""
    src = tok(source, add_special_tokens=False)["input_ids"] or [tok.eos_token_id]
    tgt = tok(target, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([src + tgt])
    with torch.no_grad():
        logits = model(ids).logits[0]
    logp = torch.log_softmax(logits.double(), -1)
    return [float(logp[len(src) - 1 + j, t]) for j, t in enumerate(tgt)]


def direct_seq2seq(model, tok, source: str, target: str) -> list[float]:
    src = tok(source)["input_ids"]  # with </s>, as the encoder is trained
    tgt = tok(target, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([src]), labels=torch.tensor([tgt])).logits[0]
    logp = torch.log_softmax(logits.double(), -1)
    return [float(logp[j, t]) for j, t in enumerate(tgt)]


@pytest.mark.parametrize("family", ["causal", "seq2seq"])
@pytest.mark.parametrize("batch_size", [1, 16, 4])
@pytest.mark.parametrize("side", ["right", "left"])
def test_score_matches_unbatched_direct(family, batch_size, side, gpt2, t5):
    model, tok = gpt2 if family == "causal" else t5
    direct = direct_causal if family == "causal" else direct_seq2seq
    got = loglik.score(model, tok, family, SOURCES, TARGETS, batch_size=batch_size, max_length=512, padding_side=side)
    assert len(got) == len(SOURCES)
    for s, t, g in zip(SOURCES, TARGETS, got, strict=True):
        want = direct(model, tok, s, t)
        assert g.n_tokens == len(want) > 0
        assert g.sum_logprob == pytest.approx(sum(want), abs=1e-5)
        assert g.mean_logprob == pytest.approx(sum(want) / len(want), abs=1e-5)
        assert not g.truncated


def test_score_excludes_eos_from_target(t5):
    model, tok = t5
    got = loglik.score(model, tok, "seq2seq", ["a b"], [" c d"])[0]
    assert got.n_tokens == len(tok(" c d", add_special_tokens=False)["input_ids"])
    assert tok.eos_token_id not in tok(" c d", add_special_tokens=False)["input_ids"]


def test_score_truncates_source_from_left_and_counts(gpt2):
    model, tok = gpt2
    long_source = " the sun is a kind of star" * 40 + " Therefore,"
    tgt = tok(" 72", add_special_tokens=False)["input_ids"]
    max_length = 24
    scorer = loglik.Scorer(model, tok, "causal", batch_size=4, max_length=max_length)
    got = scorer([long_source, " Therefore,"], [" 72", " 72"])
    assert [g.truncated for g in got] == [True, False]
    assert scorer.truncated == 1 and scorer.calls == 1 and scorer.pairs == 2
    # Same as scoring the last (max_length - target) source tokens directly.
    src = tok(long_source, add_special_tokens=False)["input_ids"][-(max_length - len(tgt)) :]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([src + tgt])).logits[0].double(), -1)
    want = sum(float(logp[len(src) - 1 + j, t]) for j, t in enumerate(tgt))
    assert got[0].sum_logprob == pytest.approx(want, abs=1e-5)


def test_score_empty_target_has_no_tokens(gpt2):
    model, tok = gpt2
    got = loglik.score(model, tok, "causal", [" a", " b c"], ["", " d"])
    assert got[0].n_tokens == 0 and got[0].sum_logprob == 0.0 and math.isnan(got[0].mean_logprob)
    assert got[1].n_tokens > 0


def test_token_logprobs_hand_values():
    # logits [0, ln 3] -> p = [1/4, 3/4]; mask drops the second position whatever its label.
    logits = torch.tensor([[[0.0, math.log(3.0)], [5.0, 1.0]]])
    labels = torch.tensor([[1, -100]])
    mask = torch.tensor([[True, False]])
    got = loglik.token_logprobs(logits, labels, mask)
    assert got[0, 0].item() == pytest.approx(math.log(0.75), abs=1e-6)
    assert got[0, 1].item() == 0.0


def test_length_batches_sorts_and_covers_every_index():
    batches = loglik.length_batches([3, 9, 1, 7, 5], 2)
    assert batches == [[1, 3], [4, 0], [2]]


def _fake_factory():
    def fn(sources, targets):
        if any("boom" in s for s in sources):
            raise ValueError("boom")
        return [loglik.TargetScore(-float(len(s)), len(t), -float(len(s)) / max(len(t), 1)) for s, t in zip(sources, targets, strict=True)]

    return fn


def test_loglik_udf_quarantine_mode_isolates_failing_rows(spark):
    df = spark.createDataFrame([("ab", "xyz"), ("boom", "q"), ("abcd", "zz")], "source string, target string")
    udf = loglik.loglik_udf(_fake_factory, on_error="quarantine")
    rows = df.select("source", udf("source", "target").alias("r")).orderBy("source").collect()
    got = {r.source: r.r for r in rows}
    assert (got["ab"].sum_logprob, got["ab"].n_tokens, got["ab"].error) == (-2.0, 3, None)
    assert (got["abcd"].mean_logprob, got["abcd"].n_tokens) == (-2.0, 2)
    assert got["boom"].sum_logprob is None and "ValueError: boom" in got["boom"].error


def test_loglik_udf_fail_mode_raises(spark):
    df = spark.createDataFrame([("boom", "q")], "source string, target string")
    udf = loglik.loglik_udf(_fake_factory, on_error="fail")
    with pytest.raises(Exception, match="boom"):
        df.select(udf("source", "target")).collect()


def test_loglik_udf_real_model_matches_score(spark, tiny_models, gpt2):
    model, tok = gpt2
    factory = loglik.model_scorer_factory(str(tiny_models["tiny-gpt2"]), "causal", device="cpu", batch_size=3)
    df = spark.createDataFrame(list(zip(SOURCES, TARGETS, strict=True)), "source string, target string").repartition(2)
    rows = df.select("source", "target", loglik.loglik_udf(factory)("source", "target").alias("r")).collect()
    want = {(s, t): g for s, t, g in zip(SOURCES, TARGETS, loglik.score(model, tok, "causal", SOURCES, TARGETS), strict=True)}
    assert len(rows) == len(SOURCES)
    for r in rows:
        assert r.r.sum_logprob == pytest.approx(want[(r.source, r.target)].sum_logprob, abs=1e-5)
        assert r.r.n_tokens == want[(r.source, r.target)].n_tokens
