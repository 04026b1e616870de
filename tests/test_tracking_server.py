"""Tracking against a real `mlflow server` and a dead one: a job's run is visible while it runs; with MLflow
unreachable the job still writes its Delta tables and saves a replay bundle, which a replay sends to the server.

The tests that need the live server are in this one file, so one server starts per test run (a file's tests stay in
one test process)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from cluster import free_port
from conftest import copy_sample
from delta.tables import DeltaTable
from mlflow.tracking import MlflowClient

from jobs.infra.config_paths import PROJECT_ROOT
from jobs.infra.tracking import job_run
from jobs.receval import ingest

# Keep the client from retrying a dead server for minutes.
QUICK_CLIENT = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


def point_at_dead_server(mp: pytest.MonkeyPatch) -> str:
    """Set MLFLOW_TRACKING_URI to a port nothing listens on (just handed back by the kernel), quick to give up."""
    uri = f"http://127.0.0.1:{free_port()}"
    mp.setenv("MLFLOW_TRACKING_URI", uri)
    for key, value in QUICK_CLIENT.items():
        mp.setenv(key, value)
    return uri


@pytest.fixture
def dead_tracking(monkeypatch) -> str:
    return point_at_dead_server(monkeypatch)


def ingest_args(lake: Path) -> list[str]:
    return [
        "--set", f"paths.lake={lake}",
        "--set", f"ingest.input={copy_sample(lake.parent / 'input')}",
        "--set", "spark.master=local[2]",
        "--set", "spark.shuffle_partitions=1",
    ]


def replay_bundles(lake: Path) -> list[Path]:
    return sorted((lake / "_tracking_replay").glob("*_ingest_*.json"))


@dataclass
class Outage:
    """One ingest run of the sample lake while MLflow was unreachable."""

    lake: Path
    uri: str  # the dead tracking URI
    counts: dict
    err: str  # the job's standard error


@pytest.fixture(scope="module")
def outage(spark, tmp_path_factory) -> Outage:
    """`python -m jobs.receval.ingest` once with a dead tracking server; the tests read its lake and bundle (the
    replay test sends a copy of the bundle)."""
    lake = tmp_path_factory.mktemp("outage") / "lake"
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        uri = point_at_dead_server(mp)
        # Jobs log to the standard error as it is at each record (jobs.infra.logs).
        with contextlib.redirect_stderr(err):
            counts = ingest.main(ingest_args(lake))
    return Outage(lake, uri, counts, err.getvalue())


def test_job_run_is_visible_while_running_and_ends_finished(mlflow_server, settings, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    client = MlflowClient(mlflow_server)
    with job_run(settings, "unit-job") as run:
        run.log_metrics({"chains_done": 10}, step=1)
        run.log_metrics({"chains_done": 20}, step=2)
        run.log_table("chains", "/lake/chains", 3, "input")
        run.log_table("curated", "/lake/curated", 7, "output")
        run.log_text("notes/summary.md", "# hello")
        child = run.child("stage-a")
        child.log_metrics({"seconds": 1.5})
        # While the job works, its run is there with what it has reported so far.
        live = client.get_run(run.run_id)
        assert live.info.status == "RUNNING"
        assert [(m.step, m.value) for m in client.get_metric_history(run.run_id, "chains_done")] == [(1, 10), (2, 20)]
        assert client.get_run(child.run_id).info.status == "RUNNING"
    got = client.get_run(run.run_id)
    assert got.info.status == "FINISHED"
    assert got.info.end_time - got.info.start_time >= 0 and got.data.metrics["wall_seconds"] > 0
    assert got.data.params["runtime.batch_size"] == "32"
    assert got.data.params["models.profile"] == "offline"
    tags = got.data.tags
    assert tags["mlflow.source.type"] == "JOB" and tags["mlflow.runName"] == "unit-job"
    assert len(tags["mlflow.source.git.commit"]) == 40 and "mlflow.user" in tags
    assert tags["models_profile"] == "offline" and tags["spark_master"] == "local[2]"
    inputs = {(d.dataset.name, d.tags[0].value, d.dataset.source_type) for d in got.inputs.dataset_inputs}
    assert inputs == {("chains", "input", "delta"), ("curated", "output", "delta")}
    sources = {d.dataset.name: d.dataset.source for d in got.inputs.dataset_inputs}
    assert '"delta_table_version": 7' in sources["curated"] and '"/lake/curated"' in sources["curated"]
    assert {"config", "notes"} <= {a.path for a in client.list_artifacts(run.run_id)}
    children = client.search_runs(
        [got.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run.run_id}'"
    )
    assert [(c.data.metrics["seconds"], c.info.status) for c in children] == [(1.5, "FINISHED")]


def test_job_run_tracking_outage_writes_tables_and_replay_bundle(spark, outage):
    lake, counts, err = outage.lake, outage.counts, outage.err
    # The tables are written as if tracking had worked.
    assert DeltaTable.isDeltaTable(spark, str(lake / "chains"))
    assert spark.read.format("delta").load(str(lake / "chains")).count() == counts["inserted"] > 0
    assert counts["reconciled"] == 1
    # The run says tracking failed and how to send it later.
    bundles = replay_bundles(lake)
    assert len(bundles) == 1
    assert f"MLflow at {outage.uri} failed" in err
    assert f"python -m jobs.infra.tracking replay {bundles[0]}" in err
    saved = json.loads(bundles[0].read_text())
    assert saved["uri"] == outage.uri
    assert saved["bundle"]["metrics"]["rows_inserted"] == counts["inserted"]
    assert saved["bundle"]["status"] == "FINISHED" and saved["bundle"]["run_id"] is None
    assert {(d["name"], d["context"]) for d in saved["bundle"]["datasets"]} == {
        ("chains", "output"), ("quarantine", "output")
    }


def test_job_run_tracking_lost_mid_run_keeps_the_whole_record(spark, settings, tmp_path, monkeypatch):
    """Reachable at the start, gone mid-run: the job finishes, and the replay is one complete run."""
    from jobs.infra.tracking import replay

    uri = f"sqlite:///{tmp_path}/t.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)

    class Gone:
        def __getattr__(self, name):
            raise ConnectionError("tracking server went away")

    with job_run(settings, "night") as run:
        run.log_metrics({"chains_done": 5}, step=1)
        live = run._client
        run._client = Gone()  # every later call to the server fails
        run.log_metrics({"chains_done": 9}, step=2)
        run.log_table("curated", "/lake/curated", 4, "output")
        run._client = live  # the server answers again when the job ends (closes the partial run)
    assert not run.online and run.replay_file
    client = MlflowClient(uri)
    partial = client.get_run(run.run_id)
    assert partial.info.status == "FAILED"  # not left RUNNING
    assert [m.value for m in client.get_metric_history(run.run_id, "chains_done")] == [5]

    full_id = replay(run.replay_file)
    full = client.get_run(full_id)
    assert full.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(full_id, "chains_done")] == [(1, 5), (2, 9)]
    assert [d.dataset.name for d in full.inputs.dataset_inputs] == ["curated"]
    assert client.get_run(run.run_id).data.tags["receval.replayed_as"] == full_id


def test_replay_sends_saved_run_to_real_server(outage, tmp_path, mlflow_server):
    lake, counts = outage.lake, outage.counts
    (saved,) = replay_bundles(lake)
    bundle = Path(shutil.copy(saved, tmp_path / saved.name))  # the replay renames what it sent

    env = {**os.environ, **QUICK_CLIENT, "MLFLOW_TRACKING_URI": mlflow_server}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    out = subprocess.run(
        [sys.executable, "-m", "jobs.infra.tracking", "replay", str(bundle)],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run_id = out.stdout.strip().splitlines()[-1]

    client = MlflowClient(mlflow_server)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["job"] == "ingest"
    assert {d.dataset.name for d in run.inputs.dataset_inputs} == {"chains", "quarantine"}
    assert run.data.metrics["rows_inserted"] == counts["inserted"]
    assert run.data.metrics["rows_read"] == counts["read"]
    assert run.data.params["paths.lake"] == str(lake)
    download = client.download_artifacts(run_id, "config/resolved.yaml", str(tmp_path))
    assert f"lake: {lake}" in Path(download).read_text()
    # Sent once: the bundle is renamed, so a second replay cannot duplicate the run.
    assert not bundle.exists()
    assert bundle.with_suffix(".sent.json").exists()


def test_replay_unreachable_server_keeps_bundle(lake, tmp_path, dead_tracking):
    bundle = tmp_path / "bundle.json"
    bundle.write_text(json.dumps({"uri": dead_tracking, "bundle": {
        "job": "ingest", "params": {}, "metrics": {"rows_read": 1.0}, "tags": {}, "artifacts": {}, "children": [],
    }}))
    env = {**os.environ, **QUICK_CLIENT}
    out = subprocess.run(
        [sys.executable, "-m", "jobs.infra.tracking", "replay", str(bundle)],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode != 0
    assert bundle.exists()  # a failed replay leaves the bundle for the next try
