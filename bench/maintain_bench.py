"""Lake layout and maintenance over 10 simulated nights: data files and read time of a config-hash query.

Each night MERGEs `--chains` new chain-score rows in `--batches` batches (as the nightly job commits) into a
`chain_scores`-shaped table, half under the current config hash and half under an older one. Three layouts:
plain (today's tables), partitioned by config_hash, and liquid-clustered by config_hash; each is measured after
the 10 nights and again after `jobs.infra.maintain` (OPTIMIZE + VACUUM). The read is what the pipeline and
curation do: the rows of one config hash, aggregated (median of 5 timed runs after one warm-up).

    .venv/bin/python bench/maintain_bench.py            # appends a section to bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pyspark.sql import functions as F  # noqa: E402

from jobs.infra import maintain, tables  # noqa: E402
from jobs.infra.config_layers import load_settings  # noqa: E402
from jobs.infra.session import build_session  # noqa: E402
from schemas import chain_scores as CS  # noqa: E402

CURRENT, OLD = "c" * 16, "o" * 16
LAYOUTS = ("plain", "partitioned", "clustered")


def night_rows(spark, night: int, batch: int, n: int):
    ids = spark.range(n).select(
        F.concat(F.lit(f"n{night}-b{batch}-"), F.col("id").cast("string")).alias(CS.CHAIN_ID),
        F.when(F.col("id") % 2 == 0, F.lit(CURRENT)).otherwise(F.lit(OLD)).alias(CS.CONFIG_HASH),
        (F.col("id") % 7 + 1).cast("int").alias(CS.N_STEPS),
        *[F.rand(seed=night * 100 + batch + i).alias(CS.min_col(m)) for i, m in enumerate(CS.metric_names())],
    )
    return tables.conform(ids.select("*", *[F.lit(None).alias(c) for c in CS.SCHEMA.fieldNames()
                                            if c not in ids.columns]), CS.SCHEMA)


def create(spark, path: str, layout: str) -> None:
    empty = spark.createDataFrame([], CS.SCHEMA)
    if layout == "clustered":
        from delta.tables import DeltaTable

        DeltaTable.create(spark).location(path).addColumns(CS.SCHEMA).clusterBy(CS.CONFIG_HASH).execute()
    elif layout == "partitioned":
        empty.write.format("delta").partitionBy(CS.CONFIG_HASH).save(path)
    else:
        empty.write.format("delta").save(path)


def query(spark, path: str) -> tuple:
    row = (tables.read(spark, path).where(F.col(CS.CONFIG_HASH) == CURRENT)
           .agg(F.count(F.lit(1)), F.min(CS.min_col("inter")), F.sum(CS.N_STEPS)).first())
    return tuple(row)


def read_seconds(spark, path: str) -> tuple[float, tuple]:
    """Median seconds of the query (5 runs after a warm-up) and its result."""
    result = query(spark, path)
    times = []
    for _ in range(5):
        started = time.perf_counter()
        query(spark, path)
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def data_files_on_disk(path: str) -> int:
    return sum(1 for p in Path(path).glob("**/*.parquet") if "_delta_log" not in p.parts)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nights", type=int, default=10)
    parser.add_argument("--chains", type=int, default=2000, help="new chains per night")
    parser.add_argument("--batches", type=int, default=2, help="MERGE commits per night")
    parser.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="maintain_bench_"))
    settings = load_settings(overrides=[f"paths.lake={work}/lake", "spark.master=local[2]",
                                        "spark.shuffle_partitions=4", "maintain.retention_hours=0",
                                        "maintain.cluster_by={}"], environ={})
    spark = build_session(settings.spark)
    # Warm-up: the first MERGEs of a session pay JVM and Delta start-up; not part of any layout's figures.
    create(spark, str(work / "warmup"), "plain")
    for batch in range(3):
        tables.insert_new(spark, night_rows(spark, 0, batch, 100), str(work / "warmup"), CS.SCHEMA,
                          [CS.CHAIN_ID, CS.CONFIG_HASH])
    started = time.time()
    rows = []
    for layout in LAYOUTS:
        path = str(work / layout / "chain_scores")
        create(spark, path, layout)
        t0 = time.time()
        for night in range(args.nights):
            for batch in range(args.batches):
                frame = night_rows(spark, night, batch, args.chains // args.batches)
                tables.insert_new(spark, frame, path, CS.SCHEMA, [CS.CHAIN_ID, CS.CONFIG_HASH])
        write_s = time.time() - t0
        files_before, (read_before, result_before) = maintain.files(spark, path), read_seconds(spark, path)
        t0 = time.time()
        from delta.tables import DeltaTable

        DeltaTable.forPath(spark, path).optimize().executeCompaction()
        maintain.vacuum(spark, path, 0)
        maintain_s = time.time() - t0
        files_after, (read_after, result_after) = maintain.files(spark, path), read_seconds(spark, path)
        assert result_after == result_before, (layout, result_before, result_after)  # maintenance changes no result
        on_disk = data_files_on_disk(path)
        rows.append((layout, write_s, files_before, read_before, maintain_s, files_after, on_disk, read_after))
        print(rows[-1], flush=True)
    load = os.getloadavg()
    lines = [
        "",
        f"## Lake layout and maintenance over {args.nights} nights (bench/maintain_bench.py)",
        "",
        f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; machine: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores; load average at the end: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}",
        f"- {args.nights} nights x {args.chains} chain_scores rows in {args.batches} MERGE batches (insert_new), "
        "half under the current config hash; Spark local[2], 4 shuffle partitions; "
        f"whole run {time.time() - started:.0f} s",
        "- read: rows of the current config hash, count + min + sum; median of 5 after a warm-up; its result is "
        "the same before and after maintenance (checked); a warm-up table is written first",
        "",
        "| layout | 10 nights written (s) | files before | read before (s) | OPTIMIZE+VACUUM (s) | files after "
        "| data files on disk after VACUUM | read after (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *[f"| {r[0]} | {r[1]:.1f} | {r[2]} | {r[3]:.3f} | {r[4]:.1f} | {r[5]} | {r[6]} | {r[7]:.3f} |" for r in rows],
        "",
    ]
    text = "\n".join(lines)
    with open(args.out, "a") as f:
        f.write(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
