"""Every job run is an MLflow run: params, metrics, tags, artifacts; against a real `mlflow server`."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from jobs.tracking import job_run


def _run_job(settings, monkeypatch, uri: str):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with job_run(settings, "unit-job") as run:
        run.log_metrics({"rows_read": 28, "rows_written": 24})
        run.set_tags({"chains_version_after": 3})
        run.log_text("notes/summary.md", "# hello")
        child = run.child("stage-a")
        child.log_metrics({"seconds": 1.5})
    return run


def test_job_run_logs_to_real_mlflow_server(mlflow_server, settings, monkeypatch):
    run = _run_job(settings, monkeypatch, mlflow_server)
    assert run.run_id and run.tracking_error is None
    client = MlflowClient(mlflow_server)
    got = client.get_run(run.run_id)
    assert got.data.metrics["rows_read"] == 28 and got.data.metrics["rows_written"] == 24
    assert got.data.params["runtime.batch_size"] == "32"
    assert got.data.params["models.profile"] == "offline"
    assert got.data.tags["chains_version_after"] == "3"
    assert got.data.tags["models_profile"] == "offline"
    assert got.data.tags["spark_master"] == "local[2]"
    assert len(got.data.tags["git_commit"]) in (40, 7) or got.data.tags["git_commit"] == "unknown"
    names = {a.path for a in client.list_artifacts(run.run_id)}
    assert {"config", "notes"} <= names
    children = client.search_runs(
        [got.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run.run_id}'"
    )
    assert [c.data.metrics["seconds"] for c in children] == [1.5]


def test_job_run_default_store_is_sqlite_in_project(settings, monkeypatch):
    from jobs.config import PROJECT_ROOT
    from jobs.tracking import tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri(settings.model_copy(update={"mlflow": settings.mlflow.model_copy(update={"tracking_uri": None})})) == (
        f"sqlite:///{PROJECT_ROOT / 'mlruns.db'}"
    )


def test_job_run_failure_is_recorded_and_reraised(settings, monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/t.db")
    with pytest.raises(ZeroDivisionError):
        with job_run(settings, "failing-job") as run:
            1 / 0  # noqa: B018
    got = MlflowClient(f"sqlite:///{tmp_path}/t.db").get_run(run.run_id)
    assert got.data.tags["status"] == "FAILED" and "ZeroDivisionError" in got.data.tags["error"]
