"""Lake upkeep: every Delta table compacted (OPTIMIZE, clustered where configured) and vacuumed; a bad night
restored.

A night writes one MERGE per batch to each table, so files pile up: reads then open many small files. OPTIMIZE
rewrites them into few large ones (clustering the tables in `maintain.cluster_by` by the columns readers filter
on, config_hash: bench/maintain_bench.py measured it), and VACUUM deletes the files no version younger than
`maintain.retention_hours` needs. Query results are unchanged. `curated` and `rejected` keep a change data
feed (`maintain.change_feed`), so a downstream reader can take only what a night added (docs/OPERATIONS.md).

    python -m jobs.infra.maintain                          # compact + vacuum now (the pipeline also runs it
                                                           # after maintain.every_nights nights)
    python -m jobs.infra.maintain restore --run RUN_ID     # every table back to its version before that run
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.config_paths import resolve_path
from jobs.infra.session import session_confs
from jobs.infra.stage import Job, Stage

log = logging.getLogger(__spec__.name)

# Every table a job writes (the pipeline's, meta-evaluation's, CoT evaluation's).
TABLES = [
    "chains", "quarantine", "input_files", "steps", "contexts", "step_scores", "chain_scores", "unscored",
    "curation", "curated", "rejected", "baseline_scores", "step_baseline_scores", "meta_eval", "localisation",
    "localisation_predictions", "step_labels",
    "cot_predictions", "cot_metrics",
]
STATE = "_maintenance.json"  # nights since the last maintenance, next to the tables
RUN_METADATA = "spark.databricks.delta.commitInfo.userMetadata"  # each commit names the run that made it


def _sql_path(path: str) -> str:
    return "delta.`" + path.replace("`", "``") + "`"


def files(spark: SparkSession, path: str) -> int:
    """Data files in the table's current version."""
    return int(DeltaTable.forPath(spark, path).detail().select("numFiles").first()[0])


def layout(spark: SparkSession, settings: Settings, name: str) -> None:
    """Turn on the change feed and clustering the config asks for (idempotent; table versions move only when
    something changes)."""
    path = settings.table(name)
    detail = DeltaTable.forPath(spark, path).detail().select("properties", "clusteringColumns").first()
    if name in settings.maintain.change_feed and detail["properties"].get("delta.enableChangeDataFeed") != "true":
        spark.sql(f"ALTER TABLE {_sql_path(path)} SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    wanted = settings.maintain.cluster_by.get(name)
    if wanted and list(detail["clusteringColumns"] or []) != wanted:
        spark.sql(f"ALTER TABLE {_sql_path(path)} CLUSTER BY ({', '.join(wanted)})")


LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"


def vacuum(spark: SparkSession, path: str, hours: float, listing_parallelism: int | None = None) -> None:
    """VACUUM with the given retention; its file listing runs `listing_parallelism` tasks per stage (None: the
    cluster's cores) rather than Spark's 10,000 (maintain.vacuum_listing_parallelism)."""
    # Delta refuses retention under 7 days unless told: the retention is the config's explicit choice.
    confs = {
        "spark.databricks.delta.retentionDurationCheck.enabled": "false",
        LISTING_PARALLELISM: str(listing_parallelism or spark.sparkContext.defaultParallelism),
    }
    with session_confs(spark, confs):
        DeltaTable.forPath(spark, path).vacuum(hours)


def run(spark: SparkSession, settings: Settings, names: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Layout, OPTIMIZE and VACUUM every existing table; returns files before/after and seconds per table."""
    report: dict[str, dict[str, Any]] = {}
    for name in names or TABLES:
        path = settings.table(name)
        if not tables.exists(spark, path):
            continue
        started = time.time()
        before = files(spark, path)
        layout(spark, settings, name)
        DeltaTable.forPath(spark, path).optimize().executeCompaction()
        vacuum(spark, path, settings.maintain.retention_hours, settings.maintain.vacuum_listing_parallelism)
        report[name] = {"files_before": before, "files_after": files(spark, path),
                        "seconds": round(time.time() - started, 1)}
        log.info("[maintain] %s: %d -> %d files in %.1f s", name, before, report[name]["files_after"],
                 report[name]["seconds"])
    _write_state(settings, 0)
    return report


# -- when the nightly job runs it --------------------------------------------------------------------------
def _state_file(settings: Settings) -> Path:
    return resolve_path(settings.paths.lake) / STATE


def _write_state(settings: Settings, nights: int) -> None:
    path = _state_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"nights_since_maintenance": nights, "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}))


def night_done(spark: SparkSession, settings: Settings) -> dict[str, dict[str, Any]] | None:
    """Count a finished night; maintain when `maintain.every_nights` nights have passed since the last time."""
    every = settings.maintain.every_nights
    if every is None:
        return None
    path = _state_file(settings)
    nights = (json.loads(path.read_text())["nights_since_maintenance"] if path.exists() else 0) + 1
    if nights < every:
        _write_state(settings, nights)
        return None
    log.info("[maintain] %d nights since the last maintenance (maintain.every_nights=%d): maintaining", nights, every)
    return run(spark, settings)


# -- after a bad night -------------------------------------------------------------------------------------
def versions_before(spark: SparkSession, settings: Settings, run_id: str) -> dict[str, int]:
    """Per table the run wrote: the version just before its first commit (-1: the run created the table)."""
    out = {}
    for name in TABLES:
        path = settings.table(name)
        if not tables.exists(spark, path):
            continue
        first = (
            DeltaTable.forPath(spark, path).history()
            .where(F.col("userMetadata") == run_id).agg(F.min("version")).first()[0]
        )
        if first is not None:
            out[name] = int(first) - 1
    return out


def restore(spark: SparkSession, settings: Settings, run_id: str) -> dict[str, int]:
    """Every table the run wrote back to its version before the run (Delta RESTORE: a new version, so the bad
    night stays in the history and can itself be restored to). A table the run created is emptied."""
    target = versions_before(spark, settings, run_id)
    for name, version in target.items():
        table = DeltaTable.forPath(spark, settings.table(name))
        if version >= 0:
            table.restoreToVersion(version)
        else:
            table.delete()
        log.info("[maintain] %s restored to version %d (before run %s)", name, version, run_id)
    return target


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=["optimize", "restore"], default="optimize")
    parser.add_argument("--run", help="restore: the pipeline run id (its MLflow tag pipeline_run / Summary.run_id)")


def _check(settings: Settings, args: argparse.Namespace) -> None:
    if args.action == "restore" and not args.run:
        raise SystemExit("maintain restore needs --run RUN_ID")


def _plan(spark: SparkSession | None, settings: Settings, args: argparse.Namespace) -> list[str]:
    if args.action == "restore":
        return [f"  restore: would restore {versions_before(spark, settings, args.run)}"]
    existing = [n for n in TABLES if tables.exists(spark, settings.table(n))]
    return [f"  would OPTIMIZE and VACUUM (retention {settings.maintain.retention_hours} h): "
            + ", ".join(f"{n} ({files(spark, settings.table(n))} files)" for n in existing)]


def _body(job: Job) -> dict[str, Any]:
    spark, settings, tracked = job.spark, job.settings, job.tracked
    if job.args.action == "restore":
        result: dict[str, Any] = restore(spark, settings, job.args.run)
        tracked.log_metrics({f"restored_version.{k}": v for k, v in result.items()})
        return result
    result = run(spark, settings)
    for name, r in result.items():
        tracked.log_metrics({f"files_before.{name}": r["files_before"], f"files_after.{name}": r["files_after"]})
    return result


# Upkeep of every table of the lake (TABLES): a platform job, so it names tables, never stages.
# It rewrites (OPTIMIZE) or restores every table: declared so, it holds the lake's claim while it runs (stage.py).
STAGE = Stage("maintain", __doc__, _body, writes=tuple(TABLES), section="maintain", arguments=_arguments,
              check=_check, plan=_plan, run_name=lambda args: f"maintain_{args.action}", creates_tables=False)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
