"""Driver-side progress from work the executors finished: per finished partition, with rate and ETA."""

from __future__ import annotations

import logging
import threading
import time

from jobs.infra.progress import Progress, counted, counter, heartbeat


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


def test_a_batch_of_parts_moves_as_each_part_finishes_and_counters_show_a_rate(spark, caplog):
    """A batch of one long chain (10 steps): its NLI part, then its PVI part, then the written rows each finish
    the batch's 10 rows; the batch's share is the mean over the three (1/3, 2/3, 1), long before it commits, and
    the line names each part's rows and the pairs the model counted, with a rate."""
    logger = logging.getLogger("test.progress")
    caplog.set_level(logging.INFO, logger="test.progress")
    steps = spark.range(10).repartition(1)
    with Progress("scores", total=1, unit="chains", every=60, spark=spark, logger=logger) as progress:
        progress.expect(1, rows=10)
        pairs = counter("NLI pairs")
        assert counter("NLI pairs") is pairs
        nli, pvi = counted(steps, "NLI"), counted(steps, "PVI")

        def score(batches):
            for batch in batches:
                pairs.add(7 * len(batch))
                yield batch

        assert nli.mapInPandas(score, nli.schema).count() == 10
        assert progress.done == 1 / 3
        line = progress.line()
        assert "rows done 0/10, NLI 10/10, PVI 0/10" in line and "; NLI pairs 70 (" in line and "/s)" in line
        assert pvi.count() == 10 and progress.done == 2 / 3
        assert counted(steps).count() == 10 and progress.done == 1.0
        progress.commit(1)
        progress.expect(1, rows=10)  # the next batch starts from none of its rows, whatever the last one counted
        assert progress.done == 1.0 and "NLI 0/10" in progress.line()
        progress.commit(1)
    assert counter("NLI pairs") is None  # no progress reports: a UDF gets no counter


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


def test_progress_shows_finished_tasks_of_a_batch_before_its_counted_frame_finishes(spark, caplog):
    # The scores stage's shape: the model work runs in a stage of several partitions, and the frame `counted`
    # sits after a shuffle, so its rows arrive only when all the model partitions are done.
    from pyspark.sql import functions as F

    logger = logging.getLogger("test.progress.tasks")
    caplog.set_level(logging.INFO, logger="test.progress.tasks")
    work = _slow(spark.range(60).repartition(6), 0.6)  # 6 model partitions, 2 at a time on local[2]
    after_shuffle = work.groupBy((F.col("id") % 3).alias("k")).count().coalesce(1)
    seen: list[tuple[float, int | None]] = []
    with Progress("unit", total=3, unit="keys", every=0.5, spark=spark, logger=logger) as progress:
        assert progress.tasks_finished is None  # no batch running
        progress.expect(3)
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.05):
                seen.append((progress.done, progress.tasks_finished))

        sampler = threading.Thread(target=sample)
        sampler.start()
        assert counted(after_shuffle).count() == 3
        stop.set()
        sampler.join()
        during = {tasks for _, tasks in seen}
        # The status tracker learns of a task's end through Spark's asynchronous listener bus: count() can return
        # before the last task's event is processed (a loaded machine read 8 of the 9 tasks). Drain it first.
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
        final_tasks = progress.tasks_finished
        progress.commit(3)
    # The batch's tasks: range's 2, the 6 model tasks (two at a time), the counted one after the shuffle.
    assert final_tasks is not None and final_tasks >= 2 + 6 + 1
    # The model tasks end pair by pair: the count moves inside the one batch, before its end (two distinct counts
    # at least: the listener bus that tells the tracker of ended tasks lags on a loaded machine, which read only
    # 2 and 4 of 2, 4, 6, 8 once) ...
    assert len({t for t in during if t is not None and 0 < t < final_tasks}) >= 2
    # ... while the unit count still stood at 0 for most of the batch (it moves when the counted frame's task ends).
    assert sum(1 for done, _ in seen if done == 0) > len(seen) // 2
    assert progress.tasks_finished is None  # committed: between batches again
    running = [r.getMessage() for r in caplog.records][1:-1]
    assert any("/3 keys (" in line and "; this batch: " in line and " Spark tasks finished" in line for line in running)


def test_progress_bar_shows_the_batch_task_count(spark):
    with Progress("unit", total=2, unit="rows", spark=spark, bar=True) as progress:
        progress.expect(2)
        assert counted(spark.range(2).repartition(2)).count() == 2
        time.sleep(1.3)  # the bar refreshes every second
        shown = progress._bar.tasks[0].fields["batch"]
        progress.commit(2)
    assert shown.endswith(" tasks") and int(shown.split()[0]) >= 2
