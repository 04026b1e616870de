"""`curated` and `rejected`: the chain scores of chains that passed (or failed) the curation rules."""

from __future__ import annotations

from pyspark.sql.types import ArrayType, IntegerType, StringType, StructField, StructType, TimestampType

from schemas import chain_scores as CS

CHAIN_ID = CS.CHAIN_ID
CONFIG_HASH = CS.CONFIG_HASH  # scoring config hash of the scores the rules were applied to
RULES_HASH = "rules_hash"  # CurationSettings.rules_hash(): new rules curate every chain again
FAILED_RULES = "failed_rules"  # rule ids, e.g. "threshold:intra_entail_min>=0.5"; empty in `curated`
RUN_ID = "run_id"  # the pipeline run that curated the chain
CURATED_AT = "curated_at"
# curation.step_thresholds set: the first step scoring below the threshold of any of its metrics (0-based, as
# step_scores.step_idx; -1 = no step flagged) and that metric (the first in name order when several are below
# at that step; null when none). Both null when no step threshold is set or the chain has no step scores.
FIRST_FLAGGED_STEP = "first_flagged_step"
FIRST_FLAGGED_METRIC = "first_flagged_metric"

KEYS = [CHAIN_ID, CONFIG_HASH, RULES_HASH]
_FLAG_FIELDS = [StructField(FIRST_FLAGGED_STEP, IntegerType(), True),
                StructField(FIRST_FLAGGED_METRIC, StringType(), True)]

_SCORE_FIELDS = [f for f in CS.SCHEMA.fields if f.name != CS.SCORED_AT]

CURATED_SCHEMA = StructType(
    [
        *_SCORE_FIELDS[:2],
        StructField(RULES_HASH, StringType(), False),
        *_SCORE_FIELDS[2:],
        StructField(RUN_ID, StringType(), True),
        StructField(CURATED_AT, TimestampType(), True),
        # Last and nullable: `tables.ensure` appends them to tables made before them.
        *_FLAG_FIELDS,
    ]
)

REJECTED_SCHEMA = StructType(
    [
        *CURATED_SCHEMA.fields[:3],
        StructField(FAILED_RULES, ArrayType(StringType(), True), False),
        *CURATED_SCHEMA.fields[3:],
    ]
)
