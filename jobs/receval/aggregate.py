"""`step_scores` -> `chain_scores`: per (chain, config hash) each metric's min over steps, worst step, mean, API_k.

A chain is as good as its worst step (docs/design/RECEVAL.md "Per chain"), so the chain score is the min; the index of
that step (first on ties) says where the chain breaks. A metric that is null on any step of a chain (that
step's scoring failed or has not run yet) gives a null chain score, never a min over the steps that happen
to be there, which would flatter the chain. A sparse score (arith_valid: null on a step without an equation)
is the exception: its aggregations go over the steps that have a value, null when none has. A count's chain
score (arith_errors_total) is its sum, null when a step's count is. API_k(R) is the paper's definition: every
window of k consecutive info_gain values sums to > 0. A chain with fewer than k steps has one window, the whole chain, so API_k is
"sum(info_gain) > 0" for it (the window cannot be longer than the chain; an empty chain never reaches here).
`write` is the one write into `chain_scores`: the night's aggregate stage and score_chains(write=True) insert through it
(jobs.receval.chain_tables.insert), the standalone job (`run`) replaces.
"""

from __future__ import annotations

import logging

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.stage import Job, Stage
from jobs.receval.settings import AggregateSettings
from schemas import chain_scores as CS
from schemas import chains as C
from schemas import metrics as MR
from schemas import step_scores as SS

log = logging.getLogger(__spec__.name)

MODEL_COLS = [CS.NLI_MODEL, CS.PVI_MODEL, CS.PVI_NULL_MODEL, CS.IG_MODEL]


def _metric_aggs(metric: MR.Metric) -> list[Column]:
    """The chain_scores columns of one step score: one per aggregation it declares (min, worst step, mean,
    a count's total)."""
    value = F.col(metric.name)
    nulls = F.sum(F.when(value.isNull(), 1).otherwise(0))
    # min over struct(value, step_idx) gives the smallest value and, on ties, the smallest step index.
    worst = F.min(F.when(value.isNotNull(), F.struct(value.alias("v"), F.col(SS.STEP_IDX).alias("i"))))
    # A sparse score's null says "does not apply here": the chain's value is over the steps that have one.
    complete = F.lit(True) if metric.sparse else nulls == 0
    columns = {
        MR.MIN: F.when(complete, worst["v"]).alias(CS.min_col(metric.name)),
        MR.WORST_STEP: F.when(complete, worst["i"]).alias(CS.worst_step_col(metric.name)),
        MR.MEAN: F.when(complete, F.avg(value)).alias(CS.mean_col(metric.name)),
        MR.TOTAL: F.when(complete, F.sum(value)).cast("int").alias(CS.total_col(metric.name)),
    }
    return [column for agg, column in columns.items() if agg in metric.aggregations]


def api_k(gains: Column, k: int) -> Column:
    """API_k over an array of info_gain values in step order (null when the array holds a null)."""
    n = F.size(gains)
    window_sums = F.transform(
        F.sequence(F.lit(1), F.greatest(n - k + 1, F.lit(1))),
        lambda start: F.aggregate(F.slice(gains, start, k), F.lit(0.0), lambda acc, x: acc + x),
    )
    every = F.forall(window_sums, lambda s: s > 0)
    return F.when(F.exists(gains, lambda x: x.isNull()), F.lit(None).cast("boolean")).otherwise(every)


def transform(step_scores: DataFrame, cfg: AggregateSettings) -> DataFrame:
    """`step_scores` rows -> `chain_scores` rows (schema order). Pure: no reads or writes."""
    unknown = sorted(set(cfg.api_k) - set(CS.API_KS))
    if unknown:
        raise ValueError(f"aggregate.api_k: {unknown} have no column in chain_scores (allowed: {CS.API_KS})")
    api_metric = MR.api_metric()
    # array_sort on (step_idx, value) structs puts API_k's values in step order whatever the row order was.
    gains = ([F.array_sort(F.collect_list(F.struct(F.col(SS.STEP_IDX).alias("i"), F.col(api_metric.name).alias("g"))))
              .alias("_gains")] if api_metric is not None else [])
    grouped = step_scores.groupBy(*CS.KEYS).agg(
        F.count(F.lit(1)).cast("int").alias(CS.N_STEPS),
        *[agg for m in MR.of_table(MR.STEP_SCORES) for agg in _metric_aggs(m)],
        *gains,
        *[F.max(c).alias(c) for c in MODEL_COLS],
        F.max(SS.SCORED_AT).alias(CS.SCORED_AT),
    )
    out = grouped
    if api_metric is not None:
        values = F.transform(F.col("_gains"), lambda s: s["g"])
        for k in CS.API_KS:
            value = api_k(values, k) if k in cfg.api_k else F.lit(None).cast("boolean")
            out = out.withColumn(CS.api_col(k), value)
    return tables.conform(out, CS.schema())


def label_score_cols() -> list[str]:
    """The chain scores a nightly summary shows per label group: each step score's min over steps, e.g.
    correctness (intra-step entailment, inter-step) and informativeness (intra-step PVI, information gain)."""
    return CS.score_columns()


ALL_CHAINS = "all"  # the label column of a dataset's row over all its chains


def by_label(scores: DataFrame, chains: DataFrame) -> DataFrame:
    """Mean chain scores per dataset and per (label, value) of the chains' `labels` (1 = no error, 0 = error,
    ratings as given), beside each dataset's row over all its chains (label "all", value null). Columns:
    dataset, label, value, chains, and the mean of each label_score_cols() column (nulls left out). Pure."""
    cols = label_score_cols()
    joined = scores.select(CS.CHAIN_ID, *cols).join(
        chains.select(C.CHAIN_ID, C.DATASET, C.LABELS), CS.CHAIN_ID)
    labelled = joined.select(C.DATASET, F.explode(C.LABELS).alias("label", "value"), *cols)
    overall = joined.select(C.DATASET, F.lit(ALL_CHAINS).alias("label"), F.lit(None).cast("double").alias("value"),
                            *cols)
    return (overall.unionByName(labelled.where(F.col("value").isNotNull()))
            .groupBy(C.DATASET, "label", "value")
            .agg(F.count(F.lit(1)).alias("chains"), *[F.avg(c).alias(c) for c in cols])
            .orderBy(C.DATASET, F.col("label") != ALL_CHAINS, "label", F.col("value").desc()))


def write(spark: SparkSession, settings: Settings, rows: DataFrame, replace: bool = False) -> int | None:
    """Write `rows` into `chain_scores` by CS.KEYS (chain, config hash), under the contract as the registry declares
    it now (CS.schema()). Every writer of the table writes through here.

    Insert-only (the default; the night's aggregate stage and score_chains(write=True), through chain_tables.insert): a
    key the table holds keeps its row, so a rerun, or a retry after a concurrent commit, inserts only what is
    missing; returns the rows inserted. `replace` (the standalone job, `run`, which recomputes every chain from
    `step_scores`): a key already there gets the new row, so a rescored step changes its chain's scores and a rerun
    leaves the table as it was (an upsert); returns None (the upsert counts nothing).
    """
    path = settings.table("chain_scores")
    if replace:
        tables.upsert(spark, rows, path, CS.schema(), CS.KEYS)
        return None
    return tables.insert_new(spark, rows, path, CS.schema(), CS.KEYS)


def run(spark: SparkSession, settings: Settings) -> dict[str, int]:
    """Aggregate every (chain, config hash) in `step_scores` into `chain_scores` (`write` with replace: a rerun
    rewrites the same rows, a rescored step's chain gets its new scores)."""
    steps = tables.read(spark, settings.table("step_scores"), SS.SCHEMA)
    with tables.Held() as hold:
        chains = hold(transform(steps, settings.aggregate))
        counts = {
            "chains": chains.count(),
            # A sparse score is null on a chain it does not apply to (no equation): not a sign of a missing step.
            "incomplete": chains.where(
                F.greatest(*[F.col(MR.chain_score_column(m)).isNull() for m in MR.of_table(MR.STEP_SCORES)
                             if not m.sparse])
            ).count(),
        }
        write(spark, settings, chains, replace=True)
    return counts


def _body(job: Job) -> dict[str, int]:
    spark, settings, tracked = job.spark, job.settings, job.tracked
    counts = run(spark, settings)
    tracked.log_metrics({f"rows_{k}": v for k, v in counts.items()})
    tracked.set_tags({"chain_scores_version": tables.version(spark, settings.table("chain_scores"))})
    log.info(f"[aggregate] chains={counts['chains']} with a null metric={counts['incomplete']}")
    return counts


STAGE = Stage("aggregate", __doc__, _body, reads=("step_scores",), writes=("chain_scores",), section="aggregate")


def main(argv: list[str] | None = None) -> dict[str, int]:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
