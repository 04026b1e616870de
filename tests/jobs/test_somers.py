from __future__ import annotations

import math

import numpy as np
from tolerance import EXACT_ABS, EXACT_REL, exact

from jobs.metaeval import somers

# Somers' D is a ratio of pair counts: exact rationals, computed in float64.


def test_somers_d_binary_with_ties_hand_computed():
    # Pairs (clean, error): clean scores {3, 2, 2}, error scores {2, 1}.
    # (3,2)+ (3,1)+ (2,2)tie (2,1)+ (2,2)tie (2,1)+ -> C=4, D=0 over 6 pairs untied on the label: 4/6.
    label = [1, 1, 1, 0, 0]
    score = [3, 2, 2, 2, 1]
    assert somers.somers_d(label, score) == exact(4 / 6)
    assert somers.auc_d(label, score) == exact(4 / 6)


def test_somers_d_label_first():
    # D(label|score) counts pairs untied on the score: 10 pairs less the 3 among the three 2s = 7;
    # concordant (3,1)>(2,0), (3,1)>(1,0), (2,1)>(1,0) twice = 4, none discordant: 4/7, not 4/6.
    label = [1, 1, 1, 0, 0]
    score = [3, 2, 2, 2, 1]
    assert somers.somers_d(score, label) == exact(4 / 7)
    assert somers.somers_d(label, score) != exact(somers.somers_d(score, label))


def test_somers_d_ordinal_hand_computed():
    # Ratings 1, 2, 2, 3 with scores 0.1, 0.5, 0.3, 0.3. Pairs untied on rating: (1,2a),(1,2b),(1,3),
    # (2a,3),(2b,3) = 5. Concordant: (1,2a),(1,2b),(1,3); discordant: (2a,3) since 0.5 > 0.3; tie: (2b,3).
    # D = (3 - 1) / 5.
    assert somers.somers_d([1, 2, 2, 3], [0.1, 0.5, 0.3, 0.3]) == exact(2 / 5)


def test_somers_d_reversed_and_constant():
    assert somers.somers_d([1, 1, 0, 0], [0.1, 0.2, 0.8, 0.9]) == exact(-1.0)
    assert math.isnan(somers.somers_d([1, 1, 0, 0], [0.5, 0.5, 0.5, 0.5]))
    assert math.isnan(somers.somers_d([1, 1, 1], [0.1, 0.2, 0.3]))


def test_somers_d_drops_missing_scores():
    assert somers.somers_d([1, 1, 0, 0], [0.9, float("nan"), 0.1, 0.2]) == exact(1.0)


def test_auc_d_matches_scipy_on_random_ties():
    rng = np.random.default_rng(3)
    for _ in range(20):
        y = rng.integers(0, 2, 40)
        s = rng.integers(0, 5, 40).astype(float)  # many ties
        assert somers.auc_d(y, s) == exact(somers.somers_d(y, s))


def test_auc_d_vectorised():
    y = np.array([[1, 0, 1, 0], [1, 1, 0, 0]])
    s = np.array([[1.0, 0.0, 0.0, 1.0], [0.9, 0.8, 0.1, 0.1]])
    np.testing.assert_allclose(somers.auc_d(y, s), [0.0, 1.0], rtol=EXACT_REL, atol=EXACT_ABS)


def test_bootstrap_ci_seeded_and_covers_estimate():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    s = y * 0.5 + rng.normal(size=200)
    low, high = somers.bootstrap_ci(y, s, resamples=500, seed=7)
    assert (low, high) == somers.bootstrap_ci(y, s, resamples=500, seed=7)
    assert low < somers.somers_d(y, s) < high
    assert -1 <= low < high <= 1


def test_bootstrap_ci_rare_errors_defined():
    # 2 errors in 200: a plain resample often draws no error; stratified resampling keeps D defined.
    y = np.ones(200)
    y[:2] = 0
    s = np.linspace(0, 1, 200)
    low, high = somers.bootstrap_ci(y, s, resamples=200, seed=1)
    assert math.isfinite(low) and math.isfinite(high)


def test_bootstrap_ci_ordinal():
    y = np.repeat([1, 2, 3, 4, 5], 10)
    s = y + np.random.default_rng(2).normal(scale=2, size=50)
    low, high = somers.bootstrap_ci(y, s, resamples=200, seed=0)
    assert low < somers.somers_d(y, s) < high
