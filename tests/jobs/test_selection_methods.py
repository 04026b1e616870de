"""Selection methods (udfs/selection.py) and their cross-validation (jobs/selection/cross_validation.py) on
hand-made questions; no Spark. Every expected choice is worked out in the comment beside it."""

from __future__ import annotations

import math

import pytest

from jobs.receval.settings import CurationSettings
from jobs.selection import cross_validation as CV
from jobs.selection.settings import MethodSpec, SelectSettings
from udfs import selection as SEL


def cand(cid: str, order: float, answer: str | None, both: float | None = None, *, arith: float | None = None,
         correct: bool = False, **scores: float | None) -> SEL.Candidate:
    return SEL.Candidate(cid, order, SEL.normalise(answer), {"both": both, **scores}, arith, correct)


def test_answers_compare_as_the_select_stage_does():
    assert SEL.normalise(" $1,000. ") == "1000"
    assert SEL.same_answer("1000", SEL.normalise("1,000.0000001"))  # numbers within 1e-6
    assert not SEL.same_answer("1000", "1000.01")
    assert SEL.same_answer("yes", "yes") and not SEL.same_answer("yes", "no")
    assert not SEL.same_answer(None, None)  # no answer is never right
    # Groups in the order of their earliest chain; "18.0" joins "18"; the chains without answer share a group.
    groups = SEL.answer_groups([cand("c", 2, "18.0"), cand("a", 0, None), cand("b", 1, "$18"), cand("d", 3, None),
                                cand("e", 4, "7")])  # fmt: skip
    assert [[c.chain_id for c in g] for g in groups] == [["a", "d"], ["b", "c"], ["e"]]


def test_argmax_best_score_missing_last_ties_earliest():
    group = [cand("c0", 0, "1", 0.2), cand("c2", 2, "2", 0.9), cand("c1", 1, "3", 0.9), cand("c3", 3, "4", None)]
    # 0.9 twice: c1 is sampled before c2, whatever the list order.
    assert SEL.choose(SEL.ARGMAX, group, {"score": "both"}) == "c1"
    # Only c0 has a score, however low: the missing ones rank last.
    assert SEL.choose(SEL.ARGMAX, [cand("n0", 0, "1"), cand("n1", 1, "2", -5.0)], {"score": "both"}) == "n1"
    # NaN is a missing score too (pandas holds nulls as NaN); none scored: the earliest.
    assert SEL.choose(SEL.ARGMAX, [cand("n1", 1, "2", math.nan), cand("n0", 0, "1")], {}) == "n0"


def test_argmax_mixes_two_scores_by_weight():
    group = [cand("c0", 0, "a", correctness=1.0, informativeness=0.0),
             cand("c1", 1, "b", correctness=0.4, informativeness=0.8),
             cand("c2", 2, "c", correctness=0.0, informativeness=0.9)]  # fmt: skip
    mix = {"score": "correctness", "mix_with": "informativeness"}
    # weight 0: correctness alone (c0: 1.0); weight 1: informativeness alone (c2: 0.9);
    # weight 0.5: the means 0.5, 0.6, 0.45 -> c1.
    assert [SEL.choose(SEL.ARGMAX, group, {**mix, "weight": w}) for w in (0.0, 1.0, 0.5)] == ["c0", "c2", "c1"]


def test_vote_majority_ties_to_the_earliest_sample():
    # "5" twice, "7" once: "5"'s earliest chain, s1.
    assert SEL.choose(SEL.VOTE, [cand("s0", 0, "7"), cand("s2", 2, "5"), cand("s1", 1, "5.")]) == "s1"
    # 2-2 between "4" (first chain s1) and "9" (first chain s0): "9", and its earliest chain s0.
    tie = [cand("s1", 1, "4"), cand("s3", 3, "4"), cand("s2", 2, "9"), cand("s0", 0, "9")]
    assert SEL.choose(SEL.VOTE, tie) == "s0"
    # select_chains' q4: yes (sample 0) against no (sample 1), one each: yes.
    assert SEL.choose(SEL.VOTE, [cand("q4-1", 1, "no"), cand("q4-0", 0, "yes")]) == "q4-0"


def test_filter_then_vote_drops_wrong_arithmetic_and_low_scores():
    group = [cand("c0", 0, "5", 0.6, arith=1), cand("c1", 1, "5", 0.7, arith=2), cand("c2", 2, "7", 0.2, arith=0),
             cand("c3", 3, "8", 0.9, arith=0), cand("c4", 4, "7", 0.1, arith=None)]  # fmt: skip
    # A plain vote: "5" and "7" twice each, "5" comes first (c0).
    assert SEL.choose(SEL.VOTE, group) == "c0"
    # Arithmetic errors > 0 dropped (c0, c1); the unchecked c4 stays: "7" (c2, c4) beats "8" (c3): c2.
    assert SEL.choose(SEL.FILTER_THEN_VOTE, group, {}) == "c2"
    # And a threshold 0.5 on "both": c2 (0.2) and c4 (0.1) go too, "8" alone is left: c3.
    assert SEL.choose(SEL.FILTER_THEN_VOTE, group, {"threshold": 0.5}) == "c3"
    # max_arith_errors None: no arithmetic filter; threshold 0.65: c1 (0.7) and c3 (0.9) pass, a 1-1 tie -> c1.
    assert SEL.choose(SEL.FILTER_THEN_VOTE, group, {"max_arith_errors": None, "threshold": 0.65}) == "c1"
    # A missing score fails a threshold: only c0 scores here, "5" wins over the two "7"s.
    unscored = [cand("u0", 0, "5", 0.8), cand("u1", 1, "7"), cand("u2", 2, "7")]
    assert SEL.choose(SEL.FILTER_THEN_VOTE, unscored, {"threshold": 0.0}) == "u0"


def test_filter_then_vote_falls_back_to_all_when_nothing_is_left():
    group = [cand("c0", 0, "5", arith=1), cand("c1", 1, "6", arith=3), cand("c2", 2, "6", arith=1)]
    # Every chain has an arithmetic error: nothing survives, so the vote is over all three: "6" (c1, c2) -> c1.
    assert SEL.survivors(group, {"max_arith_errors": 0}) == group
    assert SEL.choose(SEL.FILTER_THEN_VOTE, group, {}) == SEL.choose(SEL.VOTE, group) == "c1"
    # A threshold nobody reaches: the same fallback.
    scored = [cand("d0", 0, "5", 0.1), cand("d1", 1, "6", 0.2), cand("d2", 2, "6", 0.3)]
    assert SEL.choose(SEL.FILTER_THEN_VOTE, scored, {"threshold": 0.9}) == "d1"


def test_filter_then_weighted_vote_combination():
    # Arithmetic filter, then a weighted vote at a low temperature: after dropping c0 ("5", 0.95, 1 error) the best
    # remaining chain is c3 ("8", 0.9): its answer wins over "7" (0.2, 0.1) as the temperature goes to 0.
    group = [cand("c0", 0, "5", 0.95, arith=1), cand("c2", 2, "7", 0.2, arith=0), cand("c3", 3, "8", 0.9, arith=0),
             cand("c4", 4, "7", 0.1, arith=0)]  # fmt: skip
    params = {"then": SEL.WEIGHTED_VOTE, "temperature": 0.01}
    assert SEL.choose(SEL.FILTER_THEN_VOTE, group, params) == "c3"
    # The same weighted vote without the filter: c0's "5".
    assert SEL.choose(SEL.WEIGHTED_VOTE, group, {"temperature": 0.01}) == "c0"


def test_weighted_vote_temperature_crossing_worked_by_hand():
    # "A": three chains scoring 0.2; "B": one chain scoring 1.0.
    # A's weight log(3 e^(0.2/T)) = log 3 + 0.2/T, B's 1/T: A wins iff T > 0.8 / log 3 = 0.7282...
    group = [cand("a0", 0, "A", 0.2), cand("a1", 1, "A", 0.2), cand("a2", 2, "A", 0.2), cand("b3", 3, "B", 1.0)]
    crossing = 0.8 / math.log(3)
    assert SEL.choose(SEL.WEIGHTED_VOTE, group, {"temperature": crossing * 0.99}) == "b3"
    # A wins: its chains tie at 0.2, so its earliest, a0.
    assert SEL.choose(SEL.WEIGHTED_VOTE, group, {"temperature": crossing * 1.01}) == "a0"


def test_weighted_vote_temperature_limits():
    # A plain vote (3 to 2 to 1, no tie) and an argmax that disagree with it.
    group = [cand("s0", 0, "10", 0.3), cand("s1", 1, "12", 0.5), cand("s2", 2, "10", 0.1), cand("s3", 3, "11", 0.95),
             cand("s4", 4, "12", 0.6), cand("s5", 5, "10", 0.2)]  # fmt: skip
    vote, best = SEL.choose(SEL.VOTE, group), SEL.choose(SEL.ARGMAX, group, {})
    assert (vote, best) == ("s0", "s3")
    # Very high temperature: every chain weighs ~1, the vote's answer "10" (its best-scoring chain s0, 0.3).
    assert SEL.choose(SEL.WEIGHTED_VOTE, group, {"temperature": 1e6}) == "s0"
    # Very low temperature: the answer of the best chain, "11" (s3).
    assert SEL.choose(SEL.WEIGHTED_VOTE, group, {"temperature": 1e-4}) == "s3"
    # Between: "12" (0.5, 0.6) at T = 0.1: weights log(e^5 + e^6) = 6.31, "11" e^9.5 -> 9.5, "10" log(e^3 + e^1 +
    # e^2) = 3.41: still "11". At T = 1: "12" log(e^.5 + e^.6) = 1.24, "10" log(e^.3 + e^.1 + e^.2) = 1.30, "11"
    # 0.95: "10", whose best chain is s0.
    assert SEL.choose(SEL.WEIGHTED_VOTE, group, {"temperature": 0.1}) == "s3"
    assert SEL.choose(SEL.WEIGHTED_VOTE, group, {"temperature": 1.0}) == "s0"
    # Chains without a score weigh nothing: a group of them loses to any scored answer, however many they are.
    bare = [cand("n0", 0, "1"), cand("n1", 1, "1"), cand("n2", 2, "1"), cand("n3", 3, "2", 0.0)]
    assert SEL.choose(SEL.WEIGHTED_VOTE, bare, {"temperature": 1e6}) == "n3"


def test_group_score_mean_or_max():
    # "A": 0.9 and 0.1 (mean 0.5, max 0.9); "B": 0.6 and 0.6 (mean 0.6, max 0.6).
    group = [cand("a0", 0, "A", 0.9), cand("b1", 1, "B", 0.6), cand("a2", 2, "A", 0.1), cand("b3", 3, "B", 0.6)]
    # mean: B, its chains tie -> the earliest, b1; max: A, its best chain a0.
    assert SEL.choose(SEL.GROUP_SCORE, group, {"agg": "mean"}) == "b1"
    assert SEL.choose(SEL.GROUP_SCORE, group, {"agg": "max"}) == "a0"
    # Equal means (0.5 and 0.5): the answer whose earliest chain comes first, "Y" (y0), over the bigger "X".
    tie = [cand("x1", 1, "X", 0.5), cand("x2", 2, "X", 0.5), cand("y0", 0, "Y", 0.5)]
    assert SEL.choose(SEL.GROUP_SCORE, tie, {"agg": "mean"}) == "y0"
    # A missing score is left out of the mean: "X" = mean(0.4) = 0.4 beats "Y" = 0.3; a group with none loses.
    gaps = [cand("x0", 0, "X", 0.4), cand("x1", 1, "X"), cand("y2", 2, "Y", 0.3), cand("z3", 3, "Z")]
    assert SEL.choose(SEL.GROUP_SCORE, gaps, {"agg": "mean"}) == "x0"


def test_oracle_earliest_correct_else_earliest():
    assert SEL.choose(SEL.ORACLE, [cand("c2", 2, "1", correct=True), cand("c1", 1, "1", correct=True),
                                   cand("c0", 0, "2")]) == "c1"  # fmt: skip
    assert SEL.choose(SEL.ORACLE, [cand("c1", 1, "1"), cand("c0", 0, "2")]) == "c0"


def test_chosen_answer_keeps_every_chain_of_the_answer():
    group = [cand("c0", 0, "5", arith=1), cand("c1", 1, "7", arith=0), cand("c2", 2, "7", arith=0),
             cand("c3", 3, "5", arith=1), cand("c4", 4, "5", arith=0)]  # fmt: skip
    # The vote: "5" (c0, c3, c4) over "7" (c1, c2): all three chains of "5".
    assert SEL.chosen_answer(SEL.VOTE, group) == ["c0", "c3", "c4"]
    # Filtered (c0, c3 dropped for their arithmetic): "7" (c1, c2) over "5" (c4 alone): c1 and c2.
    assert SEL.chosen_answer(SEL.FILTER_THEN_VOTE, group) == ["c1", "c2"]
    # A filter that leaves only c4 of the "5"s keeps only c4 when "5" wins: drop "7" by a threshold.
    scored = [cand("d0", 0, "5", 0.9, arith=1), cand("d1", 1, "7", 0.1, arith=0), cand("d2", 2, "5", 0.8, arith=0)]
    assert SEL.chosen_answer(SEL.FILTER_THEN_VOTE, scored, {"threshold": 0.5}) == ["d2"]


def test_config_checks_methods_and_parameters():
    with pytest.raises(ValueError, match="unknown selection method"):
        SEL.check("best_of", {})
    with pytest.raises(ValueError, match="takes no"):
        SEL.check(SEL.VOTE, {"temperature": 1.0})
    with pytest.raises(ValueError, match="not a score"):
        SEL.check(SEL.ARGMAX, {"score": "inter_min"})
    with pytest.raises(ValueError, match="needs mix_with"):
        SEL.check(SEL.ARGMAX, {"weight": 0.5})
    SEL.check(SEL.FILTER_THEN_VOTE, {"then": SEL.GROUP_SCORE, "agg": "max"})  # passes the voter's parameters on
    with pytest.raises(ValueError, match="temperature must be > 0"):
        MethodSpec(method=SEL.WEIGHTED_VOTE, grid={"temperature": [1.0, 0.0]})
    # The declared grid unless a parameter is fixed or a grid given; {} tunes nothing.
    assert MethodSpec(method=SEL.WEIGHTED_VOTE).tuned_grid() == {"temperature": [0.03, 0.1, 0.3, 1.0, 3.0]}
    assert MethodSpec(method=SEL.WEIGHTED_VOTE, params={"temperature": 0.5}).tuned_grid() == {}
    assert MethodSpec(method=SEL.FILTER_THEN_VOTE, grid={}).tuned_grid() == {}
    with pytest.raises(ValueError, match="share a table row"):
        SelectSettings(methods={"both": MethodSpec(method=SEL.VOTE)})
    # Today's rows stay among the defaults.
    defaults = SelectSettings()
    assert defaults.criteria == ["correctness", "informativeness", "both"]
    assert (defaults.methods["self_consistency"].method, defaults.methods["oracle"].method) == (SEL.VOTE, SEL.ORACLE)


def test_folds_are_a_seeded_near_even_split():
    questions = [f"q{i}" for i in range(11)]
    fold = CV.folds_of(questions, 4, seed=3)
    sizes = sorted(list(fold.values()).count(f) for f in range(4))
    assert set(fold) == set(questions) and sizes == [2, 3, 3, 3]
    assert CV.folds_of(list(reversed(questions)), 4, seed=3) == fold  # the input order does not matter
    assert CV.folds_of(questions, 4, seed=4) != fold
    assert set(CV.folds_of(questions[:3], 5, seed=0).values()) == {0, 1, 2}  # k above n: one question per fold
    assert CV.grid_points({"w": [0, 1], "t": [0.1, 1]}) == [{"w": 0, "t": 0.1}, {"w": 0, "t": 1}, {"w": 1, "t": 0.1},
                                                            {"w": 1, "t": 1}]  # fmt: skip


def test_best_setting_ties_to_the_first_in_the_grid():
    outcomes = {"q0": {"a": True, "b": True}, "q1": {"a": False, "b": False}}
    assert CV.best_setting(outcomes, ["q0", "q1"], ["b", "a"]) == ("b", 0.5)
    assert CV.best_setting(outcomes, ["q0", "q1"], ["a", "b"]) == ("a", 0.5)


def test_cross_validation_chooses_on_the_other_folds_only():
    questions = [f"q{i}" for i in range(10)]
    fold = CV.folds_of(questions, 2, seed=0)
    # Setting "a" is right exactly on fold 1's questions, "b" exactly on fold 0's. In sample, either would score
    # 50 %; held out, each fold is answered with the setting its other fold favours, which is wrong on it: 0 %.
    outcomes = {q: {"a": fold[q] == 1, "b": fold[q] == 0} for q in questions}
    got_fold, folds = CV.cross_validate(outcomes, ["a", "b"], k=2, seed=0)
    assert got_fold == fold
    assert [(f.fold, f.questions, f.setting, f.train_accuracy, f.heldout_accuracy) for f in folds] == [
        (0, 5, "a", 1.0, 0.0), (1, 5, "b", 1.0, 0.0)]


def test_cross_validation_ignores_the_held_out_labels():
    # Flip every outcome of one fold's questions: the setting that fold is answered with must not move (it was
    # chosen on the other folds), only its held-out accuracy; every other fold's choice may move.
    questions = [f"q{i}" for i in range(12)]
    settings = ["t0", "t1", "t2"]
    # Fixed outcomes with a distinct best setting per subset: q is right under t_j when (i * (j + 2)) % 5 < 2.
    outcomes = {q: {s: (int(q[1:]) * (j + 2)) % 5 < 2 for j, s in enumerate(settings)} for q in questions}
    fold, folds = CV.cross_validate(outcomes, settings, k=3, seed=1)
    moved = False
    for f in folds:
        flipped = {q: {s: (not v) if fold[q] == f.fold else v for s, v in row.items()} for q, row in outcomes.items()}
        _, again = CV.cross_validate(flipped, settings, k=3, seed=1)
        assert again[f.fold].setting == f.setting
        assert again[f.fold].train_accuracy == f.train_accuracy
        assert again[f.fold].heldout_accuracy == 1 - f.heldout_accuracy
        moved |= any(a.setting != b.setting for a, b in zip(again, folds, strict=True))
    assert moved  # the flipped labels do reach the choice of the folds that train on them: the check has teeth
    # The pooled held-out accuracy is each question's outcome under its fold's setting.
    chosen = {f.fold: f.setting for f in folds}
    pooled = sum(outcomes[q][chosen[fold[q]]] for q in questions) / len(questions)
    assert pooled == sum(f.heldout_accuracy * f.questions for f in folds) / len(questions)


def test_cross_validation_needs_two_questions():
    with pytest.raises(ValueError, match="at least 2 questions"):
        CV.cross_validate({"q0": {"a": True}}, ["a"], k=5, seed=0)


def test_curation_rule_is_off_by_default_and_hashed_when_on():
    # Off: the rules hash of the rules before it (tests/jobs/test_curate.py pins that hash), whatever select_keep.
    assert CurationSettings().rules_hash() == CurationSettings(select_keep="chosen_answer").rules_hash()
    on = CurationSettings(select_method=SEL.FILTER_THEN_VOTE, select_params={"threshold": 0.5})
    assert len({CurationSettings().rules_hash(), on.rules_hash(),
                on.model_copy(update={"select_keep": "chosen_answer"}).rules_hash(),
                on.model_copy(update={"select_params": {"threshold": 0.25}}).rules_hash()}) == 4
    with pytest.raises(ValueError, match="unknown selection method"):
        CurationSettings(select_method="best_of")
    with pytest.raises(ValueError, match="without a select_method"):
        CurationSettings(select_params={"threshold": 0.5})
