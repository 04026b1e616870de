from __future__ import annotations

import numpy as np
from pyspark.sql import Row
from tolerance import exact

from jobs.selection import select_chains as S
from schemas import chain_scores as CS
from schemas import chains as C

# (question, sample, answer, gold, intra_entail_min, inter_min, info_gain_min)
SAMPLES = [
    ("q1", 0, "17", "18", 0.2, 0.3, 0.1),
    ("q1", 1, "18", "18", 0.9, 0.8, -0.5),  # best correctness
    ("q1", 2, "18", "18", 0.5, 0.6, 0.4),  # best informativeness and best "both"
    ("q2", 0, "1000.", "$1,000", 0.1, 0.1, 0.9),  # greedy; wins "both" on a tie by coming first
    ("q2", 1, "7", "$1,000", 0.9, 0.9, 0.2),
    ("q2", 2, "7", "$1,000", 0.5, 0.5, 0.3),
    ("q3", 0, "5", "5", 0.5, 0.5, 0.5),  # one sample only: not a selection question
    ("q4", 0, "yes", "yes", None, 0.9, 0.0),  # a null correctness score ranks last
    ("q4", 1, "no", "yes", 0.5, 0.5, 0.1),
]


# Real greedy decodes (sample_chains' metadata greedy=true, no sample_idx): (question, answer, gold, scores).
GREEDY_DECODES = [
    ("q1", "18", "18", None, None, None),  # right where q1's first sample is wrong; no scores: still the baseline
    ("q3", "5", "5", 0.9, 0.9, 0.9),  # q3 has one sample: not a selection question, so not reported either
    ("q4", "no", "yes", 0.99, 0.99, 0.99),  # best scores and the tie-breaking vote: it would win if a candidate
]


def _frames(spark, greedy=()):
    chains, scores = [], []
    rows = [(q, k, a, g, e, i, n, {"sample_idx": str(k)}) for q, k, a, g, e, i, n in SAMPLES]
    rows += [(q, "greedy", a, g, e, i, n, {"greedy": "true"}) for q, a, g, e, i, n in greedy]
    for q, k, answer, gold, entail, inter, gain, meta in rows:
        cid = f"{q}-{k}"
        chains.append(Row(**{f.name: None for f in C.SCHEMA.fields} | {
            C.CHAIN_ID: cid, C.DATASET: "toy", C.QUESTION_ID: q, C.CONTEXT: "x", C.STEPS: ["s."],
            C.ANSWER: answer, C.GOLD_ANSWER: gold, C.METADATA: meta, C.CONTENT_HASH: cid}))
        scores.append(Row(**{f.name: None for f in CS.SCHEMA.fields} | {
            CS.CHAIN_ID: cid, CS.CONFIG_HASH: "h", CS.N_STEPS: 1, CS.min_col("intra_entail"): entail,
            CS.min_col("inter"): inter, CS.min_col("info_gain"): gain}))
    return spark.createDataFrame(chains, C.SCHEMA), spark.createDataFrame(scores, CS.SCHEMA)


def test_picks_known_best_chain(spark, make_settings):
    chains, scores = _frames(spark)
    got = S.picks(chains, scores, make_settings("select.config_hash=h"))
    chosen = {(r[C.QUESTION_ID], r[S.METHOD]): (r[C.CHAIN_ID], r[S.CORRECT]) for r in got.collect()}
    assert chosen == {
        ("q1", "greedy"): ("q1-0", False), ("q1", "correctness"): ("q1-1", True),
        ("q1", "informativeness"): ("q1-2", True), ("q1", "both"): ("q1-2", True),
        ("q1", "self_consistency"): ("q1-1", True),
        ("q2", "greedy"): ("q2-0", True), ("q2", "correctness"): ("q2-1", False),
        ("q2", "informativeness"): ("q2-0", True), ("q2", "both"): ("q2-0", True),
        ("q2", "self_consistency"): ("q2-1", False),
        ("q4", "greedy"): ("q4-0", True), ("q4", "correctness"): ("q4-1", False),
        ("q4", "informativeness"): ("q4-1", False), ("q4", "both"): ("q4-1", False),
        ("q4", "self_consistency"): ("q4-0", True),  # 1-1 tie: the earliest sample's answer
        # the oracle: the earliest correct candidate ("1000." is "$1,000"); every question here has one
        ("q1", "oracle"): ("q1-1", True), ("q2", "oracle"): ("q2-0", True), ("q4", "oracle"): ("q4-0", True),
    }
    acc = {r[S.METHOD]: (r["n_questions"], r["accuracy"]) for r in S.accuracy(got).collect()}  # exact: k / 3
    assert acc == {"greedy": (3, exact(2 / 3)), "correctness": (3, exact(1 / 3)),
                   "informativeness": (3, exact(2 / 3)), "both": (3, exact(2 / 3)),
                   "self_consistency": (3, exact(2 / 3)), "oracle": (3, exact(1.0))}
    # Paired against greedy (F, T, T on q1, q2, q4). Oracle T, T, T: differences (1, 0, 0), a resample of three
    # is all zeros with p = 8/27 and all ones with p = 1/27 > 2.5 %, so the 95 % percentile CI is [0, 1].
    # Correctness T, F, F: differences (1, -1, -1): all -1 with p = 8/27, all +1 with p = 1/27: [-1, 1].
    compared = S.against_greedy(got, 10_000, 0.95, 0)
    assert compared[("toy", "oracle")] == (exact(1 / 3), 0.0, 1.0)
    assert compared[("toy", "correctness")] == (exact(-1 / 3), -1.0, 1.0)
    assert compared[("toy", "greedy")] == (0.0, 0.0, 0.0)
    # Informativeness T, T, F: differences (1, 0, -1), all -1 and all +1 each with p = 1/27: [-1, 1] around 0.
    assert compared[("toy", "informativeness")] == (0.0, -1.0, 1.0)


def test_picks_sum_combination(spark, make_settings):
    chains, scores = _frames(spark)
    settings = make_settings("select.config_hash=h", "select.combine=sum", "select.criteria=[correctness,both]")
    got = {(r[C.QUESTION_ID], r[S.METHOD]): r[C.CHAIN_ID] for r in S.picks(chains, scores, settings).collect()}
    # q1 sums: correctness 0.5 / 1.7 / 1.1; both 0.6 / 1.2 / 1.5.
    assert (got[("q1", "correctness")], got[("q1", "both")]) == ("q1-1", "q1-2")


def test_picks_real_greedy_decode_kept_apart(spark, make_settings):
    """A question's greedy decode is the greedy baseline and never a candidate; without one, the first sample."""
    chains, scores = _frames(spark, GREEDY_DECODES)
    got = S.picks(chains, scores, make_settings("select.config_hash=h")).collect()
    chosen = {(r[C.QUESTION_ID], r[S.METHOD]): (r[C.CHAIN_ID], r[S.CORRECT], r[S.BASIS]) for r in got}
    assert {q for q, _ in chosen} == {"q1", "q2", "q4"}  # q3 (one sample) stays out, greedy decode or not
    assert chosen[("q1", "greedy")] == ("q1-greedy", True, "greedy_decode")
    assert chosen[("q2", "greedy")] == ("q2-0", True, "first_sample")  # no decode: the documented old rule
    assert chosen[("q4", "greedy")] == ("q4-greedy", False, "greedy_decode")
    # The candidates' picks are those of the test above: q4's decode (best scores, a second "no") changes nothing.
    assert {key: v[0] for key, v in chosen.items() if key[1] != "greedy"} == {
        ("q1", "correctness"): "q1-1", ("q1", "informativeness"): "q1-2", ("q1", "both"): "q1-2",
        ("q1", "self_consistency"): "q1-1", ("q2", "correctness"): "q2-1", ("q2", "informativeness"): "q2-0",
        ("q2", "both"): "q2-0", ("q2", "self_consistency"): "q2-1", ("q4", "correctness"): "q4-1",
        ("q4", "informativeness"): "q4-1", ("q4", "both"): "q4-1", ("q4", "self_consistency"): "q4-0",
        ("q1", "oracle"): "q1-1", ("q2", "oracle"): "q2-0", ("q4", "oracle"): "q4-0",
    }
    assert {key[0]: v[2] for key, v in chosen.items() if key[1] != "greedy"} == {"q1": None, "q2": None, "q4": None}
    acc = {r[S.METHOD]: r["accuracy"] for r in S.accuracy(spark.createDataFrame(got)).collect()}
    assert acc["greedy"] == exact(2 / 3)  # q1 right, q2 right (first sample), q4 wrong
    bases = S.greedy_bases(spark.createDataFrame(got))
    assert bases == {"toy": {"greedy_decode": 2, "first_sample": 1}}
    rows = [{C.DATASET: "toy", S.METHOD: "greedy", "n_questions": 3, "accuracy": 2 / 3, S.DECODE: 2, S.FIRST: 1}]
    assert "| toy | greedy (2 greedy decodes, 1 first samples) | 3 | 66.7 % |" in S.report(rows)
    assert "no question has 2 or more candidate chains" in S.report([])


def test_paired_bootstrap_hand_values():
    """Percentile CIs of the mean paired difference, each derived by hand from the resampling distribution."""
    # (1, 0): a resample of two has mean 0 (p 1/4), 0.5 (1/2) or 1 (1/4): the 2.5 % and 97.5 % points are 0 and 1.
    assert S.paired_bootstrap(np.array([1, 0]), np.array([0, 0]), 10_000, 0.95, 0) == (0.5, 0.0, 1.0)
    # (1, 1, 1, 0): mean 0 has p 1/256 < 2.5 % < p(mean <= 0.25) = 13/256; mean 1 has p 81/256: [0.25, 1].
    assert S.paired_bootstrap(np.array([1, 1, 1, 0]), np.zeros(4), 10_000, 0.95, 0) == (0.75, 0.25, 1.0)
    # Paired: both right on the same questions is no difference at all, however the accuracy varies.
    assert S.paired_bootstrap(np.array([1, 0, 1, 0]), np.array([1, 0, 1, 0]), 10_000, 0.95, 0) == (0.0, 0.0, 0.0)
    # (1, -1, 1, -1): mean -1 or +1 each with p 1/16 > 2.5 %: [-1, 1] around a difference of 0.
    assert S.paired_bootstrap(np.array([1, 0, 1, 0]), np.array([0, 1, 0, 1]), 10_000, 0.95, 0) == (0.0, -1.0, 1.0)
    assert S.paired_bootstrap(np.array([1]), np.array([0]), 10_000, 0.95, 0) == (1.0, None, None)
    # The same seed gives the same interval; a narrower confidence a narrower one.
    method, greedy = np.array([1, 1, 0, 1, 0, 1, 1, 0] * 5), np.array([0, 1, 0, 1, 1, 0, 0, 0] * 5)
    wide = S.paired_bootstrap(method, greedy, 2_000, 0.95, 7)
    assert wide == S.paired_bootstrap(method, greedy, 2_000, 0.95, 7)
    narrow = S.paired_bootstrap(method, greedy, 2_000, 0.5, 7)
    assert wide[1] < narrow[1] <= 0.25 <= narrow[2] < wide[2]


def test_report_shows_the_difference_against_greedy():
    rows = [{C.DATASET: "toy", S.METHOD: "greedy", "n_questions": 3, "accuracy": 2 / 3, S.DELTA: 0.0, S.LOW: 0.0,
             S.HIGH: 0.0},
            {C.DATASET: "toy", S.METHOD: "oracle", "n_questions": 3, "accuracy": 1.0, S.DELTA: 1 / 3, S.LOW: 0.0,
             S.HIGH: 1.0},
            {C.DATASET: "toy", S.METHOD: "both", "n_questions": 1, "accuracy": 1.0, S.DELTA: 1.0, S.LOW: None,
             S.HIGH: None}]  # fmt: skip
    text = S.report(rows)
    assert "| toy | greedy | 3 | 66.7 % |  |" in text
    assert "| toy | oracle | 3 | 100.0 % | +33.3 [+0.0, +100.0] |" in text
    assert "| toy | both | 1 | 100.0 % | +100.0 (no CI: < 2 questions) |" in text
