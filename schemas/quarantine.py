"""`quarantine`: rows that failed validation or scoring, with the stage and reason; nothing is dropped."""

from __future__ import annotations

from pyspark.sql.types import StringType, StructField, StructType, TimestampType

STAGE = "stage"  # ingest | steps | nli | pvi | ...
REASON = "reason"  # short machine-readable kind, e.g. missing_context
DETAIL = "detail"  # human-readable message (exception text for scoring failures)
CHAIN_ID = "chain_id"  # null when the row never had one
RAW = "raw"  # the row as JSON text, to replay it
SOURCE = "source"
RUN_ID = "run_id"
QUARANTINED_AT = "quarantined_at"

SCHEMA = StructType(
    [
        StructField(STAGE, StringType(), False),
        StructField(REASON, StringType(), False),
        StructField(DETAIL, StringType(), True),
        StructField(CHAIN_ID, StringType(), True),
        StructField(RAW, StringType(), True),
        StructField(SOURCE, StringType(), True),
        StructField(RUN_ID, StringType(), True),
        StructField(QUARANTINED_AT, TimestampType(), True),
    ]
)
