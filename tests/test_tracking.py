"""Every job run is an MLflow run that lives as long as the job: against a real `mlflow server` and sqlite."""

from __future__ import annotations

import os

import pytest
from mlflow.tracking import MlflowClient

from jobs.infra.tracking import job_run


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


def test_job_run_default_store_is_sqlite_in_project(settings, monkeypatch):
    from jobs.infra.config import PROJECT_ROOT
    from jobs.infra.tracking import tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri(settings.model_copy(update={"mlflow": settings.mlflow.model_copy(update={"tracking_uri": None})})) == (
        f"sqlite:///{PROJECT_ROOT / 'mlruns.db'}"
    )


@pytest.mark.parametrize(
    ("error", "status"), [(ZeroDivisionError, "FAILED"), (KeyboardInterrupt, "KILLED"), (SystemExit(143), "KILLED")]
)
def test_job_run_status_is_how_the_job_ended(settings, monkeypatch, tmp_path, error, status):
    uri = f"sqlite:///{tmp_path}/t.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    kind = error if isinstance(error, type) else type(error)
    with pytest.raises(kind):
        with job_run(settings, "failing-job") as run:
            raise error
    got = MlflowClient(uri).get_run(run.run_id)
    assert got.info.status == status
    # MLflow's own status filter finds it: a failure is not hidden among FINISHED runs.
    found = MlflowClient(uri).search_runs([got.info.experiment_id], filter_string=f"attributes.status = '{status}'")
    assert [r.info.run_id for r in found] == [run.run_id]
    assert kind.__name__ in got.data.tags["error"]


def test_job_run_logs_model_as_registered_mlflow_model(settings, tiny_models, monkeypatch, tmp_path):
    import mlflow
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    uri = f"sqlite:///{tmp_path}/t.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with job_run(settings, "train") as run:
        run.log_model(tiny_models["tiny-t5"], "pvi_g", registered_name="receval-pvi-g")
        run.log_folder("model", tiny_models["tiny-t5"])  # the plain folder too, as train_pvi does
    files = {a.path for a in MlflowClient(uri).list_artifacts(run.run_id, "model")}
    assert {"model/config.json", "model/model.safetensors"} <= files
    (version,) = MlflowClient(uri).search_model_versions("name='receval-pvi-g'")
    assert version.run_id == run.run_id and int(version.version) == 1
    assert os.environ["MLFLOW_TRACKING_URI"] == uri  # the caller's environment is left as it was
    with _use_tracking_uri(uri):
        model = mlflow.pyfunc.load_model("models:/receval-pvi-g/1")
    (text,) = model.predict(["Generate entailed sentence: fur is thick ->"])
    assert isinstance(text, str)
