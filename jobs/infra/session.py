"""One SparkSession builder for jobs, tests and spark-submit, with Delta Lake from a local jar cache."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from jobs.infra.config import SparkSettings
from jobs.infra.config_paths import resolve_path
from udfs.home import HOME_ENV, command, home

# Maven Central serves delta-spark_4.2_2.13 only at 4.4.0 (4.4.1: 404, checked 2026-11-30), so the
# pip package is pinned to the same 4.4.0.
DELTA_PACKAGE = "io.delta:delta-spark_4.2_2.13:4.4.0"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"


class JarsMissing(RuntimeError):
    pass


def delta_jars(jars_dir: str | os.PathLike[str]) -> list[Path]:
    folder = resolve_path(jars_dir)
    jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    if not any("delta-spark_" in j.name for j in jars):
        raise JarsMissing(
            f"spark.jars_dir: Delta jars not found in {folder}. Run `{command('jobs.infra.jars', 'jars')}` once "
            "(needs Maven Central); later runs work offline from that folder. Where the cluster provides Delta "
            "Lake, set spark.delta_jars=false instead."
        )
    return jars


def build_session(spark: SparkSettings, extra: dict[str, str] | None = None) -> SparkSession:
    """Session for `spark.master` with Delta configured; reuses a session spark-submit already made."""
    # Executors must run the same interpreter as the driver, or pandas UDFs import another torch.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = (
        SparkSession.builder.appName(spark.app_name)
        .config("spark.sql.extensions", DELTA_EXTENSION)
        .config("spark.sql.catalog.spark_catalog", DELTA_CATALOG)
        .config("spark.sql.shuffle.partitions", str(spark.shuffle_partitions))
        # Delta rebuilds a table's state from its log in 50 partitions by default: 50 tasks for every
        # read or MERGE of a small table. Sized like the other shuffles (spark.conf can override).
        .config("spark.databricks.delta.snapshotPartitions", str(spark.shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.ui.enabled", str(spark.ui).lower())
        .config("spark.ui.showConsoleProgress", str(spark.ui).lower())
        .config("spark.databricks.delta.schema.autoMerge.enabled", "false")
        .config("spark.executorEnv.PYSPARK_PYTHON", os.environ["PYSPARK_PYTHON"])
        # Executors resolve relative model folders against the driver's home (udfs.home), not their own work
        # folder: the same folder where they share the driver's file system, as scripts/submit.sh needs.
        .config(f"spark.executorEnv.{HOME_ENV}", str(home()))
    )
    # Under spark-submit the JVM already runs with its --master and --jars (PYSPARK_GATEWAY_PORT is
    # set); a plain `python -m jobs.x` starts the JVM here and must name both, the jars only where the
    # cluster does not provide Delta (spark.delta_jars).
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.master(spark.master)
        if spark.delta_jars:
            builder = builder.config("spark.jars", ",".join(str(j) for j in delta_jars(spark.jars_dir)))
    if spark.event_log:
        # The History Server reads this folder after the job (docs/OPERATIONS.md); Spark needs it to exist.
        folder = resolve_path(spark.event_log)
        folder.mkdir(parents=True, exist_ok=True)
        builder = builder.config("spark.eventLog.enabled", "true").config("spark.eventLog.dir", folder.as_uri())
    for key, value in {**spark.conf, **(extra or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(spark.log_level)
    ship_wheels(session)
    return session


def ship_wheels(session: SparkSession) -> list[str]:
    """A wheel given to spark-submit (`--py-files receval_spark-*.whl`) is on the driver's Python path, but Spark
    adds only .zip, .egg and .jar files to the executors' (pyspark SparkContext.PACKAGE_EXTENSIONS): the same file
    under a .zip name reaches them too. Returns the copies added."""
    from pyspark import SparkFiles

    added = []
    for entry in filter(None, session.sparkContext.getConf().get("spark.submit.pyFiles", "").split(",")):
        name = os.path.basename(entry)
        if not name.lower().endswith(".whl"):
            continue
        local = Path(SparkFiles.getRootDirectory()) / name  # the driver's copy (pyspark makes it)
        if not local.is_file():
            local = Path(entry.removeprefix("file:"))
        copy = Path(tempfile.mkdtemp(prefix="receval-wheel-")) / f"{name[:-len('.whl')]}.zip"
        shutil.copyfile(local, copy)
        session.sparkContext.addPyFile(str(copy))
        added.append(str(copy))
    return added



@contextlib.contextmanager
def session_confs(spark: SparkSession, confs: Mapping[str, str]) -> Iterator[None]:
    """Set runtime SQL settings for the duration of a block; each goes back to its value before (unset where it
    had none), also when the block raises."""
    before = {key: spark.conf.get(key, None) for key in confs}
    for key, value in confs.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
