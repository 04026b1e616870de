"""MLflow unreachable -> the job still writes its Delta tables and saves a replay bundle; replay to a real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import free_port
from conftest import copy_sample
from delta.tables import DeltaTable

from jobs.infra.config import PROJECT_ROOT
from jobs.receval import ingest

# Keep the client from retrying a dead server for minutes.
QUICK_CLIENT = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


@pytest.fixture
def dead_tracking(monkeypatch) -> str:
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens on a port just handed back by the kernel
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    for key, value in QUICK_CLIENT.items():
        monkeypatch.setenv(key, value)
    return uri


def ingest_args(lake: Path) -> list[str]:
    return [
        "--set", f"paths.lake={lake}",
        "--set", f"ingest.input={copy_sample(lake.parent / 'input')}",
        "--set", "spark.master=local[2]",
        "--set", "spark.shuffle_partitions=2",
    ]


def replay_bundles(lake: Path) -> list[Path]:
    return sorted((lake / "_tracking_replay").glob("*_ingest_*.json"))


def test_job_run_tracking_outage_writes_tables_and_replay_bundle(spark, lake, dead_tracking, capsys):
    counts = ingest.main(ingest_args(lake))

    # The tables are written as if tracking had worked.
    assert DeltaTable.isDeltaTable(spark, str(lake / "chains"))
    assert spark.read.format("delta").load(str(lake / "chains")).count() == counts["inserted"] > 0
    assert counts["reconciled"] == 1
    # The run says tracking failed and how to send it later.
    err = capsys.readouterr().err
    bundles = replay_bundles(lake)
    assert len(bundles) == 1
    assert f"MLflow at {dead_tracking} failed" in err
    assert f"python -m jobs.infra.tracking replay {bundles[0]}" in err
    saved = json.loads(bundles[0].read_text())
    assert saved["uri"] == dead_tracking
    assert saved["bundle"]["metrics"]["rows_inserted"] == counts["inserted"]
    assert saved["bundle"]["status"] == "FINISHED" and saved["bundle"]["run_id"] is None
    assert {(d["name"], d["context"]) for d in saved["bundle"]["datasets"]} == {
        ("chains", "output"), ("quarantine", "output")
    }


def test_job_run_tracking_lost_mid_run_keeps_the_whole_record(spark, settings, tmp_path, monkeypatch):
    """Reachable at the start, gone mid-run: the job finishes, and the replay is one complete run."""
    from mlflow.tracking import MlflowClient

    from jobs.infra.tracking import job_run, replay

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


def test_replay_sends_saved_run_to_real_server(spark, lake, tmp_path, dead_tracking, mlflow_server, monkeypatch):
    counts = ingest.main(ingest_args(lake))
    (bundle,) = replay_bundles(lake)

    env = {**os.environ, **QUICK_CLIENT, "MLFLOW_TRACKING_URI": mlflow_server}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    out = subprocess.run(
        [sys.executable, "-m", "jobs.infra.tracking", "replay", str(bundle)],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run_id = out.stdout.strip().splitlines()[-1]

    from mlflow.tracking import MlflowClient

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
