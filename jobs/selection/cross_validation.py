"""k-fold cross-validation over questions: a selection method's parameter (a threshold, a temperature, a weight
between scores) is never chosen on the questions whose accuracy is reported (issue 56 item 3).

The questions are split into k folds by a seeded permutation (fold sizes differ by at most one). For each fold,
the grid point with the best accuracy on the other folds is chosen (ties: the first in the grid's order) and
only the fold's own questions are answered with it, so every reported answer comes from a parameter chosen
without that question's gold answer. Pure Python over collected outcomes: the select stage runs every grid point
on every question in Spark and hands the outcomes here.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# question_id -> {setting: the chosen chain's answer is right}; a setting is a grid point's `label`.
Outcomes = Mapping[str, Mapping[str, bool]]


def grid_points(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, the first parameter varying slowest, in the order given."""
    names = list(grid)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*(grid[n] for n in names))]


def label(point: Mapping[str, Any]) -> str:
    """A grid point as the text the table and the fold record show: `{"temperature": 0.1}`."""
    return json.dumps(dict(point), sort_keys=True)


def folds_of(questions: Sequence[str], k: int, seed: int) -> dict[str, int]:
    """question -> fold in 0..min(k, n) - 1: the sorted ids permuted by `seed`, dealt round-robin."""
    ordered = sorted(set(questions))
    k = min(k, len(ordered))
    order = np.random.default_rng(seed).permutation(len(ordered))
    return {ordered[j]: i % k for i, j in enumerate(order)}


def best_setting(outcomes: Outcomes, questions: Sequence[str], settings: Sequence[str]) -> tuple[str, float]:
    """The setting right on most of `questions` (ties: the first in `settings`) and its accuracy."""
    right = np.array([[outcomes[q][s] for s in settings] for q in questions], dtype=float)
    accuracy = right.mean(axis=0)
    best = int(np.argmax(accuracy))  # argmax keeps the first of equal maxima
    return settings[best], float(accuracy[best])


@dataclass(frozen=True)
class Fold:
    """One fold: the setting chosen on the other folds, its accuracy there and on this fold's questions."""

    fold: int
    questions: int
    setting: str
    train_accuracy: float
    heldout_accuracy: float


def cross_validate(outcomes: Outcomes, settings: Sequence[str], k: int, seed: int) -> tuple[dict[str, int], list[Fold]]:
    """(question -> fold, the folds in order). A question is answered with its fold's setting. Needs two questions
    at least (a fold's training questions are the others); k above the number of questions becomes that number."""
    if len(outcomes) < 2:
        raise ValueError(f"cross-validation needs at least 2 questions, got {len(outcomes)}")
    fold = folds_of(list(outcomes), k, seed)
    out = []
    for f in sorted(set(fold.values())):
        train = sorted(q for q in outcomes if fold[q] != f)
        held = sorted(q for q in outcomes if fold[q] == f)
        chosen, train_accuracy = best_setting(outcomes, train, settings)  # the held-out fold is not read here
        heldout = float(np.mean([outcomes[q][chosen] for q in held]))
        out.append(Fold(f, len(held), chosen, train_accuracy, heldout))
    return fold, out
