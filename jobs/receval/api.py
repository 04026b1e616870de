"""Scoring from code (a notebook, a job task): a Spark DataFrame of chains -> step and chain scores as DataFrames,
and the nightly pipeline on a lake path.

    from jobs.receval.api import score_chains, run_pipeline

    df = spark.read.json("/Volumes/main/llm/outputs/gsm8k/*.jsonl")       # this project's rows, or any preset's
    with score_chains(df, ["models.profile=small"]) as scores:            # same overrides as --set
        scores.chain_scores.orderBy("intra_entail_min").show()            # one row per chain
        scores.step_scores.where("chain_id = 'gsm8k-17'").show()           # one row per step
        scores.quarantine.groupBy("reason").count().show()                # rows that could not be scored, and why

    summary = run_pipeline("/mnt/lake", input="/mnt/outputs/*.jsonl")     # the night, as `receval pipeline` runs it

`score_chains` runs the pipeline's own transforms (ingest's validation and mapping, then the night's steps, NLI
and PVI scores and aggregate: the functions jobs.receval.pipeline's stages call) on the frame: the same scores the
pipeline writes for those chains (tests/jobs/test_pipeline_offline.py compares them), without reading or writing
the lake and without an MLflow run unless asked (`write`, `track`).

Both resolve their settings as `receval pipeline` does (settings_for): the same layers, and the `small` model
profile once `make models` built it unless a layer chose one, so a notebook scores with the night's models under
the night's config hash. A write holds the lake's claim as a night does (jobs.infra.claim): one writing run at a
time, and a lake a live run holds is left untouched (claim.LakeBusy).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from jobs.infra import claim, tables
from jobs.infra.config import Settings
from jobs.infra.stage import claim_tags, settings_of, take_claim, with_built_models
from jobs.receval import chain_tables, ingest, ingest_rows, pipeline, score

Overrides = Sequence[str] | Mapping[str, Any]


def _pairs(overrides: Overrides) -> list[str]:
    """`--set` pairs from a list of "key=value" or a {key: value} mapping (values that are not text as JSON,
    which the config's YAML reading accepts: lists, numbers, booleans, null)."""
    if isinstance(overrides, Mapping):
        return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in overrides.items()]
    if isinstance(overrides, str):
        raise TypeError("overrides: a list of 'key=value' strings or a mapping, not one string")
    return list(overrides)


def _command_line(overrides: Overrides, config: str | os.PathLike[str] | None, *pairs: str) -> list[str]:
    """The command line `receval pipeline` would get for these settings: `config` as --config, `pairs` then the
    caller's overrides (which win) as --set, and the model profile the night chooses (with_built_models), as
    `receval` adds it to every stage's arguments."""
    argv = [] if config is None else ["--config", os.fspath(config)]
    for pair in (*pairs, *_pairs(overrides)):
        argv += ["--set", pair]
    return with_built_models(argv)


def settings_for(overrides: Overrides = (), config: str | os.PathLike[str] | None = None) -> Settings:
    """The settings `receval pipeline --config config --set ...` runs with: defaults, profiles, RECEVAL__* variables,
    and the `small` model profile once `make models` built it where no layer chose a profile (an explicit
    `models.profile` override still wins). Resolved by the stages' own path (jobs.infra.stage: with_built_models,
    then settings_of), so the scores land under the night's config hash."""
    return settings_of(_command_line(overrides, config))


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
        F.make_valid_utf8(text).alias(ingest_rows.RAW),
        F.is_valid_utf8(text).alias(ingest_rows.VALID_UTF8),
        F.lit(source).alias("source"),
        F.lit(None).cast("string").alias(ingest_rows.CTX),
    ).where(F.trim(F.col(ingest_rows.RAW)) != "")


def score_chains(
    chains: DataFrame,
    overrides: Overrides = (),
    *,
    config: str | os.PathLike[str] | None = None,
    json_column: str | None = None,
    source: str = "dataframe",
    write: bool = False,
    track: bool = False,
    force: bool = False,
) -> Scores:
    """Score the chains in a DataFrame: step scores (NLI: intra_entail, inter; PVI: intra_pvi, info_gain) and chain
    scores (min over steps, mean, worst step, API_k), as the nightly pipeline computes them.

    chains: rows in this project's shape (chain_id, context, steps or chain_text, answer, labels, ...), or any
      ingest preset's (name it: `ingest.preset=chat`, `lm_eval`, `vllm`, ...; `ingest.mapping.<field>=<path>`
      for other shapes). `json_column` names a column that holds each row as JSON text instead.
    overrides: settings as `--set` takes them (["models.profile=small"] or {"models.profile": "small"});
      `config`: a YAML file layered under them, as --config. Resolved as `receval pipeline` resolves them
      (settings_for): the `small` model profile once `make models` built it, unless a layer chose one.
    write: also insert the rows into the lake (paths.lake: chains, steps, contexts, step_scores, chain_scores,
      quarantine) the way the pipeline does (jobs.receval.chain_tables.insert: insert-only MERGEs, so chains already
      there under this config hash are kept, not scored twice into the tables). The write holds the lake's claim
      as a night does, from before anything is computed until the last table is written (released on an error
      too); `force`: take it even from a live run, as `--force` (logged; docs/OPERATIONS.md, Overlapping runs).
    track: one MLflow run ("score_chains") with the config and the counts.

    A missing model fails before any Spark job runs, naming the setting and how to provide it. With `write`, a
    lake another live run holds (a night, `maintain`) raises jobs.infra.claim.LakeBusy before anything is
    computed or written: the exception behind the CLI's busy exit, whose message is the line `receval pipeline`
    prints before it exits with status 75 (claim.EXIT_BUSY); with `track` too, the skipped run is recorded in
    MLflow as the CLI records it. Under `pipeline.on_busy=wait` it waits for the claim first, as a night does. A
    claim taken over while writing (another run's `--force`) raises claim.ClaimLost before the next table.
    """
    settings = settings_for(overrides, config)
    pipeline.prepare(settings)
    run_id = uuid.uuid4().hex  # the claim's holder and the MLflow run's local id, as a stage's run
    # Taken before any Spark job, as a night takes it before its session starts: a busy lake costs no scoring.
    held_lake = take_claim(settings, "score_chains", run_id, force, "score_chains" if track else None) if write else None
    try:
        result, contexts = _score(chains, settings, json_column, source)
        try:
            if write or track:
                _write_and_track(result, contexts, write, track, run_id, held_lake)
        except BaseException:
            result.release()
            raise
        return result
    finally:
        if held_lake is not None:
            claim.release(held_lake)


def _score(chains: DataFrame, settings: Settings, json_column: str | None, source: str) -> tuple[Scores, DataFrame]:
    """The night's transforms on a frame: ingest's validation and mapping, then the pipeline's own steps, scores
    and aggregate (pipeline._steps, score.score_steps and split as score.run, pipeline._aggregate). Returns the
    scores and the `contexts` rows; each frame that feeds two others is persisted in the Scores' holder, so the
    models run once."""
    held = tables.Held()
    try:
        on_error = settings.runtime.on_row_error
        checked = held(ingest_rows.check(raw_rows(chains, json_column, source), settings.ingest, on_error))
        valid, rejected = ingest.transform(checked, settings.ingest, on_error)
        valid = held(valid)
        steps, contexts, steps_bad = pipeline._steps(valid, settings, held)
        steps, contexts = held(steps), held(contexts)
        scored = held(score.score_steps(steps, contexts, settings))
        step_scores, score_bad = score.split(scored)
        step_scores = held(step_scores)
        chain_scores = pipeline._aggregate(step_scores, settings)
        quarantine = rejected.unionByName(steps_bad).unionByName(score_bad)
        scores = Scores(settings, settings.scoring_hash(), valid, steps, step_scores, chain_scores, quarantine,
                        _held=held)
        return scores, contexts
    except BaseException:
        held.__exit__(None, None, None)
        raise


def _write_and_track(result: Scores, contexts: DataFrame, write: bool, track: bool, run_id: str,
                     held_lake: claim.Claim | None) -> None:
    from jobs.infra.tracking import job_run

    settings, spark = result.settings, result.chains.sparkSession

    def counts() -> dict[str, int]:
        return {"chains": result.chains.count(), "steps": result.steps.count(),
                "scored_chains": result.chain_scores.count(), "quarantined": result.quarantine.count()}

    def insert() -> dict[str, int]:
        frames = {"chains": result.chains, "steps": result.steps, "contexts": contexts,
                  "step_scores": result.step_scores, "chain_scores": result.chain_scores,
                  "quarantine": result.quarantine}
        written = {}
        for name in chain_tables.CHAIN_TABLES:  # the night's tables and order: a chain's markers after its rows
            claim.check_held(settings)  # a claim taken over writes no further table, as a night's next batch
            written[name] = chain_tables.insert(spark, settings, name, frames[name])
        return written

    if not track:
        result.written = insert()
        return
    with job_run(settings, "score_chains", local_id=run_id) as tracked:
        if held_lake is not None:
            tracked.set_tags(claim_tags(held_lake.holder))
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
) -> pipeline.Summary:
    """The nightly pipeline (`receval pipeline`) on the lake at `lake`, from code: ingest `input` (default:
    ingest.input), steps, scores, aggregate, curate, the report; one MLflow parent run with a child per stage.
    Returns the pipeline's Summary (rows per table, stages, scores by label, the MLflow run id). Uses the active
    Spark session when there is one (a notebook's).

    It runs as `receval pipeline --set paths.lake=... --set ...` does, model profile included (settings_for), and
    ends as it ends: a lake another live run holds raises SystemExit(75) (claim.EXIT_BUSY) after the one line on
    the standard error, having written nothing; an expected failure (a commit conflict, a lost claim, ingest's
    quarantine limit) raises SystemExit with the CLI's one-line message."""
    lake = str(Path(lake))
    pairs = [f"paths.lake={lake}", f"paths.checkpoints={lake}/_checkpoints"]
    if input is not None:
        pairs.append(f"ingest.input={input}")
    return pipeline.main(_command_line(overrides, config, *pairs))
