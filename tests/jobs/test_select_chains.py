from __future__ import annotations

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
    }
    acc = {r[S.METHOD]: (r["n_questions"], r["accuracy"]) for r in S.accuracy(got).collect()}  # exact: k / 3
    assert acc == {"greedy": (3, exact(2 / 3)), "correctness": (3, exact(1 / 3)),
                   "informativeness": (3, exact(2 / 3)), "both": (3, exact(2 / 3)),
                   "self_consistency": (3, exact(2 / 3))}


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
    }
    assert {key[0]: v[2] for key, v in chosen.items() if key[1] != "greedy"} == {"q1": None, "q2": None, "q4": None}
    acc = {r[S.METHOD]: r["accuracy"] for r in S.accuracy(spark.createDataFrame(got)).collect()}
    assert acc["greedy"] == exact(2 / 3)  # q1 right, q2 right (first sample), q4 wrong
    bases = S.greedy_bases(spark.createDataFrame(got))
    assert bases == {"toy": {"greedy_decode": 2, "first_sample": 1}}
    rows = [{C.DATASET: "toy", S.METHOD: "greedy", "n_questions": 3, "accuracy": 2 / 3, S.DECODE: 2, S.FIRST: 1}]
    assert "| toy | greedy (2 greedy decodes, 1 first samples) | 3 | 66.7 % |" in S.report(rows)
    assert "no question has 2 or more candidate chains" in S.report([])
