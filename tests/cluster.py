"""The cluster tests' helpers: the standalone cluster (scripts/cluster.py, re-exported), lake comparison.

    with StandaloneCluster(tmp_dir) as cluster:          # master + 2 workers, 1 core and 1500m each
        result = cluster.submit("jobs.receval.ingest", ["--set", "paths.lake=/tmp/lake"])

`submit` runs scripts/submit.sh, so tests exercise exactly what an operator runs. Every process the cluster
starts is stopped by its PID, also when a test fails.

Run as a script, this module is also a spark-submit entry point for fault injection (see `slow_scores`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

# Run by spark-submit as a script, the project root is not on the path (appended: the shipped zip stays first).
sys.path.append(str(Path(__file__).resolve().parent.parent))

from scripts.cluster import (  # noqa: E402
    PROJECT_ROOT,
    SUBMIT,
    Daemon,
    StandaloneCluster,
    alive,
    children,
    free_port,
    kill_tree,
    spark_home,
)

__all__ = ["PROJECT_ROOT", "SUBMIT", "Daemon", "StandaloneCluster", "alive", "children", "free_port", "kill_tree",
           "spark_home", "job_args", "assert_lakes_equal", "slow_scores", "fake_night"]

# The job the cluster tests submit: the whole nightly pipeline (ingest, steps, scores, aggregate, curate).
PIPELINE_MODULE = "jobs.receval.pipeline"
# Tables the cluster and invariance tests compare, and columns that legitimately differ between runs
# (when a row was written, by which run).
COMPARED_TABLES = ("chains", "quarantine", "steps", "contexts", "step_scores", "chain_scores", "unscored",
                   "curation", "curated", "rejected")
VOLATILE = frozenset({"ingested_at", "scored_at", "curated_at", "quarantined_at", "recorded_at", "seen_at", "run_id"})
# Scores may differ by float rounding, no more: fp32 forwards over differently padded batches (another
# partitioning puts other rows in a batch) move scores by ~1e-6 (measured 2.4e-6 at most). Each table's scale
# is stated through tests/tolerance.py: step_scores row by row (log-likelihoods relative to themselves,
# intra_pvi / info_gain relative to their two terms, probabilities absolutely); the chain-level tables hold
# mins, means and copies of step scores, which move no more than those do, so they get the largest
# step-score tolerance of the reference lake (~4e-5 for ~19-nat log-likelihoods).
STEP_SCORE_KEYS = ("chain_id", "step_idx", "config_hash")


def _store(path: Path) -> str:
    # Imported here: as a spark-submit entry point this module must not load the test session's conftest.
    from conftest import sqlite_store

    return sqlite_store(path)


def job_args(lake: Path, input_path: Path | str, *extra: str) -> list[str]:
    """--set arguments that point a job at its own lake, input and MLflow store."""
    pairs = [
        f"paths.lake={lake}",
        f"paths.checkpoints={lake}/_checkpoints",
        f"ingest.input={input_path}",
        f"mlflow.tracking_uri={_store(lake.parent / f'mlruns-{lake.name}.db')}",
        f"mlflow.artifact_location={lake.parent}/mlartifacts-{lake.name}",
        "pipeline.progress=plain",
        # Named: an entry point picks the small profile where `make models` has built it, the reference would not.
        "models.profile=offline",
        # One batch per stage: the batch loop is test_pipeline's; here each batch is a minute of Spark jobs.
        "pipeline.batch_chains=64",
        # No report: it reads the tables compared here and writes HTML no test of this file reads (test_pipeline
        # and test_report check it); on the cluster's one-core executors it is half a minute per run.
        "pipeline.stages=[ingest,steps,scores,aggregate,curate]",
        *extra,
    ]
    return [arg for pair in pairs for arg in ("--set", pair)]


def assert_lakes_equal(spark, expected: Path, actual: Path, tables: Sequence[str] = COMPARED_TABLES, *,
                       by_file_name: bool = False) -> None:
    """Every compared table holds the same rows in both lakes (order-free; floats within float32 rounding).
    `by_file_name`: the rows' `source` (the input file read) compared by its name alone, for two runs that read
    the same files from different folders (the installed package's sample lake and the checkout's)."""
    from pyspark.sql import functions as F
    from pyspark.testing import assertDataFrameEqual
    from tolerance import assert_scores_close, scores_tol

    from jobs.infra.tables import exists

    def load(lake: Path, name: str):
        df = spark.read.format("delta").load(str(lake / name))
        if by_file_name and "source" in df.columns:
            df = df.withColumn("source", F.element_at(F.split("source", "/"), -1))
        return df.drop(*VOLATILE.intersection(df.columns))

    has_steps = exists(spark, str(expected / "step_scores"))
    steps_tol = scores_tol(load(expected, "step_scores")) if has_steps else 0.0
    nonempty = 0
    for name in tables:
        if not exists(spark, str(expected / name)) or not exists(spark, str(actual / name)):
            # A table a run had no rows for may not exist (e.g. `unscored`): then the other must be empty.
            for lake in (expected, actual):
                if exists(spark, str(lake / name)):
                    assert spark.read.format("delta").load(str(lake / name)).count() == 0, f"{name} in {lake}"
            continue
        want, got = load(expected, name), load(actual, name)
        nonempty += want.count() > 0
        try:
            if name == "step_scores":
                assert_scores_close(got, want, keys=STEP_SCORE_KEYS)
            else:
                assertDataFrameEqual(got, want, rtol=0.0, atol=steps_tol)
        except AssertionError as err:
            raise AssertionError(f"table {name} differs:\n{err}") from None
    # Empty tables (nothing rejected, nothing unscored) compare trivially; the scored ones must not be empty.
    assert nonempty >= len(tables) - 3, f"only {nonempty} of {len(tables)} tables hold rows: nothing was compared"


# -- fault-injection entry point: tests/slow_scores.py (a file of its own, so a test can submit it from a folder
# with no checkout beside the wheel); `spark-submit tests/cluster.py slow-scores ...` still runs it.
def slow_scores(marker_dir: str, delay_s: float, argv: list[str]) -> None:
    from slow_scores import slow_scores as run

    run(marker_dir, delay_s, argv)


def fake_night(argv: list[str]) -> None:
    """`jobs.receval.pipeline.main` with the fake stages of tests/jobs/pipeline_fakes.py (column expressions only:
    the executors need no test module): a driver on the cluster that holds the lake's claim (test_cluster)."""
    sys.path.append(str(Path(__file__).resolve().parent / "jobs"))
    from pipeline_fakes import Fakes

    import jobs.receval.pipeline as pipeline

    with Fakes().installed():
        pipeline.main(argv)


if __name__ == "__main__":
    sys.path.append(str(Path(__file__).resolve().parent))
    if sys.argv[1] == "slow-scores":
        slow_scores(sys.argv[2], float(sys.argv[3]), sys.argv[4:])
    elif sys.argv[1] == "fake-night":
        fake_night(sys.argv[2:])
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")
