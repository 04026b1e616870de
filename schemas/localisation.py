"""`localisation` and `localisation_predictions`: how well each step score finds a chain's earliest error.

ProcessBench's protocol (Zheng et al. 2024, docs/META_EVAL.md "Step-level localisation"): a step score becomes a
predictor of the earliest erroneous step by a threshold (the first step scoring below it, else -1 = no error);
the threshold is the F1-best one on the calibration subset and is applied unchanged to every other subset.
Fractions in [0, 1] throughout (x 100 = the paper's percentages). Every figure is higher-is-better.
"""

from __future__ import annotations

from pyspark.sql.types import (
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

DATASET = "dataset"  # the subset evaluated, e.g. processbench_math
METRIC = "metric"  # a step_scores metric, the combination (COMBINED) or a per-step baseline
CALIBRATION = "calibration"  # the subset the threshold was chosen on (its own row is in-sample)
THRESHOLD = "threshold"  # a step is flagged when its score is strictly below this (-inf: never, +inf: any score)
N = "n"  # chains evaluated (scored, labelled, not quarantined)
N_ERROR = "n_error"  # of which erroneous (label >= 0)
N_CORRECT = "n_correct"  # of which all-correct (label -1)
ACC_ERROR = "acc_error"  # exact match of the predicted index on erroneous chains
ACC_CORRECT = "acc_correct"  # share of all-correct chains predicted -1
F1 = "f1"  # 2 acc_error acc_correct / (acc_error + acc_correct): ProcessBench's figure (run_eval.py)
AUROC = "auroc"  # P(the earliest-error step scores below a step before it), ties 1/2; later steps left out
AUROC_LOW = "auroc_low"  # percentile bootstrap CI over chains (localise.ci_level, seeded)
AUROC_HIGH = "auroc_high"
N_POSITIVE = "n_positive_steps"  # earliest-error steps the AUROC ranked
N_NEGATIVE = "n_negative_steps"  # steps before them and steps of all-correct chains
HIT_RATE = "hit_rate"  # erroneous chains whose lowest-scoring step (first on ties) is the labelled one
RANDOM_HIT_RATE = "random_hit_rate"  # the same for a uniformly drawn step: mean of 1 / n_steps
CONFIG_HASH = "config_hash"  # scoring hash of the step scores evaluated
RUN_ID = "run_id"
COMPUTED_AT = "computed_at"

# The ReCEval combination: each of localise.combine rank-normalised over the calibration subset's steps (its
# empirical CDF there, applied unchanged to every subset), then the per-step min. Lower = more suspicious.
COMBINED = "receval_rank_min"
# localise.check_first: `checks` predicts the first step a check (e.g. arith_valid < 1) flags, else -1;
# `checks_then_<metric>` that step, else the metric's prediction. Predictions only: no AUROC or hit rate.
CHECKS = "checks"
CHECKS_THEN = "checks_then_"

KEYS = [DATASET, METRIC, CALIBRATION, CONFIG_HASH]

SCHEMA = StructType(
    [
        StructField(DATASET, StringType(), False),
        StructField(METRIC, StringType(), False),
        StructField(CALIBRATION, StringType(), False),
        StructField(THRESHOLD, DoubleType(), False),
        StructField(N, LongType(), False),
        StructField(N_ERROR, LongType(), False),
        StructField(N_CORRECT, LongType(), False),
        StructField(ACC_ERROR, DoubleType(), True),
        StructField(ACC_CORRECT, DoubleType(), True),
        StructField(F1, DoubleType(), True),
        StructField(AUROC, DoubleType(), True),
        StructField(AUROC_LOW, DoubleType(), True),
        StructField(AUROC_HIGH, DoubleType(), True),
        StructField(N_POSITIVE, LongType(), False),
        StructField(N_NEGATIVE, LongType(), False),
        StructField(HIT_RATE, DoubleType(), True),
        StructField(RANDOM_HIT_RATE, DoubleType(), True),
        StructField(CONFIG_HASH, StringType(), False),
        StructField(RUN_ID, StringType(), True),
        StructField(COMPUTED_AT, TimestampType(), True),
    ]
)

# One row per chain and metric: enough to recompute the official figures (run_eval.py compares `prediction`
# with `label`) with any tool, and to see which chains a metric got right.
CHAIN_ID = "chain_id"
PREDICTED = "predicted"  # the predicted earliest-error index, -1 = no step flagged
LABEL = "label"  # the labelled earliest-error index, -1 = every step correct

PREDICTION_KEYS = [CHAIN_ID, METRIC, CALIBRATION, CONFIG_HASH]

PREDICTIONS_SCHEMA = StructType(
    [
        StructField(CHAIN_ID, StringType(), False),
        StructField(DATASET, StringType(), False),
        StructField(METRIC, StringType(), False),
        StructField(PREDICTED, IntegerType(), False),
        StructField(THRESHOLD, DoubleType(), False),
        StructField(LABEL, IntegerType(), False),
        StructField(CALIBRATION, StringType(), False),
        StructField(CONFIG_HASH, StringType(), False),
        StructField(RUN_ID, StringType(), True),
    ]
)
