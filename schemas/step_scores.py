"""`step_scores`: ReCEval scores per step (all higher-is-better), keyed by chain, step and config hash."""

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

CHAIN_ID = "chain_id"
STEP_IDX = "step_idx"
CONFIG_HASH = "config_hash"  # Settings.scoring_hash(): models and scoring options

INTRA_ENTAIL = "intra_entail"
INTER = "inter"
INTRA_PVI = "intra_pvi"
INFO_GAIN = "info_gain"

# metric -> (definition, direction). Every ReCEval score is higher-is-better.
METRICS: dict[str, tuple[str, str]] = {
    INTRA_ENTAIL: (
        "P_entail(premise = ' and '.join(premise RCUs + earlier conclusions), hypothesis = conclusion RCU); "
        "1.0 when there is no premise text. Range [0, 1].",
        "higher is better",
    ),
    INTER: (
        "1 - max P_contradiction(r, conclusion) over r in context sentences + earlier conclusions; "
        "1.0 when that set is empty. Range [0, 1].",
        "higher is better",
    ),
    INTRA_PVI: (
        "meanlogp_g(conclusion | premises) - meanlogp_g'(conclusion | None): nats of usable information "
        "the premises give about the conclusion.",
        "higher is better",
    ),
    INFO_GAIN: (
        "L(i) - L(i-1), L(k) = meanlogp(' ' + answer | steps 1..k + ' Therefore,'): nats the step adds "
        "towards the predicted answer.",
        "higher is better",
    ),
}

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
    ]
)
