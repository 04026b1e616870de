"""Scoring from code (a notebook, a job task): a Spark DataFrame of chains -> step and chain scores as DataFrames,
and the nightly pipeline on a lake path.

    from jobs.receval.api import score_chains, run_pipeline

    df = spark.read.json("/Volumes/main/llm/outputs/gsm8k/*.jsonl")       # this project's rows, or any preset's
    with score_chains(df, ["models.profile=small"]) as scores:            # same overrides as --set
        scores.chain_scores.orderBy("intra_entail_min").show()            # one row per chain
        scores.step_scores.where("chain_id = 'gsm8k-17'").show()           # one row per step
        scores.quarantine.groupBy("reason").count().show()                # rows that could not be scored, and why

    summary = run_pipeline("/mnt/lake", input="/mnt/outputs/*.jsonl")     # the night, as `receval pipeline` runs it

`score_chains` runs the pipeline's own transforms (ingest's validation and mapping, steps, NLI and PVI scores,
aggregate) on the frame: the same scores the pipeline writes for those chains (tests/jobs/test_pipeline_offline.py
compares them), without reading or writing the lake and without an MLflow run unless asked (`write`, `track`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from jobs.infra import tables
from jobs.infra.config import Settings, load_settings
from jobs.receval import aggregate, ingest, score, scores_table
from jobs.receval import steps as steps_job
from schemas import chain_scores as CS
from schemas import chains as C
from schemas import steps as ST

Overrides = Sequence[str] | Mapping[str, Any]


def _pairs(overrides: Overrides) -> list[str]:
    """`--set` pairs from a list of "key=value" or a {key: value} mapping (values that are not text as JSON,
    which the config's YAML reading accepts: lists, numbers, booleans, null)."""
    if isinstance(overrides, Mapping):
        return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in overrides.items()]
    if isinstance(overrides, str):
        raise TypeError("overrides: a list of 'key=value' strings or a mapping, not one string")
    return list(overrides)


def settings_for(overrides: Overrides = (), config: str | os.PathLike[str] | None = None) -> Settings:
    """The settings a job gets for `--config config --set ...` (defaults, profiles, RECEVAL__* variables too)."""
    return load_settings(config, _pairs(overrides))


@dataclass
class Scores:
    """What score_chains returns. The frames are lazy, but share one persisted scoring pass (the models run
    once): `release()` (or leaving `with score_chains(...) as scores:`) frees it."""

    settings: Settings
    config_hash: str
    chains: DataFrame  # the valid chains, in the `chains` table's shape
    steps: DataFrame  # one row per step with its RCUs (`steps`)
    step_scores: DataFrame  # one row per step of a fully scored chain (`step_scores`)
    chain_scores: DataFrame  # one row per scored chain (`chain_scores`)
    quarantine: DataFrame  # rows ingest, steps or scoring refused, with the reason (`quarantine`)
    written: dict[str, int] = field(default_factory=dict)  # rows inserted per table, with write=True
    mlflow_run_id: str | None = None  # with track=True
    _held: tables.Held = field(default_factory=tables.Held, repr=False)

    def release(self) -> None:
        self._held.__exit__(None, None, None)

    def __enter__(self) -> Scores:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def raw_rows(chains: DataFrame, json_column: str | None = None, source: str = "dataframe") -> DataFrame:
    """A DataFrame of chains -> the rows ingest validates: each row as JSON text (its columns as the fields, or
    the JSON text already in `json_column`, e.g. spark.read.text's `value`) and where it came from (`source`)."""
    if json_column is not None:
        text = F.col(json_column).cast("string")
    else:
        text = F.to_json(F.struct(*[F.col(f"`{c}`") for c in chains.columns]))
    return chains.select(
        F.make_valid_utf8(text).alias(ingest.RAW),
        F.is_valid_utf8(text).alias(ingest.VALID_UTF8),
        F.lit(source).alias("source"),
        F.lit(None).cast("string").alias(ingest.CTX),
    ).where(F.trim(F.col(ingest.RAW)) != "")


def score_chains(
    chains: DataFrame,
    overrides: Overrides = (),
    *,
    config: str | os.PathLike[str] | None = None,
    json_column: str | None = None,
    source: str = "dataframe",
    write: bool = False,
    track: bool = False,
) -> Scores:
    """Score the chains in a DataFrame: step scores (NLI: intra_entail, inter; PVI: intra_pvi, info_gain) and chain
    scores (min over steps, mean, worst step, API_k), as the nightly pipeline computes them.

    chains: rows in this project's shape (chain_id, context, steps or chain_text, answer, labels, ...), or any
      ingest preset's (name it: `ingest.preset=chat`, `lm_eval`, `vllm`, ...; `ingest.mapping.<field>=<path>`
      for other shapes). `json_column` names a column that holds each row as JSON text instead.
    overrides: settings as `--set` takes them (["models.profile=small"] or {"models.profile": "small"});
      `config`: a YAML file layered under them, as --config.
    write: also insert the rows into the lake (paths.lake: chains, steps, contexts, step_scores, chain_scores,
      quarantine) the way the pipeline does (insert-only MERGEs: chains already there under this config hash are
      kept, not scored twice into the tables).
    track: one MLflow run ("score_chains") with the config and the counts.

    A missing model fails before any Spark job runs, naming the setting and how to provide it.
    """
    from jobs.receval.pipeline import prepare

    settings = settings_for(overrides, config)
    prepare(settings, None)
    config_hash = settings.scoring_hash()
    held = tables.Held()
    try:
        on_error = settings.runtime.on_row_error
        checked = held(ingest.check(raw_rows(chains, json_column, source), settings.ingest, on_error))
        valid, rejected = ingest.transform(checked, settings.ingest, on_error)
        valid = held(valid)
        steps, contexts, steps_bad = steps_job.transform(
            valid, settings.steps, settings.models, settings.runtime, config_hash, held)
        steps, contexts = held(steps), held(contexts)
        scored = held(score.score_steps(steps, contexts, settings))
        step_scores, score_bad = score.split(scored)
        step_scores = held(step_scores)
        chain_scores = aggregate.transform(step_scores, settings.aggregate)
        quarantine = rejected.unionByName(steps_bad).unionByName(score_bad)
        result = Scores(settings, config_hash, valid, steps, step_scores, chain_scores, quarantine, _held=held)
        if write or track:
            _write_and_track(result, contexts, write, track)
        return result
    except BaseException:
        held.__exit__(None, None, None)
        raise


def _write_and_track(result: Scores, contexts: DataFrame, write: bool, track: bool) -> None:
    from jobs.infra.tracking import job_run

    settings, spark = result.settings, result.chains.sparkSession

    def counts() -> dict[str, int]:
        return {"chains": result.chains.count(), "steps": result.steps.count(),
                "scored_chains": result.chain_scores.count(), "quarantined": result.quarantine.count()}

    def insert() -> dict[str, int]:
        written = {
            "chains": tables.insert_new(spark, result.chains, settings.table("chains"), C.SCHEMA, [C.CHAIN_ID]),
            "steps": tables.insert_new(spark, result.steps, settings.table("steps"), ST.SCHEMA,
                                       [ST.CHAIN_ID, ST.CONFIG_HASH, ST.STEP_IDX]),
            "contexts": tables.insert_new(spark, contexts, settings.table("contexts"), ST.CONTEXTS_SCHEMA,
                                          [ST.CHAIN_ID, ST.CONFIG_HASH]),
            "step_scores": scores_table.write(spark, settings, result.step_scores),
            "chain_scores": tables.insert_new(spark, result.chain_scores, settings.table("chain_scores"),
                                              CS.SCHEMA, [CS.CHAIN_ID, CS.CONFIG_HASH]),
        }
        written["quarantine"] = tables.append_quarantine(spark, settings, result.quarantine)
        return written

    if not track:
        result.written = insert()
        return
    with job_run(settings, "score_chains") as tracked:
        tracked.log_metrics(counts())
        if write:
            result.written = insert()
            tracked.log_metrics({f"written.{k}": v for k, v in result.written.items()})
        result.mlflow_run_id = tracked.run_id


def run_pipeline(
    lake: str | os.PathLike[str],
    input: str | os.PathLike[str] | None = None,  # noqa: A002 - the ingest.input setting's name
    overrides: Overrides = (),
    *,
    config: str | os.PathLike[str] | None = None,
):
    """The nightly pipeline (`receval pipeline`) on the lake at `lake`, from code: ingest `input` (default:
    ingest.input), steps, scores, aggregate, curate, the report; one MLflow parent run with a child per stage.
    Returns the pipeline's Summary (rows per table, stages, scores by label, the MLflow run id). Uses the active
    Spark session when there is one (a notebook's)."""
    from jobs.receval import pipeline

    lake = str(Path(lake))
    argv = ["--set", f"paths.lake={lake}", "--set", f"paths.checkpoints={lake}/_checkpoints"]
    if input is not None:
        argv += ["--set", f"ingest.input={input}"]
    if config is not None:
        argv += ["--config", os.fspath(config)]
    for pair in _pairs(overrides):
        argv += ["--set", pair]
    return pipeline.main(argv)
