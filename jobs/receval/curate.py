"""`chain_scores` -> `curation` (every decision) -> `curated` (passed) and `rejected` (with the failed rules).

With `curation.step_thresholds` (per-metric thresholds, e.g. calibrated by `python -m jobs.metaeval.localise`),
`step_scores` too: every decision carries the chain's first flagged step and the metric that flagged it, the
form process-reward data is curated in. `curation.reject_arith_errors` rejects every chain with an equation that
does not hold (rule `max:arith_errors_total<=0`) and flags its first such step (metric arith_valid).
`curation.select_method` keeps per question only what a selection method chooses among its sampled chains (rule
`select:<method>:<keep>`, jobs.selection.select_chains.selected_chains): a sampled lake into a training set.

Decisions are written to `curation` in one MERGE first and copied to `curated`/`rejected` from there, so a
run killed between the two copies finishes from the stored decisions: quantile bounds computed "over the
run" are never recomputed over a smaller set.
"""

from __future__ import annotations

import io
import json
import logging
import re
from dataclasses import asdict, dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BooleanType, StringType, StructField, StructType

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.stage import Job, Stage
from jobs.infra.tracking import JobRun
from jobs.receval.settings import CurationSettings
from jobs.selection.select_chains import SELECTED, selected_chains
from schemas import chain_scores as CS
from schemas import chains as C
from schemas import curation as CU
from schemas import metrics as MR
from schemas import step_scores as SS

logger = logging.getLogger(__spec__.name)

PASSED = "passed"
DECISION_SCHEMA = StructType(
    [
        *CU.REJECTED_SCHEMA.fields[:3],
        StructField(PASSED, BooleanType(), False),
        *CU.REJECTED_SCHEMA.fields[3:],
    ]
)


@dataclass(frozen=True)
class Rule:
    """One curation rule; `id` is what `rejected.failed_rules` lists."""

    id: str
    kind: str  # threshold | quantile | api_k | max_steps | max | selected
    column: str
    bound: float | None  # the resolved lower (or, for max_steps and max, upper) bound

    def passes(self) -> Column:
        value = F.col(self.column)
        if self.kind in ("api_k", "selected"):
            ok = value == F.lit(True)
        elif self.kind in ("max_steps", "max"):
            ok = value <= F.lit(self.bound)
        elif self.bound is None:  # a quantile over an empty reference: nothing to compare against
            ok = F.lit(False)
        else:
            ok = value >= F.lit(self.bound)
        return F.coalesce(ok, F.lit(False))  # a null score never passes


def score_column(key: str) -> str:
    """`inter` -> `inter_min` (the chain score); a numeric chain_scores column name is taken as is."""
    metrics = CS.metric_names()
    if key in metrics:
        return CS.min_col(key)
    if key in {f.name for f in CS.schema().fields if f.dataType.typeName() in ("double", "integer")}:
        return key
    raise ValueError(f"curation: {key!r} is neither a metric ({metrics}) nor a numeric chain_scores column")


def quantile_bounds(reference: DataFrame, cfg: CurationSettings) -> dict[str, float | None]:
    """metric key -> the q-quantile of its score over `reference` (exact, linear interpolation, nulls ignored)."""
    if not cfg.quantiles:
        return {}
    keys = sorted(cfg.quantiles)
    row = reference.agg(
        *[F.percentile(F.col(score_column(k)), F.lit(cfg.quantiles[k])).alias(k) for k in keys]
    ).first()
    return {k: (None if row is None or row[k] is None else float(row[k])) for k in keys}


def _fmt(value: float) -> str:
    return f"{value:g}"


def rules(cfg: CurationSettings, bounds: dict[str, float | None] | None = None) -> list[Rule]:
    """The configured rules in a fixed order: thresholds, quantiles, API_k, max steps, arithmetic errors (keys
    sorted)."""
    bounds = bounds or {}
    out = [
        Rule(f"threshold:{score_column(k)}>={_fmt(v)}", "threshold", score_column(k), float(v))
        for k, v in sorted(cfg.thresholds.items())
    ]
    for k, q in sorted(cfg.quantiles.items()):
        if k not in bounds:
            raise ValueError(f"curation: no bound computed for quantile rule {k!r}")
        out.append(Rule(f"quantile:{score_column(k)}>=q{_fmt(q)}", "quantile", score_column(k), bounds[k]))
    if cfg.require_api_k is not None:
        k = cfg.require_api_k
        if k not in CS.API_KS:
            raise ValueError(f"curation.require_api_k: {k} has no column in chain_scores (allowed: {CS.API_KS})")
        out.append(Rule(f"api_k:{CS.api_col(k)}", "api_k", CS.api_col(k), None))
    if cfg.max_steps is not None:
        out.append(Rule(f"max_steps:{CS.N_STEPS}<={cfg.max_steps}", "max_steps", CS.N_STEPS, float(cfg.max_steps)))
    if cfg.reject_arith_errors:
        column = CS.total_col(MR.ARITH_ERRORS)
        out.append(Rule(f"max:{column}<=0", "max", column, 0.0))
    if cfg.select_method is not None:
        out.append(Rule(f"select:{cfg.select_method}:{cfg.select_keep}", "selected", SELECTED, None))
    return out


def with_selection(chain_scores: DataFrame, selected: DataFrame | None) -> DataFrame:
    """chain_scores with the selection rule's column (`selected_chains`; null, which fails, for a chain that is no
    candidate). Without `selected`, unchanged."""
    if selected is None:
        return chain_scores
    return chain_scores.join(selected, CU.CHAIN_ID, "left")


def step_flags(step_scores: DataFrame, thresholds: dict[str, float]) -> DataFrame:
    """step_scores rows (one config hash) -> (chain_id, first_flagged_step, first_flagged_metric): the first step
    scoring strictly below the threshold of any metric in `thresholds` (-1 and null when none is), as
    jobs.metaeval.localise predicts the earliest error. A null score flags nothing
    (jobs.metaeval.localise_maths.predicted_error).
    Spark-native: one aggregation, the earliest flagged (step, metric) as the min of a struct."""
    known = [m.name for m in MR.ranked_step_scores()]
    unknown = sorted(set(thresholds) - set(known))
    if unknown:
        raise ValueError(f"curation.step_thresholds: {unknown} are not higher-is-better step_scores metrics "
                         f"({sorted(known)})")
    # The first metric in name order below its threshold at this step (coalesce keeps the first non-null).
    metric = F.coalesce(*[F.when(F.col(m) < F.lit(float(t)), F.lit(m)) for m, t in sorted(thresholds.items())])
    first = F.min(F.when(metric.isNotNull(), F.struct(F.col(SS.STEP_IDX).alias("i"), metric.alias("m"))))
    return step_scores.groupBy(SS.CHAIN_ID).agg(first.alias("f")).select(
        SS.CHAIN_ID,
        F.coalesce(F.col("f.i"), F.lit(-1)).cast("int").alias(CU.FIRST_FLAGGED_STEP),
        F.col("f.m").alias(CU.FIRST_FLAGGED_METRIC),
    )


def decide(chain_scores: DataFrame, rule_list: list[Rule], rules_hash: str, run_id: str | None = None,
           flags: DataFrame | None = None) -> DataFrame:
    """chain_scores rows -> `curation` rows: passed, and the ids of the rules each chain failed; with `flags`
    (`step_flags`), each chain's first flagged step (null for a chain without step scores). Pure."""
    if flags is not None:
        chain_scores = chain_scores.join(flags, CU.CHAIN_ID, "left")
    else:
        chain_scores = chain_scores.withColumn(CU.FIRST_FLAGGED_STEP, F.lit(None).cast("int")).withColumn(
            CU.FIRST_FLAGGED_METRIC, F.lit(None).cast("string"))
    failed = (
        F.filter(F.array(*[F.when(~r.passes(), F.lit(r.id)) for r in rule_list]), lambda x: x.isNotNull())
        if rule_list
        else F.array().cast(ArrayType(StringType()))
    )
    out = (
        chain_scores.withColumn(CU.RULES_HASH, F.lit(rules_hash))
        .withColumn(CU.FAILED_RULES, failed)
        .withColumn(PASSED, F.size(CU.FAILED_RULES) == 0)
        .withColumn(CU.RUN_ID, F.lit(run_id).cast("string"))
        .withColumn(CU.CURATED_AT, tables.now())
    )
    return tables.conform(out, DECISION_SCHEMA)


def transform(
    chain_scores: DataFrame,
    cfg: CurationSettings,
    bounds: dict[str, float | None] | None = None,
    run_id: str | None = None,
    step_scores: DataFrame | None = None,
    selected: DataFrame | None = None,
) -> tuple[DataFrame, DataFrame]:
    """chain_scores -> (curated rows, rejected rows). Quantile bounds come resolved (see `quantile_bounds`);
    `step_scores` (same config hash) give the first flagged steps when `cfg.flag_thresholds()` has any;
    `selected` (`selected_chains`) the selection rule's verdicts when `cfg.select_method` is set."""
    thresholds = cfg.flag_thresholds()
    flags = step_flags(step_scores, thresholds) if thresholds and step_scores is not None else None
    decisions = decide(with_selection(chain_scores, selected), rules(cfg, bounds), cfg.rules_hash(), run_id, flags)
    return split(decisions)


def split(decisions: DataFrame) -> tuple[DataFrame, DataFrame]:
    curated = tables.conform(decisions.where(F.col(PASSED)), CU.CURATED_SCHEMA)
    rejected = tables.conform(decisions.where(~F.col(PASSED)), CU.REJECTED_SCHEMA)
    return curated, rejected


def rule_pass_rates(decisions: DataFrame, rule_list: list[Rule]) -> dict[str, float]:
    """rule id -> fraction of chains passing it, plus `all` for the whole rule set."""
    aggs = [F.avg(F.when(F.array_contains(CU.FAILED_RULES, r.id), 0.0).otherwise(1.0)).alias(r.id) for r in rule_list]
    row = decisions.agg(F.avg(F.col(PASSED).cast("double")).alias("all"), *aggs).first()
    return {k: float(v) for k, v in row.asDict().items() if v is not None}


def histograms(df: DataFrame, columns: list[str], bins: int) -> dict[str, tuple[list[float], list[int]]]:
    """Equal-width histograms (edges, counts) of several columns, computed in Spark (only the bin counts reach the
    driver) in two jobs, not two per column: their ranges in one aggregation, then every column's bin counts in one
    grouping. A column with no value: ([], [])."""
    ranges = df.agg(*[F.struct(F.min(c), F.max(c)).alias(c) for c in columns]).first()
    spans: dict[str, tuple[float, float]] = {}
    for c in columns:
        lo, hi = ranges[c][0], ranges[c][1]
        if lo is not None:
            spans[c] = (float(lo), (float(hi) - float(lo)) / bins if hi > lo else 1.0)
    out: dict[str, tuple[list[float], list[int]]] = {c: ([], []) for c in columns}
    if not spans:
        return out
    binned = F.explode(F.array(*[
        F.struct(F.lit(c).alias("column"),
                 # least() skips nulls: a null score must stay out of every bin, not land in the last one.
                 F.when(F.col(c).isNotNull(), F.least(F.floor((F.col(c) - F.lit(lo)) / F.lit(width)).cast("int"),
                                                      F.lit(bins - 1))).alias("b"))
        for c, (lo, width) in spans.items()
    ]))
    counts = {(r["column"], r["b"]): r["count"]
              for r in df.select(binned.alias("x")).select("x.*").where(F.col("b").isNotNull())
              .groupBy("column", "b").count().collect()}
    for c, (lo, width) in spans.items():
        out[c] = ([lo + i * width for i in range(bins + 1)], [int(counts.get((c, i), 0)) for i in range(bins)])
    return out


def histogram_png(column: str, edges: list[float], counts: list[int], bounds: dict[str, float]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(5, 3), dpi=100)
    if counts:
        ax.bar(edges[:-1], counts, width=[b - a for a, b in zip(edges[:-1], edges[1:], strict=True)], align="edge",
               color="#4c72b0", edgecolor="white")
    for name, value in bounds.items():
        ax.axvline(value, color="#c44e52", linestyle="--", linewidth=1)
        ax.annotate(name, (value, ax.get_ylim()[1] * 0.9), fontsize=7, color="#c44e52", rotation=90)
    # Tiny random models give scores within 1e-6 of each other: few ticks keep the labels readable.
    ax.xaxis.set_major_locator(MaxNLocator(5))
    ax.set_title(f"{column} (chains: {sum(counts)})", fontsize=9)
    ax.set_xlabel("score (higher is better)", fontsize=8)
    ax.set_ylabel("chains", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def label_agreement(decisions: DataFrame, chains: DataFrame) -> dict[str, dict[str, float]]:
    """Precision and recall of `passed` against each binary label (1 = clean is the positive class)."""
    labelled = decisions.join(chains.select(C.CHAIN_ID, C.LABELS), CU.CHAIN_ID).select(
        PASSED, F.explode(C.LABELS).alias("label", "value")
    )
    # Only labels whose every value is 0 or 1; ordinal ratings have no single "clean" class.
    binary = labelled.groupBy("label").agg(
        F.sum(F.when(F.col(PASSED) & (F.col("value") == 1), 1).otherwise(0)).alias("tp"),
        F.sum(F.when(F.col(PASSED) & (F.col("value") == 0), 1).otherwise(0)).alias("fp"),
        F.sum(F.when(~F.col(PASSED) & (F.col("value") == 1), 1).otherwise(0)).alias("fn"),
        F.count(F.lit(1)).alias("n"),
        F.sum(F.when(F.col("value").isin(0.0, 1.0), 0).otherwise(1)).alias("non_binary"),
    )
    out: dict[str, dict[str, float]] = {}
    for r in binary.where(F.col("non_binary") == 0).collect():
        tp, fp, fn = r["tp"], r["fp"], r["fn"]
        out[r["label"]] = {
            "precision": tp / (tp + fp) if tp + fp else float("nan"),
            "recall": tp / (tp + fn) if tp + fn else float("nan"),
            "n": float(r["n"]),
        }
    return out


def _reference(spark: SparkSession, settings: Settings, batch: DataFrame) -> DataFrame:
    ref = settings.curation.quantile_reference
    if ref == "run":
        return batch
    scores = tables.read(spark, settings.table("chain_scores"), CS.SCHEMA)
    if ref == "all":
        return scores.where(F.col(CS.CONFIG_HASH) == settings.scoring_hash())
    return tables.read(spark, ref)


@dataclass
class CurationResult:
    counts: dict[str, int]
    rules: list[dict[str, Any]]
    pass_rates: dict[str, float]
    labels: dict[str, dict[str, float]]
    histograms: dict[str, bytes]


def run(spark: SparkSession, settings: Settings, run_id: str | None = None) -> CurationResult:
    """Curate the chains scored under this config hash that the current rules have not decided yet."""
    cfg = settings.curation
    config_hash, rules_hash = settings.scoring_hash(), cfg.rules_hash()
    decisions_path = settings.table("curation")
    scores = tables.read(spark, settings.table("chain_scores"), CS.SCHEMA).where(F.col(CS.CONFIG_HASH) == config_hash)
    decided = (
        tables.read(spark, decisions_path, DECISION_SCHEMA)
        .where((F.col(CU.CONFIG_HASH) == config_hash) & (F.col(CU.RULES_HASH) == rules_hash))
        .select(CU.CHAIN_ID)
    )
    with tables.Held() as hold:
        batch = scores.join(decided, CU.CHAIN_ID, "left_anti")
        if cfg.select_method is not None:  # chosen among every chain of the question, decided before or not
            chains = tables.read(spark, settings.table("chains"), C.SCHEMA)
            batch = with_selection(batch, selected_chains(chains, scores, settings))
        batch = hold(batch)
        n_batch = batch.count()
        bounds = quantile_bounds(_reference(spark, settings, batch), cfg) if n_batch else {
            k: None for k in cfg.quantiles
        }
        rule_list = rules(cfg, bounds)
        flags = None
        if cfg.flag_thresholds():
            steps = tables.read(spark, settings.table("step_scores"), SS.SCHEMA).where(
                F.col(SS.CONFIG_HASH) == config_hash)
            flags = step_flags(steps.join(batch.select(CU.CHAIN_ID), SS.CHAIN_ID, "left_semi"),
                               cfg.flag_thresholds())
        decisions = hold(decide(batch, rule_list, rules_hash, run_id, flags))
        n_new = tables.insert_new(spark, decisions, decisions_path, DECISION_SCHEMA, CU.KEYS) if n_batch else 0
        # Copy every stored decision not yet in curated/rejected: also finishes a run killed after the MERGE above.
        stored = tables.read(spark, decisions_path, DECISION_SCHEMA).where(
            (F.col(CU.CONFIG_HASH) == config_hash) & (F.col(CU.RULES_HASH) == rules_hash)
        )
        curated, rejected = split(stored)
        # A downstream reader follows curated/rejected by their change data feed (docs/OPERATIONS.md).
        for name, schema in (("curated", CU.CURATED_SCHEMA), ("rejected", CU.REJECTED_SCHEMA)):
            if name in settings.maintain.change_feed:
                tables.ensure(spark, settings.table(name), schema, properties={"delta.enableChangeDataFeed": "true"})
        n_curated = tables.insert_new(spark, curated, settings.table("curated"), CU.CURATED_SCHEMA, CU.KEYS)
        n_rejected = tables.insert_new(spark, rejected, settings.table("rejected"), CU.REJECTED_SCHEMA, CU.KEYS)
        this_run = stored.where(F.col(CU.RUN_ID) == F.lit(run_id)) if run_id else decisions
        # Both in one Spark job.
        passed, failed = this_run.agg(F.count(F.when(F.col(PASSED), 1)), F.count(F.when(~F.col(PASSED), 1))).first()
        counts = {
            "batch": n_batch,
            "decided": n_new,
            "curated": n_curated,
            "rejected": n_rejected,
            "run_passed": int(passed),
            "run_failed": int(failed),
        }
        counts["reconciled"] = int(n_batch == counts["run_passed"] + counts["run_failed"] or run_id is None)
        pass_rates = rule_pass_rates(this_run, rule_list) if n_batch else {}
        labels = label_agreement(this_run, tables.read(spark, settings.table("chains"), C.SCHEMA)) if n_batch else {}
        pngs: dict[str, bytes] = {}
        if n_batch:
            hists = histograms(this_run, CS.score_columns(), cfg.histogram_bins)
            for metric in CS.metric_names():
                column = CS.min_col(metric)
                edges, hist = hists[column]
                marks = {r.id: r.bound for r in rule_list if r.column == column and r.bound is not None}
                pngs[metric] = histogram_png(column, edges, hist, marks)
    return CurationResult(counts, [asdict(r) for r in rule_list], pass_rates, labels, pngs)


def metric_name(text: str) -> str:
    """A rule id or label as an MLflow metric name (which allows no '>', '<', '=')."""
    text = text.replace(">=", "_ge_").replace("<=", "_le_")
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", text)


def log_curation(result: CurationResult, tracked: JobRun) -> None:
    """Rules, pass rates, label agreement and histograms to an MLflow run."""
    tracked.log_metrics({f"rows_{k}": v for k, v in result.counts.items()})
    tracked.log_metrics({metric_name(f"pass_rate.{k}"): v for k, v in result.pass_rates.items()})
    for label, stats in result.labels.items():
        tracked.log_metrics({metric_name(f"label.{label}.{k}"): v for k, v in stats.items() if v == v})
    tracked.log_params({f"rule.{i}": r["id"] for i, r in enumerate(result.rules)})
    tracked.log_text("curation/rules.json", json.dumps(result.rules, indent=2))
    for metric, png in result.histograms.items():
        tracked.log_bytes(f"curation/hist_{metric}.png", png)


def _body(job: Job) -> CurationResult:
    spark, settings, tracked = job.spark, job.settings, job.tracked
    result = run(spark, settings, tracked.local_id)
    log_curation(result, tracked)
    logger.info(f"[curate] {result.counts} pass rates {result.pass_rates}")
    return result


def _reads(settings: Settings) -> tuple[str, ...]:
    # step_scores only with step flags (curation.step_thresholds, reject_arith_errors): each first flagged step.
    return ("chain_scores", *(("step_scores",) if settings.curation.flag_thresholds() else ()), "chains")


STAGE = Stage("curate", __doc__, _body, reads=_reads, writes=("curation", "curated", "rejected"), section="curation")


def main(argv: list[str] | None = None) -> CurationResult:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
