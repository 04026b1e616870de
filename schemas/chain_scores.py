"""`chain_scores`: per chain and config hash, each metric's min over steps (the chain score), its worst step,
mean, and API_k. Every score is higher-is-better."""

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

from schemas.step_scores import INFO_GAIN, INTER, INTRA_ENTAIL, INTRA_PVI, METRICS

CHAIN_ID = "chain_id"
CONFIG_HASH = "config_hash"
N_STEPS = "n_steps"
METRIC_NAMES = [INTRA_ENTAIL, INTRA_PVI, INTER, INFO_GAIN]
API_KS = [1, 2, 3]


def min_col(metric: str) -> str:
    """The chain score: min over steps (a chain is as good as its worst step)."""
    return f"{metric}_min"


def worst_step_col(metric: str) -> str:
    """0-based index of the step that gave the min (first one on ties)."""
    return f"{metric}_worst_step"


def mean_col(metric: str) -> str:
    return f"{metric}_mean"


def api_col(k: int) -> str:
    """API_k: True when every window of k consecutive info_gain values sums to > 0 (chains shorter than k:
    the whole chain is the one window)."""
    return f"api_{k}"


NLI_MODEL = "nli_model"
PVI_MODEL = "pvi_model"
PVI_NULL_MODEL = "pvi_null_model"
IG_MODEL = "ig_model"
SCORED_AT = "scored_at"

SCHEMA = StructType(
    [
        StructField(CHAIN_ID, StringType(), False),
        StructField(CONFIG_HASH, StringType(), False),
        StructField(N_STEPS, IntegerType(), False),
        *[
            field
            for m in METRIC_NAMES
            for field in (
                StructField(min_col(m), DoubleType(), True),
                StructField(worst_step_col(m), IntegerType(), True),
                StructField(mean_col(m), DoubleType(), True),
            )
        ],
        *[StructField(api_col(k), BooleanType(), True) for k in API_KS],
        StructField(NLI_MODEL, StringType(), True),
        StructField(PVI_MODEL, StringType(), True),
        StructField(PVI_NULL_MODEL, StringType(), True),
        StructField(IG_MODEL, StringType(), True),
        StructField(SCORED_AT, TimestampType(), True),
    ]
)

__all__ = ["METRICS", "SCHEMA"]
