"""jobs/metaeval/localise_maths.py against hand-computed values: the predictor, ProcessBench's F1, threshold choice,
AUROC, hit rate."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tolerance import exact

from jobs.metaeval import localise_maths as L


def test_predicted_error_first_step_below_threshold_and_missing_scores_never_flag():
    chain = [0.9, None, 0.2, 0.1]
    assert L.predicted_error(chain, 0.5) == 2  # the gap at step 1 is no error
    assert L.predicted_error(chain, 0.95) == 0
    assert L.predicted_error(chain, 0.1) == -1  # strictly below: 0.1 itself is not flagged
    assert L.predicted_error([None, math.nan], math.inf) == -1
    assert L.predicted_error([], 0.5) == -1


def _official(predictions: list[int], labels: list[int]) -> tuple[float, float, float]:
    """QwenLM/ProcessBench code/run_eval.py's last lines, verbatim but for the records (percent)."""
    res_data = [{"label": y, "prediction": p, "match": p == y} for p, y in zip(predictions, labels, strict=True)]
    error_data = [e for e in res_data if e["label"] != -1]
    correct_data = [e for e in res_data if e["label"] == -1]
    acc1 = np.mean([e["match"] for e in error_data]) * 100
    acc2 = np.mean([e["match"] for e in correct_data]) * 100
    f1 = 2 * acc1 * acc2 / (acc1 + acc2)
    return acc1, acc2, f1


def test_figures_equal_the_official_run_eval_on_hand_made_predictions():
    labels = [-1, -1, -1, 2, 0, 1, 3]
    predicted = [-1, 0, -1, 2, 1, 1, -1]
    got = L.figures(predicted, labels)
    # Erroneous: 2 of 4 exact (labels 2 and 1); correct: 2 of 3 predicted -1; F1 = 2 (1/2)(2/3) / (7/6) = 4/7.
    assert (got.acc_error, got.acc_correct, got.f1) == exact((1 / 2, 2 / 3, 4 / 7))
    assert (got.n_error, got.n_correct) == (4, 3)
    assert tuple(100 * v for v in (got.acc_error, got.acc_correct, got.f1)) == exact(_official(predicted, labels))


def test_figures_undefined_parts():
    assert L.figures([0, 1], [-1, -1]) == L.Figures(None, 0.0, None, 0, 2)  # no erroneous item: no F1
    assert L.figures([-1, 0], [0, -1]).f1 == 0.0  # both accuracies 0: the harmonic mean's limit


# Each chain's right thresholds: A (0.2, 0.9], B (-inf, 0.6], C (0.3, inf], D (-inf, 0.4].
CHAINS = [[0.9, 0.2, 0.8], [0.7, 0.6], [0.3, 0.9], [0.8, 0.5, 0.4]]
LABELS = [1, -1, 0, -1]


def test_select_threshold_best_f1_by_hand():
    # t=0.3: A right, C not (0.3 < 0.3 fails): F1 2/3; t=0.4: all four right: F1 1; t=0.5: D flagged: 2/3.
    assert L.select_threshold(CHAINS, LABELS) == 0.4
    assert [L.predicted_error(c, 0.4) for c in CHAINS] == LABELS
    a, b, f1 = L.f1_curve(CHAINS, LABELS, np.array([-np.inf, 0.3, 0.4, 0.5, 0.7, np.inf]))
    assert f1.tolist() == exact([0.0, 2 / 3, 1.0, 2 / 3, 0.0, 0.0])


def test_select_threshold_ties_go_to_the_lowest():
    # A (0.2, inf], B (0.6, inf], C (-inf, 0.4], D (-inf, 0.8]: t=0.4 and t=0.8 both give F1 2/3.
    chains, labels = [[0.2], [0.6], [0.4], [0.8]], [0, 0, -1, -1]
    _, _, f1 = L.f1_curve(chains, labels, np.array([0.4, 0.6, 0.8]))
    assert f1.tolist() == exact([2 / 3, 1 / 2, 2 / 3])
    assert L.select_threshold(chains, labels) == 0.4


def test_f1_curve_equals_running_the_predictor_at_every_threshold():
    rng = np.random.default_rng(3)
    chains = [[None if rng.random() < 0.1 else float(v) for v in rng.integers(0, 6, rng.integers(1, 6))]
              for _ in range(40)]
    labels = [int(rng.integers(-1, len(c))) for c in chains]
    thresholds = np.array([-np.inf, *range(7), np.inf], dtype=float)
    a, b, f1 = L.f1_curve(chains, labels, thresholds)
    for i, t in enumerate(thresholds):
        want = L.figures([L.predicted_error(c, t) for c in chains], labels)
        assert (a[i], b[i], f1[i]) == exact((want.acc_error, want.acc_correct, want.f1)), t


def test_labels_outside_the_steps_are_refused():
    with pytest.raises(ValueError, match="step index of 2 steps"):
        L.select_threshold([[0.1, 0.2]], [2])
    with pytest.raises(ValueError, match="-2"):
        L.hit_rate([[0.1]], [-2])


# X: steps 0 (0.9) before its error at 1 (0.3), step 2 after it (0.1, excluded); Y all correct, a gap at step 1;
# Z: error at step 0 (0.4, tied with Y's step 0).
AUC_CHAINS = [[0.9, 0.3, 0.1], [0.4, None, 0.7], [0.4]]
AUC_LABELS = [1, -1, 0]


def test_step_auroc_by_hand_excludes_steps_after_the_error():
    score, positive, owner = L.step_sets(AUC_CHAINS, AUC_LABELS)
    assert (score.tolist(), positive.tolist(), owner.tolist()) == (
        [0.9, 0.3, 0.4, 0.7, 0.4], [False, True, False, False, True], [0, 0, 1, 1, 2])
    # Positives 0.3, 0.4 vs negatives 0.9, 0.4, 0.7: 0.3 below all three (3), 0.4 below two, tied once (2.5).
    got = L.step_auroc(AUC_CHAINS, AUC_LABELS, resamples=100)
    assert got.auroc == exact(5.5 / 6)
    assert (got.n_positive, got.n_negative) == (2, 3)
    assert (got.low, got.high) == (None, None)  # one all-correct chain: nothing to resample it from


def test_step_auroc_bootstrap_ci_is_seeded_and_holds_the_estimate():
    rng = np.random.default_rng(0)
    chains = [list(rng.random(5)) for _ in range(30)]
    labels = [int(rng.integers(-1, 5)) for _ in chains]
    for c, y in zip(chains, labels, strict=True):
        if y >= 0:
            c[y] -= 0.3  # the error scores lower: an AUROC well above 1/2
    got = L.step_auroc(chains, labels, resamples=200, seed=1)
    assert got == L.step_auroc(chains, labels, resamples=200, seed=1)
    assert got.low < got.auroc < got.high and got.auroc > 0.6
    assert L.step_auroc(chains, labels, resamples=200, seed=2).low != got.low
    assert L.step_auroc([[0.5, 0.2]], [-1]) == L.Auroc(None, None, None, 0, 2)


def test_hit_rate_and_random_baseline_by_hand():
    chains = [[0.9, 0.3, 0.1], [0.4], [0.2, 0.2, 0.5], [None, None], [0.1, 0.9]]
    labels = [1, 0, 0, 1, -1]
    # Hits: [0.4] (one step) and the tie at [0.2, 0.2] (first step); misses: argmin 2 != 1, no score at all.
    # Random: mean of 1/3, 1, 1/3, 1/2 over the four erroneous chains = 13/24; the all-correct chain is skipped.
    assert L.hit_rate(chains, labels) == exact((2 / 4, 13 / 24))
    assert L.hit_rate([[0.1]], [-1]) == (None, None)


def test_rank_normaliser_mid_ranks_of_the_reference_and_min_combination():
    norm = L.rank_normaliser(np.array([0.1, 0.2, 0.2, 0.4, np.nan]))
    # Among 4 finite reference scores: 0.2 is above one and tied with two ((1 + 3) / 2 / 4 = 1/2).
    assert norm(np.array([0.0, 0.1, 0.2, 0.3, 0.9, np.nan])).tolist()[:5] == exact([0.0, 1 / 8, 1 / 2, 3 / 4, 1.0])
    assert math.isnan(norm(np.array([np.nan]))[0])
    got = L.combine_min([np.array([0.5, np.nan, np.nan]), np.array([0.25, 0.75, np.nan])])
    assert got[:2].tolist() == [0.25, 0.75] and math.isnan(got[2])
