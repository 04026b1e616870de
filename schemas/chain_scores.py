"""`chain_scores`: per chain and config hash, each step score's min over steps (the chain score), its worst step,
mean, and API_k: the aggregations schemas/metrics.py declares. Every score is higher-is-better."""

from __future__ import annotations

from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from schemas import metrics as MR

CHAIN_ID = "chain_id"
CONFIG_HASH = "config_hash"
KEYS = [CHAIN_ID, CONFIG_HASH]  # one row per chain and config hash: the table's MERGE key
N_STEPS = "n_steps"
API_KS = list(MR.API_KS)


def min_col(metric: str) -> str:
    """The chain score: min over steps (a chain is as good as its worst step)."""
    return MR.chain_column(metric, MR.MIN)


def worst_step_col(metric: str) -> str:
    """0-based index of the step that gave the min (first one on ties)."""
    return MR.chain_column(metric, MR.WORST_STEP)


def mean_col(metric: str) -> str:
    return MR.chain_column(metric, MR.MEAN)


def api_col(k: int) -> str:
    """API_k: True when every window of k consecutive info_gain values sums to > 0 (chains shorter than k:
    the whole chain is the one window)."""
    return MR.api_column(k)


def metric_names() -> list[str]:
    """The higher-is-better step scores chain_scores aggregates (chain score: the min), in column order (the
    registry's, read now). The counts (`count_names`) have a total instead."""
    return [m.name for m in MR.ranked_step_scores()]


def count_names() -> list[str]:
    """The per-step counts (lower is better), each with a `<count>_total` column."""
    return [m.name for m in MR.step_counts()]


def total_col(metric: str) -> str:
    """A count's chain score: its sum over steps (e.g. arith_errors_total)."""
    return MR.chain_column(metric, MR.TOTAL)


def score_columns() -> list[str]:
    """Each higher-is-better step score's chain score (its min over steps), in column order."""
    return [min_col(m) for m in metric_names()]


NLI_MODEL = "nli_model"
PVI_MODEL = "pvi_model"
PVI_NULL_MODEL = "pvi_null_model"
IG_MODEL = "ig_model"
SCORED_AT = "scored_at"

_TYPES = {MR.MIN: DoubleType(), MR.WORST_STEP: IntegerType(), MR.MEAN: DoubleType(), MR.TOTAL: IntegerType()}


def schema() -> StructType:
    """The contract from the registry as it is now: per step score (registry order) a column per aggregation it
    declares, then API_k. `SCHEMA` is this at import; a job writing chain scores conforms to `schema()`."""
    metric_fields = [
        StructField(MR.chain_column(m.name, agg), _TYPES[agg], True)
        for m in MR.of_table(MR.STEP_SCORES)
        for agg in (MR.MIN, MR.WORST_STEP, MR.MEAN, MR.TOTAL)
        if agg in m.aggregations
    ]
    api = [StructField(api_col(k), BooleanType(), True) for k in API_KS] if MR.api_metric() is not None else []
    return StructType(
        [
            StructField(CHAIN_ID, StringType(), False),
            StructField(CONFIG_HASH, StringType(), False),
            StructField(N_STEPS, IntegerType(), False),
            *metric_fields,
            *api,
            StructField(NLI_MODEL, StringType(), True),
            StructField(PVI_MODEL, StringType(), True),
            StructField(PVI_NULL_MODEL, StringType(), True),
            StructField(IG_MODEL, StringType(), True),
            StructField(SCORED_AT, TimestampType(), True),
        ]
    )


SCHEMA = schema()
