"""Float tolerances for tests, each named with the scale it is stated against.

Two kinds of numbers are compared in the tests:

* model outputs (log-likelihoods, option scores, NLI probabilities, embeddings) from float32 forwards, which
  move by rounding whenever the arithmetic is reordered: another batch or padding, prefix sharing, another
  partitioning, thread count or machine. Their tolerance is a few float32 epsilons *of the scale the rounding
  happens at*, which is not always the value compared: a difference of two log-likelihoods (intra_pvi,
  info_gain) carries the rounding of both terms, so its tolerance scales with |a| + |b|, not |a - b|;
* exact values (hand-derived rationals, fakes, statistics over counts) computed in float64: only float64
  rounding of a few operations may differ, so `exact` is tight.

Measured on the tiny test models (batched vs unbatched, shared prefix vs not, one partitioning vs another):
log-likelihoods move by at most 4.9e-7 relative (tiny T5, sums up to 175 nats; GPT-2 and option scores
1e-7..2e-7), a difference of two ~19-nat means by 2.5e-6 (1.3e-7 of its terms), lakes of another partitioning
by 2.4e-6, NLI probabilities by 1.1e-7, MiniLM embeddings by 1.0e-6 on vectors of norm 5..6.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from schemas import step_scores as SS

# A log-likelihood is a sum (or mean) of token log-probs of one sign, so a relative bound per token bounds
# the sum too. 1e-6 is ~8 float32 epsilons (1.19e-7): twice the worst measured (4.9e-7), 7x the case that
# failed elsewhere; a real change of 1e-4 in a -19-nat score is still 5x outside it.
LOGLIK_REL = 1e-6
# Nats, for a single log-likelihood near 0, which has no larger term to scale by (a difference near 0 does:
# its terms). An empty target scores exactly 0 and the tiny models' log-probs are all several nats; 1e-6 is
# the rounding of logits of a few nats.
LOGLIK_FLOOR = 1e-6
# Probabilities from a float32 softmax live in [0, 1], so absolute: logit noise d moves a probability by at
# most d/2, and classifier logits of a few units round to ~1e-7 (measured 1.1e-7).
PROB_ABS = 1e-6
# Embedding components are compared against the vector's L2 norm, the scale their sums round at (a component
# near 0 came from the same sums); measured 1.0e-6 / norm 5.9 = 1.7e-7.
EMBED_REL = 1e-6
# Exact values computed in float64: a handful of operations round by ~1e-16; 1e-12 is slack for that only.
EXACT_REL = 1e-12
EXACT_ABS = 1e-12
# assertDataFrameEqual's keywords for frames of exact values (its default, rtol 1e-5, states no scale).
EXACT_FRAME = {"rtol": EXACT_REL, "atol": EXACT_ABS}

# step_scores: each derived difference and the two log-likelihoods it is taken of; the NLI probabilities.
STEP_TERMS: dict[str, tuple[str, str]] = {
    SS.INTRA_PVI: (SS.PVI_G, SS.PVI_NULL),
    SS.INFO_GAIN: (SS.IG_L, SS.IG_L_PREV),
}
STEP_PROBS: tuple[str, ...] = (SS.INTRA_ENTAIL, SS.INTER, SS.INTER_MAX_CONTRADICTION)
# Shares computed by plain Python from the text alone (the arithmetic check's exact fractions): the same on any run.
STEP_EXACT: tuple[str, ...] = ("arith_valid",)


def loglik_tol(*terms: float) -> float:
    """Absolute tolerance of a log-likelihood, or of a sum/difference of the log-likelihoods `terms`."""
    return LOGLIK_REL * sum(abs(t) for t in terms) + LOGLIK_FLOOR


def loglik_approx(want: Any, *terms: float) -> Any:
    """`want` as a float32 log-likelihood (scalar or sequence); with `terms`, as a difference of them."""
    if terms:
        return pytest.approx(want, rel=0, abs=loglik_tol(*terms))
    if isinstance(want, (int, float, np.floating)):
        return pytest.approx(want, rel=0, abs=loglik_tol(want))
    return pytest.approx(want, rel=LOGLIK_REL, abs=LOGLIK_FLOOR)  # element-wise: max(rel * |w|, floor)


def prob_approx(want: Any) -> Any:
    """`want` as float32 softmax probabilities (scalar, sequence or array)."""
    return pytest.approx(want, rel=0, abs=PROB_ABS)


def exact(want: Any) -> Any:
    """`want` as an exact value (hand-derived, or computed from fakes) that the code computes in float64."""
    return pytest.approx(want, rel=EXACT_REL, abs=EXACT_ABS)


def assert_vectors_close(got: Any, want: Any) -> None:
    """Float32 embeddings (rows of `want` are vectors): every component within EMBED_REL of its row's norm."""
    got, want = np.atleast_2d(np.asarray(got, dtype=float)), np.atleast_2d(np.asarray(want, dtype=float))
    assert got.shape == want.shape, (got.shape, want.shape)
    rel = np.abs(got - want) / np.linalg.norm(want, axis=-1, keepdims=True)
    bad = int((rel > EMBED_REL).sum())
    assert not bad, f"{bad} components differ by up to {rel.max():.3g} of their vector's norm > {EMBED_REL:g}"


def _records(frame: Any) -> list[dict]:
    """Rows as dicts from a Spark or pandas DataFrame, or a list of Rows / dicts."""
    if hasattr(frame, "to_dict"):  # pandas
        return frame.to_dict("records")
    rows = frame.collect() if hasattr(frame, "collect") else frame
    return [r.asDict() if hasattr(r, "asDict") else dict(r) for r in rows]


def _is_float(v: Any) -> bool:
    return isinstance(v, (float, np.floating))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):  # pandas array cells
        return np.array_equal(a, b)
    return a == b


def assert_scores_close(
    got: Any,
    want: Any,
    keys: Sequence[str],
    terms: Mapping[str, Sequence[str]] = STEP_TERMS,
    probs: Iterable[str] = STEP_PROBS,
    logliks: Iterable[str] = (),
    exact: Iterable[str] = STEP_EXACT,
) -> None:
    """Row by row after sorting by `keys`: other columns exactly, float columns by their stated scale.

    `terms` maps a derived difference to the log-likelihood columns it is taken of (its tolerance is taken
    from the *want* row's terms); those terms and `logliks` are log-likelihoods; `probs` are probabilities.
    A float column named in none of them fails: its scale has not been stated. NaN equals NaN, None None.
    """
    lls, probs = {t for ts in terms.values() for t in ts} | set(logliks), set(probs)
    a, b = (sorted(_records(f), key=lambda r: tuple(r[k] for k in keys)) for f in (got, want))
    assert [tuple(r[k] for k in keys) for r in a] == [tuple(r[k] for k in keys) for r in b], "keys differ"
    bad = []
    for g, w in zip(a, b, strict=True):
        key = tuple(w[k] for k in keys)
        assert set(g) == set(w), f"columns differ: {sorted(set(g) ^ set(w))}"
        for col, wv in w.items():
            gv = g[col]
            if not _is_float(wv):
                if not _same(gv, wv):
                    bad.append(f"{col} at {key}: got {gv!r}, want {wv!r}")
                continue
            if _is_float(gv) and math.isnan(gv) and math.isnan(wv):
                continue
            if col in terms:
                tol = loglik_tol(*(w[t] for t in terms[col] if _is_float(w[t]) and not math.isnan(w[t])))
                scale = f"{LOGLIK_REL:g} x (|{'| + |'.join(terms[col])}|) + {LOGLIK_FLOOR:g}"
            elif col in lls:
                tol, scale = loglik_tol(wv), f"{LOGLIK_REL:g} x |{col}| + {LOGLIK_FLOOR:g}"
            elif col in probs:
                tol, scale = PROB_ABS, "probability"
            elif col in exact:
                tol, scale = EXACT_ABS, "exact (no model)"
            else:
                raise AssertionError(f"float column {col} has no stated scale (terms, probs or logliks)")
            if not (_is_float(gv) and abs(gv - wv) <= tol):
                diff = f"{abs(gv - wv):.3g}" if _is_float(gv) else "-"
                bad.append(f"{col} at {key}: got {gv!r}, want {wv!r}, |diff| {diff} > {tol:.3g} ({scale})")
    assert not bad, f"{len(bad)} values differ:\n" + "\n".join(bad[:20])


def scores_tol(frame: Any, terms: Mapping[str, Sequence[str]] = STEP_TERMS) -> float:
    """The largest tolerance any score of `frame` gets: the bound for mins, means and copies of its scores."""
    rows = _records(frame)
    tols = [loglik_tol(*(r[t] for t in ts)) for r in rows for ts in terms.values()
            if all(_is_float(r[t]) and not math.isnan(r[t]) for t in ts)]
    return max([PROB_ABS, *tols])
