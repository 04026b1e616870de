"""Human-annotated chains (ROSCOE CSV + generated JSON lines) -> `chains` rows with `labels`.

Labels follow docs/design/RECEVAL.md: 1 = clean, 0 = error. A per-step yes/no question gives a chain label that is the
min over the chain's steps (no -> 1, yes -> 0); a chain-level yes/no question maps the same way; Likert
ratings (Overall, Coherent) stay ordinal. Every column name and label name comes from HumanLabelSettings, so
another annotated set in the same CSV shape loads with a config file and no code change.
"""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from jobs.infra import tables
from jobs.infra.config import Settings, resolve_path
from jobs.infra.tracking import job
from jobs.metaeval.settings import HumanLabelSettings
from schemas import chains as C
from schemas.chains import content_hash

log = logging.getLogger(__spec__.name)

CALCULATOR = re.compile(r"<<[^<>]*>>")


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or str(value).strip() == ""


def clean_text(text: str, cfg: HumanLabelSettings) -> str:
    text = CALCULATOR.sub("", text) if cfg.strip_calculator else text
    return re.sub(r"\s+", " ", text).strip()


def yes_no(value: Any, cfg: HumanLabelSettings) -> float | None:
    """'no' -> 1.0 (clean), 'yes' -> 0.0 (error), anything else (empty cell) -> None."""
    if _missing(value):
        return None
    answer = str(value).strip().lower()
    if answer == cfg.error_value.lower():
        return 0.0
    if answer == cfg.ok_value.lower():
        return 1.0
    raise ValueError(f"expected {cfg.ok_value!r}/{cfg.error_value!r}, got {value!r}")


def answer_after(text: str, marker: str) -> str | None:
    """The text after the last answer marker ("A: 18" -> "18")."""
    at = text.rfind(marker)
    return text[at + len(marker) :].strip() or None if at >= 0 else None


def steps_of(row: pd.Series, cfg: HumanLabelSettings) -> list[tuple[int, str]]:
    """(n, step text) for the steps present in an annotated row, with the "Step n - " prefix removed."""
    out = []
    for n in range(1, cfg.max_steps + 1):
        column = cfg.step_text.format(n=n)
        if column not in row.index or _missing(row[column]):
            continue
        out.append((n, clean_text(re.sub(cfg.step_prefix, "", str(row[column])), cfg)))
    return out


def labels_of(row: pd.Series, step_numbers: list[int], cfg: HumanLabelSettings) -> dict[str, float]:
    labels: dict[str, float] = {}
    for name, question in cfg.step_labels.items():
        values = [yes_no(row.get(cfg.step_result.format(n=n, q=question)), cfg) for n in step_numbers]
        values = [v for v in values if v is not None]
        if values:  # a question nobody answered for this chain gives no label, not a clean one
            labels[name] = min(values)
    for name, question in cfg.chain_flags.items():
        value = yes_no(row.get(cfg.chain_result.format(q=question)), cfg)
        if value is not None:
            labels[name] = value
    for name, question in cfg.ordinal_labels.items():
        value = row.get(cfg.chain_result.format(q=question))
        if not _missing(value):
            labels[name] = float(value)
    return labels


def gold_of(generated: dict[str, Any], cfg: HumanLabelSettings) -> tuple[list[str] | None, str | None]:
    text = generated.get(cfg.generated_gold)
    if not text:
        return None, None
    text = str(text).replace(cfg.gold_prefix, "", 1)
    lines = [clean_text(line, cfg) for line in text.split("\n")]
    lines = [line for line in lines if line]
    return lines or None, answer_after(text, cfg.answer_marker)


def adapt(annotated: pd.DataFrame, generated: list[dict[str, Any]], cfg: HumanLabelSettings) -> list[dict[str, Any]]:
    """Annotated rows -> `chains` records (schemas.chains field names). Pure: no Spark, no files."""
    records: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for _, row in annotated.iterrows():
        source = generated[int(row[cfg.example_idx])]
        steps = steps_of(row, cfg)
        if not steps:
            raise ValueError(f"annotated row {row.name} has no step text")
        key = str(source.get(cfg.generated_key, row[cfg.example_idx]))
        seen[key] = seen.get(key, 0) + 1
        # One chain can be annotated more than once; each annotation is its own labelled row.
        chain_id = f"{cfg.dataset}:{key}" + (f"#{seen[key]}" if seen[key] > 1 else "")
        gold_steps, gold_answer = gold_of(source, cfg)
        texts = [text for _, text in steps]
        record = {
            C.CHAIN_ID: chain_id,
            C.DATASET: cfg.dataset,
            C.QUESTION_ID: key,
            C.CONTEXT: clean_text(str(source[cfg.generated_context]), cfg),
            C.QUESTION: None,
            C.STEPS: texts,
            C.CHAIN_TEXT: None,
            C.ANSWER: answer_after(texts[-1], cfg.answer_marker),
            C.GOLD_ANSWER: gold_answer,
            C.GOLD_STEPS: gold_steps,
            C.LABELS: labels_of(row, [n for n, _ in steps], cfg),
            C.METADATA: {
                k: str(row[k]) for k in ("hit_id", "worker_id", "run_id") if k in row.index and not _missing(row[k])
            }
            | {"example_idx": str(int(row[cfg.example_idx])), "annotation": "roscoe"},
        }
        record[C.CONTENT_HASH] = content_hash(record)
        record[C.SOURCE] = cfg.annotated
        records.append(record)
    return records


def load(cfg: HumanLabelSettings) -> list[dict[str, Any]]:
    annotated = pd.read_csv(resolve_path(cfg.annotated))
    if cfg.max_rows is not None:
        annotated = annotated.head(cfg.max_rows)
    with resolve_path(cfg.generated).open(encoding="utf-8") as f:
        generated = [json.loads(line) for line in f if line.strip()]
    return adapt(annotated, generated, cfg)


def to_frame(spark: SparkSession, records: list[dict[str, Any]]) -> DataFrame:
    rows = [{f.name: r.get(f.name) for f in C.SCHEMA.fields} for r in records]
    return spark.createDataFrame(rows, C.SCHEMA)


def run(spark: SparkSession, settings: Settings) -> dict[str, int]:
    """Insert the labelled chains (insert-only by chain_id: a rerun adds nothing)."""
    records = load(settings.human_labels)
    inserted = tables.insert_new(spark, to_frame(spark, records), settings.table("chains"), C.SCHEMA, [C.CHAIN_ID])
    counts = {"read": len(records), "inserted": inserted}
    for name in [*settings.human_labels.step_labels, *settings.human_labels.chain_flags]:
        counts[f"errors_{name}"] = sum(1 for r in records if r[C.LABELS].get(name) == 0.0)
    return counts


def main(argv: list[str] | None = None) -> dict[str, int]:
    with job("human_labels", __doc__, argv) as (spark, settings, tracked):
        counts = run(spark, settings)
        tracked.log_metrics(counts)
        log.info(f"[human_labels] {counts}")
    return counts


if __name__ == "__main__":
    main()
