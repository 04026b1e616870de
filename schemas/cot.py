"""`cot_predictions` (one row per example, mode and model) and `cot_metrics` (accuracy / EM per group)."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

# Common example schema (loaders -> this; users may bring their own JSONL in it).
DATASET = "dataset"
TASK = "task"
TEMPLATE = "template"
EXAMPLE_ID = "example_id"
SOURCE = "source"
OPTIONS = "options"  # null for generation tasks
GOLD = "gold"

EXAMPLE_SCHEMA = StructType(
    [
        StructField(DATASET, StringType(), False),
        StructField(TASK, StringType(), False),
        StructField(TEMPLATE, StringType(), True),
        StructField(EXAMPLE_ID, StringType(), False),
        StructField(SOURCE, StringType(), False),
        StructField(OPTIONS, ArrayType(StringType()), True),
        StructField(GOLD, StringType(), False),
    ]
)

MODE = "mode"  # direct | cot
MODEL = "model"
PROMPT = "prompt"
RATIONALE = "rationale"
PREDICTION = "prediction"
CORRECT = "correct"
NUMERIC_CORRECT = "numeric_correct"
OPTION_SCORES = "option_scores"
TRUNCATED = "truncated"

OPTION_SCORE = StructType(
    [
        StructField("option", StringType(), False),
        StructField("sum_logprob", DoubleType(), False),  # T0 convention: the default ranking
        StructField("per_token", DoubleType(), False),
        StructField("per_byte", DoubleType(), False),
        StructField("n_tokens", IntegerType(), False),
    ]
)

PREDICTIONS_SCHEMA = StructType(
    [
        *EXAMPLE_SCHEMA.fields,
        StructField(MODE, StringType(), False),
        StructField(MODEL, StringType(), False),
        StructField(PROMPT, StringType(), False),
        StructField(RATIONALE, StringType(), True),
        StructField(PREDICTION, StringType(), True),
        StructField(CORRECT, BooleanType(), False),
        StructField(NUMERIC_CORRECT, BooleanType(), True),
        StructField(OPTION_SCORES, ArrayType(OPTION_SCORE), True),
        StructField(TRUNCATED, BooleanType(), False),
    ]
)

GROUP = "group"  # task, template, or '*' for dataset-level means
AGGREGATE = "aggregate"  # task | template | macro | micro | median_template
METRIC_NAME = "metric"  # accuracy | exact_match | numeric_match | acc_norm_token | acc_norm_byte
VALUE = "value"
CI_LOW = "ci_low"
CI_HIGH = "ci_high"
N = "n"
RUN_ID = "run_id"
COMPUTED_AT = "computed_at"

METRICS_SCHEMA = StructType(
    [
        StructField(DATASET, StringType(), False),
        StructField(MODE, StringType(), False),
        StructField(MODEL, StringType(), False),
        StructField(AGGREGATE, StringType(), False),
        StructField(GROUP, StringType(), False),
        StructField(METRIC_NAME, StringType(), False),
        StructField(VALUE, DoubleType(), True),
        StructField(CI_LOW, DoubleType(), True),
        StructField(CI_HIGH, DoubleType(), True),
        StructField(N, LongType(), False),
        StructField(RUN_ID, StringType(), True),
        StructField(COMPUTED_AT, TimestampType(), True),
    ]
)
