"""Lake upkeep: OPTIMIZE + VACUUM keep query results and cut files; a bad night is restored from Delta history."""

from __future__ import annotations

import json

from delta.tables import DeltaTable
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from jobs.infra import maintain, tables
from schemas import chain_scores as CS

HASH_A, HASH_B = "a" * 16, "b" * 16


def _night(spark, settings, night: int, run_id: str | None = None) -> None:
    """Two MERGE batches of 5 chains under each of two config hashes: one night's commits."""
    if run_id:
        spark.conf.set(maintain.RUN_METADATA, run_id)
    try:
        for batch in range(2):
            rows = [
                {**{f.name: None for f in CS.SCHEMA.fields}, CS.CHAIN_ID: f"n{night}-b{batch}-{i}", CS.CONFIG_HASH: h,
                 CS.N_STEPS: i + 1, CS.min_col("inter"): (night * 10 + i) / 100}
                for i in range(5) for h in (HASH_A, HASH_B)
            ]
            frame = spark.createDataFrame(rows, CS.SCHEMA).repartition(2)
            tables.insert_new(spark, frame, settings.table("chain_scores"), CS.SCHEMA, [CS.CHAIN_ID, CS.CONFIG_HASH])
    finally:
        spark.conf.unset(maintain.RUN_METADATA)


def _on_disk(settings, name: str) -> int:
    from pathlib import Path

    return len(list(Path(settings.table(name)).glob("**/*.parquet")))


def test_run_compacts_vacuums_and_keeps_query_results(spark, make_settings):
    settings = make_settings("maintain.retention_hours=0")
    for night in range(2):
        _night(spark, settings, night)
    path = settings.table("chain_scores")
    query = lambda: tables.read(spark, path).where(F.col(CS.CONFIG_HASH) == HASH_A).select(  # noqa: E731
        CS.CHAIN_ID, CS.N_STEPS, CS.min_col("inter"))
    before = query().collect()
    files_before, disk_before = maintain.files(spark, path), _on_disk(settings, "chain_scores")

    report = maintain.run(spark, settings, ["chain_scores"])

    assert report["chain_scores"]["files_before"] == files_before > 1
    assert report["chain_scores"]["files_after"] == maintain.files(spark, path) < files_before
    assert _on_disk(settings, "chain_scores") < disk_before  # VACUUM removed the compacted files
    assertDataFrameEqual(query(), before)
    assert tables.read(spark, path).count() == 2 * 2 * 5 * 2  # nights x batches x chains x hashes
    detail = DeltaTable.forPath(spark, path).detail().select("clusteringColumns").first()[0]
    assert list(detail) == settings.maintain.cluster_by["chain_scores"]


def test_vacuum_lists_with_the_configured_tasks_and_restores_the_setting(spark, make_settings):
    settings = make_settings()
    path = settings.table("chain_scores")
    _night(spark, settings, 0)
    spark.sparkContext.setJobGroup("maintain-vacuum", "vacuum under test")
    try:
        maintain.vacuum(spark, path, 168, listing_parallelism=3)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    tracker = spark.sparkContext.statusTracker()
    stages = [tracker.getStageInfo(s) for j in tracker.getJobIdsForGroup("maintain-vacuum")
              for s in tracker.getJobInfo(j).stageIds]
    tasks = {stage.numTasks for stage in stages if stage is not None}
    # The listing stages run 3 tasks, not Spark's 10,000 (each of them a near-empty task: minutes per VACUUM).
    assert max(tasks) == 3, tasks
    assert spark.conf.get(maintain.LISTING_PARALLELISM, None) is None  # the session's own setting is back


def test_night_done_maintains_after_configured_nights(spark, make_settings, lake):
    settings = make_settings("maintain.every_nights=3", "maintain.retention_hours=0")
    _night(spark, settings, 0)
    assert maintain.night_done(spark, settings) is None
    assert maintain.night_done(spark, settings) is None
    assert json.loads((lake / maintain.STATE).read_text())["nights_since_maintenance"] == 2
    report = maintain.night_done(spark, settings)
    assert report is not None and report["chain_scores"]["files_after"] < report["chain_scores"]["files_before"]
    assert json.loads((lake / maintain.STATE).read_text())["nights_since_maintenance"] == 0


def test_restore_puts_tables_back_to_the_version_before_a_run(spark, make_settings):
    settings = make_settings()
    _night(spark, settings, 1, run_id="night-1")
    path = settings.table("chain_scores")
    good_version = tables.version(spark, path)
    good = tables.read(spark, path).collect()
    _night(spark, settings, 2, run_id="night-2")  # the bad night
    assert tables.read(spark, path).count() == 2 * len(good)

    assert maintain.versions_before(spark, settings, "night-2") == {"chain_scores": good_version}
    restored = maintain.restore(spark, settings, "night-2")

    assert restored == {"chain_scores": good_version}
    assertDataFrameEqual(tables.read(spark, path), good)
    # RESTORE is a new version: the bad night stays in the history.
    assert tables.version(spark, path) > good_version
    assert maintain.versions_before(spark, settings, "night-1") == {"chain_scores": -1}
