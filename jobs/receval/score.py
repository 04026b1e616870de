"""`steps` + `contexts` -> `step_scores`: NLI and PVI scores joined per step, and the arithmetic check of each
step's text (jobs/receval/arith_scores.py: no model); chains with a failed step -> `quarantine`.

A chain is scored whole or not at all: a step whose NLI or PVI scoring raised (an `error` column from the
scoring transforms) or produced no row quarantines every step of its chain, so `chain_scores` never takes a
min over the steps that happened to survive.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from jobs.infra import tables
from jobs.infra.config import ModelRef, Settings
from jobs.infra.progress import counted, counter
from jobs.infra.stage import Stage
from jobs.receval import arith_scores, nli_scores, pvi_scores, scores_table
from schemas import step_scores as SS
from schemas import steps as ST
from udfs.runtime import resolve_model_path

ERROR = "error"
QUARANTINE_STAGE = "score"

ScoreFn = Callable[[DataFrame, DataFrame, Settings], DataFrame]


def _nli(steps: DataFrame, contexts: DataFrame, settings: Settings) -> DataFrame:
    # The pairs the model scored move the pipeline's progress line (none reports: no accumulator).
    pairs = counter("NLI pairs")
    return nli_scores.transform(steps, contexts, settings.nli, settings.models.nli, settings.runtime,
                                embedding=settings.models.embedding, accumulators=(pairs,) if pairs else ())


def _pvi(steps: DataFrame, contexts: DataFrame, settings: Settings) -> DataFrame:
    return pvi_scores.transform(steps, contexts, settings.pvi, settings.models, settings.runtime,
                                sent=counter("LM passes"))


def nli_revision(settings: Settings) -> str | None:
    """The NLI model's revision: configured, else a fingerprint of the weights (jobs.receval.nli_scores)."""
    ref = settings.models.nli
    return nli_scores.model_revision(ref, resolve_model_path(ref.path))


def _model_id(ref: ModelRef, real: bool) -> str:
    """The id the PVI job writes (path@revision) when the real transform ran; the configured path otherwise."""
    return pvi_scores.model_id(ref) if real else ref.path


def _scores_with_error(df: DataFrame, columns: list[str], marker: str, optional: tuple[str, ...] = ()) -> DataFrame:
    """Keep the contract columns, an error column (null when the transform has none) and a row marker.

    `optional` columns are null when the transform does not report them (a flag it has no notion of)."""
    error = F.col(ERROR).cast("string") if ERROR in df.columns else F.lit(None).cast("string")
    extra = [F.col(c) if c in df.columns else F.lit(None).alias(c) for c in optional]
    return df.select(
        SS.CHAIN_ID, SS.STEP_IDX, *columns, *extra, error.alias(f"_{marker}_error"), F.lit(True).alias(f"_{marker}_row")
    )


def score_steps(
    steps: DataFrame,
    contexts: DataFrame,
    settings: Settings,
    nli: ScoreFn | None = None,
    pvi: ScoreFn | None = None,
) -> DataFrame:
    """One row per step: the step_scores columns plus `error` (null when the step scored). Pure."""
    # Each part counts the steps it finished: a batch of one long chain moves as its NLI, then its PVI part ends.
    nli_df = _scores_with_error(counted((nli or _nli)(steps, contexts, settings), "NLI"),
                                SS.NLI_SCHEMA.fieldNames()[2:], "nli")
    pvi_df = _scores_with_error(counted((pvi or _pvi)(steps, contexts, settings), "PVI"),
                                SS.PVI_SCHEMA.fieldNames()[2:], "pvi", optional=(SS.PVI_TRUNCATED,))
    keys = steps.select(ST.CHAIN_ID, ST.STEP_IDX, ST.CONFIG_HASH, *arith_scores.columns(F.col(ST.STEP_TEXT)),
                        F.to_json(F.struct(*steps.columns)).alias("_raw"))
    joined = keys.join(nli_df, [SS.CHAIN_ID, SS.STEP_IDX], "left").join(pvi_df, [SS.CHAIN_ID, SS.STEP_IDX], "left")
    error = F.coalesce(
        F.when(F.col("_nli_error").isNotNull(), F.concat(F.lit("nli: "), F.col("_nli_error"))),
        F.when(F.col("_pvi_error").isNotNull(), F.concat(F.lit("pvi: "), F.col("_pvi_error"))),
        F.when(F.col("_nli_row").isNull(), F.lit("nli: no score for the step")),
        F.when(F.col("_pvi_row").isNull(), F.lit("pvi: no score for the step")),
    )
    models = settings.models
    return joined.select(
        *[c for c in SS.SCHEMA.fieldNames() if c not in (SS.NLI_MODEL, SS.NLI_REVISION, SS.PVI_MODEL,
                                                          SS.PVI_NULL_MODEL, SS.IG_MODEL, SS.SCORED_AT)],
        F.lit(models.nli.path).alias(SS.NLI_MODEL),
        F.lit(nli_revision(settings) if nli is None else models.nli.revision).cast("string").alias(SS.NLI_REVISION),
        F.lit(_model_id(models.pvi_g, pvi is None)).alias(SS.PVI_MODEL),
        F.lit(_model_id(models.pvi_null, pvi is None)).alias(SS.PVI_NULL_MODEL),
        F.lit(_model_id(models.info_gain, pvi is None)).alias(SS.IG_MODEL),
        tables.now().alias(SS.SCORED_AT),
        error.alias(ERROR),
        F.col("_raw"),
    )


def _reason(error: Column) -> Column:
    return (
        F.when(error.startswith("nli: no score") | error.startswith("pvi: no score"), "missing_score")
        .when(error.startswith("nli: "), "nli_error")
        .otherwise("pvi_error")
    )


def split(scored: DataFrame, run_id: str | None = None) -> tuple[DataFrame, DataFrame]:
    """score_steps rows -> (step_scores of fully scored chains, quarantine rows for the other chains' steps)."""
    chain = Window.partitionBy(SS.CHAIN_ID, SS.CONFIG_HASH)
    flagged = scored.withColumn("_chain_failed", F.max(F.col(ERROR).isNotNull()).over(chain))
    good = tables.conform(flagged.where(~F.col("_chain_failed")), SS.SCHEMA)
    failed = flagged.where(F.col("_chain_failed"))
    bad = tables.quarantine_rows(
        failed,
        QUARANTINE_STAGE,
        F.when(F.col(ERROR).isNull(), F.lit("chain_has_failed_step")).otherwise(_reason(F.col(ERROR))),
        F.coalesce(F.col(ERROR), F.lit("another step of this chain failed to score")),
        chain_id=F.col(SS.CHAIN_ID),
        raw=F.col("_raw"),
        source=F.concat(F.lit("config_hash:"), F.col(SS.CONFIG_HASH)),
        run_id=run_id,
    )
    return good, bad


def transform(
    steps: DataFrame,
    contexts: DataFrame,
    settings: Settings,
    nli: ScoreFn | None = None,
    pvi: ScoreFn | None = None,
) -> tuple[DataFrame, DataFrame]:
    """(steps, contexts) -> (step_scores rows, quarantine rows). Pure: no reads or writes.

    Callers that write both outputs should persist `score_steps(...)` and `split` it, so the models run once.
    """
    return split(score_steps(steps, contexts, settings, nli, pvi))


def run(
    spark: SparkSession,
    settings: Settings,
    steps: DataFrame,
    contexts: DataFrame,
    run_id: str | None = None,
    nli: ScoreFn | None = None,
    pvi: ScoreFn | None = None,
) -> dict[str, int]:
    """Score the given steps into `step_scores` (whole rows: scores_table.write, insert-only) and quarantine
    failures."""
    with tables.Held() as hold:
        # Counted as scored: the pipeline's progress moves per finished partition, inside a batch.
        scored = hold(counted(score_steps(steps, contexts, settings, nli, pvi)))
        if settings.runtime.on_row_error == "fail":
            first = scored.where(F.col(ERROR).isNotNull()).select(SS.CHAIN_ID, SS.STEP_IDX, ERROR).first()
            if first is not None:
                raise RuntimeError(
                    f"scoring failed for chain {first[0]} step {first[1]}: {first[2]} "
                    "(runtime.on_row_error=fail; set it to quarantine to score the other rows)"
                )
        good, bad = split(scored, run_id)
        counts = {"written": scores_table.write(spark, settings, good), **tally(scored)}
        if counts["quarantined"]:
            tables.append_quarantine(spark, settings, bad)
    return counts


def tally(scored: DataFrame) -> dict[str, int]:
    """score_steps rows -> steps, quarantined (the steps of chains with a failed step, as `split` sends them)
    and truncated (the kept steps scored on a cut input: the night's summary shows how many); one Spark job
    where three counts cost three per batch."""
    chains = scored.groupBy(SS.CHAIN_ID, SS.CONFIG_HASH).agg(
        F.count(F.lit(1)).alias("n"),
        F.max(F.col(ERROR).isNotNull()).alias("failed"),
        F.count(F.when(F.col(SS.PVI_TRUNCATED).cast("boolean"), 1)).alias("cut"),  # void when not reported
    )
    row = chains.agg(
        F.sum("n").alias("steps"),
        F.sum(F.when(F.col("failed"), F.col("n")).otherwise(0)).alias("quarantined"),
        F.sum(F.when(~F.col("failed"), F.col("cut")).otherwise(0)).alias("truncated"),
    ).first()
    return {key: int(row[key] or 0) for key in ("steps", "quarantined", "truncated")}


# A part of the nightly pipeline only (it scores the chains the pipeline hands it); `python -m
# jobs.receval.nli_scores` and `jobs.receval.pvi_scores` score a whole steps table on their own.
STAGE = Stage("scores", __doc__, reads=("steps", "contexts"), writes=("step_scores", "quarantine"))
