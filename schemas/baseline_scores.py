"""`baseline_scores`: ROSCOE (SA, SS, LI, REP) and ROUGE-2 chain scores, long format, keyed by chain and metric;
`step_baseline_scores`: the per-step forms of five of them, keyed by chain, step and metric.

Every score is higher-is-better in [0, 1]. Definitions (schemas/metrics.py, after ROSCOE (Golovneva et al., 2023)
and its `projects/roscoe/score.py`): docs/META_EVAL.md lists where this implementation differs.
"""

from __future__ import annotations

from pyspark.sql.types import DoubleType, IntegerType, StringType, StructField, StructType, TimestampType

from schemas import metrics as MR

CHAIN_ID = "chain_id"
STEP_IDX = "step_idx"  # 0-based position in chains.steps (the steps job's step_idx for chains given as steps)
METRIC = "metric"
SCORE = "score"
MODEL = "model"  # embedding model, NLI model or "rouge-score", whichever produced the score
COMPUTED_AT = "computed_at"

SCHEMA = StructType(
    [
        StructField(CHAIN_ID, StringType(), False),
        StructField(METRIC, StringType(), False),
        StructField(SCORE, DoubleType(), True),
        StructField(MODEL, StringType(), True),
        StructField(COMPUTED_AT, TimestampType(), True),
    ]
)

STEP_SCHEMA = StructType(
    [
        StructField(CHAIN_ID, StringType(), False),
        StructField(STEP_IDX, IntegerType(), False),
        StructField(METRIC, StringType(), False),
        StructField(SCORE, DoubleType(), True),
        StructField(MODEL, StringType(), True),
        StructField(COMPUTED_AT, TimestampType(), True),
    ]
)
STEP_KEYS = [CHAIN_ID, STEP_IDX, METRIC]

# The metrics and their definitions: schemas/metrics.py (tables baseline_scores and step_baseline_scores).
_NAMES = MR.names(MR.BASELINE_SCORES)
REFERENCE_FREE = _NAMES[:8]
REFERENCE_BASED = [m for m in _NAMES[8:] if m != "rouge2"]

# Summary rows of the correlation table: the best metric of each ROSCOE family, as the ReCEval paper reports them.
GROUPS: dict[str, list[str]] = {
    "ROSCOE-SA": [m for m in _NAMES if m.startswith("roscoe_sa_")],
    "ROSCOE-SS": [m for m in _NAMES if m.startswith("roscoe_ss_")],
    "ROSCOE-LI": [m for m in _NAMES if m.startswith("roscoe_li_")],
    "ROSCOE-REP": ["roscoe_sa_repetition_token", "roscoe_ss_repetition_step"],
}
