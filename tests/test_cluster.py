"""spark-submit on a Spark standalone cluster -> the same Delta tables as local mode; a lost worker loses nothing.

One cluster (master + 2 workers, 1 core and 1500m each) serves the module. The reference is an in-process
local[2] run; the cluster runs go through scripts/submit.sh exactly as an operator submits.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from cluster import (
    COMPARED_TABLES,
    PIPELINE_MODULE,
    PROJECT_ROOT,
    StandaloneCluster,
    assert_lakes_equal,
    job_args,
)
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from jobs import ingest
from jobs.config import load_settings

BAD_INPUT = PROJECT_ROOT / "tests" / "data" / "bad_input" / "files"
SAMPLE = PROJECT_ROOT / "tests" / "data" / "sample_lake"
SLOW_BATCH_S = 20  # long enough to kill a worker while its task sleeps, even on a loaded machine


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = StandaloneCluster(tmp_path_factory.mktemp("cluster"))
    c.start()
    yield c
    c.stop()
    assert not c.live_daemons()


@pytest.fixture
def full_cluster(cluster):
    cluster.ensure_workers()  # a fault test before may have killed one
    return cluster


@pytest.fixture(scope="module")
def nightly_input(tmp_path_factory) -> Path:
    """The bundled sample lake plus the hostile-input corpus: good rows and every kind of bad one."""
    folder = tmp_path_factory.mktemp("nightly") / "input"
    shutil.copytree(SAMPLE, folder)
    shutil.copytree(BAD_INPUT, folder / "bad_input")
    return folder


@pytest.fixture(scope="module")
def reference_lake(spark, nightly_input, tmp_path_factory) -> Path:
    """The clean local-mode run (in-process, local[2]) every other run must equal."""
    lake = tmp_path_factory.mktemp("reference") / "lake"
    args = job_args(lake, nightly_input)
    settings = load_settings(overrides=[a for a in args if a != "--set"], environ={})
    counts = ingest.run(spark, settings)
    assert counts["reconciled"] == 1 and counts["inserted"] > 0 and counts["quarantined"] > 0
    return lake


def _submit_ok(cluster: StandaloneCluster, module: str, args: list[str]):
    started = time.monotonic()
    result = cluster.submit(module, args)
    assert result.returncode == 0, result.stdout[-6000:]
    return result, time.monotonic() - started


@pytest.mark.cluster
def test_submit_pipeline_on_cluster_equals_local_mode(spark, full_cluster, nightly_input, reference_lake, tmp_path):
    lake = tmp_path / "lake"
    apps_before = len(full_cluster.state()["completedapps"])
    result, seconds = _submit_ok(full_cluster, PIPELINE_MODULE, job_args(lake, nightly_input, "profile=cluster"))
    print(f"\n[cluster] {PIPELINE_MODULE} on {full_cluster.master_url}: {seconds:.0f}s")
    assert f"master={full_cluster.master_url}" in result.stdout  # the job saw the cluster, not local mode
    # The master ran it as an application on its workers (local mode would never register there).
    assert len(full_cluster.completed_apps(apps_before + 1)) == apps_before + 1
    assert_lakes_equal(spark, reference_lake, lake)


@pytest.mark.cluster
def test_submit_local_one_core_equals_local_two_cores(spark, nightly_input, reference_lake, tmp_path):
    """scripts/submit.sh with --master local[1]: one core, another partitioning, the same tables."""
    import subprocess

    lake = tmp_path / "lake"
    out = subprocess.run(
        [str(PROJECT_ROOT / "scripts" / "submit.sh"), "--master", "local[1]", PIPELINE_MODULE,
         *job_args(lake, nightly_input)],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=1800,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    assert "master=local[1]" in out.stdout
    assert_lakes_equal(spark, reference_lake, lake)


@pytest.mark.slow
@pytest.mark.parametrize("partitions", [3, 7])
def test_ingest_transform_invariant_to_partitions(spark, nightly_input, partitions):
    settings = load_settings(overrides=[f"ingest.input={nightly_input}"], environ={})
    raw = ingest.read_raw(spark, settings.ingest)
    base_chains, base_rejected = ingest.transform(raw.coalesce(1), settings.ingest)
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    try:
        chains, rejected = ingest.transform(raw.repartition(partitions), settings.ingest)
        volatile_c, volatile_q = COMPARED_TABLES["chains"], COMPARED_TABLES["quarantine"]
        assertDataFrameEqual(chains.drop(*volatile_c), base_chains.drop(*volatile_c))
        assertDataFrameEqual(rejected.drop(*volatile_q), base_rejected.drop(*volatile_q))
        assert chains.count() > 0 and rejected.count() > 0
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")


# Last in the module: it leaves the cluster one worker short (full_cluster replaces it for any later test).
@pytest.mark.cluster
def test_worker_killed_mid_stage_job_finishes_with_equal_tables(
    spark, full_cluster, nightly_input, reference_lake, tmp_path
):
    markers = tmp_path / "markers"
    markers.mkdir()
    lake = tmp_path / "lake"
    started = time.monotonic()
    proc = full_cluster.start_job(
        str(Path("tests") / "cluster.py"),
        ["slow-ingest", str(markers), str(SLOW_BATCH_S), *job_args(lake, nightly_input, "profile=cluster")],
    )
    victim, deadline = None, time.monotonic() + 1200
    while victim is None:
        assert proc.poll() is None, Path(proc.log).read_text()[-6000:]
        assert time.monotonic() < deadline, "no validation task started within 20 minutes"
        for marker in markers.iterdir():
            victim = full_cluster.worker_of(int(marker.name))
            if victim is not None:
                break
        time.sleep(0.5)
    killed = full_cluster.kill_worker(victim)  # the worker, its executor and the Python worker mid-task
    result = full_cluster.finish_job(proc, timeout_s=1800)
    print(f"\n[cluster] worker-kill run: {time.monotonic() - started:.0f}s, killed {len(killed)} processes")

    assert result.returncode == 0, result.stdout[-6000:]
    assert "Lost executor" in result.stdout or "ExecutorLostFailure" in result.stdout, result.stdout[-4000:]
    assert len(full_cluster.live_workers()) == 1
    assert_lakes_equal(spark, reference_lake, lake)
    chains = spark.read.format("delta").load(str(lake / "chains"))
    assert chains.groupBy("chain_id").count().where(F.col("count") > 1).count() == 0  # no task wrote twice
