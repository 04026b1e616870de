"""`step_scores`: ReCEval scores per step (all higher-is-better; defined in schemas/metrics.py), keyed by chain, step
and config hash."""

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
STEP_IDX = "step_idx"
CONFIG_HASH = "config_hash"  # Settings.scoring_hash(): models and scoring options

# The step scores' columns; their definitions, directions and chain aggregations are in the registry.
INTRA_ENTAIL, INTER, INTRA_PVI, INFO_GAIN = MR.INTRA_ENTAIL, MR.INTER, MR.INTRA_PVI, MR.INFO_GAIN
ARITH_VALID, ARITH_ERRORS, ARITH_FAILED = MR.ARITH_VALID, MR.ARITH_ERRORS, MR.ARITH_FAILED
ARITH_CHECKED = "arith_checked"  # how many equations of the step the arithmetic check could evaluate

INTER_WORST_PREMISE = "inter_worst_premise"  # the sentence or earlier conclusion with max contradiction
INTER_WORST_SOURCE = "inter_worst_source"  # context | step:<j>
INTER_MAX_CONTRADICTION = "inter_max_contradiction"
INTRA_PREMISE = "intra_premise"  # the premise text the intra pair used
PVI_G = "pvi_g_logp"  # meanlogp under g
PVI_NULL = "pvi_null_logp"  # meanlogp under g'
IG_L_PREV = "ig_l_prev"  # L(i-1)
IG_L = "ig_l"  # L(i)
NLI_MODEL = "nli_model"
NLI_REVISION = "nli_revision"
PVI_MODEL = "pvi_model"
PVI_NULL_MODEL = "pvi_null_model"
IG_MODEL = "ig_model"
SCORED_AT = "scored_at"
# True: some LM pass of the step's intra_pvi or info_gain (g, g', L(i-1), L(i)) was longer than its model's
# own position limit and was scored on a cut (source cut from the left; docs/PVI.md), so those scores are not
# the official ones. False: every pass was scored whole. Null: the PVI transform did not report it.
PVI_TRUNCATED = "pvi_truncated"

NLI_SCHEMA = StructType(
    [
        StructField(CHAIN_ID, StringType(), False),
        StructField(STEP_IDX, IntegerType(), False),
        StructField(INTRA_ENTAIL, DoubleType(), True),
        StructField(INTRA_PREMISE, StringType(), True),
        StructField(INTER, DoubleType(), True),
        StructField(INTER_MAX_CONTRADICTION, DoubleType(), True),
        StructField(INTER_WORST_PREMISE, StringType(), True),
        StructField(INTER_WORST_SOURCE, StringType(), True),
    ]
)

PVI_SCHEMA = StructType(
    [
        StructField(CHAIN_ID, StringType(), False),
        StructField(STEP_IDX, IntegerType(), False),
        StructField(INTRA_PVI, DoubleType(), True),
        StructField(PVI_G, DoubleType(), True),
        StructField(PVI_NULL, DoubleType(), True),
        StructField(INFO_GAIN, DoubleType(), True),
        StructField(IG_L_PREV, DoubleType(), True),
        StructField(IG_L, DoubleType(), True),
    ]
)

# The arithmetic check (udfs/arith.py, jobs/receval/arith_scores.py): no model, computed from the step text.
ARITH_SCHEMA = StructType(
    [
        StructField(CHAIN_ID, StringType(), False),
        StructField(STEP_IDX, IntegerType(), False),
        StructField(ARITH_VALID, DoubleType(), True),
        StructField(ARITH_ERRORS, IntegerType(), True),
        StructField(ARITH_CHECKED, IntegerType(), True),
        StructField(ARITH_FAILED, StringType(), True),
    ]
)

SCHEMA = StructType(
    [
        StructField(CHAIN_ID, StringType(), False),
        StructField(STEP_IDX, IntegerType(), False),
        StructField(CONFIG_HASH, StringType(), False),
        *NLI_SCHEMA.fields[2:],
        *PVI_SCHEMA.fields[2:],
        StructField(NLI_MODEL, StringType(), True),
        StructField(NLI_REVISION, StringType(), True),
        StructField(PVI_MODEL, StringType(), True),
        StructField(PVI_NULL_MODEL, StringType(), True),
        StructField(IG_MODEL, StringType(), True),
        StructField(SCORED_AT, TimestampType(), True),
        # Last: `tables.ensure` appends a nullable contract column to tables made before it.
        StructField(PVI_TRUNCATED, BooleanType(), True),
        *ARITH_SCHEMA.fields[2:],  # issue 45: rows scored before it have them null
    ]
)
