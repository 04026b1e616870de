"""`curated` and `rejected`: the chain scores of chains that passed (or failed) the curation rules."""

from __future__ import annotations

from pyspark.sql.types import ArrayType, StringType, StructField, StructType, TimestampType

from schemas import chain_scores as CS

CHAIN_ID = CS.CHAIN_ID
CONFIG_HASH = CS.CONFIG_HASH  # scoring config hash of the scores the rules were applied to
RULES_HASH = "rules_hash"  # CurationSettings.rules_hash(): new rules curate every chain again
FAILED_RULES = "failed_rules"  # rule ids, e.g. "threshold:intra_entail_min>=0.5"; empty in `curated`
RUN_ID = "run_id"  # the pipeline run that curated the chain
CURATED_AT = "curated_at"

KEYS = [CHAIN_ID, CONFIG_HASH, RULES_HASH]

_SCORE_FIELDS = [f for f in CS.SCHEMA.fields if f.name != CS.SCORED_AT]

CURATED_SCHEMA = StructType(
    [
        *_SCORE_FIELDS[:2],
        StructField(RULES_HASH, StringType(), False),
        *_SCORE_FIELDS[2:],
        StructField(RUN_ID, StringType(), True),
        StructField(CURATED_AT, TimestampType(), True),
    ]
)

REJECTED_SCHEMA = StructType(
    [
        *CURATED_SCHEMA.fields[:3],
        StructField(FAILED_RULES, ArrayType(StringType(), True), False),
        *CURATED_SCHEMA.fields[3:],
    ]
)
