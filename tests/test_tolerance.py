"""tests/tolerance.py: the tolerances accept float32 rounding of model outputs and reject a real change."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from tolerance import (
    assert_scores_close,
    assert_vectors_close,
    exact,
    loglik_approx,
    loglik_tol,
    prob_approx,
    scores_tol,
)

G, NULL = -19.2345678, -19.4445678  # mean log-probs as in the failing work-reduction case: intra_pvi 0.21
L_PREV, L = -18.7654321, -18.9012345


def f32(x: float) -> float:
    """x after a float32 round-trip: the rounding a float32 forward leaves on it."""
    return float(np.float32(x))


def test_loglik_accepts_float32_rounding_and_rejects_a_change_of_1e_4():
    assert f32(G) == loglik_approx(G)
    assert G + 1e-4 != loglik_approx(G)
    assert [f32(G), f32(NULL)] == loglik_approx([G, NULL])
    assert [G, NULL + 1e-4] != loglik_approx([G, NULL])


def test_difference_tolerance_scales_with_its_terms():
    pvi = G - NULL
    assert f32(G) - f32(NULL) == loglik_approx(pvi, G, NULL)
    # The case that failed elsewhere: 2.5e-6 of float32 noise in two ~19-nat terms, 1.2e-5 of the 0.21 result.
    assert pvi + 2.5e-6 != pytest.approx(pvi, rel=1e-5, abs=1e-6)
    assert pvi + 2.5e-6 == loglik_approx(pvi, G, NULL)
    assert pvi + 1e-4 != loglik_approx(pvi, G, NULL)
    assert pvi - 1e-4 != loglik_approx(pvi, G, NULL)


def test_prob_exact_and_vectors():
    assert f32(0.3) == prob_approx(0.3) and 0.3 + 1e-4 != prob_approx(0.3)
    assert np.float32([0.2, 0.7]).astype(float) == prob_approx(np.array([0.2, 0.7]))
    assert 1 - 2 / 3 == exact(1 / 3) and 1 / 3 + 1e-9 != exact(1 / 3)
    v = np.random.default_rng(0).normal(size=(2, 384))
    assert_vectors_close(v.astype(np.float32), v)
    moved = v.copy()
    moved[1, 5] += 1e-4 * np.linalg.norm(v[1])
    with pytest.raises(AssertionError, match="1 components"):
        assert_vectors_close(moved, v)


def _scores(g: float, null: float, prev: float, cur: float, entail: float = 0.4,
            model: str = "m") -> pd.DataFrame:
    rows = [
        {"chain_id": "c", "step_idx": 1, "pvi_g_logp": g, "pvi_null_logp": null, "intra_pvi": g - null,
         "ig_l_prev": prev, "ig_l": cur, "info_gain": cur - prev, "intra_entail": entail, "pvi_model": model},
        {"chain_id": "c", "step_idx": 0, "pvi_g_logp": -3.0, "pvi_null_logp": -2.0, "intra_pvi": -1.0,
         "ig_l_prev": None, "ig_l": None, "info_gain": None, "intra_entail": np.nan, "pvi_model": model},
    ]
    return pd.DataFrame(rows)


def test_assert_scores_close_rounding_passes_real_changes_fail():
    want = _scores(G, NULL, L_PREV, L)
    keys = ["chain_id", "step_idx"]
    # float32 rounding of every term, the differences taken of the rounded terms; rows in another order
    assert_scores_close(_scores(f32(G), f32(NULL), f32(L_PREV), f32(L), f32(0.4))[::-1], want, keys)
    noisy = want.copy()
    noisy.loc[0, "intra_pvi"] += 2.5e-6
    assert_scores_close(noisy, want, keys)
    for col in ("intra_pvi", "info_gain", "pvi_g_logp", "ig_l"):
        changed = want.copy()
        changed.loc[0, col] += 1e-4
        with pytest.raises(AssertionError, match=rf"{col} at \('c', 1\): got .*, want .*\|diff\| 0\.0001"):
            assert_scores_close(changed, want, keys)
    with pytest.raises(AssertionError, match="pvi_model at .*'other'"):
        assert_scores_close(_scores(G, NULL, L_PREV, L, model="other"), want, keys)
    with pytest.raises(AssertionError, match="intra_entail at .*probability"):
        assert_scores_close(_scores(G, NULL, L_PREV, L, entail=0.4 + 1e-4), want, keys)
    with pytest.raises(AssertionError, match="no stated scale"):
        assert_scores_close(want.assign(x=1.5), want.assign(x=1.5), keys)


def test_scores_tol_is_the_largest_difference_tolerance():
    assert scores_tol(_scores(G, NULL, L_PREV, L)) == loglik_tol(G, NULL) > loglik_tol(L, L_PREV)
