"""Progress of long work on the driver: units done (chains, steps, examples), rate and ETA, logged at least every
`log.progress_seconds` while the executors work, not only when a batch commits.

The executors' share comes from two counts of finished work, read by a reporter thread (nothing waits for it):

- rows: a Spark accumulator that a pass-through over the frame a stage computes adds to (`counted`). Spark
  sends accumulator updates to the driver when a task ends (a pandas UDF's too), so this moves per finished
  partition of that frame. It is the batch's share in units, but that frame is often the last of the batch's
  Spark stages (scores: the join after the NLI and PVI stages), so on a small machine it stood at 0 until the
  model work had all finished (`local[2]`, 1,012 chains: `0/1012 (0%)` for three minutes).
- tasks: the Spark tasks finished, in every stage the batch's jobs created (the NLI, PVI and generation stages
  included), from Spark's status tracker. A task ends as each partition's model calls finish, in whichever
  stage runs them; the model stages run several partitions a core (pvi: 4 x parallelism), so this moves many
  times a batch on any cluster size, and the line shows it. It is no share of the units: the stages a batch
  still has to start are unknown, so the unit count never runs ahead of the work.

Several frames of a batch can count its rows, each under its own label (`counted(df, "NLI")`: the scores
stage counts the steps its NLI and PVI parts finish and the steps it writes), so a batch of one long chain moves
as each part ends; the share of the batch is the mean over the labels. Counters (`counter("NLI pairs")`) count
model inputs as the UDFs finish them and are shown with their rate.

    with Progress("scores", total=1012, unit="chains") as progress:
        for batch in batches:
            progress.expect(len(batch), rows=n_steps)   # this batch's chains, and the rows counted for them
            ... hold(counted(scored)) ...              # rows finished by executors move the count
            progress.commit(len(batch))                # the batch is written
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__spec__.name)

_active: Progress | None = None  # the progress that `counted` reports to (one stage runs at a time)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class Progress:
    """Units done of `total`, from batches committed and rows finished in the executors; a context manager."""

    def __init__(
        self,
        name: str,
        total: int,
        unit: str = "chains",
        every: float = 30.0,
        spark: SparkSession | None = None,
        bar: bool = False,
        logger: logging.Logger | None = None,
    ) -> None:
        self.name, self.total, self.unit, self.every = name, total, unit, every
        self.logger = logger or log
        self.committed = 0
        self._batch_units, self._batch_rows = 0, 0
        self._rows_at_batch = 0
        spark = spark or SparkSession.getActiveSession()
        self._sc = spark.sparkContext if spark is not None else None
        self._rows = self._sc.accumulator(0) if self._sc is not None else None
        # label -> accumulator of rows a counted frame finished; "" is `_rows`, the frame a batch ends with
        self._parts: dict[str, Any] = {"": self._rows} if self._rows is not None else {}
        self._parts_at_batch: dict[str, int] = {}
        self._counters: dict[str, Any] = {}  # label -> accumulator of model inputs done, shown with a rate
        self._first_stage: int | None = None  # the first Spark stage id of the running batch
        self.started = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: Any = None
        if bar and total:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bar

            self._bar = Bar(TextColumn(f"{name}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
                            TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[batch]}"))
            self._task = self._bar.add_task(name, total=total, batch="")

    # -- what the work reports ----------------------------------------------------------------------
    def expect(self, units: int, rows: int | None = None) -> None:
        """The next batch: `units` of work whose executors will count `rows` rows (default one per unit)."""
        self._batch_units, self._batch_rows = units, rows if rows is not None else units
        self._rows_at_batch = self.rows_finished
        self._parts_at_batch = {label: int(acc.value) for label, acc in self._parts.items()}
        self._first_stage = _next_stage_id(self._sc)

    def part(self, label: str) -> Any:
        """The accumulator that a frame counted under `label` adds its finished rows to (made on first use)."""
        if label not in self._parts and self._sc is not None:
            self._parts[label] = self._sc.accumulator(0)
            self._parts_at_batch[label] = 0
        return self._parts.get(label)

    def counter(self, label: str) -> Any:
        """An accumulator of model inputs done (pairs, passes), shown in the line with its rate."""
        if label not in self._counters and self._sc is not None:
            self._counters[label] = self._sc.accumulator(0)
        return self._counters.get(label)

    def _part_done(self, label: str) -> int:
        return int(self._parts[label].value) - self._parts_at_batch.get(label, 0)

    def commit(self, units: int) -> None:
        """`units` are done and written."""
        self.committed += units
        self._batch_units = self._batch_rows = 0
        self._first_stage = None

    @property
    def tasks_finished(self) -> int | None:
        """Spark tasks finished in the stages created since the running batch began; None between batches."""
        first = self._first_stage
        if first is None or self._sc is None:
            return None
        last = _next_stage_id(self._sc)
        if last is None:
            return None
        tracker = self._sc.statusTracker()
        # Stage ids only grow: the batch's stages are the ones numbered from its start on. A stage of an
        # earlier batch that a job of this one reuses (skipped) is not counted again.
        infos = (tracker.getStageInfo(i) for i in range(first, last))
        return sum(info.numCompletedTasks for info in infos if info is not None)

    @property
    def rows_finished(self) -> int:
        return int(self._rows.value) if self._rows is not None else 0

    @property
    def done(self) -> float:
        """Committed units plus the finished share of the running batch (by rows the executors counted)."""
        if not self._batch_rows or not self._parts:
            return float(self.committed)
        share = sum(min(1.0, self._part_done(label) / self._batch_rows) for label in self._parts) / len(self._parts)
        return self.committed + share * self._batch_units

    @property
    def rate(self) -> float:
        elapsed = time.time() - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    def line(self) -> str:
        done, rate = self.done, self.rate
        pct = 100.0 * done / self.total if self.total else 100.0
        eta = _duration((self.total - done) / rate) if rate > 0 and self.total else "-"
        tasks = self.tasks_finished
        batch = f"; this batch: {tasks} Spark tasks finished" if tasks is not None else ""
        if self._batch_rows and len(self._parts) > 1:  # the rows each part of the batch finished
            # Capped as the share is: a partition Spark computes twice (a frame read by two jobs) counts twice.
            batch += ", rows " + ", ".join(
                f"{label or 'done'} {min(self._part_done(label), self._batch_rows):,}/{self._batch_rows:,}"
                for label in self._parts
            )
        elapsed = time.time() - self.started
        for label, acc in self._counters.items():
            batch += f"; {label} {int(acc.value):,} ({int(acc.value) / max(elapsed, 1e-9):.3g}/s)"
        return (f"[{self.name}] {done:.0f}/{self.total} {self.unit} ({pct:.0f}%), {rate:.3g} {self.unit}/s, "
                f"ETA {eta}, {_duration(elapsed)} elapsed{batch}")

    # -- reporting ------------------------------------------------------------------------------------
    def _report(self) -> None:
        last = time.time()
        tick = 1.0 if self._bar is not None else min(self.every, 5.0)
        while not self._stop.wait(tick):
            if self._bar is not None:
                tasks = self.tasks_finished
                self._bar.update(self._task, completed=self.done, batch="" if tasks is None else f"{tasks} tasks")
            elif time.time() - last >= self.every:
                self.logger.info(self.line())
                last = time.time()

    def __enter__(self) -> Progress:
        global _active
        _active = self
        self.logger.info("[%s] %d %s to do", self.name, self.total, self.unit)
        if self._bar is not None:
            self._bar.start()
        self._thread = threading.Thread(target=self._report, name=f"progress-{self.name}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        global _active
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done)
            self._bar.stop()
        if _active is self:
            _active = None
        self.logger.info(self.line())


def _next_stage_id(sc: Any) -> int | None:
    """The id Spark's scheduler gives the next stage (None without a JVM scheduler to ask, e.g. Spark Connect)."""
    if sc is None:
        return None
    try:
        counter = sc._jsc.sc().dagScheduler().nextStageId()  # an AtomicInteger; py4j hands it over as an int
        return int(counter if isinstance(counter, int) else counter.get())
    except Exception:  # a private field: a Spark without it just loses the task count
        return None


def bar_wanted(mode: str) -> bool:
    """`pipeline.progress`: rich (a live bar), plain (log lines) or auto (a bar on a terminal)."""
    return mode == "rich" or (mode == "auto" and sys.stderr.isatty())


def counted(df: DataFrame, label: str = "") -> DataFrame:
    """`df` unchanged, each finished partition adding its row count to the active progress (none: `df`), under
    `label` when the batch has several parts that each finish its rows ("" : the frame the batch ends with).

    Put it on the frame whose computation is the work (the scored rows, the generated answers), so a
    partition counts when its model calls are done.
    """
    progress = _active
    rows = progress.part(label) if progress is not None else None
    if rows is None:
        return df

    def count(batches: Iterator[Any]) -> Iterator[Any]:
        n = 0
        for batch in batches:
            n += batch.num_rows
            yield batch
        rows.add(n)

    return df.mapInArrow(count, df.schema)


def counter(label: str) -> Any:
    """The active progress's counter `label` (an accumulator for a UDF to add to), or None when none reports."""
    return _active.counter(label) if _active is not None else None


def spark_tasks(spark: SparkSession | None) -> str | None:
    """Finished / all tasks of the running Spark stages (each task is a partition), or None when idle."""
    if spark is None:
        return None
    tracker = spark.sparkContext.statusTracker()
    stages = [s for s in (tracker.getStageInfo(i) for i in tracker.getActiveStageIds()) if s is not None]
    if not stages:
        return None
    return ", ".join(f"stage {s.stageId}: {s.numCompletedTasks}/{s.numTasks} tasks" for s in stages)


@contextlib.contextmanager
def heartbeat(name: str, every: float = 30.0, logger: logging.Logger | None = None) -> Iterator[None]:
    """While a job runs, a line at least every `every` s: elapsed time and the partitions Spark finished.
    Silent while a `Progress` of the job reports (it says more: units, rate, ETA)."""
    logger = logger or log
    stop = threading.Event()
    started = time.time()
    spark = SparkSession.getActiveSession()  # thread-local: taken here, read by the reporting thread

    def beat() -> None:
        while not stop.wait(every):
            if _active is None:
                tasks = spark_tasks(spark or SparkSession.getActiveSession())
                logger.info("[%s] running for %s%s", name, _duration(time.time() - started),
                            f"; Spark {tasks}" if tasks else "")

    thread = threading.Thread(target=beat, name=f"heartbeat-{name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
