"""The PVI and information-gain request strings (docs/design/RECEVAL.md "Scores per step i", docs/PVI.md): one
definition that the scoring job (jobs.receval.pvi_scores), the training job (jobs.training.train_pvi) and the
benchmarks all use, so a model is trained on exactly the inputs it is later asked to score. Plain Python."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

G_PREFIX = "Generate entailed sentence: "
NULL_SOURCE = G_PREFIX + "None ->"
# g's source for a step with no premise text: the official code joins the empty list, so it sends
# "Generate entailed sentence:  ->" (two spaces); "none" sends g' own source instead (a departure, docs/PVI.md).
EMPTY_PREMISES = {"empty_join": G_PREFIX + " ->", "none": NULL_SOURCE}
IG_BRIDGE = " Therefore,"
IG_SEQ2SEQ_PREFIX = "Generate final answer:"

# Request kinds per step and the model role that scores them.
G, NULL, IG_PREV, IG_CUR = "g", "null", "ig_prev", "ig_cur"
ROLE = {G: "pvi_g", NULL: "pvi_null", IG_PREV: "info_gain", IG_CUR: "info_gain"}

# Model role -> the train_pvi kind that makes it.
TRAINED_KIND = {"pvi_g": "g", "pvi_null": "g_null", "info_gain": "info_gain"}


def target(text: str) -> str:
    return " " + text


def g_source(premises: Sequence[str], empty_premises: str = "empty_join") -> str:
    """g's input. No premise text at all (a one-RCU first step): EMPTY_PREMISES[empty_premises]."""
    if not premises:
        return EMPTY_PREMISES[empty_premises]
    return G_PREFIX + " & ".join(premises) + " ->"


def ig_source(steps_so_far: Sequence[str], family: str = "causal") -> str:
    """L(k)'s source for the steps s(1..k); the seq2seq model is trained with the "Generate final answer:" prefix."""
    text = (" " + " ".join(steps_so_far) if steps_so_far else "") + IG_BRIDGE
    return IG_SEQ2SEQ_PREFIX + text if family == "seq2seq" else text


def earlier(conclusions: Sequence[str], history: str | int, kept: Sequence[int] | None = None) -> list[str]:
    """The earlier conclusions joined to g's premises: all, none, the last k, or (relevant) those at `kept`."""
    if history == "none":
        return []
    if history == "all":
        return list(conclusions)
    if history == "relevant":
        if kept is None:
            raise ValueError("history 'relevant' needs the kept earlier conclusions of each step")
        return [conclusions[j] for j in kept]
    return list(conclusions[-int(history) :]) if int(history) > 0 else []


@dataclass(frozen=True)
class Request:
    step_idx: int
    kind: str
    source: str
    target: str

    @property
    def role(self) -> str:
        return ROLE[self.kind]


def chain_requests(
    step_texts: Sequence[str],
    premises: Sequence[Sequence[str]],
    conclusions: Sequence[str],
    answer: str | None,
    family: str = "causal",
    history: str | int = "all",
    empty_premises: str = "empty_join",
    kept: Sequence[Sequence[int]] | None = None,
) -> list[Request]:
    """Every (source, target) a chain needs, steps in order; no info-gain requests without an answer.

    `kept` (history "relevant"): per step, the indices of the earlier conclusions g's source joins
    (udfs.candidates.intra_relevant)."""
    out: list[Request] = []
    for i, (premise, conclusion) in enumerate(zip(premises, conclusions, strict=True)):
        mine = None if kept is None else kept[i]
        source = g_source([*premise, *earlier(conclusions[:i], history, mine)], empty_premises)
        out.append(Request(i, G, source, target(conclusion)))
        out.append(Request(i, NULL, NULL_SOURCE, target(conclusion)))
        if answer is not None:
            out.append(Request(i, IG_PREV, ig_source(step_texts[:i], family), target(answer)))
            out.append(Request(i, IG_CUR, ig_source(step_texts[: i + 1], family), target(answer)))
    return out
