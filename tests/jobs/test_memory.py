"""Memory that does not creep: every job run in a session leaves nothing persisted behind.

Each job releases every frame it cached when it is done (jobs.infra.tables.Held) and Delta's cached table
states (tables.release_table_state); checked by what Spark itself reports: no persisted RDD, an empty cache
manager, and storage memory no higher than where it started. The nightly loop (the pipeline) runs twice, a
first night and an unchanged rerun, which take different paths; every other job runs once: what it holds
after one run is what a second run would start from, and the check is absolute (nothing held), so a second
run of the same job adds a job run's minutes on 2 cores and no case.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import copy_sample, sqlite_store
from pipeline_fakes import Fakes

from jobs.infra.config_layers import load_settings
from jobs.infra.tracking import JobRun


def held(spark) -> tuple[int, bool, int]:
    """(persisted RDDs, whether the cache manager holds a plan, storage memory used in bytes)."""
    rdds = spark.sparkContext._jsc.sc().getPersistentRDDs().size()
    cached = not spark._jsparkSession.sharedState().cacheManager().isEmpty()
    return rdds, cached, _storage_used(spark)


def _storage_used(spark) -> int:
    # Broadcast blocks also live in storage memory; they go once Python and the JVM dropped their handles and
    # Spark's cleaner saw it: collect both first, so what remains is what somebody still holds.
    jvm = spark.sparkContext._jvm
    for _ in range(10):
        gc.collect()
        jvm.System.gc()
        time.sleep(0.3)
        used = int(jvm.org.apache.spark.SparkEnv.get().memoryManager().storageMemoryUsed())
        if used == 0:
            break
    return used


def released(spark, before: tuple[int, bool, int], name: str) -> None:
    """Nothing persisted or cached, and storage memory no higher than before the job.

    Not equal: what an earlier test in the session left in storage (a broadcast whose handle it still held)
    may be cleaned while the job runs, so the job can end below where it started, never above.
    """
    rdds, cached, used = held(spark)
    assert (rdds, cached) == (0, False), f"{name}: {rdds} persisted RDDs, cache manager holds a plan: {cached}"
    assert used <= before[2], f"{name}: storage memory {used} bytes after, {before[2]} before"


def twice(spark, job: Callable[[], object], name: str) -> None:
    before = held(spark)
    job()
    job()
    released(spark, before, name)


def once(spark, job: Callable[[], object], name: str) -> None:
    before = held(spark)
    job()
    released(spark, before, name)


def _overrides(tmp_path: Path, *extra: str) -> list[str]:
    return [
        f"paths.lake={tmp_path / 'lake'}", f"mlflow.tracking_uri={sqlite_store(tmp_path / 'mlruns.db')}",
        f"mlflow.artifact_location={tmp_path}/mlartifacts", "spark.master=local[2]", "spark.shuffle_partitions=2",
        f"ingest.input={tmp_path / 'input'}", "pipeline.batch_chains=16", "pipeline.progress=plain",
        "pipeline.stages=[ingest,steps,scores,aggregate,curate]", "curation.quantiles={inter: 0.25}",
        "select.criteria=[correctness]", "meta_eval.bootstrap_resamples=10", "meta_eval.include_baselines=false",
        *extra,
    ]


def _argv(overrides: list[str]) -> list[str]:
    return [f"--set={o}" for o in overrides]


@pytest.fixture(scope="module")
def night(spark, tmp_path_factory) -> list[str]:
    """The overrides of a lake the pipeline (fake stages, two batches per stage) made; the file's tests share it.

    The night runs twice: the first run writes every table, the second finds nothing new. Each must give back
    what it held. (Not a second night of new chains: that is the same code over other rows, and a whole
    pipeline night of Delta commits, minutes on 2 cores.)
    """
    from jobs.receval import pipeline

    tmp_path = tmp_path_factory.mktemp("night")
    copy_sample(tmp_path / "input")
    overrides = _overrides(tmp_path)
    settings = load_settings(overrides=overrides, environ={})

    def run() -> None:
        with Fakes().installed():
            pipeline.run(spark, settings, JobRun("pipeline", settings))

    twice(spark, run, "pipeline")
    return overrides


@pytest.mark.slow  # six job runs over a shared lake of two pipeline runs: minutes on 2 cores
def test_jobs_in_one_session_release_what_they_hold(spark, night, tmp_path):
    # The lake is shared with the next test: these jobs only add tables of their own (select, meta_eval, export).
    from jobs.metaeval import meta_eval
    from jobs.receval import aggregate, curate, export, ingest
    from jobs.selection import select_chains

    argv = _argv(night)
    once(spark, lambda: ingest.main(argv), "ingest")
    once(spark, lambda: aggregate.main(argv), "aggregate")
    once(spark, lambda: curate.main(argv), "curate")
    once(spark, lambda: select_chains.main(argv), "select_chains")
    once(spark, lambda: meta_eval.main(argv), "meta_eval")
    once(spark, lambda: export.main([*argv, f"--set=export.output={tmp_path / 'out'}"]), "export")


@pytest.mark.slow  # real spaCy and tiny models: several minutes on 2 cores
def test_model_jobs_in_one_session_release_what_they_hold(spark, night, tiny_models):
    from jobs.cot import evaluate as cot_eval
    from jobs.metaeval import baselines
    from jobs.receval import nli_scores, pvi_scores, steps

    argv = _argv([
        *night, "steps.boundary=newline", "runtime.device=cpu", "baselines.groups=[rouge,li]", "cot.datasets=[]",
        "cot.custom_path=tests/data/cot_custom.jsonl", "cot.max_new_tokens=6", "cot.direct_max_new_tokens=4",
        "cot.generation_max_new_tokens=6",
        "cot.bootstrap_resamples=20",
    ])
    once(spark, lambda: steps.main(argv), "steps")
    once(spark, lambda: nli_scores.main(argv), "nli_scores")
    once(spark, lambda: pvi_scores.main(argv), "pvi_scores")
    once(spark, lambda: baselines.main(argv), "baselines")
    once(spark, lambda: cot_eval.main(argv), "cot_eval")
