"""The readers' comparison (tests/jobs/delta_readers.py) without Spark: one row in each reader's shapes is one
canonical row, and a changed value, a missing or a duplicated row is a difference (the pipeline's reader test,
tests/jobs/test_pipeline.py, relies on both)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
from delta_readers import canonical, first_difference
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

RCU = StructType([StructField("premises", ArrayType(StringType())), StructField("conclusion", StringType())])
SCHEMA = StructType([
    StructField("chain_id", StringType()),
    StructField("worst_step", IntegerType()),
    StructField("score", DoubleType()),
    StructField("labels", MapType(StringType(), DoubleType())),
    StructField("steps", ArrayType(StringType())),
    StructField("rcus", ArrayType(RCU)),
    StructField("at", TimestampType()),
])
AT = dt.datetime(2026, 12, 3, 1, 2, 3, 456789, tzinfo=dt.timezone.utc)

# The same two rows as each reader returns them (shapes seen from Spark 4.2 collect, deltalake 1.6.6 to_pandas
# and polars 2.1 to_dicts on the pipeline's tables; the machine's time zone UTC).
SPARK = [
    # collect: a map is a dict, a struct a Row, a timestamp naive in the driver's local time
    {"chain_id": "c1", "worst_step": 2, "score": 0.25, "labels": {"clean": 1.0, "QUAL": 3.0}, "steps": ["a", "b"],
     "rcus": [Row(premises=["p"], conclusion="q")], "at": AT.astimezone().replace(tzinfo=None)},
    {"chain_id": "c2", "worst_step": None, "score": None, "labels": None, "steps": [], "rcus": None, "at": None},
]
PANDAS = [
    # deltalake to_pandas: (key, value) tuples, numpy arrays, Timestamps; a null int makes the column float
    {"chain_id": "c2", "worst_step": np.nan, "score": np.nan, "labels": None, "steps": np.array([], dtype=object),
     "rcus": None, "at": pd.NaT},
    {"chain_id": "c1", "worst_step": np.float64(2.0), "score": np.float64(0.25),
     "labels": [("QUAL", 3.0), ("clean", 1.0)], "steps": np.array(["a", "b"], dtype=object),
     "rcus": np.array([{"premises": np.array(["p"], dtype=object), "conclusion": "q"}], dtype=object),
     "at": pd.Timestamp(AT)},
]
POLARS = [
    # polars to_dicts: lists, dicts, aware timestamps
    {"chain_id": "c1", "worst_step": 2, "score": 0.25, "labels": {"clean": 1.0, "QUAL": 3.0}, "steps": ["a", "b"],
     "rcus": [{"premises": ["p"], "conclusion": "q"}], "at": AT},
    {"chain_id": "c2", "worst_step": None, "score": None, "labels": None, "steps": [], "rcus": None, "at": None},
]


def test_canonical_each_readers_shapes_are_one_row():
    expected = [
        {"chain_id": "c1", "worst_step": 2, "score": 0.25, "labels": {"clean": 1.0, "QUAL": 3.0},
         "steps": ["a", "b"], "rcus": [{"premises": ["p"], "conclusion": "q"}], "at": AT},
        {"chain_id": "c2", "worst_step": None, "score": None, "labels": None, "steps": [], "rcus": None, "at": None},
    ]
    assert canonical(SPARK, SCHEMA) == canonical(PANDAS, SCHEMA) == canonical(POLARS, SCHEMA) == expected
    # polars 1 gave a map as {"key", "value"} structs
    polars_1 = [dict(POLARS[0], labels=[{"key": "clean", "value": 1.0}, {"key": "QUAL", "value": 3.0}]), POLARS[1]]
    assert canonical(polars_1, SCHEMA) == expected


def test_canonical_a_changed_missing_or_duplicated_row_differs():
    changed = [dict(POLARS[0], labels={"clean": 0.0, "QUAL": 3.0}), POLARS[1]]
    got, want = canonical(changed, SCHEMA), canonical(SPARK, SCHEMA)
    assert got != want
    assert first_difference(got, want) == (
        "row 0: labels: {'clean': 0.0, 'QUAL': 3.0} != {'clean': 1.0, 'QUAL': 3.0}")
    later = [dict(POLARS[0], at=AT + dt.timedelta(microseconds=1)), POLARS[1]]
    assert canonical(later, SCHEMA) != want  # timestamps compare to the microsecond
    assert first_difference(canonical(POLARS[:1], SCHEMA), want) == "1 rows, expected 2"
    assert canonical([POLARS[0], POLARS[0]], SCHEMA) != canonical(POLARS[:1] + POLARS[1:], SCHEMA)
