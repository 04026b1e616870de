"""Every job run is an MLflow run that lives as long as the job, on sqlite stores (against a real `mlflow server`:
tests/test_tracking_server.py)."""

from __future__ import annotations

import os

import pytest
from mlflow.tracking import MlflowClient

from jobs.infra.tracking import job_run


def test_job_run_default_store_is_sqlite_in_project(settings, monkeypatch):
    from jobs.infra.config_paths import PROJECT_ROOT
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


def test_nli_model_predict_sizes_its_calls_from_the_model_config(monkeypatch):
    from types import SimpleNamespace

    import numpy as np
    import pandas as pd

    from jobs.infra import mlflow_models
    from jobs.infra.config import RuntimeSettings
    from udfs import nli

    sizes = []

    def fake_pairs(model, tokenizer, premises, hypotheses, batch_size, max_length):
        sizes.append((batch_size, max_length))
        return SimpleNamespace(probs=np.zeros((len(premises), 3)))

    monkeypatch.setattr(nli, "predict_pairs", fake_pairs)
    model = mlflow_models.NliClassifier()
    model.model = model.tokenizer = None
    pairs = pd.DataFrame({"premise": ["p"], "hypothesis": ["h"]})
    for config in (mlflow_models.nli_config(5, 40), None):  # None: a model logged before the sizes were
        model.predict(SimpleNamespace(model_config=config), pairs)
    runtime = RuntimeSettings()
    assert sizes == [(5, 40), (runtime.batch_size, runtime.max_length)]


def test_job_run_logs_nli_model_with_the_sizes_it_was_given(settings, tiny_models, monkeypatch, tmp_path):
    import mlflow
    import pandas as pd
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    from jobs.infra.mlflow_models import nli_config
    from udfs.nli import CONTRADICTION, ENTAIL, NEUTRAL

    uri = f"sqlite:///{tmp_path}/t.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with job_run(settings, "train_nli") as run:
        run.log_model(tiny_models["tiny-nli"], "nli", registered_name="receval-nli", config=nli_config(2, 24))
    with _use_tracking_uri(uri):
        model = mlflow.pyfunc.load_model("models:/receval-nli/1")
    assert {k: model.model_config[k] for k in ("batch_size", "max_length")} == nli_config(2, 24)
    pairs = pd.DataFrame({"premise": ["a cat sat", "it rains", "x"], "hypothesis": ["a cat", "dry", "y"]})
    probs = model.predict(pairs)
    assert list(probs.columns) == [ENTAIL, NEUTRAL, CONTRADICTION] and len(probs) == 3
