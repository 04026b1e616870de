"""Step-level error localisation (ProcessBench, Zheng et al. 2024): the earliest-error predictor of a step score,
the benchmark's figures, threshold selection, per-step AUROC and the worst step's hit rate (numpy/scipy/sklearn).

Conventions: every score is higher-is-better (schemas/step_scores.py), so a LOW score flags a step; a chain's
label is the 0-based index of its earliest erroneous step, -1 when every step is correct (ProcessBench's `label`).
A missing score (None or NaN) is never below a threshold and takes no part in a ranking: see `predicted_error`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from jobs.metaeval.somers import auc_d

NO_ERROR = -1  # ProcessBench's label (and prediction) for a chain whose every step is correct


def as_scores(scores: Sequence[float | None]) -> np.ndarray:
    """A chain's step scores as float64, None -> NaN."""
    return np.array([math.nan if s is None else s for s in scores], dtype=float)


def predicted_error(scores: Sequence[float | None], threshold: float) -> int:
    """The predicted earliest error: the index of the first step scoring strictly below `threshold`, else -1.

    A None or NaN score (a step the metric could not score) is never below the threshold: a scoring gap is no
    evidence of an error, and counting it as one would let failures of the scorer pass for detections. NaN
    compares false with everything, so this is also what `score < threshold` gives.
    """
    below = np.flatnonzero(as_scores(scores) < threshold)
    return int(below[0]) if len(below) else NO_ERROR


def check_label(label: int, n_steps: int) -> int:
    """The label as an int; ValueError unless it is -1 or a step index of a chain of `n_steps` steps."""
    if int(label) != label or not NO_ERROR <= label < n_steps:
        raise ValueError(f"earliest-error label {label!r} is neither -1 nor a step index of {n_steps} steps")
    return int(label)


@dataclass(frozen=True)
class Figures:
    """ProcessBench's figures of one subset, as fractions (x 100 = the paper's and run_eval.py's percentages)."""

    acc_error: float | None  # exact match of the predicted index on erroneous items (label >= 0)
    acc_correct: float | None  # share of all-correct items (label -1) predicted -1
    f1: float | None  # harmonic mean of the two
    n_error: int
    n_correct: int


def figures(predicted: Sequence[int], labels: Sequence[int]) -> Figures:
    """acc_error, acc_correct and F1 = 2 a b / (a + b), as the official code/run_eval.py computes them.

    run_eval.py splits the items by `label != -1`, takes each part's mean of `prediction == label` and their
    harmonic mean (in percent; here fractions). Where its formula is undefined: a subset without erroneous or
    without correct items has no accuracy for that part and no F1 (None; run_eval.py gets NaN from an empty
    mean); both accuracies 0 give F1 0, the harmonic mean's limit (run_eval.py divides 0 by 0).
    """
    p = np.asarray(predicted, dtype=int)
    y = np.asarray(labels, dtype=int)
    if p.shape != y.shape:
        raise ValueError(f"predictions and labels differ in length: {p.shape} vs {y.shape}")
    error, correct = y != NO_ERROR, y == NO_ERROR
    a = float(np.mean(p[error] == y[error])) if error.any() else None
    b = float(np.mean(p[correct] == y[correct])) if correct.any() else None
    f1 = None if a is None or b is None else (0.0 if a + b == 0 else 2 * a * b / (a + b))
    return Figures(a, b, f1, int(error.sum()), int(correct.sum()))


def _intervals(chains: Sequence[np.ndarray], labels: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per chain, the thresholds t for which the predictor is right, as half-open intervals (low, high]:
    an all-correct chain is right while no score is below t, t in [-inf, min score]; a chain whose earliest error
    is step L is right while step L is below t and no earlier step is, t in (score L, min of the earlier scores]
    (empty when L has no score or an earlier step scores no higher). NaN scores are skipped, as everywhere."""
    low = np.empty(len(chains))
    high = np.empty(len(chains))
    for i, (s, label) in enumerate(zip(chains, labels, strict=True)):
        finite = np.where(np.isnan(s), np.inf, s)
        label = check_label(label, len(s))
        if label == NO_ERROR:
            low[i], high[i] = -np.inf, finite.min(initial=np.inf)
        else:
            low[i] = s[label] if not np.isnan(s[label]) else np.inf
            high[i] = finite[:label].min(initial=np.inf)
    return low, high, np.asarray(labels) == NO_ERROR


def f1_curve(chains: Sequence[Sequence[float | None]], labels: Sequence[int],
             thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(acc_error, acc_correct, F1) at every threshold, from each chain's interval of right thresholds (no
    predictor run per threshold). Equals `figures([predicted_error(c, t) for c in chains], labels)` at each t;
    F1 is NaN where a part is empty."""
    arrays = [as_scores(c) for c in chains]
    low, high, correct = _intervals(arrays, labels)
    t = np.asarray(thresholds, dtype=float)[:, None]
    # An all-correct chain is right at t = -inf too (nothing is below it): its interval is closed at -inf.
    right = ((low[None, :] < t) | correct[None, :]) & (t <= high[None, :])
    with np.errstate(invalid="ignore", divide="ignore"):
        a = right[:, ~correct].mean(axis=1) if (~correct).any() else np.full(len(t), np.nan)
        b = right[:, correct].mean(axis=1) if correct.any() else np.full(len(t), np.nan)
        f1 = np.where(a + b == 0, 0.0, 2 * a * b / (a + b))
    return a, b, f1


def select_threshold(chains: Sequence[Sequence[float | None]], labels: Sequence[int]) -> float:
    """The threshold with the best F1 on these (calibration) chains, as the paper picks it on GSM8K.

    Candidates: every distinct finite step score, -inf (flag nothing) and +inf (flag every scored step). The
    predictor changes only at a score: a threshold between two adjacent scores s1 < s2 flags what s2 flags, so
    these candidates give every predictor the chains admit. Ties: the lowest threshold with the best F1 (the one
    that flags fewest steps, on these and on any other subset). No defined F1 (a part empty): ValueError.
    """
    values = np.concatenate([as_scores(c) for c in chains]) if len(chains) else np.array([])
    candidates = np.unique(np.concatenate([[-np.inf, np.inf], values[np.isfinite(values)]]))
    _, _, f1 = f1_curve(chains, labels, candidates)
    if np.isnan(f1).all():
        raise ValueError("no threshold has an F1 here: the chains need erroneous and all-correct items")
    return float(candidates[int(np.nanargmax(f1))])  # nanargmax takes the first best: candidates are sorted


def step_sets(chains: Sequence[Sequence[float | None]], labels: Sequence[int]) -> tuple[np.ndarray, np.ndarray,
                                                                                         np.ndarray]:
    """(score, is_first_error, chain index) of every step the AUROC ranks: the labelled earliest error (positive),
    steps before it and every step of an all-correct chain (negatives). Steps after the earliest error are
    unknown (ProcessBench labels only the first) and left out; so are steps without a score."""
    scores, positive, owner = [], [], []
    for i, (c, label) in enumerate(zip(chains, labels, strict=True)):
        s = as_scores(c)
        label = check_label(label, len(s))
        end = len(s) if label == NO_ERROR else label + 1
        keep = ~np.isnan(s[:end])
        scores.append(s[:end][keep])
        positive.append((np.arange(end) == label)[keep])
        owner.append(np.full(int(keep.sum()), i))
    if not scores:
        return np.array([]), np.array([], dtype=bool), np.array([], dtype=int)
    return np.concatenate(scores), np.concatenate(positive), np.concatenate(owner)


def _auc(score: np.ndarray, positive: np.ndarray) -> float:
    """P(a first-error step scores below a step before it), ties 1/2; NaN without both kinds of step."""
    if positive.all() or not positive.any():
        return math.nan
    # Mann-Whitney from average ranks (jobs.metaeval.somers.auc_d = 2 AUC - 1, positives ranked high): ~50 us where
    # sklearn's roc_auc_score takes ~3 ms, which a 1,000-resample bootstrap per metric and subset would feel.
    return (float(auc_d(positive, -score)) + 1) / 2  # lower score = more likely the error


@dataclass(frozen=True)
class Auroc:
    auroc: float | None
    low: float | None
    high: float | None
    n_positive: int
    n_negative: int


def step_auroc(chains: Sequence[Sequence[float | None]], labels: Sequence[int], resamples: int = 1000,
               seed: int = 0, level: float = 0.95) -> Auroc:
    """Per-step AUROC of "this step is the earliest error" vs "this step comes before it" (`step_sets`), lower
    score = more likely the error, with a percentile bootstrap CI that resamples chains (their steps are not
    independent; erroneous and all-correct chains each within their kind) by scipy.stats.bootstrap with a fixed
    seed. None where a kind of step is missing."""
    score, positive, owner = step_sets(chains, labels)
    point = _auc(score, positive)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if math.isnan(point):
        return Auroc(None, None, None, n_pos, n_neg)
    # Chains are drawn within their kind (erroneous / all-correct), as scipy draws each sample of several: every
    # resample keeps the number of erroneous chains, so it has positive steps and the AUROC stays defined.
    bounds = zip(np.searchsorted(owner, np.arange(len(chains)), "left"),
                 np.searchsorted(owner, np.arange(len(chains)), "right"), strict=True)
    rows_of = [np.arange(start, end) for start, end in bounds]
    erroneous = np.asarray(labels) != NO_ERROR
    samples = tuple(g for g in (np.flatnonzero(erroneous), np.flatnonzero(~erroneous)) if len(g))

    def statistic(*drawn: np.ndarray) -> float:
        rows = np.concatenate([rows_of[i] for part in drawn for i in part])
        return _auc(score[rows], positive[rows])

    low = high = None
    if resamples > 0 and all(len(g) > 1 for g in samples):  # scipy draws from samples of two or more
        with warnings.catch_warnings():
            # A resample of identical scores has no AUROC (NaN): scipy warns and the interval comes back NaN.
            warnings.simplefilter("ignore")
            ci = stats.bootstrap(samples, statistic, n_resamples=resamples, vectorized=False, paired=False,
                                 confidence_level=level, method="percentile", rng=np.random.default_rng(seed))
        lo, hi = float(ci.confidence_interval.low), float(ci.confidence_interval.high)
        low, high = (None, None) if math.isnan(lo) or math.isnan(hi) else (lo, hi)
    return Auroc(point, low, high, n_pos, n_neg)


def hit_rate(chains: Sequence[Sequence[float | None]], labels: Sequence[int]) -> tuple[float | None, float | None]:
    """(worst-step hit rate, random-step baseline) over the erroneous chains: the share whose lowest-scoring step
    (first on ties, NaN skipped; no score at all = a miss) is the labelled one, and the expected share of a step
    drawn uniformly from each chain's steps, mean of 1 / n_steps. None without erroneous chains."""
    hits, chance = [], []
    for c, label in zip(chains, labels, strict=True):
        s = as_scores(c)
        if check_label(label, len(s)) == NO_ERROR:
            continue
        hits.append(not np.isnan(s).all() and int(np.nanargmin(s)) == label)
        chance.append(1 / len(s))
    return (float(np.mean(hits)), float(np.mean(chance))) if hits else (None, None)


def rank_normaliser(reference: np.ndarray):
    """x -> the mid-rank of x among the finite `reference` scores, in [0, 1] (the empirical CDF, ties halved):
    fitted on one subset's steps and applied unchanged to every subset, so scores of different scales (NLI
    probabilities, nats) become comparable without looking at the subset being evaluated. NaN stays NaN."""
    ref = np.sort(reference[np.isfinite(reference)])

    def normalise(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        if not len(ref):
            return np.full(x.shape, np.nan)
        mid = (np.searchsorted(ref, x, "left") + np.searchsorted(ref, x, "right")) / (2 * len(ref))
        return np.where(np.isnan(x), np.nan, mid)

    return normalise


def combine_min(per_metric: Sequence[np.ndarray]) -> np.ndarray:
    """The step-wise min over metrics (each already rank-normalised), NaN skipped; a step no metric scored: NaN.
    A step is as suspicious as its most suspicious score, as a chain is as good as its worst step."""
    stacked = np.vstack(per_metric)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: NaN, which is what we want
        return np.nanmin(stacked, axis=0)
