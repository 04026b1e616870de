"""`meta_eval`: Somers' D of each metric against each label, with a bootstrap 95% CI."""

from __future__ import annotations

from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType, TimestampType

DATASET = "dataset"
LABEL = "label"  # e.g. HALL, QUAL; 1 = clean, 0 = error (ordinal for QUAL/COH)
METRIC = "metric"  # e.g. intra_entail_min, roscoe_sa_faithfulness_step
SOMERS_D = "somers_d"  # D(score | label): > 0 means the metric ranks clean chains higher
CI_LOW = "ci_low"
CI_HIGH = "ci_high"
N = "n"
N_ERRORS = "n_errors"  # rows with label 0 (binary labels) or below the max rating
METHOD = "method"  # scipy (point estimate; CI: label-stratified bootstrap) | spark_auc (CI: DeLong)
CONFIG_HASH = "config_hash"  # scoring hash of the ReCEval scores evaluated (baseline rows share the run's)
RUN_ID = "run_id"
COMPUTED_AT = "computed_at"

SCHEMA = StructType(
    [
        StructField(DATASET, StringType(), False),
        StructField(LABEL, StringType(), False),
        StructField(METRIC, StringType(), False),
        StructField(SOMERS_D, DoubleType(), True),
        StructField(CI_LOW, DoubleType(), True),
        StructField(CI_HIGH, DoubleType(), True),
        StructField(N, LongType(), False),
        StructField(N_ERRORS, LongType(), False),
        StructField(METHOD, StringType(), False),
        StructField(CONFIG_HASH, StringType(), False),
        StructField(RUN_ID, StringType(), True),
        StructField(COMPUTED_AT, TimestampType(), True),
    ]
)
