"""Every job run is an MLflow run that lives as long as the job, on sqlite stores (against a real `mlflow server`:
tests/test_tracking_server.py)."""

from __future__ import annotations

import os

import pytest
from mlflow.tracking import MlflowClient

from jobs.infra.tracking import job_run


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
