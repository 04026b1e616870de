"""`cot_predictions` (one row per example, mode and model) and `cot_metrics` (accuracy / EM per group).

Keys: predictions (dataset, task, template, example_id, mode, model, protocol_hash), template null-safe (BBH and MGSM have
none); metrics (dataset, mode, model, aggregate, group, metric). All metrics: higher is better.
"""

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

from schemas import metrics as MR

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
CORRECT = "correct"  # classification: the option ranked first by cot.score matches gold; generation: EM
NUMERIC_CORRECT = "numeric_correct"  # generation with a numeric gold: same number ("18." == "$18" == "18")
CORRECT_PER_TOKEN = "correct_per_token"  # classification: argmax of log-prob per option token is gold
CORRECT_PER_BYTE = "correct_per_byte"  # classification: argmax of log-prob per UTF-8 byte is gold
OPTION_SCORES = "option_scores"
CHANCE = "chance"  # the accuracy a uniform guess expects: 1 / number of options; 0 for generation
TRUNCATED = "truncated"
# Fingerprint of every setting that changes a prediction (protocol keys, seed, model family): a key column, so
# runs under different protocols sit side by side and a resumed run reuses only rows made the same way.
PROTOCOL_HASH = "protocol_hash"

OPTION_SCORE = StructType(
    [
        StructField("option", StringType(), True),
        StructField("sum_logprob", DoubleType(), True),  # T0 convention: the default ranking (natural log)
        StructField("per_token", DoubleType(), True),  # sum_logprob / n_tokens (lm-eval acc_norm style)
        StructField("per_byte", DoubleType(), True),  # sum_logprob / UTF-8 bytes of the option
        StructField("n_tokens", IntegerType(), True),
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
        StructField(CORRECT_PER_TOKEN, BooleanType(), True),
        StructField(CORRECT_PER_BYTE, BooleanType(), True),
        StructField(OPTION_SCORES, ArrayType(OPTION_SCORE), True),
        StructField(TRUNCATED, BooleanType(), False),
        StructField(PROTOCOL_HASH, StringType(), True),  # null on rows written before it existed
        StructField(CHANCE, DoubleType(), True),  # null on rows written before it existed
    ]
)

GROUP = "group"  # task name; "task/template" for aggregate=template; "*" for dataset-level means
AGGREGATE = "aggregate"  # one of AGGREGATES (schemas/metrics.COT_AGGREGATES says what each is)
AGGREGATES = MR.COT_AGGREGATES
METRIC_NAME = "metric"  # a cot_metrics metric of the registry (schemas/metrics.py: definition, source column)
VALUE = "value"
CI_LOW = "ci_low"  # bootstrap percentile interval (scipy.stats.bootstrap), cot.confidence; null if n < 2
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
