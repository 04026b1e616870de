"""Selection methods: which of one question's k sampled chains answers it, declared once (issue 56).

Each method is a pure function over one question's candidates, `choose(candidates, params) -> chain_id`; the
select stage (jobs.selection.select_chains) runs them per question inside a grouped applyInPandas, and curation
(`curation.select_method`) keeps what they choose. `METHODS` declares every method with its parameters and their
defaults, and the grid cross-validation tunes over when a config asks for no fixed value.

- `argmax`: the candidate with the best score.
- `vote`: self-consistency, the answer most chains give.
- `filter_then_vote`: drop candidates with arithmetic errors (`arith_errors_total` > `max_arith_errors`) or a score
  under `threshold`, then vote (or `then` another voting method) over the rest; when nothing is left, over all.
- `weighted_vote`: per answer, the log of the sum of exp(score / temperature) over its chains (softmax weights:
  their shared normaliser changes no choice, so it is left out). A very high temperature weighs every chain the
  same (a plain vote), a very low one lets each answer's best chain decide (the answer of the argmax chain).
- `group_score`: per answer, the mean or max (`agg`) of its chains' scores; the best answer.
- `oracle`: a correct candidate whenever there is one (needs the gold answer: the ceiling, never a selector).

Scores: `score` names one of the candidate's scores (the select stage's criteria: correctness, informativeness,
both); with `mix_with` and `weight`, the score is (1 - weight) * score + weight * mix_with. A missing score (None or
NaN) ranks last in argmax, weighs nothing in a weighted vote, and is left out of a group's mean or max.

Answers are grouped as select_chains compares them: normalised text (`normalise`), numbers equal within 1e-6
(`same_answer`); chains without an answer form one group of their own, as the vote always counted them.

Ties, every method: the earliest sample wins (the smallest sample order, then chain_id): among tied answers, the
one whose earliest chain comes first; within the chosen answer, its earliest chain (vote, filter_then_vote) or its
best-scoring chain, ties again to the earliest (weighted_vote, group_score). The sample order is the seeded
sampler's draw order, each sample from its own generator (udfs/sampling.py), so it carries nothing about a
chain's quality: the rule is a seeded random tie-break, and the one self-consistency has always used.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import logsumexp

Params = Mapping[str, Any]

# Numbers as the select stage's cast to double reads them after normalising: sign, digits, point, exponent.
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


@dataclass(frozen=True)
class Candidate:
    """One sampled chain of a question."""

    chain_id: str
    order: float  # sample order (metadata sample_idx; inf without one)
    answer: str | None  # normalised (`normalise`)
    scores: Mapping[str, float | None] = field(default_factory=dict)
    arith_errors: float | None = None  # chain_scores.arith_errors_total; None: not checked
    correct: bool = False  # the answer matches the gold answer (the oracle and cross-validation read it)

    @property
    def rank(self) -> tuple[float, str]:
        """Earliest first: the tie-break of every method."""
        return self.order, self.chain_id


def normalise(answer: str | None) -> str | None:
    """Lower case, no '$' or thousands commas, no trailing period (select_chains.normalise in Python)."""
    if answer is None:
        return None
    return re.sub(r"\.+$", "", re.sub(r"[$,]", "", answer.strip().lower()))


def _number(text: str) -> float | None:
    return float(text) if _NUMBER.match(text) else None


def same_answer(a: str | None, b: str | None) -> bool:
    """Two normalised answers agree: numbers within 1e-6, other text equal (select_chains.same_answer)."""
    if a is None or b is None:
        return False
    num_a, num_b = _number(a), _number(b)
    if num_a is not None and num_b is not None:
        return abs(num_a - num_b) < 1e-6
    return a == b


def answer_groups(candidates: Sequence[Candidate]) -> list[list[Candidate]]:
    """Candidates by answer, each group earliest first, groups in the order of their earliest chain. A chain joins
    the first group whose first answer it agrees with; chains without an answer share one group."""
    groups: list[list[Candidate]] = []
    for c in sorted(candidates, key=lambda c: c.rank):
        home = next((g for g in groups if (g[0].answer is None and c.answer is None)
                     or same_answer(g[0].answer, c.answer)), None)  # fmt: skip
        if home is None:
            groups.append([c])
        else:
            home.append(c)
    return groups


def score_of(c: Candidate, params: Params) -> float | None:
    """The candidate's score under `params` (score, optionally mixed with `mix_with` by `weight`); None: missing."""
    value = _value(c, params["score"])
    if params.get("mix_with") is not None and params.get("weight") is not None:
        other, w = _value(c, params["mix_with"]), float(params["weight"])
        # weight 0 or 1 is one score alone: a missing other score must not make it missing
        value = value if w == 0 else other if w == 1 else (
            None if value is None or other is None else (1 - w) * value + w * other)  # fmt: skip
    return value


def _value(c: Candidate, name: str) -> float | None:
    value = c.scores.get(name)
    return None if value is None or math.isnan(value) else float(value)


def _best(items: Sequence[Any], key: Callable[[Any], float]) -> Any:
    """The first item with the highest key: `items` come earliest first, so ties go to the earliest."""
    keys = [key(i) for i in items]
    return items[keys.index(max(keys))]


def _best_chain(group: Sequence[Candidate], params: Params) -> Candidate:
    """A group's best-scoring chain, ties and missing scores to the earliest."""
    return _best(group, lambda c: -math.inf if (s := score_of(c, params)) is None else s)


def argmax(candidates: Sequence[Candidate], params: Params) -> str:
    """The best-scoring candidate; missing scores last; ties to the earliest sample."""
    return _best_chain(sorted(candidates, key=lambda c: c.rank), params).chain_id


def vote(candidates: Sequence[Candidate], params: Params) -> str:
    """Self-consistency: the answer of most chains (ties: the answer whose earliest chain comes first); its
    earliest chain."""
    return _best(answer_groups(candidates), len)[0].chain_id


def weighted_vote(candidates: Sequence[Candidate], params: Params) -> str:
    """Per answer, logsumexp(score / temperature) over its scored chains (-inf without any); the best answer's
    best-scoring chain."""
    temperature = float(params["temperature"])

    def weight(group: list[Candidate]) -> float:
        scores = [s for c in group if (s := score_of(c, params)) is not None]
        return float(logsumexp(np.asarray(scores) / temperature)) if scores else -math.inf

    return _best_chain(_best(answer_groups(candidates), weight), params).chain_id


def group_score(candidates: Sequence[Candidate], params: Params) -> str:
    """Per answer, the mean or max (`agg`) of its chains' scores (-inf without any); the best answer's
    best-scoring chain."""
    reduce = {"mean": np.mean, "max": np.max}[params["agg"]]

    def value(group: list[Candidate]) -> float:
        scores = [s for c in group if (s := score_of(c, params)) is not None]
        return float(reduce(scores)) if scores else -math.inf

    return _best_chain(_best(answer_groups(candidates), value), params).chain_id


def survivors(candidates: Sequence[Candidate], params: Params) -> list[Candidate]:
    """filter_then_vote's pool: the candidates with at most `max_arith_errors` arithmetic errors (None: no such
    filter; an unchecked chain, None, passes: unknown is not wrong) and, with a `threshold`, a score at or above it
    (a missing score fails); all candidates when none passes."""
    limit, threshold = params.get("max_arith_errors"), params.get("threshold")
    kept = [c for c in candidates
            if (limit is None or c.arith_errors is None or c.arith_errors <= limit)
            and (threshold is None or ((s := score_of(c, params)) is not None and s >= threshold))]  # fmt: skip
    return kept or list(candidates)


def filter_then_vote(candidates: Sequence[Candidate], params: Params) -> str:
    """`then` (vote, weighted_vote or group_score) over `survivors`."""
    then = METHODS[params["then"]]
    return then.choose(survivors(candidates, params), {**then.defaults, **params})


def oracle(candidates: Sequence[Candidate], params: Params) -> str:
    """The earliest correct candidate, else the earliest: the ceiling any choice among the k can reach."""
    ordered = sorted(candidates, key=lambda c: c.rank)
    return next((c for c in ordered if c.correct), ordered[0]).chain_id


@dataclass(frozen=True)
class Method:
    """A selection method: `choose` with its parameters' defaults, and the grid cross-validation tunes over
    unless a config fixes the parameter or gives its own grid."""

    name: str
    choose: Callable[[Sequence[Candidate], Params], str]
    defaults: Mapping[str, Any]
    grid: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    uses_gold: bool = False  # reads Candidate.correct: a ceiling, not a selector

    def accepts(self) -> set[str]:
        """The parameter names a config may set (filter_then_vote passes its voting method's on)."""
        names = set(self.defaults)
        if self.name == FILTER_THEN_VOTE:
            names |= {p for m in VOTERS for p in METHODS[m].defaults}
        return names


ARGMAX, VOTE, FILTER_THEN_VOTE, WEIGHTED_VOTE, GROUP_SCORE, ORACLE = (
    "argmax", "vote", "filter_then_vote", "weighted_vote", "group_score", "oracle")
VOTERS = (VOTE, WEIGHTED_VOTE, GROUP_SCORE)  # what filter_then_vote may vote with
# The scores a method may name: the select stage's criteria, each computed per question (select.combine).
SCORES = ("correctness", "informativeness", "both")
_SCORE = {"score": "both", "mix_with": None, "weight": None}

# Grids are on the criteria's default scale (select.combine rank_mean: percent ranks within the question, in [0, 1]).
METHODS: dict[str, Method] = {m.name: m for m in (
    Method(ARGMAX, argmax, _SCORE),
    Method(VOTE, vote, {}),
    Method(FILTER_THEN_VOTE, filter_then_vote, {**_SCORE, "max_arith_errors": 0, "threshold": None, "then": VOTE},
           grid={"threshold": (0.25, 0.5, 0.75)}),
    Method(WEIGHTED_VOTE, weighted_vote, {**_SCORE, "temperature": 1.0},
           grid={"temperature": (0.03, 0.1, 0.3, 1.0, 3.0)}),
    Method(GROUP_SCORE, group_score, {**_SCORE, "agg": "mean"}),
    Method(ORACLE, oracle, {}, uses_gold=True),
)}  # fmt: skip


def choose(method: str, candidates: Sequence[Candidate], params: Params | None = None) -> str:
    """`method`'s chosen chain_id, its defaults under `params`."""
    if not candidates:
        raise ValueError("a selection method needs at least one candidate")
    m = METHODS[method]
    return m.choose(candidates, {**m.defaults, **(params or {})})


def chosen_answer(method: str, candidates: Sequence[Candidate], params: Params | None = None) -> list[str]:
    """The chain_ids of every chain of the chosen answer, earliest first: the chosen chain's answer group among
    the candidates the method chose from (filter_then_vote: its survivors, so a chain it dropped stays out)."""
    full = {**METHODS[method].defaults, **(params or {})}
    picked = choose(method, candidates, full)
    pool = survivors(candidates, full) if method == FILTER_THEN_VOTE else list(candidates)
    group = next(g for g in answer_groups(pool) if any(c.chain_id == picked for c in g))
    return [c.chain_id for c in group]


def check(method: str, params: Params) -> None:
    """Raise ValueError unless `params` are values `method` takes (config validation, before any Spark job)."""
    if method not in METHODS:
        raise ValueError(f"unknown selection method {method!r} (known: {sorted(METHODS)})")
    m = METHODS[method]
    unknown = sorted(set(params) - m.accepts())
    if unknown:
        raise ValueError(f"selection method {method!r} takes no {unknown} (it takes {sorted(m.accepts())})")
    full = {**m.defaults, **params}
    for key in ("score", "mix_with"):
        if key in full and full[key] is not None and full[key] not in SCORES:
            raise ValueError(f"{method}: {key}={full[key]!r} is not a score ({', '.join(SCORES)})")
    if full.get("weight") is not None and (full.get("mix_with") is None or not 0 <= float(full["weight"]) <= 1):
        raise ValueError(f"{method}: weight={full['weight']!r} needs mix_with and a value in [0, 1]")
    if "temperature" in full and not float(full["temperature"]) > 0:
        raise ValueError(f"{method}: temperature must be > 0, got {full['temperature']!r}")
    if "agg" in full and full["agg"] not in ("mean", "max"):
        raise ValueError(f"{method}: agg must be mean or max, got {full['agg']!r}")
    if "then" in full and full["then"] not in VOTERS:
        raise ValueError(f"{method}: then must be one of {VOTERS}, got {full['then']!r}")
