"""udfs.nli: label mapping, softmax, premise-only truncation, length-sorted batching, error isolation, the UDF."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from pyspark import cloudpickle
from tolerance import EXACT_REL, exact, prob_approx

from jobs.infra.tiny_models import NLI_LABEL2ID
from udfs import nli

# Fakes defined here run in Spark's Python workers, which cannot import this test module by name.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def tiny_nli(tiny_models):
    from udfs import runtime

    return runtime.load_model(str(tiny_models["tiny-nli"]), "nli")


def test_label_indices_reads_label2id_case_insensitively():
    # tiny model: {"NEUTRAL": 0, "Contradiction": 1, "entailment": 2}
    assert nli.label_indices(NLI_LABEL2ID) == (2, 0, 1)
    assert nli.label_indices({"CONTRADICTION": 0, "NEUTRAL": 1, "ENTAILMENT": 2}) == (2, 1, 0)
    assert nli.label_indices({"entailment": 0, "neutral": 1, "contradiction": 2}) == (0, 1, 2)


def test_label_indices_rejects_generic_or_two_way_labels():
    with pytest.raises(ValueError, match="LABEL_0"):
        nli.label_indices({"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2})
    with pytest.raises(ValueError, match="lacks"):
        nli.label_indices({"entailment": 0, "not_entailment": 1})


def test_softmax_labels_hand_computed():
    # logits ln1, ln2, ln5 -> softmax 1/8, 2/8, 5/8; label order picked by indices (entail=2, neutral=0, contra=1)
    logits = np.log(np.array([[1.0, 2.0, 5.0], [4.0, 2.0, 2.0]]))
    got = nli.softmax_labels(logits + 100.0, (2, 0, 1))  # shift-invariant, no overflow
    np.testing.assert_allclose(got, [[5 / 8, 1 / 8, 2 / 8], [2 / 8, 4 / 8, 2 / 8]], rtol=EXACT_REL)  # float64


def test_length_batches_longest_first_and_cover_every_index():
    batches = nli.length_batches([3, 9, 1, 9, 5], 2)
    assert batches == [[1, 3], [4, 0], [2]]
    assert nli.length_batches([3, 9, 1, 9, 5], 2, sort=False) == [[0, 1], [2, 3], [4]]


def test_encode_pairs_truncates_only_the_premise(tiny_nli):
    _, tok = tiny_nli
    long_premise = "the sun is a kind of star " * 40
    hypothesis = "earth orbits the sun"
    rows, cut = nli.encode_pairs(tok, [long_premise, "a cat sits"], [hypothesis, "an animal sits"], 32)
    assert cut.tolist() == [True, False]
    assert len(rows[0]["input_ids"]) == 32
    hyp_ids = tok(hypothesis, add_special_tokens=False)["input_ids"]
    sep = tok.sep_token_id
    # [CLS] premise... [SEP] hypothesis [SEP]: the hypothesis survives whole at the end.
    assert rows[0]["input_ids"][-len(hyp_ids) - 2 :] == [sep, *hyp_ids, sep]
    assert rows[1]["input_ids"] == tok("a cat sits", "an animal sits")["input_ids"]


def test_encode_pairs_hypothesis_too_long_falls_back_and_counts(tiny_nli):
    _, tok = tiny_nli
    rows, cut = nli.encode_pairs(tok, ["short premise"], ["the sun is a star " * 40], 24)
    assert cut.tolist() == [True]
    assert len(rows[0]["input_ids"]) == 24


def _manual(model, tok, premise: str, hypothesis: str, max_length: int) -> list[float]:
    """One unpadded forward pass, label names read from id2label: the reference for the batched path."""
    import torch

    enc = tok(premise, hypothesis, truncation="only_first", max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        probs = torch.softmax(model(**enc).logits[0].double(), -1).tolist()
    by_name = {model.config.id2label[i].lower(): p for i, p in enumerate(probs)}
    return [by_name["entailment"], by_name["neutral"], by_name["contradiction"]]


PAIRS = [
    ("an animal requires warmth for survival", "a thick coat helps the animal survive"),
    ("the sun is a kind of star " * 30, "the sun is a star"),
    ("x", "y"),
    ("earth orbits the sun", "the sun orbits earth"),
    ("natalia sold 48 clips in april", "natalia sold 24 clips in may"),
    ("a", "the answer is 72"),
    ("if a premise entails a hypothesis then the hypothesis follows", "the hypothesis follows"),
]


@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_predict_pairs_matches_unpadded_single_passes(spread_nli, batch_size):
    from udfs import runtime

    model, tok = runtime.load_model(str(spread_nli), "nli")
    premises, hypotheses = [p for p, _ in PAIRS], [h for _, h in PAIRS]
    out = nli.predict_pairs(model, tok, premises, hypotheses, batch_size=batch_size, max_length=40)
    expected = np.array([_manual(model, tok, p, h, 40) for p, h in PAIRS])
    assert out.probs == prob_approx(expected)
    assert out.truncated.tolist() == [False, True, False, False, False, False, False]
    assert np.ptp(out.probs[:, 2]) > 1e-2  # pairs differ, so a lost order would show


def _fake_predict(premises: list[str], hypotheses: list[str]) -> np.ndarray:
    if any("POISON" in p for p in premises):
        raise ValueError("poisoned premise")
    rows = [[len(p), len(h), 10.0] for p, h in zip(premises, hypotheses, strict=True)]
    return np.array([[v / sum(r) for v in r] for r in rows])


def test_score_frame_isolates_a_poisoned_pair():
    calls: list[int] = []

    def predict(premises, hypotheses):
        calls.append(len(premises))
        return _fake_predict(premises, hypotheses)

    premises = [f"premise {i}" for i in range(16)]
    premises[11] = "POISON here"
    frame = nli.score_frame(predict, premises, ["h"] * 16, on_error="quarantine")
    assert frame[nli.ERROR].notna().tolist() == [i == 11 for i in range(16)]
    assert frame.loc[11, nli.ERROR] == "ValueError: poisoned premise"
    assert frame.loc[11, nli.ENTAIL] is None
    assert frame.loc[0, nli.ENTAIL] == exact(9 / 20)  # len("premise 0")=9, len("h")=1, +10
    assert len(calls) <= 1 + 2 * math.ceil(math.log2(16))  # bisection, not one call per pair


def test_score_frame_fail_fast_raises():
    with pytest.raises(RuntimeError, match="NLI scoring failed"):
        nli.score_frame(_fake_predict, ["ok", "POISON"], ["h", "h"], on_error="fail")


def test_score_frame_non_finite_probabilities_are_errors():
    def predict(premises, hypotheses):
        return np.array([[np.nan, 0.5, 0.5] if p == "bad" else [0.2, 0.3, 0.5] for p in premises])

    frame = nli.score_frame(predict, ["good", "bad"], ["h", "h"], on_error="quarantine")
    assert frame[nli.ERROR].tolist() == [None, "non-finite probabilities"]
    assert frame[nli.CONTRADICTION].tolist() == [0.5, None]
    with pytest.raises(RuntimeError, match="non-finite"):
        nli.score_frame(predict, ["good", "bad"], ["h", "h"], on_error="fail")


def _constant_factory():
    # A random constant per factory call: equal values within a task prove one load per task.
    value = float(np.random.default_rng().uniform(0.01, 0.3))

    def predict(premises, hypotheses):
        return np.tile([value, 1 - 2 * value, value], (len(premises), 1))

    return predict


def test_nli_udf_builds_the_predictor_once_per_task(spark):
    from pyspark.sql import functions as F

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "5")
    try:
        df = spark.range(40).repartition(2).select(
            F.spark_partition_id().alias("part"), F.col("id").cast("string").alias("p"), F.lit("h").alias("h")
        )
        udf = nli.nli_udf(_constant_factory, on_error="fail")
        rows = df.select("part", udf("p", "h").alias("s")).select("part", "s.*").collect()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    by_part: dict[int, set[float]] = {}
    for r in rows:
        by_part.setdefault(r["part"], set()).add(r[nli.ENTAIL])
        assert r[nli.NEUTRAL] == exact(1 - 2 * r[nli.ENTAIL])  # the fake's float64 values
        assert r[nli.TRUNCATED] is False and r[nli.ERROR] is None
    assert len(rows) == 40 and len(by_part) == 2
    assert all(len(values) == 1 for values in by_part.values())  # 8 Arrow batches per task, one factory call


def test_nli_udf_model_scores_in_spark_equal_plain_torch(spark, spread_nli):
    factory = nli.model_predictor(str(spread_nli), None, "cpu", "fp32", batch_size=3, max_length=40)
    df = spark.createDataFrame(PAIRS, "p string, h string").coalesce(1)  # one worker imports torch
    rows = df.select("p", "h", nli.nli_udf(factory, on_error="fail")("p", "h").alias("s")).collect()
    from udfs import runtime

    model, tok = runtime.load_model(str(spread_nli), "nli")
    for r in rows:
        expected = _manual(model, tok, r["p"], r["h"], 40)
        got = [r["s"][nli.ENTAIL], r["s"][nli.NEUTRAL], r["s"][nli.CONTRADICTION]]
        assert got == prob_approx(expected)
        assert r["s"][nli.TRUNCATED] == (r["p"] == PAIRS[1][0])
