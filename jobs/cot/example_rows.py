"""An evaluation example as a row of the common example schema (`_example`), and the error every loader of
jobs.cot.data and jobs.cot.p3 raises for a missing or malformed file (`DataError`, `_need`).

Each row: dataset, task, template, example_id, source, options (None for generation tasks), gold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schemas import cot as S

Example = dict[str, Any]


class DataError(ValueError):
    """An evaluation file is missing or malformed; the message names the file."""


def _need(path: Path) -> Path:
    if not path.exists():
        raise DataError(f"evaluation file not found: {path} (cot.data_root points at the data folder)")
    return path


def _example(dataset: str, task: str, template: str | None, example_id: str, source: str,
             options: list[str] | None, gold: str) -> Example:  # fmt: skip
    return {
        S.DATASET: dataset,
        S.TASK: task,
        S.TEMPLATE: template,
        S.EXAMPLE_ID: example_id,
        S.SOURCE: source,
        S.OPTIONS: options,
        S.GOLD: gold,
    }
