"""Bookkeeping tables of the nightly pipeline: `unscored` chains and the `input_files` already ingested."""

from __future__ import annotations

from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

CHAIN_ID = "chain_id"
CONFIG_HASH = "config_hash"
STAGE = "stage"  # the stage that produced no output for the chain (its reason is in `quarantine`)
RUN_ID = "run_id"
RECORDED_AT = "recorded_at"

# A chain that a stage could not process under a config hash: not retried every night (its rows are in
# `quarantine`); `pipeline.rescore` or a new config hash tries it again.
UNSCORED_SCHEMA = StructType(
    [
        StructField(CHAIN_ID, StringType(), False),
        StructField(CONFIG_HASH, StringType(), False),
        StructField(STAGE, StringType(), False),
        StructField(RUN_ID, StringType(), True),
        StructField(RECORDED_AT, TimestampType(), True),
    ]
)
UNSCORED_KEYS = [CHAIN_ID, CONFIG_HASH]

PATH = "path"
SIZE = "size"
MODIFIED_NS = "modified_ns"
SEEN_AT = "seen_at"
# Hash of the ingest settings that shape rows (the ingest section but its input): a file read under other
# settings (a fixed mapping) is read again. Null in rows recorded before it existed: those files are read once more.
INGEST_HASH = "ingest_hash"

# Input files (or Delta input tables, by their latest log entry) ingest has fully read.
INPUT_FILES_SCHEMA = StructType(
    [
        StructField(PATH, StringType(), False),
        StructField(SIZE, LongType(), False),
        StructField(MODIFIED_NS, LongType(), False),
        StructField(RUN_ID, StringType(), True),
        StructField(SEEN_AT, TimestampType(), True),
        StructField(INGEST_HASH, StringType(), True),
    ]
)
INPUT_FILES_KEYS = [PATH, SIZE, MODIFIED_NS, INGEST_HASH]
