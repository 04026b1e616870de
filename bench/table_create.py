"""Creating an empty Delta table: `tables.ensure` (Delta's table builder, a metadata-only commit) against the
empty-frame write it replaced (a Spark job, an empty data file, then the commit), alternated in one session.

A first night on a new lake creates 14 tables and every test with a fresh lake creates its own, so this fixed
cost is paid often on small data. The tables both ways are checked equal (schema with nullability, partition
columns, properties) before the times count.

    .venv/bin/python bench/table_create.py [--rounds 5] [--tables 14]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.infra import tables  # noqa: E402
from jobs.infra.config import SparkSettings  # noqa: E402
from jobs.infra.session import build_session  # noqa: E402
from schemas import chain_scores, chains, quarantine, step_scores, steps  # noqa: E402

CONTRACTS = [chains.SCHEMA, steps.SCHEMA, steps.CONTEXTS_SCHEMA, step_scores.SCHEMA, chain_scores.SCHEMA,
             quarantine.SCHEMA]
CDF = {"delta.enableChangeDataFeed": "true"}


def by_write(spark, path: str, schema, partition_by, properties) -> None:
    """The previous `tables.ensure` creation: an empty frame written with mode "ignore"."""
    writer = spark.createDataFrame([], schema).write.format("delta").mode("ignore")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    for key, value in properties.items():
        writer = writer.option(key, value)
    writer.save(path)


def by_ensure(spark, path: str, schema, partition_by, properties) -> None:
    tables.ensure(spark, path, schema, partition_by=partition_by, properties=properties)


def shape(spark, path: str) -> tuple:
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()
    return (spark.read.format("delta").load(path).schema, tuple(detail["partitionColumns"]),
            tables.table_properties(spark, path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tables", type=int, default=14)
    args = parser.parse_args()
    spark = build_session(SparkSettings(master="local[2]", shuffle_partitions=2, app_name="table-create-bench"))
    root = tempfile.mkdtemp(prefix="table-create-")
    schemas = [CONTRACTS[i % len(CONTRACTS)] for i in range(args.tables)]
    specs = [(s, ["config_hash"] if i % 2 and "config_hash" in s.fieldNames() else [], CDF if i % 3 == 0 else {})
             for i, s in enumerate(schemas)]
    per_table: dict[str, list[float]] = {"write": [], "ensure": []}
    for r in range(args.rounds + 1):  # round 0 warms the JVM for both and is not counted
        for name, create in (("write", by_write), ("ensure", by_ensure)) if r % 2 else (("ensure", by_ensure),
                                                                                       ("write", by_write)):
            t0 = time.perf_counter()
            for i, (schema, part, props) in enumerate(specs):
                create(spark, f"{root}/{name}-{r}-{i}", schema, part, props)
            if r:
                per_table[name].append((time.perf_counter() - t0) / len(specs))
        for i in range(len(specs)):
            assert shape(spark, f"{root}/write-{r}-{i}") == shape(spark, f"{root}/ensure-{r}-{i}"), i
    files = {name: sum(len(files) for d, _, files in os.walk(f"{root}/{name}-1-0") if "_delta_log" not in d)
             for name in per_table}
    write, ensure = (statistics.median(per_table[n]) for n in ("write", "ensure"))
    load = os.getloadavg()[0]
    section = f"""
## Creating an empty Delta table (bench/table_create.py)

- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; machine: {os.cpu_count()} cores; load average at the end: {load:.1f}
- {args.tables} tables of the contracts (some partitioned, some with the change data feed) per round, {args.rounds}
  rounds alternating the order after a warm-up round; Spark local[2]; tables both ways equal (schema with
  nullability, partition columns, properties)

| creation | s per table (median of rounds) | data files in a new table |
|---|---:|---:|
| empty-frame write (before) | {write:.3f} | {files['write']} |
| `tables.ensure` (table builder) | {ensure:.3f} | {files['ensure']} |

ensure / write = {ensure / write:.2f}
"""
    print(section)
    with open(ROOT / "bench" / "RESULTS.md", "a") as out:
        out.write(section)


if __name__ == "__main__":
    main()
