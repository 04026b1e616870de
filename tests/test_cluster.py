"""The nightly pipeline by spark-submit on a standalone cluster -> the same Delta tables as local mode.

One cluster (master + 2 workers, 1 core and 1500m each) serves the module. The reference is an in-process
local[2] run of jobs.receval.pipeline (tiny offline models, 8 shuffle partitions); the cluster runs (16 shuffle
partitions, two executors) and the local[1] run go through scripts/submit.sh exactly as an operator submits
from a checkout, and the worker-kill run as one submits without any: plain spark-submit from a folder holding
only its entry script, the project shipped as its wheel (--py-files) and the Delta jars (--jars). Equal tables
also show the scores do not depend on master, cores, partitioning or how the code got there. A worker killed in
the middle of the scoring stage loses nothing.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest
from cluster import (
    PIPELINE_MODULE,
    PROJECT_ROOT,
    VOLATILE,
    StandaloneCluster,
    assert_lakes_equal,
    job_args,
    kill_tree,
)
from conftest import TEST_JVM_OPTIONS, copy_sample, sqlite_store
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual
from test_package import build_wheel
from tolerance import EXACT_FRAME

from jobs.infra.config_layers import load_settings
from jobs.receval import ingest, ingest_readers, pipeline
from udfs.model_paths import small_built

BAD_INPUT = PROJECT_ROOT / "tests" / "data" / "bad_input" / "files"
SLOW_BATCH_S = 20  # long enough to kill a worker while its task sleeps, even on a loaded machine


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = StandaloneCluster(tmp_path_factory.mktemp("cluster"), java_options=TEST_JVM_OPTIONS)
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
    copy_sample(folder)
    shutil.copytree(BAD_INPUT, folder / "bad_input")
    return folder


@pytest.fixture(scope="module")
def reference_lake(spark, tiny_models, nightly_input, tmp_path_factory) -> Path:
    """The clean local-mode pipeline run (in-process, local[2]) every other run must equal."""
    lake = tmp_path_factory.mktemp("reference") / "lake"
    summary = pipeline.main(job_args(lake, nightly_input, "spark.master=local[2]"))
    assert summary.rows_after["chains"] > 0 and summary.rows_after["quarantine"] > 0
    assert summary.rows_after["chain_scores"] > 0
    return lake


def _submit_ok(cluster: StandaloneCluster, module: str, args: list[str]):
    started = time.monotonic()
    result = cluster.submit(module, args)
    assert result.returncode == 0, result.stdout[-6000:]
    return result, time.monotonic() - started


@pytest.mark.cluster
@pytest.mark.manual  # ~13 min in CI; the worker-kill test below is this submit with a fault, to the same reference
def test_submit_pipeline_on_cluster_equals_local_mode(spark, full_cluster, nightly_input, reference_lake, tmp_path):
    """The plain cluster run; when the worker-kill test fails, this tells the cluster from the fault apart."""
    lake = tmp_path / "lake"
    apps_before = len(full_cluster.state()["completedapps"])
    result, seconds = _submit_ok(full_cluster, PIPELINE_MODULE, job_args(lake, nightly_input, "profile=cluster"))
    print(f"\n[cluster] {PIPELINE_MODULE} on {full_cluster.master_url}: {seconds:.0f}s")
    assert f"master={full_cluster.master_url}" in result.stdout  # the job saw the cluster, not local mode
    # The master ran it as an application on its workers (local mode would never register there).
    assert len(full_cluster.completed_apps(apps_before + 1)) == apps_before + 1
    assert_lakes_equal(spark, reference_lake, lake)


@pytest.fixture(scope="module")
def small_reference_lake(spark, nightly_input, tmp_path_factory) -> Path:
    """The reference run with the `small` profile's trained NLI model (models/nli-small)."""
    lake = tmp_path_factory.mktemp("reference-small") / "lake"
    summary = pipeline.main(job_args(lake, nightly_input, "spark.master=local[2]", "models.profile=small"))
    assert summary.rows_after["chain_scores"] > 0
    return lake


@pytest.mark.cluster
@pytest.mark.manual  # needs `make models` (CI builds no trained NLI model); ~2 pipeline runs
@pytest.mark.skipif(not small_built(), reason="needs the small profile's NLI model: make models")
def test_submit_small_profile_on_cluster_equals_local_mode(
    spark, full_cluster, nightly_input, small_reference_lake, tmp_path
):
    """The trained NLI model (issue #16) through the cluster path unchanged: executors load it from the profile's
    folder and the tables equal the local run's, with scores that really differ between steps."""
    lake = tmp_path / "lake"
    result, seconds = _submit_ok(
        full_cluster, PIPELINE_MODULE, job_args(lake, nightly_input, "profile=cluster", "models.profile=small"))
    print(f"\n[cluster] small profile on {full_cluster.master_url}: {seconds:.0f}s")
    assert f"master={full_cluster.master_url}" in result.stdout
    assert "models=small" in result.stdout
    assert_lakes_equal(spark, small_reference_lake, lake)
    spread = spark.read.format("delta").load(str(lake / "step_scores")).agg(
        F.max("intra_entail") - F.min("intra_entail")).first()[0]
    assert spread > 0.1  # random models give every step ~1/3: equal tables would prove little


@pytest.mark.cluster
@pytest.mark.manual  # 4-5 min; the cluster run already differs from the reference in master, cores, partitions
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
@pytest.mark.manual  # the default set checks partition invariance of every stage's transform
@pytest.mark.parametrize("partitions", [3, 7])
def test_ingest_transform_invariant_to_partitions(spark, nightly_input, partitions):
    settings = load_settings(overrides=[f"ingest.input={nightly_input}"], environ={})
    raw = ingest_readers.read_raw(spark, settings.ingest)
    base_chains, base_rejected = ingest.transform(raw.coalesce(1), settings.ingest)
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    try:
        chains, rejected = ingest.transform(raw.repartition(partitions), settings.ingest)
        assertDataFrameEqual(chains.drop(*VOLATILE), base_chains.drop(*VOLATILE), **EXACT_FRAME)
        assertDataFrameEqual(rejected.drop(*VOLATILE), base_rejected.drop(*VOLATILE), **EXACT_FRAME)
        assert chains.count() > 0 and rejected.count() > 0
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


# Last in the module: it leaves the cluster one worker short (full_cluster replaces it for any later test).
@pytest.mark.cluster  # 316 s on a quiet host with the cluster and the reference lake it starts (2026-12-07)
def test_worker_killed_mid_scoring_job_finishes_with_equal_tables(
    spark, full_cluster, nightly_input, reference_lake, wheel, tmp_path
):
    """spark-submit of the pipeline on the standalone cluster (two workers), one worker killed while its NLI task
    runs: the job finishes on the other and its tables equal the local-mode reference's, so the scores depend
    on neither master, cores, partitioning nor a lost executor. Submitted as without a checkout: from a folder
    holding only the entry script (and the tiny models the offline profile names, models/), the project as its
    wheel, the Delta jars from the jar cache."""
    markers = tmp_path / "markers"
    markers.mkdir()
    lake = tmp_path / "lake"
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copyfile(PROJECT_ROOT / "tests" / "slow_scores.py", outside / "slow_scores.py")
    (outside / "models").symlink_to(PROJECT_ROOT / "models")  # as `receval setup` would have built them there
    jars = sorted((PROJECT_ROOT / ".jars").glob("*.jar"))
    apps_before = len(full_cluster.state()["completedapps"])
    started = time.monotonic()
    args = [str(markers), str(SLOW_BATCH_S),
            *job_args(lake, nightly_input, "profile=cluster", f"spark.master={full_cluster.master_url}")]
    proc = full_cluster.start_job(
        "slow_scores.py", command=full_cluster.wheel_submit_command(wheel, jars, "slow_scores.py", args),
        cwd=outside, env={"PYTHONPATH": ""},
    )
    victim, deadline = None, time.monotonic() + 1200
    while victim is None:
        assert proc.poll() is None, Path(proc.log).read_text()[-6000:]
        assert time.monotonic() < deadline, "no NLI scoring task started within 20 minutes"
        for marker in (m for m in markers.iterdir() if m.name.isdigit()):
            victim = full_cluster.worker_of(int(marker.name))
            if victim is not None:
                break
        time.sleep(0.5)
    killed = full_cluster.kill_worker(victim)  # the worker, its executor and the Python worker mid-task
    result = full_cluster.finish_job(proc, timeout_s=1800)
    print(f"\n[cluster] worker-kill run: {time.monotonic() - started:.0f}s, killed {len(killed)} processes")

    assert result.returncode == 0, result.stdout[-6000:]
    assert f"[slow_scores] jobs imported from {wheel}/jobs/__init__.py" in result.stdout  # the wheel, no checkout
    assert f"master={full_cluster.master_url}" in result.stdout  # the job saw the cluster, not local mode
    # The master ran it as an application on its workers (local mode would never register there).
    assert len(full_cluster.completed_apps(apps_before + 1)) == apps_before + 1
    assert "Lost executor" in result.stdout or "ExecutorLostFailure" in result.stdout, result.stdout[-4000:]
    assert len(full_cluster.live_workers()) == 1
    assert_lakes_equal(spark, reference_lake, lake)
    chains = spark.read.format("delta").load(str(lake / "chains"))
    assert chains.groupBy("chain_id").count().where(F.col("count") > 1).count() == 0  # no task wrote twice


# Manual: 85-115 s of CI's slow set. Its parts run in CI: another host's claim is taken only once its heartbeat is
# older than the TTL (test_claim.py::test_stale_heartbeat_is_taken_over_after_the_ttl, ::test_live_claim_on_another_
# host_is_busy_and_nothing_is_created) and a SIGKILLed night's claim is taken over by the next night end to end
# (test_overlapping_runs.py::test_killed_nights_claim_is_taken_over_by_the_next_night).
@pytest.mark.cluster
@pytest.mark.manual
def test_claim_of_a_driver_on_another_host_expires_only_after_its_ttl(spark, full_cluster, tmp_path, capsys):
    """A night submitted to the cluster, its driver recording host `driver-a`, holds the lake's claim. A run that
    calls itself `driver-b` (a second driver host; `pipeline.claim_host`) sees it busy and names the holder's
    host. Once driver-a is SIGKILLed, driver-b cannot ask about a pid of another host: it takes over only when
    driver-a's last heartbeat is `claim_ttl` old, says so, and finishes the night."""
    from jobs.infra import claim
    from jobs.infra import tables as T

    sys.path.append(str(PROJECT_ROOT / "tests" / "jobs"))
    from pipeline_fakes import Fakes

    lake_input = copy_sample(tmp_path / "input")
    lake = tmp_path / "lake"
    pairs = ("pipeline.claim_heartbeat_s=2", "pipeline.claim_ttl=20", "pipeline.batch_chains=8",
             "pipeline.stages=[ingest,steps,scores,aggregate,curate]", "maintain.every_nights=null")
    started = time.monotonic()
    proc = full_cluster.start_job(str(Path("tests") / "cluster.py"), [
        "fake-night", *job_args(lake, lake_input, "profile=cluster", "pipeline.claim_host=driver-a", *pairs)])
    try:
        while not claim.generations(lake / claim.FOLDER):
            assert proc.poll() is None, Path(proc.log).read_text()[-6000:]
            assert time.monotonic() - started < 300, "no claim within 5 minutes"
            time.sleep(0.2)
        held = claim.latest(lake / claim.FOLDER)
        assert held.host == "driver-a"
        b_store = f"mlflow.tracking_uri={sqlite_store(tmp_path / 'mlruns-b.db')}"
        driver_b = [*job_args(lake, lake_input, "spark.master=local[2]", "pipeline.claim_host=driver-b", *pairs),
                    "--set", b_store]
        capsys.readouterr()
        with pytest.raises(SystemExit) as busy, Fakes().installed():
            pipeline.main(driver_b)
        assert busy.value.code == claim.EXIT_BUSY
        assert f"is busy: claimed by run {held.run_id} (pipeline) on host driver-a, pid {held.pid}" in \
            capsys.readouterr().err
    finally:
        kill_tree(proc.pid)  # the driver and spark-submit, no cleanup: driver-a's claim stays behind
        proc.wait()
    last_beat = claim.latest(lake / claim.FOLDER).last_beat
    with Fakes().installed():
        summary = pipeline.main([*driver_b, "--set", "pipeline.on_busy=wait"])
    print(f"\n[cluster] claim across hosts: {time.monotonic() - started:.0f}s")
    taker = claim.read(lake / claim.FOLDER, 1)
    assert (taker.host, taker.run_id) == ("driver-b", summary.run_id)
    assert taker.started - last_beat >= 20  # not at once: only the TTL frees another host's claim
    assert "its last heartbeat was" in taker.took_over and taker.took_over.endswith("(pipeline.claim_ttl=20 s)")
    assert f"took over the lake's claim from run {held.run_id} (pipeline) on host driver-a" in capsys.readouterr().err
    chains = T.read(spark, str(lake / "chains"))
    assert chains.count() == 24 and chains.select("chain_id").distinct().count() == 24
    assert T.read(spark, str(lake / "chain_scores")).count() == 24
