"""The lake as readers without a JVM see it: delta-rs (`deltalake`) into pandas, polars, and Spark's read of the
same table, each brought to plain Python rows for whole-table comparison.

Each reader hands the same Delta types over in its own shape: a map is a dict in Spark and polars 2, a list of
(key, value) tuples in pandas from deltalake (a list of {"key", "value"} structs in polars 1); an array is a list
or a numpy array; a timestamp a naive local-time datetime (Spark's collect), a pandas Timestamp or an aware
datetime; a null number None, NaN or NaT. `plain` walks the Spark schema of the table (its contract) to put
every value in one shape, so two readers agree exactly when they read the same rows.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql.types import ArrayType, DataType, IntegralType, MapType, StructType, TimestampType

Row = dict[str, Any]


def lake_tables(lake: Path) -> list[str]:
    """Every Delta table in the lake folder (a folder with a `_delta_log`), by name."""
    return sorted(p.parent.name for p in Path(lake).glob("*/_delta_log"))


def plain(value: Any, dtype: DataType) -> Any:
    """`value` of Delta type `dtype`, as any of the readers returned it, in one shape: dicts for structs and maps,
    lists for arrays, aware UTC datetimes, Python scalars, None for null (and for NaN and NaT, which pandas makes
    of a null number or timestamp)."""
    if value is None or (not isinstance(value, (list, tuple, dict, np.ndarray)) and pd.isna(value)):
        return None  # also NaN, NaT (pandas' null number and timestamp)
    if isinstance(dtype, StructType):
        get = value.asDict() if hasattr(value, "asDict") else dict(value)
        return {f.name: plain(get.get(f.name), f.dataType) for f in dtype.fields}
    if isinstance(dtype, MapType):
        if isinstance(value, dict):
            pairs = value.items()
        else:  # (key, value) tuples (pandas from arrow) or {"key", "value"} structs (polars 1)
            pairs = [(p["key"], p["value"]) if isinstance(p, dict) else tuple(p) for p in value]
        return {plain(k, dtype.keyType): plain(v, dtype.valueType) for k, v in pairs}
    if isinstance(dtype, ArrayType):
        return [plain(v, dtype.elementType) for v in list(value)]
    if isinstance(dtype, TimestampType):
        if hasattr(value, "to_pydatetime"):  # pandas Timestamp
            value = value.to_pydatetime()
        # Naive: Spark's collect, in the driver's local time (astimezone reads a naive datetime as local time).
        return value.astimezone(dt.timezone.utc)
    if isinstance(dtype, IntegralType):
        return int(value)  # pandas holds an integer column with nulls as floats: 2.0 is read back as 2
    if isinstance(value, np.generic):
        return value.item()
    return value


def canonical(rows: list[Row], schema: StructType) -> list[Row]:
    """Rows in one shape (`plain`), sorted by their whole content: tables with and without a natural key compare
    the same way, and a duplicated or missing row shows."""
    out = [{f.name: plain(row.get(f.name), f.dataType) for f in schema.fields} for row in rows]
    return sorted(out, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def spark_rows(spark: SparkSession, path: str) -> tuple[StructType, list[Row]]:
    df = spark.read.format("delta").load(path)
    return df.schema, [r.asDict() for r in df.collect()]


def deltalake_rows(path: str) -> tuple[list[str], list[Row]]:
    """The table read the way a pandas user without Spark reads it: delta-rs, no JVM."""
    from deltalake import DeltaTable

    frame = DeltaTable(path).to_pandas()
    return list(frame.columns), frame.to_dict("records")


def polars_rows(path: str) -> tuple[list[str], list[Row]]:
    import polars as pl

    frame = pl.read_delta(path)
    return frame.columns, frame.to_dicts()


def change_feed_inserts(path: str | Path, starting_version: int) -> list[Row]:
    """What a downstream reader without Spark takes from a table's change data feed (deltalake `load_cdf`): the
    rows inserted from `starting_version` on, without the feed's own columns."""
    import pyarrow as pa
    from deltalake import DeltaTable

    feed = pa.table(DeltaTable(str(path)).load_cdf(starting_version=starting_version)).to_pandas()
    inserts = feed[feed["_change_type"] == "insert"]
    return inserts.drop(columns=["_change_type", "_commit_version", "_commit_timestamp"]).to_dict("records")


def first_difference(got: list[Row], expected: list[Row]) -> str:
    """The first row where two canonical tables differ (assert messages of whole tables are unreadable)."""
    if len(got) != len(expected):
        return f"{len(got)} rows, expected {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if g != e:
            cols = [c for c in e if g.get(c) != e[c]]
            return f"row {i}: " + "; ".join(f"{c}: {g.get(c)!r} != {e[c]!r}" for c in cols)
    return "equal"


def compare_readers(spark: SparkSession, path: str) -> tuple[StructType, list[Row]]:
    """Assert that deltalake (pandas) and polars read the same columns and rows as Spark; returns Spark's schema
    and rows (canonical), for further checks without reading the table again."""
    schema, spark_read = spark_rows(spark, path)
    expected = canonical(spark_read, schema)
    for reader, read in (("deltalake", deltalake_rows), ("polars", polars_rows)):
        columns, rows = read(path)
        assert columns == schema.fieldNames(), f"{path} via {reader}: columns {columns} != {schema.fieldNames()}"
        got = canonical(rows, schema)
        assert got == expected, f"{path} via {reader}: {first_difference(got, expected)}"
    return schema, expected
