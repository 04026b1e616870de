"""Somers' D of a score against a label (label first), 2*AUC-1 for binary labels, and bootstrap CIs (numpy/scipy).

Convention (docs/design/RECEVAL.md "Meta-evaluation"): labels are 1 = clean, 0 = error (or an ordinal rating, higher is
better) and every score is higher-is-better, so D > 0 means the metric ranks clean chains higher.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import stats


def _clean(label, score) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(label, dtype=float)
    s = np.asarray(score, dtype=float)
    if y.shape != s.shape:
        raise ValueError(f"label and score differ in length: {y.shape} vs {s.shape}")
    keep = np.isfinite(y) & np.isfinite(s)
    return y[keep], s[keep]


def is_binary(label) -> bool:
    return set(np.unique(np.asarray(label, dtype=float)).tolist()) <= {0.0, 1.0}


def somers_d(label, score) -> float:
    """D(score | label) = scipy.stats.somersd(label, score).statistic; NaN when the label or score is constant."""
    y, s = _clean(label, score)
    if len(np.unique(y)) < 2 or len(np.unique(s)) < 2:
        # scipy divides by zero here; a constant metric carries no ranking, reported as NaN not 0.
        return math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(stats.somersd(y, s).statistic)


def auc_d(label, score) -> np.ndarray | float:
    """2*AUC - 1 for binary labels, ties counted 1/2 (Mann-Whitney U from average ranks).

    Vectorised over leading axes: `label` and `score` of shape (..., n) give shape (...). Equals
    somers_d(label, score) when the label is binary.
    """
    y = np.asarray(label, dtype=float)
    s = np.asarray(score, dtype=float)
    ranks = stats.rankdata(s, axis=-1)
    n1 = y.sum(axis=-1)
    n0 = y.shape[-1] - n1
    u = (ranks * y).sum(axis=-1) - n1 * (n1 + 1) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        auc = u / (n1 * n0)
    d = 2 * auc - 1
    return float(d) if np.ndim(d) == 0 else d


def _stratified_indices(y: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Resample within each label level, so every resample keeps the group sizes (and D stays defined)."""
    parts = []
    for level in np.unique(y):
        members = np.flatnonzero(y == level)
        parts.append(members[rng.integers(0, len(members), size=(resamples, len(members)))])
    return np.concatenate(parts, axis=1)


def bootstrap_ci(
    label, score, resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile CI of Somers' D from a seeded, label-stratified bootstrap (NaN, NaN when D is undefined).

    Stratified like pROC's default AUC bootstrap: a plain resample of a set with 2 errors in 200 often draws
    none, and D is undefined there; fixing each label level's count avoids that without changing D's meaning.
    """
    y, s = _clean(label, score)
    if len(np.unique(y)) < 2 or len(np.unique(s)) < 2 or resamples < 1:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    idx = _stratified_indices(y, resamples, rng)
    ys, ss = y[idx], s[idx]
    if is_binary(y):
        values = np.asarray(auc_d(ys, ss), dtype=float)
    else:
        values = np.array([somers_d(a, b) for a, b in zip(ys, ss, strict=True)])
    values = values[np.isfinite(values)]
    if not len(values):
        return math.nan, math.nan
    alpha = (1 - level) / 2
    low, high = np.quantile(values, [alpha, 1 - alpha])
    return float(low), float(high)
