"""The Delta tables a job read and wrote, with their versions: logged to its MLflow run as datasets, and each
table's line in a dry-run. Which tables a stage reads and writes is declared once, on the stage
(jobs.infra.stage.Stage). Also the fingerprint of an input file, which tells a job whether it changed."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.tracking import JobRun


def log_tables(spark: SparkSession, settings: Settings, tracked: JobRun, names: Iterable[str], context: str) -> None:
    """Tables read (`input`, before the job runs) or written (`output`, after) with their Delta versions."""
    log_versions(settings, tracked, versions(spark, settings, names), context)


def table_line(spark: SparkSession, settings: Settings, name: str, creates: bool = True) -> str:
    """`name: version v, n rows (m under this config hash)` or `name: absent (would be created)`, `(left alone)`
    for a stage that never creates a table (`creates` False: maintain); reads the Delta log and counts."""
    path = settings.table(name)
    version = tables.version(spark, path)
    if version is None:
        return f"{name}: absent ({'would be created' if creates else 'left alone'}) at {path}"
    df = tables.read(spark, path)
    rows = df.count()
    hashed = (
        f", {df.where(F.col('config_hash') == settings.scoring_hash()).count()} under config hash "
        f"{settings.scoring_hash()}"
        if "config_hash" in df.columns else ""
    )
    return f"{name}: version {version}, {rows} rows{hashed} at {path}"


def versions(spark: SparkSession, settings: Settings, names: Iterable[str]) -> dict[str, int | None]:
    """Each table's latest Delta version (None: not made yet); reads Delta logs only, no Spark job."""
    return {name: tables.version(spark, settings.table(name)) for name in names}


def table_state(
    spark: SparkSession,
    settings: Settings,
    names: Iterable[str],
    before: tuple[dict[str, int], dict[str, int | None]] | None = None,
) -> tuple[dict[str, int], dict[str, int | None]]:
    """Rows and Delta version of every table. A table still at its version in `before` has its rows from there:
    a version fixes a table's content, and each count is a Spark job (a night that changes nothing counts none)."""
    rows, found = {}, {}
    for name in names:
        path = settings.table(name)
        found[name] = tables.version(spark, path)
        if before is not None and found[name] == before[1].get(name):
            rows[name] = before[0][name]
        else:
            rows[name] = tables.read(spark, path).count() if found[name] is not None else 0
    return rows, found


def log_versions(
    settings: Settings,
    tracked: JobRun,
    at: Mapping[str, int | None],
    context: str,
    since: Mapping[str, int | None] | None = None,
) -> None:
    """Tables at the versions `at` as the run's datasets (`input` or `output`); with `since`, only the tables
    whose version moved from it (what the run wrote)."""
    for name, version in at.items():
        if since is None or version != since.get(name):
            tracked.log_table(name, settings.table(name), version, context)


@contextmanager
def recorded(
    spark: SparkSession, settings: Settings, tracked: JobRun, inputs: Iterable[str], outputs: Iterable[str]
) -> Iterator[None]:
    """A stage's lineage around its work (the block): the tables it reads as input datasets before; after, its
    tags `input_version.<t>`, `output_version_before.<t>` and `output_version_after.<t>`, and the outputs it
    changed as output datasets. Nothing is recorded after a block that raised (the run ends FAILED)."""
    read = versions(spark, settings, inputs)
    log_versions(settings, tracked, read, "input")
    before = versions(spark, settings, outputs)
    yield
    after = versions(spark, settings, outputs)
    tracked.set_tags({f"input_version.{k}": v for k, v in read.items()})
    tracked.set_tags({f"output_version_before.{k}": v for k, v in before.items()})
    tracked.set_tags({f"output_version_after.{k}": v for k, v in after.items()})
    log_versions(settings, tracked, after, "output", since=before)


def file_fingerprint(path: str) -> tuple[int, int]:
    """(size, mtime_ns) of an input path, which change when its content may have: a file's own; a folder's total
    size and latest change over its files; a Delta table's latest log entry (its version in place of the size,
    -1 without one) and that entry's mtime."""
    p = Path(path)
    if (p / "_delta_log").is_dir():
        logs = sorted((p / "_delta_log").glob("*.json"))
        last = logs[-1] if logs else p / "_delta_log"
        return (int(last.stem) if logs else -1), last.stat().st_mtime_ns
    if p.is_dir():
        stats = [f.stat() for f in p.rglob("*") if f.is_file()]
        return sum(st.st_size for st in stats), max((st.st_mtime_ns for st in stats), default=0)
    st = p.stat()
    return st.st_size, st.st_mtime_ns
