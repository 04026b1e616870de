"""`chain_scores` + `baseline_scores` joined to `chains` labels -> `meta_eval` (Somers' D with 95% CIs).

Every (dataset, label, metric) group gets D(score | label): label 1 = clean (or a higher rating), scores are
higher-is-better (a count's total, arith_errors_total, enters negated), so D > 0 means the metric ranks clean
chains higher. A chain whose score is null (arith_valid_min: no checkable equation) is left out of that group. Groups up to
`meta_eval.spark_threshold` rows (and every ordinal label) are collected and computed on the driver with
`scipy.stats.somersd(label, score)`, CI from a seeded label-stratified bootstrap; larger binary groups stay in
Spark: D = 2*AUC - 1 from per-score-value counts (ties 1/2), CI from DeLong's variance of the AUC. A markdown
correlation table and a heatmap PNG go to MLflow.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType
from scipy import stats

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.progress import Progress
from jobs.infra.stage import Job, Stage
from jobs.metaeval import somers
from jobs.metaeval.settings import MetaEvalSettings
from schemas import baseline_scores as B
from schemas import chain_scores as CS
from schemas import chains as C
from schemas import meta_eval as M
from schemas import metrics as MR
from schemas import step_labels as SL

GROUP_KEYS = [M.DATASET, M.LABEL, M.METRIC]
KEYS = [*GROUP_KEYS, M.CONFIG_HASH]
VALUE, SCORE = "label_value", "score"

_RESULT = StructType(
    [
        StructField(M.DATASET, StringType(), False),
        StructField(M.LABEL, StringType(), False),
        StructField(M.METRIC, StringType(), False),
        StructField(M.SOMERS_D, DoubleType(), True),
        StructField(M.CI_LOW, DoubleType(), True),
        StructField(M.CI_HIGH, DoubleType(), True),
        StructField(M.N, LongType(), False),
        StructField(M.N_ERRORS, LongType(), False),
        StructField(M.METHOD, StringType(), False),
    ]
)


def melt(wide: DataFrame, keys: Sequence[str], metrics: Sequence[str]) -> DataFrame:
    """One column per metric -> (*keys, metric, score as double), a row per key and metric; no metric: no rows
    (DataFrame.unpivot refuses an empty list, and meta-evaluating baselines alone passes one)."""
    pairs = F.array(*[F.struct(F.lit(m).alias("m"), F.col(m).cast("double").alias("s")) for m in metrics])
    return wide.select(*keys, F.explode(pairs).alias("p")).select(
        *keys, F.col("p.m").alias(M.METRIC), F.col("p.s").alias(SCORE)
    )


def melt_chain_scores(chain_scores: DataFrame, metrics: Sequence[str], config_hash: str) -> DataFrame:
    """chain_scores (one config hash) -> (chain_id, metric, score); booleans (API_k) count as 0/1, a lower-is-better
    count's total (MR.lower_is_better_columns) is negated."""
    unknown = sorted(set(metrics) - set(CS.schema().fieldNames()))
    if unknown:
        raise ValueError(f"meta_eval.metrics: {unknown} are not chain_scores columns")
    lower = MR.lower_is_better_columns() & set(metrics)
    scores = chain_scores.where(F.col(CS.CONFIG_HASH) == config_hash)
    scores = scores.select(*[(-F.col(c)).alias(c) if c in lower else F.col(c) for c in scores.columns])
    return melt(scores, [CS.CHAIN_ID], metrics)


def long_frame(scores: DataFrame, chains: DataFrame, datasets: Sequence[str] | None = None) -> DataFrame:
    """(dataset, label, metric, chain_id, label_value, score) for every labelled chain with a finite score.

    Not `first_error_index` (ProcessBench, step-labelled sets): a step's position, not a rating, so no order of
    chains by quality (-1 is the best, 0 the worst); its evaluation is localise's."""
    labels = chains.select(C.CHAIN_ID, C.DATASET, F.explode(C.LABELS).alias(M.LABEL, VALUE))
    labels = labels.where(F.col(M.LABEL) != SL.FIRST_ERROR_INDEX)
    if datasets:
        labels = labels.where(F.col(C.DATASET).isin(list(datasets)))
    finite = F.col(SCORE).isNotNull() & ~F.isnan(SCORE) & (F.abs(F.col(SCORE)) != float("inf"))
    return (
        labels.where(F.col(VALUE).isNotNull() & ~F.isnan(VALUE))
        .join(scores.where(finite), C.CHAIN_ID)
        .select(F.col(C.DATASET).alias(M.DATASET), M.LABEL, M.METRIC, C.CHAIN_ID, VALUE, SCORE)
    )


def spark_auc(long: DataFrame, level: float = 0.95) -> DataFrame:
    """Binary groups: D = 2*AUC - 1 (ties 1/2) and a DeLong CI, all in Spark (no collect of the rows).

    Per group and distinct score v with pos(v) clean and neg(v) error rows: a clean row's placement is
    V10 = (errors below v + neg(v)/2) / n0, an error row's is V01 = (clean above v + pos(v)/2) / n1;
    AUC = mean V10, Var(AUC) = Var(V10)/n1 + Var(V01)/n0 (DeLong et al., 1988).
    """
    z = float(stats.norm.ppf(0.5 + level / 2))
    g = Window.partitionBy(*GROUP_KEYS)
    below = g.orderBy(SCORE).rowsBetween(Window.unboundedPreceding, -1)
    levels = long.groupBy(*GROUP_KEYS, SCORE).agg(
        F.sum(F.when(F.col(VALUE) == 1, 1).otherwise(0)).cast("double").alias("pos"),
        F.sum(F.when(F.col(VALUE) == 0, 1).otherwise(0)).cast("double").alias("neg"),
    )
    levels = (
        levels.withColumn("n1", F.sum("pos").over(g))
        .withColumn("n0", F.sum("neg").over(g))
        .withColumn("neg_below", F.coalesce(F.sum("neg").over(below), F.lit(0.0)))
        .withColumn("pos_below", F.coalesce(F.sum("pos").over(below), F.lit(0.0)))
        .withColumn("v10", (F.col("neg_below") + F.col("neg") / 2) / F.col("n0"))
        .withColumn("v01", (F.col("n1") - F.col("pos_below") - F.col("pos") + F.col("pos") / 2) / F.col("n1"))
        .withColumn("auc", F.sum(F.col("pos") * F.col("v10")).over(g) / F.col("n1"))
    )
    agg = levels.groupBy(*GROUP_KEYS).agg(
        F.first("auc").alias("auc"),
        F.first("n1").alias("n1"),
        F.first("n0").alias("n0"),
        F.sum(F.col("pos") * (F.col("v10") - F.col("auc")) ** 2).alias("ss10"),
        F.sum(F.col("neg") * (F.col("v01") - F.col("auc")) ** 2).alias("ss01"),
        F.count(F.lit(1)).alias("distinct_scores"),
    )
    defined = (F.col("n1") > 0) & (F.col("n0") > 0) & (F.col("distinct_scores") > 1)
    var = F.col("ss10") / (F.col("n1") - 1) / F.col("n1") + F.col("ss01") / (F.col("n0") - 1) / F.col("n0")
    d = 2 * F.col("auc") - 1
    half = 2 * z * F.sqrt(var)
    return agg.select(
        *GROUP_KEYS,
        F.when(defined, d).alias(M.SOMERS_D),
        F.when(defined & (F.col("n1") > 1) & (F.col("n0") > 1), F.greatest(d - half, F.lit(-1.0))).alias(M.CI_LOW),
        F.when(defined & (F.col("n1") > 1) & (F.col("n0") > 1), F.least(d + half, F.lit(1.0))).alias(M.CI_HIGH),
        (F.col("n1") + F.col("n0")).cast("long").alias(M.N),
        F.col("n0").cast("long").alias(M.N_ERRORS),
        F.lit("spark_auc").alias(M.METHOD),
    )


def driver_somers(
    spark: SparkSession, long: DataFrame, resamples: int, seed: int, level: float, every: float = 30.0
) -> DataFrame:
    """Small or ordinal groups: collected, scipy.stats.somersd(label, score) and a stratified bootstrap CI."""
    groups = long.groupBy(*GROUP_KEYS).agg(
        F.collect_list(F.struct(C.CHAIN_ID, VALUE, SCORE)).alias("rows")
    ).collect()
    out = []
    # The bootstrap runs on the driver, one group at a time: groups done, rate and ETA in the log.
    with Progress("meta_eval", len(groups), "groups", every, spark) as progress:
        for g in groups:
            # Sorted by chain id: the bootstrap draws then do not depend on Spark's collect order.
            rows = sorted(g["rows"], key=lambda r: r[C.CHAIN_ID])
            y = [r[VALUE] for r in rows]
            s = [r[SCORE] for r in rows]
            d = somers.somers_d(y, s)
            low, high = somers.bootstrap_ci(y, s, resamples, seed, level)
            top = max(y)
            out.append((
                g[M.DATASET], g[M.LABEL], g[M.METRIC],
                None if math.isnan(d) else d, None if math.isnan(low) else low, None if math.isnan(high) else high,
                len(y), sum(1 for v in y if (v == 0 if somers.is_binary(y) else v < top)), "scipy",
            ))
            progress.commit(1)
    return spark.createDataFrame(out, _RESULT)


def transform(spark: SparkSession, chain_scores: DataFrame, chains: DataFrame, baseline_scores: DataFrame | None,
              cfg: MetaEvalSettings, scoring_hash: str, progress_seconds: float,
              hold: tables.Held | None = None) -> DataFrame:
    """Scores and labels -> `meta_eval` rows (schema order); no table reads or writes. The chain scores of
    `cfg.config_hash`, else of `scoring_hash` (the current configuration's); a progress line at least every
    `progress_seconds` (log.progress_seconds). With `hold`, the long frame (read once per group size and once
    per method) is persisted until the holder releases it."""
    config_hash = cfg.config_hash or scoring_hash
    scores = melt_chain_scores(chain_scores, cfg.metrics, config_hash)
    if baseline_scores is not None and cfg.include_baselines:
        scores = scores.unionByName(baseline_scores.select(B.CHAIN_ID, B.METRIC, B.SCORE))
    long = long_frame(scores, chains, cfg.datasets)
    long = hold(long) if hold is not None else long
    sizes = long.groupBy(*GROUP_KEYS).agg(
        F.count(F.lit(1)).alias("_n"),
        F.max(F.when(~F.col(VALUE).isin(0.0, 1.0), 1).otherwise(0)).alias("_ordinal"),
    )
    tagged = long.join(sizes, GROUP_KEYS)
    big = (F.col("_n") > cfg.spark_threshold) & (F.col("_ordinal") == 0)
    results = driver_somers(spark, tagged.where(~big), cfg.bootstrap_resamples, cfg.seed, cfg.ci_level,
                            progress_seconds)
    results = results.unionByName(spark_auc(tagged.where(big), cfg.ci_level))
    out = results.withColumn(M.CONFIG_HASH, F.lit(config_hash)).withColumn(M.RUN_ID, F.lit(None).cast("string"))
    return tables.conform(out.withColumn(M.COMPUTED_AT, tables.now()), M.SCHEMA)


# ---------------------------------------------------------------------------------------------- reports
def _row_order(metric: str) -> tuple[bool, str]:
    """ReCEval's chain scores first, then the baselines, each by name."""
    return metric in MR.names(MR.BASELINE_SCORES), metric


def _fmt(d: float | None, low: float | None, high: float | None) -> str:
    if d is None:
        return "n/a"
    return f"{d:.2f} [{low:.2f}, {high:.2f}]" if low is not None and high is not None else f"{d:.2f}"


def markdown_table(rows: list[dict]) -> str:
    """Metrics as rows, labels as columns, "D [CI]" cells, ROSCOE family-best rows: one table for the
    datasets that carry a single label (the EB-challenge types side by side), one per other dataset."""
    parts = []
    datasets = sorted({r[M.DATASET] for r in rows})
    single = [d for d in datasets if len({r[M.LABEL] for r in rows if r[M.DATASET] == d}) == 1]
    groups = ([("single-label datasets", single)] if len(single) > 1 else []) + [
        (d, [d]) for d in datasets if len(single) <= 1 or d not in single
    ]
    for title, members in groups:
        mine = [r | {M.LABEL: r[M.LABEL] if len(members) == 1 else f"{r[M.DATASET]}:{r[M.LABEL]}"}
                for r in rows if r[M.DATASET] in members]
        dataset = title
        labels = sorted({r[M.LABEL] for r in mine})
        metrics = sorted({r[M.METRIC] for r in mine}, key=_row_order)
        cell = {(r[M.METRIC], r[M.LABEL]): r for r in mine}
        n = {lab: max(r[M.N] for r in mine if r[M.LABEL] == lab) for lab in labels}
        errors = {lab: max(r[M.N_ERRORS] for r in mine if r[M.LABEL] == lab) for lab in labels}
        lines = [f"### {dataset}", "", "| metric | " + " | ".join(f"{lab} (n={n[lab]}, err={errors[lab]})"
                                                                   for lab in labels) + " |",
                 "|---|" + "---|" * len(labels)]
        for metric in metrics:
            values = [cell.get((metric, lab)) for lab in labels]
            lines.append(f"| {metric} | " + " | ".join(
                _fmt(v[M.SOMERS_D], v[M.CI_LOW], v[M.CI_HIGH]) if v else "" for v in values) + " |")
        for family, names in B.GROUPS.items():
            best = []
            for lab in labels:
                found = [cell[(m, lab)] for m in names if (m, lab) in cell and cell[(m, lab)][M.SOMERS_D] is not None]
                top = max(found, key=lambda r: r[M.SOMERS_D]) if found else None
                best.append(f"{top[M.SOMERS_D]:.2f} ({top[M.METRIC].split('_', 2)[-1]})" if top else "")
            if any(best):
                lines.append(f"| **{family}** (best) | " + " | ".join(best) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def heatmap_png(rows: list[dict]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    columns = sorted({(r[M.DATASET], r[M.LABEL]) for r in rows})
    metrics = sorted({r[M.METRIC] for r in rows}, key=_row_order)
    grid = np.full((len(metrics), len(columns)), np.nan)
    for r in rows:
        if r[M.SOMERS_D] is not None:
            grid[metrics.index(r[M.METRIC]), columns.index((r[M.DATASET], r[M.LABEL]))] = r[M.SOMERS_D]
    fig, ax = plt.subplots(figsize=(1.0 + 0.7 * len(columns), 1.0 + 0.35 * len(metrics)))
    image = ax.imshow(grid, cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
    ax.set_xticks(range(len(columns)), [f"{d}\n{lab}" for d, lab in columns], rotation=90, fontsize=6)
    ax.set_yticks(range(len(metrics)), metrics, fontsize=6)
    for i in range(len(metrics)):
        for j in range(len(columns)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=5)
    fig.colorbar(image, ax=ax, label="Somers' D")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=150)
    plt.close(fig)
    return buf.getvalue()


def run(spark: SparkSession, settings: Settings, run_id: str | None = None) -> list[dict]:
    chain_scores = tables.read(spark, settings.table("chain_scores"), CS.SCHEMA)
    chains = tables.read(spark, settings.table("chains"), C.SCHEMA)
    baseline = tables.read(spark, settings.table("baseline_scores"), B.SCHEMA)
    with tables.Held() as hold:
        result = transform(spark, chain_scores, chains, baseline, settings.meta_eval, settings.scoring_hash(),
                           settings.log.progress_seconds, hold).withColumn(M.RUN_ID, F.lit(run_id))
        result = hold(result)
        tables.upsert(spark, result, settings.table("meta_eval"), M.SCHEMA, KEYS)
        return [r.asDict() for r in result.collect()]


def _body(job: Job) -> list[dict]:
    spark, settings, tracked = job.spark, job.settings, job.tracked
    rows = run(spark, settings, tracked.local_id)
    table = markdown_table(rows)
    tracked.log_text("meta_eval/correlations.md", table)
    if rows:
        tracked.log_bytes("meta_eval/heatmap.png", heatmap_png(rows))
    tracked.log_metrics({"groups": len(rows)})
    print(table)
    return rows


STAGE = Stage("meta_eval", __doc__, _body, reads=("chain_scores", "chains", "baseline_scores"), writes=("meta_eval",),
              section="meta_eval")


def main(argv: list[str] | None = None) -> list[dict]:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
