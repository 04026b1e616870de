"""The Delta tables a job read and wrote, with their versions: logged to its MLflow run as datasets, and each
table's line in a dry-run. Which tables a stage reads and writes is declared once, on the stage
(jobs.infra.stage.Stage)."""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.tracking import JobRun


def log_tables(spark: SparkSession, settings: Settings, tracked: JobRun, names: Iterable[str], context: str) -> None:
    """Tables read (`input`, before the job runs) or written (`output`, after) with their Delta versions."""
    for name in names:
        path = settings.table(name)
        tracked.log_table(name, path, tables.version(spark, path), context)


def table_line(spark: SparkSession, settings: Settings, name: str) -> str:
    """`name: version v, n rows (m under this config hash)` or `name: absent` (reads the Delta log and counts)."""
    path = settings.table(name)
    version = tables.version(spark, path)
    if version is None:
        return f"{name}: absent (would be created) at {path}"
    df = tables.read(spark, path)
    rows = df.count()
    hashed = (
        f", {df.where(F.col('config_hash') == settings.scoring_hash()).count()} under config hash "
        f"{settings.scoring_hash()}"
        if "config_hash" in df.columns else ""
    )
    return f"{name}: version {version}, {rows} rows{hashed} at {path}"
