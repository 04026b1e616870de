"""Driver-side progress from work the executors finished: per finished partition, with rate and ETA."""

from __future__ import annotations

import logging
import threading
import time

from jobs.infra.progress import Progress, counted, heartbeat


def _slow(df, seconds: float):
    def each(batches):
        for batch in batches:
            time.sleep(seconds)
            yield batch

    return df.mapInPandas(each, df.schema)


def test_progress_moves_per_finished_partition_inside_a_batch(spark, caplog):
    logger = logging.getLogger("test.progress")
    caplog.set_level(logging.INFO, logger="test.progress")
    rows = spark.range(40).repartition(4)  # 4 partitions of 10 rows, 2 running at a time (local[2])
    seen: list[float] = []
    with Progress("unit", total=40, unit="rows", every=0.3, spark=spark, logger=logger) as progress:
        progress.expect(40)
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.1):
                seen.append(progress.done)

        sampler = threading.Thread(target=sample)
        sampler.start()
        assert counted(_slow(rows, 1.5)).count() == 40
        stop.set()
        sampler.join()
        progress.commit(40)
    # Before the batch committed, the count already stood between none and all: finished partitions.
    assert any(0 < s < 40 for s in seen) and all(s % 10 == 0 for s in seen)
    assert progress.done == 40 and progress.committed == 40
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "[unit] 40 rows to do"
    assert any(" rows/s, ETA " in line and "/40 rows (" in line for line in lines[1:-1])  # reported while running
    assert lines[-1].startswith("[unit] 40/40 rows (100%)")


def test_counted_without_progress_is_the_frame(spark):
    df = spark.range(3)
    assert counted(df) is df


def test_heartbeat_reports_spark_tasks_while_a_job_runs(spark, caplog):
    logger = logging.getLogger("test.heartbeat")
    caplog.set_level(logging.INFO, logger="test.heartbeat")
    with heartbeat("job", every=0.5, logger=logger):
        _slow(spark.range(4).repartition(2), 1.5).count()
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all(line.startswith("[job] running for 0m0") for line in lines)
    assert any("tasks" in line and "stage" in line for line in lines)
