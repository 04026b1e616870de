"""Agreement of extracted RCUs with gold RCUs, per step: conclusion match, premise-set P/R/F1, edge defects.

Plain Python, no Spark. Used by `bench/rcu_bench.py` (EntailmentBank gold structure, the hand-labelled natural
set in `bench/data/`). Units are compared after `normalise`: lower case, punctuation as spaces, whitespace
collapsed, so "light and dark are kinds of color." and "Light and dark are kinds of color" agree.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Punctuation of both ASCII and the typographic kinds GSM-8K texts carry (’ – “ ”).
_PUNCT = re.compile("[" + re.escape(string.punctuation) + "\u2018\u2019\u201c\u201d\u2013\u2014\u2026" + "]")
# A unit that starts or ends with one of these carries the connective that joins it to its neighbour (or
# lost the clause it introduced): "is a kind of color, so". Multi-word ones are matched on word boundaries.
EDGE_CONNECTIVES = (
    "so",
    "thus",
    "therefore",
    "hence",
    "because",
    "since",
    "as a result",
    "consequently",
    "and",
    "but",
    "or",
    "then",
)


def normalise(text: str) -> str:
    return " ".join(_PUNCT.sub(" ", text.lower()).split())


def tokens(text: str) -> list[str]:
    return normalise(text).split()


def _prf(tp: float, n_pred: int, n_gold: int) -> tuple[float, float, float]:
    """Precision, recall, F1; an empty prediction of an empty gold scores 1 on all three (nothing to find)."""
    if n_pred == 0 and n_gold == 0:
        return 1.0, 1.0, 1.0
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_gold if n_gold else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def set_prf(pred: Iterable[str], gold: Iterable[str]) -> tuple[float, float, float]:
    """Exact unit match after normalisation, as multisets (a premise stated twice counts twice)."""
    p, g = Counter(normalise(u) for u in pred), Counter(normalise(u) for u in gold)
    return _prf(sum((p & g).values()), sum(p.values()), sum(g.values()))


def token_prf(pred: Iterable[str], gold: Iterable[str]) -> tuple[float, float, float]:
    """Token overlap of all premise units together (bags of normalised tokens): credit for near misses."""
    p = Counter(t for u in pred for t in tokens(u))
    g = Counter(t for u in gold for t in tokens(u))
    return _prf(sum((p & g).values()), sum(p.values()), sum(g.values()))


def edge_defect(unit: str) -> bool:
    """Does the unit start or end with a connective or a comma (it was cut at the wrong place)?"""
    stripped = unit.strip()
    if not stripped:
        return False
    if stripped[0] in ",;" or stripped.rstrip(".")[-1:] in (",", ";"):
        return True
    norm = normalise(stripped)
    return any(norm == c or norm.startswith(c + " ") or norm.endswith(" " + c) for c in EDGE_CONNECTIVES)


@dataclass(frozen=True)
class StepAgreement:
    conclusion_exact: bool
    conclusion_token_f1: float
    premise_p: float
    premise_r: float
    premise_f1: float
    premise_token_f1: float
    same_count: bool
    n_units: int
    edge_defects: int


def agree(pred_premises: Sequence[str], pred_conclusion: str, gold_premises: Sequence[str], gold_conclusion: str) -> StepAgreement:
    p, r, f = set_prf(pred_premises, gold_premises)
    units = [*pred_premises, pred_conclusion] if pred_conclusion else list(pred_premises)
    return StepAgreement(
        conclusion_exact=normalise(pred_conclusion) == normalise(gold_conclusion),
        conclusion_token_f1=token_prf([pred_conclusion], [gold_conclusion])[2],
        premise_p=p,
        premise_r=r,
        premise_f1=f,
        premise_token_f1=token_prf(pred_premises, gold_premises)[2],
        same_count=len(pred_premises) == len(gold_premises),
        n_units=len(units),
        edge_defects=sum(edge_defect(u) for u in units),
    )


def summarise(rows: Sequence[StepAgreement]) -> dict[str, float]:
    """Means over steps (each step weighs the same), defect counts summed."""
    n = len(rows)
    if n == 0:
        return {"steps": 0}
    mean = lambda xs: sum(xs) / n  # noqa: E731
    return {
        "steps": n,
        "conclusion_exact": mean([float(r.conclusion_exact) for r in rows]),
        "conclusion_token_f1": mean([r.conclusion_token_f1 for r in rows]),
        "premise_p": mean([r.premise_p for r in rows]),
        "premise_r": mean([r.premise_r for r in rows]),
        "premise_f1": mean([r.premise_f1 for r in rows]),
        "premise_token_f1": mean([r.premise_token_f1 for r in rows]),
        "same_count": mean([float(r.same_count) for r in rows]),
        "units": sum(r.n_units for r in rows),
        "edge_defects": sum(r.edge_defects for r in rows),
    }
