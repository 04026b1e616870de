"""Human-annotated chains (ROSCOE CSV + generated JSON lines) -> `chains` rows with `labels`, and `step_labels`.

Labels follow docs/design/RECEVAL.md: 1 = clean, 0 = error. A per-step yes/no question gives a chain label that is the
min over the chain's steps (no -> 1, yes -> 0); a chain-level yes/no question maps the same way; Likert
ratings (Overall, Coherent) stay ordinal. Every column name and label name comes from HumanLabelSettings, so
another annotated set in the same CSV shape loads with a config file and no code change.

Step labels (schemas/step_labels.py): each step's own answers, one row per answered question (no -> 1.0,
yes -> 0.0, unanswered -> no row), and `first_error` rows: the steps before the earliest step with any "yes" 1.0,
that step 0.0, later steps none (a chain without a "yes": every step 1.0). Where a step before it (any step, in a
chain without a "yes") has no answer at all, the earliest error is unknown and the chain gets no first_error rows.
With `human_labels.companion_labels` the chain's labels also get first_error_index and, where the chain's and the
gold answer are both numbers, final_answer_correct; off by default, so the chain rows stay as they were.
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
from jobs.infra.config import Settings
from jobs.infra.config_paths import dataset_file
from jobs.infra.stage import Job, Stage
from jobs.metaeval.settings import HumanLabelSettings
from jobs.metaeval.step_labels import earliest_error, first_error_rows, label_row
from schemas import chains as C
from schemas import step_labels as SL
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


def step_answers(row: pd.Series, step_numbers: list[int], cfg: HumanLabelSettings) -> list[dict[str, float]]:
    """Per step (in chain order), label name -> its question's answer as a label (no -> 1.0, yes -> 0.0); an
    unanswered question has no entry."""
    out = []
    for n in step_numbers:
        answers = {name: yes_no(row.get(cfg.step_result.format(n=n, q=question)), cfg)
                   for name, question in cfg.step_labels.items()}
        out.append({name: v for name, v in answers.items() if v is not None})
    return out


def step_label_rows(chain_id: str, answers: list[dict[str, float]], dataset: str) -> tuple[list[dict[str, Any]], int | None]:
    """A chain's `step_labels` rows from its steps' answers, and its earliest error (-1: none; None: unknown)."""
    rows = [label_row(chain_id, i, name, v, dataset) for i, step in enumerate(answers) for name, v in step.items()]
    # A step is wrong when any question says so; a step nobody judged is unknown (None), not right.
    first = earliest_error([min(step.values()) if step else None for step in answers])
    if first is not None:
        rows += first_error_rows(chain_id, first, len(answers), dataset)
    return rows, first


def _number(text: str | None) -> float | None:
    """"$1,000." -> 1000.0 (as select_chains normalises answers); None when it is not a number."""
    if text is None:
        return None
    try:
        value = float(re.sub(r"[$,]", "", text.strip().lower()).rstrip("."))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def final_answer_correct(answer: str | None, gold: str | None) -> float | None:
    """1.0 / 0.0 where both answers are numbers (equal within 1e-6, as select_chains), else None: a text
    comparison would count a different wording of the right answer as wrong."""
    a, g = _number(answer), _number(gold)
    return None if a is None or g is None else float(abs(a - g) < 1e-6)


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
    return adapt_with_step_labels(annotated, generated, cfg)[0]


def adapt_with_step_labels(
    annotated: pd.DataFrame, generated: list[dict[str, Any]], cfg: HumanLabelSettings
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Annotated rows -> (`chains` records, `step_labels` rows). Pure: no Spark, no files."""
    records: list[dict[str, Any]] = []
    step_rows: list[dict[str, Any]] = []
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
        rows, first = step_label_rows(chain_id, step_answers(row, [n for n, _ in steps], cfg), cfg.dataset)
        step_rows += rows
        if cfg.companion_labels:
            correct = final_answer_correct(record[C.ANSWER], record[C.GOLD_ANSWER])
            record[C.LABELS] |= ({SL.FIRST_ERROR_INDEX: float(first)} if first is not None else {}) | (
                {SL.FINAL_ANSWER_CORRECT: correct} if correct is not None else {})
        record[C.CONTENT_HASH] = content_hash(record)
        record[C.SOURCE] = cfg.annotated
        records.append(record)
    return records, step_rows


def load(cfg: HumanLabelSettings) -> list[dict[str, Any]]:
    return load_with_step_labels(cfg)[0]


def load_with_step_labels(cfg: HumanLabelSettings) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    annotated_path = dataset_file(cfg.annotated, "human_labels.annotated", "roscoe_gsm8k")
    generated_path = dataset_file(cfg.generated, "human_labels.generated", "roscoe_gsm8k")
    annotated = pd.read_csv(annotated_path)
    if cfg.max_rows is not None:
        annotated = annotated.head(cfg.max_rows)
    with generated_path.open(encoding="utf-8") as f:
        generated = [json.loads(line) for line in f if line.strip()]
    return adapt_with_step_labels(annotated, generated, cfg)


def to_frame(spark: SparkSession, records: list[dict[str, Any]]) -> DataFrame:
    rows = [{f.name: r.get(f.name) for f in C.SCHEMA.fields} for r in records]
    return spark.createDataFrame(rows, C.SCHEMA)


def run(spark: SparkSession, settings: Settings) -> dict[str, int]:
    """Insert the labelled chains and their step labels (insert-only: a rerun adds nothing); the chain counts."""
    return run_with_step_labels(spark, settings)[0]


def run_with_step_labels(spark: SparkSession, settings: Settings) -> tuple[dict[str, int], dict[str, int]]:
    """Insert the labelled chains (by chain_id) and their step labels (by chain, step and label): insert-only, so
    a rerun adds nothing. Returns the chain counts and the step-label counts."""
    records, step_rows = load_with_step_labels(settings.human_labels)
    inserted = tables.insert_new(spark, to_frame(spark, records), settings.table("chains"), C.SCHEMA, [C.CHAIN_ID])
    counts = {"read": len(records), "inserted": inserted}
    for name in [*settings.human_labels.step_labels, *settings.human_labels.chain_flags]:
        counts[f"errors_{name}"] = sum(1 for r in records if r[C.LABELS].get(name) == 0.0)
    firsts = [r for r in step_rows if r[SL.LABEL] == SL.FIRST_ERROR]
    step_counts = {
        "step_labels": len(step_rows),
        "step_labels_inserted": tables.insert_new(spark, spark.createDataFrame(step_rows, SL.SCHEMA),
                                                  settings.table("step_labels"), SL.SCHEMA, SL.KEY),
        "chains_first_error_known": len({r[SL.CHAIN_ID] for r in firsts}),
        "chains_first_error_step": sum(1 for r in firsts if r[SL.VALUE] == 0.0),
    }
    return counts, step_counts


def _body(job: Job) -> dict[str, int]:
    spark, settings, tracked = job.spark, job.settings, job.tracked
    counts, step_counts = run_with_step_labels(spark, settings)
    tracked.log_metrics(counts | step_counts)
    log.info(f"[human_labels] {counts} {step_counts}")
    return counts


STAGE = Stage("human_labels", __doc__, _body, writes=("chains", "step_labels"), section="human_labels")


def main(argv: list[str] | None = None) -> dict[str, int]:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
