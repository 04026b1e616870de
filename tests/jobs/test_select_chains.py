from __future__ import annotations

import numpy as np
from pyspark.sql import Row
from pyspark.sql import functions as F
from tolerance import exact

from jobs.infra import tables
from jobs.receval import curate
from jobs.selection import cross_validation as CV
from jobs.selection import select_chains as S
from schemas import chain_scores as CS
from schemas import chains as C
from schemas import curation as CU

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


# The rows the stage had before issue 56; the default select.methods add more (test_select_stage_new_methods).
TODAY = ("greedy", "correctness", "informativeness", "both", "self_consistency", "oracle")


def test_picks_known_best_chain(spark, make_settings):
    chains, scores = _frames(spark)
    got = S.picks(chains, scores, make_settings("select.config_hash=h")).where(F.col(S.METHOD).isin(*TODAY))
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
    picked = S.picks(chains, scores, make_settings("select.config_hash=h")).where(F.col(S.METHOD).isin(*TODAY))
    got = picked.collect()
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
    frame = spark.createDataFrame(got, picked.schema)  # today's rows: setting and fold all null, nothing to infer
    acc = {r[S.METHOD]: r["accuracy"] for r in S.accuracy(frame).collect()}
    assert acc["greedy"] == exact(2 / 3)  # q1 right, q2 right (first sample), q4 wrong
    bases = S.greedy_bases(frame)
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


# Two questions, four samples and a greedy decode each: (question, sample, answer, intra_entail_min, arith_errors_total).
# With select.combine=sum and correctness = [intra_entail_min], a chain's correctness is its intra_entail_min.
TWO = [
    ("q1", 0, "12", 0.1, 1), ("q1", 1, "12", 0.2, 1), ("q1", 2, "15", 0.9, 0), ("q1", 3, "12", 0.3, 0),
    ("q1", "greedy", "12", 0.5, 0),
    ("q2", 0, "5", 0.1, 1), ("q2", 1, "5", 0.2, 2), ("q2", 2, "8", 0.8, 0), ("q2", 3, "5", 0.3, 1),
    ("q2", "greedy", "5", 0.5, 0),
]
GOLD = {"q1": "12", "q2": "8"}
TWO_SETTINGS = (
    "select.combine=sum", "select.correctness=[intra_entail_min]", "select.informativeness=[info_gain_min]",
    "select.criteria=[correctness]", "select.cv_folds=2",
    "select.methods={self_consistency: {method: vote}, vote_arith_checked: {method: filter_then_vote, grid: {}}, "
    "weighted_vote: {method: weighted_vote, params: {score: correctness}, grid: {temperature: [0.01, 100.0]}}, "
    "group_max: {method: group_score, params: {score: correctness, agg: max}}, oracle: {method: oracle}}",
)


def _two_questions(spark, config_hash):
    chains, scores = [], []
    for q, k, answer, entail, errors in TWO:
        cid = f"{q}-{k}"
        meta = {"greedy": "true"} if k == "greedy" else {"sample_idx": str(k), "greedy": "false"}
        chains.append(Row(**{f.name: None for f in C.SCHEMA.fields} | {
            C.CHAIN_ID: cid, C.DATASET: "toy", C.QUESTION_ID: q, C.CONTEXT: "x", C.STEPS: ["s."], C.ANSWER: answer,
            C.GOLD_ANSWER: GOLD[q], C.METADATA: meta, C.CONTENT_HASH: cid}))
        scores.append(Row(**{f.name: None for f in CS.SCHEMA.fields} | {
            CS.CHAIN_ID: cid, CS.CONFIG_HASH: config_hash, CS.N_STEPS: 1, CS.min_col("intra_entail"): entail,
            CS.min_col("info_gain"): 0.0, CS.total_col("arith_errors"): errors}))
    return spark.createDataFrame(chains, C.SCHEMA), spark.createDataFrame(scores, CS.SCHEMA)


def test_select_stage_new_methods(spark, make_settings):
    """The stage on a lake of two questions: each method's choice, and the temperature cross-validated."""
    settings = make_settings("select.config_hash=h", *TWO_SETTINGS)
    chains, scores = _two_questions(spark, "h")
    chains.write.format("delta").save(settings.table("chains"))
    scores.write.format("delta").save(settings.table("chain_scores"))
    with tables.Held() as hold:
        picked, _ = S.choices(chains, scores, settings, hold)
        chosen = {(r[C.QUESTION_ID], r[S.METHOD]): (r[C.CHAIN_ID], r[S.CORRECT], r[S.SETTING], r[S.FOLD])
                  for r in picked.collect()}  # fmt: skip
    fold = CV.folds_of(["q1", "q2"], 2, seed=0)
    cold, hot = '{"temperature": 0.01}', '{"temperature": 100.0}'
    assert chosen == {
        # q1 (gold 12): samples 12 (0.1, 1 error), 12 (0.2, 1 error), 15 (0.9), 12 (0.3); greedy 12.
        ("q1", "greedy"): ("q1-greedy", True, None, None),
        ("q1", "correctness"): ("q1-2", False, None, None),  # the argmax, 0.9
        ("q1", "self_consistency"): ("q1-0", True, None, None),  # 12 three times: its earliest
        ("q1", "vote_arith_checked"): ("q1-2", False, None, None),  # 15 (s2) and 12 (s3) left, 1-1: the earlier
        ("q1", "group_max"): ("q1-2", False, None, None),  # max 0.9 (15) against 0.3 (12)
        ("q1", "oracle"): ("q1-0", True, None, None),
        # q2 (gold 8): samples 5 (0.1, 1 error), 5 (0.2, 2 errors), 8 (0.8), 5 (0.3, 1 error); greedy 5.
        ("q2", "greedy"): ("q2-greedy", False, None, None),
        ("q2", "correctness"): ("q2-2", True, None, None),
        ("q2", "self_consistency"): ("q2-0", False, None, None),
        ("q2", "vote_arith_checked"): ("q2-2", True, None, None),  # only 8 has no arithmetic error
        ("q2", "group_max"): ("q2-2", True, None, None),
        ("q2", "oracle"): ("q2-2", True, None, None),
        # Temperature 0.01 follows the best chain (right on q2 only), 100 the vote (right on q1 only). Each question
        # is its own fold, answered with the temperature right on the *other* one: wrong on both. A choice made on
        # the reported questions would have scored 50 % (one temperature) or 100 % (each its best).
        ("q1", "weighted_vote"): ("q1-2", False, cold, fold["q1"]),  # 15's best chain
        ("q2", "weighted_vote"): ("q2-3", False, hot, fold["q2"]),  # 5's best chain (0.3)
    }
    rows = {r[S.METHOD]: r for r in S.run(spark, settings)}
    assert {m: r["accuracy"] for m, r in rows.items()} == {
        "greedy": 0.5, "correctness": 0.5, "self_consistency": 0.5, "vote_arith_checked": 0.5, "group_max": 0.5,
        "oracle": 1.0, "weighted_vote": 0.0}  # fmt: skip
    folds = sorted(rows["weighted_vote"][S.FOLDS], key=lambda f: f["fold"])
    assert folds == sorted([{"fold": fold["q1"], "questions": 1, "setting": cold, "train_accuracy": 1.0,
                             "heldout_accuracy": 0.0},
                            {"fold": fold["q2"], "questions": 1, "setting": hot, "train_accuracy": 1.0,
                             "heldout_accuracy": 0.0}], key=lambda f: f["fold"])  # fmt: skip
    assert all(S.FOLDS not in r for m, r in rows.items() if m != "weighted_vote")
    text = S.report(list(rows.values()))
    assert "| toy | weighted_vote (held out, 2 folds) | 2 | 0.0 % |" in text
    assert f"| toy | weighted_vote | {fold['q1']} | 1 | `{cold}` | 100.0 % | 0.0 % |" in text


def test_selection_as_a_curation_rule(spark, make_settings):
    """curation.select_method keeps per question the chosen chain, or every chain of the chosen answer."""
    settings = make_settings(*TWO_SETTINGS, "curation.select_method=vote", "curation.select_keep=chosen_answer")
    chains, scores = _two_questions(spark, settings.scoring_hash())
    selected = S.selected_chains(chains, scores, settings)
    curated, rejected = curate.transform(scores, settings.curation, selected=selected)
    rule = "select:vote:chosen_answer"
    # The vote's answer, every chain of it: 12 on q1 (s0, s1, s3), 5 on q2 (s0, s1, s3, though 8 is right). The
    # rest fail the rule, the greedy decodes too (never candidates).
    assert sorted(r[CU.CHAIN_ID] for r in curated.collect()) == ["q1-0", "q1-1", "q1-3", "q2-0", "q2-1", "q2-3"]
    assert {r[CU.CHAIN_ID]: r[CU.FAILED_RULES] for r in rejected.collect()} == {
        "q1-2": [rule], "q1-greedy": [rule], "q2-2": [rule], "q2-greedy": [rule]}
    # filter_then_vote keeping the chosen chain: q1's survivors 15 (s2) and 12 (s3) tie, the earlier s2; q2's only
    # survivor is 8 (s2).
    chosen = make_settings(*TWO_SETTINGS, "curation.select_method=filter_then_vote")
    assert chosen.scoring_hash() == settings.scoring_hash()  # curation settings score nothing: the same scores
    kept = S.selected_chains(chains, scores, chosen).where(F.col(S.SELECTED)).collect()
    assert {r[C.CHAIN_ID] for r in kept} == {"q1-2", "q2-2"}
    assert settings.curation.rules_hash() != make_settings(*TWO_SETTINGS).curation.rules_hash()
