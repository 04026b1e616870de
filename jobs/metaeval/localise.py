"""`step_scores` + `chains` (first_error_index) + `step_labels` (first_error) -> `localisation` and
`localisation_predictions`: does each step score find a chain's earliest erroneous step? (ProcessBench)

Per metric (each step score, optional per-step baselines, and `receval_rank_min`, the per-step min of the ReCEval
scores rank-normalised over the calibration subset), the F1-best threshold on the calibration subset
(`localise.calibration`, default GSM8K: the paper's protocol) is applied unchanged to every subset: the predicted
earliest error is the first step scoring below it, else -1. Reported per subset: ProcessBench's acc_error,
acc_correct and F1 (equal to the official run_eval.py on the predictions written beside them), the per-step
AUROC of "earliest error" vs "a step before it" with a chain-bootstrap CI, and the worst step's hit rate beside
a random step's. The join and the per-chain step collection run in Spark; the per-metric maths
(jobs/metaeval/localise_maths.py) runs on the driver over the collected per-chain arrays (~10k steps for
ProcessBench's two subsets).

Chains whose labels cannot be used go to `quarantine` (stage localise) with a reason; read = evaluated + not
scored under the config hash + quarantined.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, IntegerType, StringType, StructField, StructType

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.stage import Job, Stage
from jobs.metaeval import localise_maths as L
from jobs.metaeval.meta_eval import melt
from jobs.metaeval.settings import LocaliseSettings
from schemas import chains as C
from schemas import localisation as LO
from schemas import metrics as MR
from schemas import step_labels as SL
from schemas import step_scores as SS

log = logging.getLogger(__spec__.name)

QUARANTINE_STAGE = "localise"
METRIC, SCORE, LABEL, N_STEPS = "metric", "score", "label", "n_steps"
# The long per-step form a baseline table gives and step_scores is melted into.
LONG_SCHEMA = StructType([
    StructField(SS.CHAIN_ID, StringType(), False), StructField(SS.STEP_IDX, IntegerType(), False),
    StructField(METRIC, StringType(), False), StructField(SCORE, DoubleType(), True),
])


def melt_step_scores(step_scores: DataFrame, metrics: Sequence[str], config_hash: str) -> DataFrame:
    """step_scores (one config hash) -> (chain_id, step_idx, metric, score)."""
    known = [m.name for m in MR.ranked_step_scores()]  # a step is flagged below a threshold: higher-is-better
    unknown = sorted(set(metrics) - set(known))
    if unknown:
        raise ValueError(f"localise.metrics: {unknown} are not higher-is-better step_scores metrics "
                         f"({sorted(known)})")
    return melt(step_scores.where(F.col(SS.CONFIG_HASH) == config_hash), [SS.CHAIN_ID, SS.STEP_IDX], metrics)


def _reason(given: Column, from_steps: Column, several: Column, n_steps: Column) -> Column:
    """Why a chain's labels cannot be used, or null: `given` is chains' label, `from_steps` step_labels' one."""
    label = F.coalesce(given, from_steps)
    return (F.when(n_steps.isNull(), F.lit("no_steps"))
            .when(several, F.lit("several_first_errors"))
            .when(label != F.floor(label), F.lit("first_error_not_integer"))
            .when((label < -1) | (label >= n_steps), F.lit("first_error_outside_steps"))
            .when(given.isNotNull() & from_steps.isNotNull() & (given != from_steps), F.lit("first_error_disagrees")))


def labelled_chains(chains: DataFrame, step_labels: DataFrame, datasets: Sequence[str] | None) -> DataFrame:
    """Every chain with an earliest-error label: (chain_id, dataset, n_steps, label, reason). The label is
    chains.labels[first_error_index]; step_labels' first_error rows (the 0.0 step, or -1 when every judged step
    is 1.0) must agree with it, and label a chain that lacks it. `reason` (null = usable) says what is wrong."""
    labels = chains.select(
        C.CHAIN_ID, C.DATASET, F.size(C.STEPS).alias(N_STEPS),
        F.col(C.LABELS).getItem(SL.FIRST_ERROR_INDEX).alias("chain_label"),
    )
    by_steps = (step_labels.where(F.col(SL.LABEL) == SL.FIRST_ERROR).groupBy(SL.CHAIN_ID).agg(
        F.min(F.when(F.col(SL.VALUE) == 0, F.col(SL.STEP_IDX))).alias("first_zero"),
        F.count(F.when(F.col(SL.VALUE) == 0, 1)).alias("zeros"),
    ).select(SL.CHAIN_ID, F.coalesce(F.col("first_zero"), F.lit(-1)).cast("double").alias("step_label"),
             (F.col("zeros") > 1).alias("several")))
    # size() of a null array is -1 (legacy) or null (ANSI): either way no steps.
    joined = labels.join(by_steps, C.CHAIN_ID, "left").withColumn(
        N_STEPS, F.when(F.col(N_STEPS) > 0, F.col(N_STEPS)))
    joined = joined.where(F.col("chain_label").isNotNull() | F.col("step_label").isNotNull())
    if datasets:
        joined = joined.where(F.col(C.DATASET).isin(list(datasets)))
    label = F.coalesce(F.col("chain_label"), F.col("step_label"))
    return joined.select(
        C.CHAIN_ID, C.DATASET, N_STEPS, label.alias(LABEL), F.col("step_label"),
        _reason(F.col("chain_label"), F.col("step_label"), F.coalesce(F.col("several"), F.lit(False)),
                F.col(N_STEPS)).alias("reason"),
    )


def per_chain(long: DataFrame, labelled: DataFrame) -> DataFrame:
    """`labelled` rows joined to (metric, steps: [(step_idx, score)] sorted) per scored metric; a chain without
    step scores under the config hash comes once, with a null metric."""
    steps = long.groupBy(SS.CHAIN_ID, METRIC).agg(
        F.array_sort(F.collect_list(F.struct(F.col(SS.STEP_IDX).alias("i"), F.col(SCORE).alias("s")))).alias("steps"))
    return labelled.join(steps, C.CHAIN_ID, "left")


@dataclass
class Item:
    """One chain on the driver: its label and, per metric, its step scores (NaN where a step has none)."""

    chain_id: str
    dataset: str
    label: int
    n_steps: int
    scores: dict[str, np.ndarray] = field(default_factory=dict)


def items_of(rows: Sequence) -> list[Item]:
    """Collected `per_chain` rows -> Items, sorted by chain id (the bootstrap then does not depend on the
    collect order). A step index outside the chain's steps is ignored (it has no place in the chain)."""
    out: dict[str, Item] = {}
    for r in rows:
        item = out.setdefault(r[C.CHAIN_ID], Item(r[C.CHAIN_ID], r[C.DATASET], int(r[LABEL]), r[N_STEPS]))
        dense = np.full(item.n_steps, math.nan)
        for step in r["steps"]:
            if 0 <= step["i"] < item.n_steps and step["s"] is not None:
                dense[step["i"]] = step["s"]
        item.scores[r[METRIC]] = dense
    return [out[k] for k in sorted(out)]


@dataclass(frozen=True)
class Evaluation:
    results: list[dict]  # `localisation` rows without config hash, run and time
    predictions: list[dict]  # `localisation_predictions` rows likewise
    thresholds: dict[str, float]
    skipped: list[str]  # metrics with no score on the calibration subset


def with_combination(items: list[Item], members: Sequence[str], calibration: str) -> list[str]:
    """Add `receval_rank_min` to every item's scores: each member rank-normalised by its calibration-subset
    steps (localise_maths.rank_normaliser), then the per-step min. Returns the members used (those scored
    there)."""
    used = []
    normalisers = {}
    for m in members:
        reference = [it.scores[m] for it in items if it.dataset == calibration and m in it.scores]
        values = np.concatenate(reference) if reference else np.array([])
        if np.isfinite(values).any():
            used.append(m)
            normalisers[m] = L.rank_normaliser(values)
    if used:
        for it in items:
            parts = [normalisers[m](it.scores.get(m, np.full(it.n_steps, math.nan))) for m in used]
            it.scores[LO.COMBINED] = L.combine_min(parts)
    return used


# The ranking figures of a row that has predictions but no step score to rank (the checks' rows).
NOT_RANKED = {LO.AUROC: None, LO.AUROC_LOW: None, LO.AUROC_HIGH: None, LO.N_POSITIVE: 0, LO.N_NEGATIVE: 0,
              LO.HIT_RATE: None, LO.RANDOM_HIT_RATE: None}


def subset_rows(metric: str, subset: str, threshold: float, chains: Sequence[tuple[str, int]],
                predicted: Sequence[int], ranked: dict, cfg: LocaliseSettings) -> tuple[dict, list[dict]]:
    """One `localisation` row (ProcessBench's figures from `predicted`, then `ranked`: AUROC and hit rates) and
    the subset's `localisation_predictions` rows; `chains` are (chain_id, label) in `predicted`'s order."""
    fig = L.figures(predicted, [label for _, label in chains])
    result = {
        LO.DATASET: subset, LO.METRIC: metric, LO.CALIBRATION: cfg.calibration, LO.THRESHOLD: threshold,
        LO.N: len(chains), LO.N_ERROR: fig.n_error, LO.N_CORRECT: fig.n_correct,
        LO.ACC_ERROR: fig.acc_error, LO.ACC_CORRECT: fig.acc_correct, LO.F1: fig.f1, **ranked,
    }
    rows = [{LO.CHAIN_ID: chain_id, LO.DATASET: subset, LO.METRIC: metric, LO.PREDICTED: p, LO.THRESHOLD: threshold,
             LO.LABEL: label, LO.CALIBRATION: cfg.calibration}
            for (chain_id, label), p in zip(chains, predicted, strict=True)]
    return result, rows


def evaluate(items: list[Item], metrics: Sequence[str], cfg: LocaliseSettings) -> Evaluation:
    """Driver maths over collected chains: per metric, the threshold from the calibration subset's chains only,
    then every subset's figures and each chain's prediction with it. Pure (no Spark)."""
    subsets = sorted({it.dataset for it in items})
    if cfg.calibration not in subsets:
        raise ValueError(f"localise.calibration: no scored, labelled chain of {cfg.calibration!r} (subsets with "
                         f"scored chains: {subsets}); score it, or choose another calibration subset")
    results, predictions, thresholds, skipped = [], [], {}, []
    for metric in metrics:
        mine = [it for it in items if metric in it.scores]
        calib = [it for it in mine if it.dataset == cfg.calibration]
        if not any(np.isfinite(it.scores[metric]).any() for it in calib):
            skipped.append(metric)
            continue
        threshold = L.select_threshold([it.scores[metric] for it in calib], [it.label for it in calib])
        thresholds[metric] = threshold
        by_subset: dict[str, list[Item]] = defaultdict(list)
        for it in mine:
            by_subset[it.dataset].append(it)
        for subset, group in sorted(by_subset.items()):
            chains, labels = [it.scores[metric] for it in group], [it.label for it in group]
            auc = L.step_auroc(chains, labels, cfg.bootstrap_resamples, cfg.seed, cfg.ci_level)
            hit, chance = L.hit_rate(chains, labels)
            ranked = {LO.AUROC: auc.auroc, LO.AUROC_LOW: auc.low, LO.AUROC_HIGH: auc.high,
                      LO.N_POSITIVE: auc.n_positive, LO.N_NEGATIVE: auc.n_negative,
                      LO.HIT_RATE: hit, LO.RANDOM_HIT_RATE: chance}
            result, rows = subset_rows(metric, subset, threshold, [(it.chain_id, it.label) for it in group],
                                       [L.predicted_error(c, threshold) for c in chains], ranked, cfg)
            results.append(result)
            predictions += rows
    if cfg.check_first:
        more = checked_first(items, predictions, thresholds, cfg)
        results += more.results
        predictions += more.predictions
    return Evaluation(results, predictions, thresholds, skipped)


def first_checked(item: Item, checks: dict[str, float]) -> int:
    """The first step any check flags (scores strictly below its fixed threshold), else -1; a chain a check did
    not score (a step without equations) is not flagged by it."""
    flags = [L.predicted_error(item.scores[c], t) for c, t in checks.items() if c in item.scores]
    return min((f for f in flags if f != L.NO_ERROR), default=L.NO_ERROR)


def checked_first(items: list[Item], predictions: Sequence[dict], thresholds: dict[str, float],
                  cfg: LocaliseSettings) -> Evaluation:
    """`checks` and `checks_then_<m>` rows (localise.check_first) from the metrics' own `predictions`: the first
    step a check flags, else m's prediction. Predictions are all these rows have: their AUROC and hit rates are
    left empty (no step score to rank), their threshold is m's (the checks' own when the checks are alone and
    one)."""
    checks = cfg.check_first
    flagged = {it.chain_id: first_checked(it, checks) for it in items}
    alone = next(iter(checks.values())) if len(checks) == 1 else math.nan
    # row name -> (threshold, subset -> [(chain_id, label, the prediction without the checks)])
    members: dict[str, tuple[float, dict[str, list]]] = {LO.CHECKS: (alone, defaultdict(list))}
    for it in items:
        members[LO.CHECKS][1][it.dataset].append((it.chain_id, it.label, L.NO_ERROR))
    for p in predictions:
        if p[LO.METRIC] not in checks:
            name = f"{LO.CHECKS_THEN}{p[LO.METRIC]}"
            _, by_subset = members.setdefault(name, (thresholds[p[LO.METRIC]], defaultdict(list)))
            by_subset[p[LO.DATASET]].append((p[LO.CHAIN_ID], p[LO.LABEL], p[LO.PREDICTED]))
    results, rows = [], []
    for name, (threshold, by_subset) in members.items():
        for subset, group in sorted(by_subset.items()):
            predicted = [flagged[chain_id] if flagged[chain_id] != L.NO_ERROR else own for chain_id, _, own in group]
            result, more = subset_rows(name, subset, threshold, [(c, label) for c, label, _ in group], predicted,
                                       NOT_RANKED, cfg)
            results.append(result)
            rows += more
    return Evaluation(results, rows, {}, [])


@dataclass(frozen=True)
class Outcome:
    results: DataFrame
    predictions: DataFrame
    quarantine: DataFrame
    counts: dict[str, int]
    evaluation: Evaluation
    combined_from: list[str]


def transform(spark: SparkSession, step_scores: DataFrame, chains: DataFrame, step_labels: DataFrame,
              cfg: LocaliseSettings, scoring_hash: str, baselines: DataFrame | None = None,
              run_id: str | None = None) -> Outcome:
    """Scores and labels -> `localisation`, `localisation_predictions` and `quarantine` rows; no table I/O.
    The step scores of `cfg.config_hash`, else of `scoring_hash` (the current configuration's, Settings.scoring_hash).
    `baselines`: per-step scores in LONG_SCHEMA's form (a per-step ROSCOE table, when one exists)."""
    config_hash = cfg.config_hash or scoring_hash
    checks_only = [c for c in cfg.check_first if c not in cfg.metrics]  # read for the checks' rows, not ranked
    long = melt_step_scores(step_scores, [*cfg.metrics, *checks_only], config_hash)
    if baselines is not None:
        long = long.unionByName(baselines.select(*LONG_SCHEMA.fieldNames()))
    unknown = sorted(set(cfg.combine) - set(cfg.metrics))
    if unknown:
        raise ValueError(f"localise.combine: {unknown} are not in localise.metrics {cfg.metrics}")
    # The calibration subset is always read: every other subset's thresholds come from it.
    datasets = sorted({*cfg.datasets, cfg.calibration}) if cfg.datasets else None
    # One collect: a row per labelled chain and metric (~5,600 for ProcessBench's two subsets and four metrics).
    labelled = labelled_chains(chains, step_labels, datasets)
    rows = per_chain(long, labelled).collect()
    verdicts = {r[C.CHAIN_ID]: r for r in rows}
    columns = labelled.schema.fieldNames()
    bad = [tuple(r[c] for c in columns) for r in verdicts.values() if r["reason"] is not None]
    quarantine = tables.quarantine_rows(
        spark.createDataFrame(bad, labelled.schema), QUARANTINE_STAGE, F.col("reason"),
        detail=F.format_string("first_error_index %s, from step_labels %s, %s steps", F.col(LABEL).cast("string"),
                               F.col("step_label").cast("string"), F.col(N_STEPS).cast("string")),
        chain_id=F.col(C.CHAIN_ID), source=F.lit("chains+step_labels"), run_id=run_id)
    rows = [r for r in rows if r["reason"] is None and r[METRIC] is not None]
    n_read, n_bad = len(verdicts), len(bad)
    items = items_of(rows)
    # The baseline table's metrics, as the collected rows name them (no Spark job of their own).
    baseline_metrics = sorted({r[METRIC] for r in rows} - set(cfg.metrics) - set(checks_only))
    used = with_combination(items, cfg.combine, cfg.calibration)
    metrics = [*cfg.metrics, *baseline_metrics, *([LO.COMBINED] if used else [])]
    evaluation = evaluate(items, metrics, cfg)
    extra = {LO.CONFIG_HASH: config_hash, LO.RUN_ID: run_id}
    results = spark.createDataFrame([r | extra for r in evaluation.results], _without(LO.SCHEMA, LO.COMPUTED_AT))
    results = results.withColumn(LO.COMPUTED_AT, tables.now())
    predictions = spark.createDataFrame([p | extra for p in evaluation.predictions], LO.PREDICTIONS_SCHEMA)
    counts = {"read": int(n_read), "evaluated": len(items), "quarantined": int(n_bad),
              "not_scored": int(n_read) - int(n_bad) - len(items)}
    return Outcome(tables.conform(results, LO.SCHEMA), predictions, quarantine, counts, evaluation, used)


def _without(schema: StructType, *names: str) -> StructType:
    """`schema` without `names` (filled in Spark afterwards)."""
    return StructType([f for f in schema.fields if f.name not in names])


# ---------------------------------------------------------------------------------------------- reports
def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def markdown_table(rows: list[dict]) -> str:
    """One table per subset: metric, threshold, ProcessBench's figures in percent (as the paper prints them),
    AUROC [CI] and the hit rates."""
    parts = []
    for subset in sorted({r[LO.DATASET] for r in rows}):
        mine = sorted((r for r in rows if r[LO.DATASET] == subset), key=lambda r: r[LO.METRIC])
        first = mine[0]
        note = " (calibration subset: in-sample)" if subset == first[LO.CALIBRATION] else ""
        lines = [f"### {subset}{note}", "",
                 f"n={first[LO.N]} (erroneous {first[LO.N_ERROR]}, all-correct {first[LO.N_CORRECT]}); thresholds "
                 f"chosen on {first[LO.CALIBRATION]}", "",
                 "| metric | threshold | acc_error | acc_correct | F1 | step AUROC [95% CI] | worst-step hit | random |",
                 "|---|---|---|---|---|---|---|---|"]
        for r in mine:
            auc = "n/a" if r[LO.AUROC] is None else (
                f"{r[LO.AUROC]:.3f}" + (f" [{r[LO.AUROC_LOW]:.3f}, {r[LO.AUROC_HIGH]:.3f}]"
                                        if r[LO.AUROC_LOW] is not None else ""))
            lines.append(f"| {r[LO.METRIC]} | {r[LO.THRESHOLD]:.4g} | {_pct(r[LO.ACC_ERROR])} | "
                         f"{_pct(r[LO.ACC_CORRECT])} | {_pct(r[LO.F1])} | {auc} | {_pct(r[LO.HIT_RATE])} | "
                         f"{_pct(r[LO.RANDOM_HIT_RATE])} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def mlflow_metrics(rows: list[dict]) -> dict[str, float]:
    """`<figure>.<subset>.<metric>` for every defined figure, plus `threshold.<metric>`."""
    out = {}
    for r in rows:
        for figure in (LO.F1, LO.ACC_ERROR, LO.ACC_CORRECT, LO.AUROC, LO.HIT_RATE, LO.RANDOM_HIT_RATE):
            if r[figure] is not None:
                out[f"{figure}.{r[LO.DATASET]}.{r[LO.METRIC]}"] = float(r[figure])
        if math.isfinite(r[LO.THRESHOLD]):
            out[f"threshold.{r[LO.METRIC]}"] = float(r[LO.THRESHOLD])
    return out


def read_baselines(spark: SparkSession, settings: Settings) -> DataFrame | None:
    """The per-step baseline table (localise.step_baselines), or None when not configured.

    The hook for ROSCOE's step-level scores: a table of (chain_id, step_idx, metric, score), higher-is-better,
    joins the evaluation as it is; nothing writes one yet.
    """
    name = settings.localise.step_baselines
    if name is None:
        return None
    path = settings.table(name)
    if not tables.exists(spark, path):
        raise ValueError(f"localise.step_baselines: no table at {path}")
    return tables.read(spark, path)


def run(spark: SparkSession, settings: Settings, run_id: str | None = None) -> Outcome:
    step_scores = tables.read(spark, settings.table("step_scores"), SS.SCHEMA)
    chains = tables.read(spark, settings.table("chains"), C.SCHEMA)
    step_labels = tables.read(spark, settings.table("step_labels"), SL.SCHEMA)
    out = transform(spark, step_scores, chains, step_labels, settings.localise, settings.scoring_hash(),
                    read_baselines(spark, settings), run_id)
    if out.evaluation.results:
        tables.upsert(spark, out.results, settings.table("localisation"), LO.SCHEMA, LO.KEYS)
        tables.upsert(spark, out.predictions, settings.table("localisation_predictions"), LO.PREDICTIONS_SCHEMA,
                      LO.PREDICTION_KEYS)
    if out.counts["quarantined"]:
        tables.append_quarantine(spark, settings, out.quarantine)
    return out


def _body(job: Job) -> Outcome:
    spark, settings, tracked = job.spark, job.settings, job.tracked
    out = run(spark, settings, tracked.local_id)
    rows = out.evaluation.results
    table = markdown_table(rows) if rows else "no chain to evaluate\n"
    tracked.log_text("localisation/table.md", table)
    tracked.log_metrics({f"rows_{k}": v for k, v in out.counts.items()})
    tracked.log_metrics(mlflow_metrics(rows))
    tracked.set_tags({"localise_combined_from": ",".join(out.combined_from),
                      "localise_skipped": ",".join(out.evaluation.skipped),
                      "localise_check_first": ",".join(f"{m}<{t:g}" for m, t in
                                                       settings.localise.check_first.items())})
    log.info("[localise] %s; thresholds %s", out.counts, out.evaluation.thresholds)
    print(table)
    return out


STAGE = Stage("localise", __doc__, _body, reads=("step_scores", "chains", "step_labels"),
              writes=("localisation", "localisation_predictions", "quarantine"), section="localise")


def main(argv: list[str] | None = None) -> Outcome:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
