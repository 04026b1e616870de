"""Step labels (schemas/step_labels.py) from a set's own annotations: the `first_error` rows of a chain and the
earliest error of per-step verdicts. Plain Python, shared by the step-labelled sets' adapters (ProcessBench in
jobs/metaeval/processbench_items.py, ROSCOE's per-step annotations in jobs/metaeval/human_labels.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from schemas import step_labels as SL

NO_ERROR = -1  # the earliest-error index of a chain whose every step is correct (ProcessBench's `label`)


def label_row(chain_id: str, step_idx: int, label: str, value: float, dataset: str | None) -> dict[str, Any]:
    """One `step_labels` row."""
    return {SL.CHAIN_ID: chain_id, SL.STEP_IDX: step_idx, SL.LABEL: label, SL.VALUE: value, SL.DATASET: dataset}


def first_error_rows(chain_id: str, first_error: int, n_steps: int, dataset: str | None) -> list[dict[str, Any]]:
    """The `first_error` rows of a chain whose earliest erroneous step is `first_error` (-1: none): the steps
    before it 1.0, the step itself 0.0, and no row for later steps: knowing the earliest error says nothing about
    the steps after it. A chain without an error gets 1.0 on every step."""
    if not NO_ERROR <= first_error < n_steps:
        raise ValueError(f"first error {first_error} outside a chain of {n_steps} steps")
    last = n_steps - 1 if first_error == NO_ERROR else first_error
    return [label_row(chain_id, i, SL.FIRST_ERROR, 0.0 if i == first_error else 1.0, dataset)
            for i in range(last + 1)]


def earliest_error(verdicts: Sequence[float | None]) -> int | None:
    """Per-step verdicts (1.0 right, 0.0 wrong, None not judged) -> the earliest wrong step, -1 when every step
    was judged right, or None when a step before the first wrong one (any step, if none is wrong) was not judged:
    that step could be the earliest error, so the index would be a guess."""
    for i, verdict in enumerate(verdicts):
        if verdict is None:
            return None
        if verdict == 0.0:
            return i
    return NO_ERROR
