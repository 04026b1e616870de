"""MLflow tracking for every job run: the run lives as long as the job, and an outage never costs the tables.

`job_run` creates the MLflow run when the job starts (status RUNNING, MLflow's standard source tags, the
resolved config as params), sends metrics, tags, artifacts, the Delta tables read and written (dataset
inputs with their versions) and trained models (MLflow models, optionally registered) as the job produces
them, and ends the run FINISHED, FAILED or KILLED as the job really ended.

Every call is also kept in the `JobRun`. When the tracking server cannot be reached (at the start or at any
later call) the job goes on untracked and, when it ends, its whole record is saved as a replay bundle under
`<lake>/_tracking_replay/`; `python -m jobs.infra.tracking replay FILE` sends it later as one complete run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from jobs.infra.config import Settings
from jobs.infra.config_describe import flatten
from jobs.infra.config_paths import PROJECT_ROOT, default_tracking_uri, resolve_path

log = logging.getLogger(__spec__.name)

MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value
STATUS_TAG = "receval.status_note"  # why a run ended as it did, when MLflow's status alone does not say
SKIPPED_TAG = "receval.skipped"  # a run that wrote nothing and why (the lake was claimed by another run)


def tracking_uri(settings: Settings) -> str:
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    if settings.mlflow.tracking_uri:
        return settings.mlflow.tracking_uri
    return default_tracking_uri()


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def source_tags(job: str) -> dict[str, str]:
    """MLflow's standard source tags (mlflow.source.*, mlflow.user) for this process and checkout."""
    from mlflow.tracking.context.registry import resolve_tags
    from mlflow.utils import mlflow_tags as T

    tags = resolve_tags({})
    # `python -m jobs.receval.ingest` names the entry point; a notebook or test keeps MLflow's own guess.
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.startswith("jobs."):
        tags[T.MLFLOW_SOURCE_NAME] = spec.name
    tags[T.MLFLOW_SOURCE_TYPE] = "JOB"
    tags[T.MLFLOW_RUN_NAME] = job
    # MLflow fills the git tags only with GitPython installed; the git CLI gives the same facts.
    commit = _git("rev-parse", "HEAD")
    if commit:
        tags[T.MLFLOW_GIT_COMMIT] = commit
        tags[T.MLFLOW_GIT_BRANCH] = _git("rev-parse", "--abbrev-ref", "HEAD") or ""
        tags[T.MLFLOW_GIT_DIRTY] = str(bool(_git("status", "--porcelain", "--untracked-files=no"))).lower()
        url = _git("config", "--get", "remote.origin.url")
        if url:
            tags[T.MLFLOW_GIT_REPO_URL] = url
    return tags


@dataclass
class JobRun:
    """One job's MLflow run: every call is sent at once (when tracking is up) and kept for a replay bundle."""

    job: str
    settings: Settings
    parent: JobRun | None = None
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # latest value of each metric
    history: list[tuple[str, float, int, int]] = field(default_factory=list)  # (key, value, ms, step)
    tags: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, bytes] = field(default_factory=dict)
    datasets: list[dict[str, Any]] = field(default_factory=list)
    models: list[dict[str, Any]] = field(default_factory=list)
    folders: dict[str, str] = field(default_factory=dict)  # artifact path -> local folder (kept by path, not bytes)
    children: list[JobRun] = field(default_factory=list)
    local_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    run_id: str | None = None
    status: str = "RUNNING"
    tracking_error: str | None = None
    replay_file: str | None = None
    started: float = field(default_factory=time.time)
    online: bool = False
    _client: Any = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # -- lifecycle ----------------------------------------------------------------------------------
    @property
    def uri(self) -> str:
        return tracking_uri(self.settings)

    def start(self, tags: dict[str, str] | None = None) -> JobRun:
        """Create the MLflow run now (RUNNING), so the job is visible while it works."""
        self.set_tags(tags or {})
        if not self.settings.mlflow.enabled or (self.parent is not None and not self.parent.online):
            return self
        try:
            from mlflow.tracking import MlflowClient

            # A client bound to this URI, never mlflow.set_tracking_uri: that also sets MLFLOW_TRACKING_URI in
            # the environment, which would then override the configured store of every later job here.
            self._client = MlflowClient(self.uri)
            run_tags = {**self.tags, **({"mlflow.parentRunId": self.parent.run_id} if self.parent else {})}
            run = self._client.create_run(_experiment_id(self._client, self.uri, self.settings), tags=run_tags)
            self.run_id = run.info.run_id
            self.online = True
        except Exception as err:  # a tracking failure must never fail the job
            self._lost(err)
        return self

    def end(self, status: str) -> None:
        """Close the run as the job ended; untracked (or half-tracked) runs go to a replay bundle."""
        self.status = status
        self.log_metrics({"wall_seconds": time.time() - self.started})
        for child in self.children:
            if child.status == "RUNNING":
                child.end(status)
        if self.online:
            self._send(lambda c: c.set_terminated(self.run_id, status))
        elif self.run_id is not None:
            # Tracking was lost mid-run: close the partial run if the server answers again (the replay
            # bundle then makes the complete one), rather than leave it RUNNING for ever.
            with contextlib.suppress(Exception):
                self._client.set_terminated(self.run_id, "FAILED")
        if self.parent is None and self.settings.mlflow.enabled and not self._all_online():
            self.replay_file = save_replay(self.to_bundle(), self.settings, self.uri)
            log.warning(
                "[tracking] MLflow at %s failed (%s); the Delta tables are written. "
                "Replay the run later with: python -m jobs.infra.tracking replay %s",
                self.uri, self.tracking_error or self._child_error(), self.replay_file,
            )

    def _all_online(self) -> bool:
        return self.online and all(c._all_online() for c in self.children)

    def _child_error(self) -> str | None:
        return next((c.tracking_error or c._child_error() for c in self.children if not c._all_online()), None)

    def _lost(self, err: BaseException) -> None:
        self.online = False
        self.tracking_error = f"{type(err).__name__}: {err}"
        log.warning("[tracking] MLflow at %s unreachable (%s); the job goes on, its record is kept", self.uri,
                    self.tracking_error)

    def _send(self, call: Callable[[Any], Any]) -> None:
        if not self.online:
            return
        try:
            with self._lock:
                call(self._client)
        except Exception as err:  # keep working: the whole record is replayed later
            self._lost(err)

    # -- what a job reports ---------------------------------------------------------------------------
    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        fresh = {}
        for key, value in params.items():
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            fresh[key] = self.params[key] = text[:MAX_PARAM_CHARS]
        batch = [Param(k, v) for k, v in fresh.items()]
        for i in range(0, len(batch), 100):
            self._send(lambda c, chunk=batch[i : i + 100]: c.log_batch(self.run_id, params=chunk))

    def log_metrics(self, metrics: dict[str, float | None], step: int | None = None) -> None:
        """Sent as they happen (a stage logs each batch with its step), so the run shows progress."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = []
        for key, value in metrics.items():
            if value is None:
                continue
            at = step if step is not None else sum(1 for k, *_ in self.history if k == key)
            self.metrics[key] = float(value)
            self.history.append((key, float(value), now, at))
            batch.append(Metric(key, float(value), now, at))
        for i in range(0, len(batch), 500):
            self._send(lambda c, chunk=batch[i : i + 500]: c.log_batch(self.run_id, metrics=chunk))

    def set_tags(self, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        fresh = {k: str(v) for k, v in tags.items()}
        self.tags.update(fresh)
        if fresh:
            self._send(lambda c: c.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in fresh.items()]))

    def log_bytes(self, name: str, data: bytes) -> None:
        self.artifacts[name] = data

        def upload(client: Any) -> None:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                client.log_artifact(self.run_id, str(path), str(Path(name).parent) if "/" in name else None)

        self._send(upload)

    def log_text(self, name: str, text: str) -> None:
        self.log_bytes(name, text.encode())

    def log_file(self, name: str, path: str | os.PathLike[str]) -> None:
        self.log_bytes(name, Path(path).read_bytes())

    def log_folder(self, name: str, folder: str | os.PathLike[str]) -> None:
        """A local folder as the artifact folder `name` (a replay bundle names the folder, it does not copy it)."""
        self.folders[name] = str(folder)
        self._send(lambda c: c.log_artifacts(self.run_id, str(folder), name))

    def log_table(self, name: str, path: str, version: int | None, context: str) -> None:
        """A Delta table read (context `input`) or written (`output`) at a version, as an MLflow dataset input.

        MLflow records dataset lineage as run inputs only; the `mlflow.data.context` tag says which way.
        """
        if version is None:
            return
        entry = {"name": name, "path": path, "version": int(version), "context": context}
        self.datasets.append(entry)
        self._send(lambda c: c.log_inputs(self.run_id, datasets=[_dataset_input(entry)]))

    def log_model(self, folder: str | os.PathLike[str], name: str, registered_name: str | None = None,
                  config: dict[str, Any] | None = None) -> None:
        """A saved transformers model folder as an MLflow (pyfunc) model named `name`, registered on request;
        `config`: model_config entries its predict reads (an NLI model's mlflow_models.nli_config)."""
        entry = {"folder": str(folder), "name": name, "registered_name": registered_name,
                 "config": config or {}}
        self.models.append(entry)
        self._send(lambda c: _send_model(self.uri, self.run_id, entry))

    def child(self, job: str) -> JobRun:
        """A nested run (a pipeline stage), started now under this one."""
        run = JobRun(job=job, settings=self.settings, parent=self)
        self.children.append(run)
        return run.start({"mlflow.runName": job, "job": job})

    # -- replay -------------------------------------------------------------------------------------
    def to_bundle(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "status": self.status,
            "run_id": self.run_id,
            "started_ms": int(self.started * 1000),
            "params": self.params,
            "metrics": self.metrics,
            "history": self.history,
            "tags": self.tags,
            "artifacts": {k: v.decode("latin-1") for k, v in self.artifacts.items()},
            "datasets": self.datasets,
            "models": self.models,
            "folders": self.folders,
            "children": [c.to_bundle() for c in self.children],
        }


def _dataset_input(entry: dict[str, Any]) -> Any:
    import hashlib

    from mlflow.data.delta_dataset_source import DeltaDatasetSource
    from mlflow.entities import Dataset, DatasetInput, InputTag

    source = DeltaDatasetSource(path=entry["path"], delta_table_version=entry["version"])
    digest = hashlib.sha256(f"{entry['path']}@{entry['version']}".encode()).hexdigest()[:16]
    dataset = Dataset(
        name=entry["name"], digest=digest, source_type="delta", source=source.to_json(),
        profile=json.dumps({"delta_version": entry["version"]}),
    )
    return DatasetInput(dataset, tags=[InputTag("mlflow.data.context", entry["context"])])


def _send_model(uri: str, run_id: str, entry: dict[str, Any]) -> None:
    from jobs.infra.mlflow_models import log_folder

    # A bundle saved before models carried a config has none.
    log_folder(uri, run_id, entry["folder"], entry["name"], entry["registered_name"], entry.get("config"))


def _experiment_id(client: Any, uri: str, settings: Settings) -> str:
    name = settings.mlflow.experiment
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = settings.mlflow.artifact_location
    # A local artifact folder for local stores; a remote server keeps its own default root.
    artifact = resolve_path(location).as_uri() if uri.startswith(("sqlite:", "file:", "/")) else None
    return client.create_experiment(name, artifact_location=artifact)


def send_bundle(bundle: dict[str, Any], uri: str, settings: Settings, parent_id: str | None = None) -> str:
    """Send a saved run as one complete MLflow run (its metric history, datasets, models, children)."""
    from mlflow.entities import DatasetInput, Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    tags = {**bundle["tags"], "mlflow.runName": bundle["job"], "receval.replayed": "true"}
    if parent_id:
        tags["mlflow.parentRunId"] = parent_id
    run = client.create_run(_experiment_id(client, uri, settings), start_time=bundle.get("started_ms"), tags=tags)
    run_id = run.info.run_id
    params = [Param(k, v) for k, v in bundle["params"].items()]
    history = bundle.get("history") or [[k, v, int(time.time() * 1000), 0] for k, v in bundle["metrics"].items()]
    metrics = [Metric(k, v, ts, step) for k, v, ts, step in history]
    for i in range(0, max(len(params), len(metrics)), 100):
        client.log_batch(run_id, metrics=metrics[i : i + 100], params=params[i : i + 100])
    if bundle["artifacts"]:
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in bundle["artifacts"].items():
                path = Path(tmp) / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(text.encode("latin-1"))
            client.log_artifacts(run_id, tmp)
    datasets: list[DatasetInput] = [_dataset_input(d) for d in bundle.get("datasets", [])]
    if datasets:
        client.log_inputs(run_id, datasets=datasets)
    for name, folder in bundle.get("folders", {}).items():
        client.log_artifacts(run_id, folder, name)
    for entry in bundle.get("models", []):
        _send_model(uri, run_id, entry)
    for child in bundle.get("children", []):
        send_bundle(child, uri, settings, parent_id=run_id)
    # A run created before the outage stays behind half-filled: point it at the complete one.
    if bundle.get("run_id") and parent_id is None:
        with contextlib.suppress(Exception):
            client.log_batch(bundle["run_id"], tags=[RunTag("receval.replayed_as", run_id)])
            client.set_terminated(bundle["run_id"], "FAILED")
    client.set_terminated(run_id, bundle.get("status", "FINISHED"))
    return run_id


def save_replay(bundle: dict[str, Any], settings: Settings, uri: str) -> str:
    folder = resolve_path(settings.paths.lake) / "_tracking_replay"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{time.strftime('%Y%m%dT%H%M%S')}_{bundle['job']}_{uuid.uuid4().hex[:8]}.json"
    path.write_text(json.dumps({"uri": uri, "bundle": bundle}))
    return str(path)


def skipped_run(settings: Settings, job: str, local_id: str, note: str, tags: dict[str, Any]) -> JobRun:
    """A run that did not start its work (the lake was busy): created and ended FINISHED at once, tagged
    `receval.skipped` with why, so the MLflow UI lists the skipped night beside the others."""
    run = JobRun(job=job, settings=settings, local_id=local_id)
    run.start({**(source_tags(job) if settings.mlflow.enabled else {}), "job": job,
               "scoring_hash": settings.scoring_hash(), SKIPPED_TAG: "lake busy", STATUS_TAG: note, **tags})
    run.end("FINISHED")
    return run


def _ended_as(err: BaseException | None) -> str:
    if err is None:
        return "FINISHED"
    if isinstance(err, KeyboardInterrupt) or (isinstance(err, SystemExit) and err.code not in (0, None)):
        return "KILLED"
    return "FINISHED" if isinstance(err, SystemExit) else "FAILED"


@contextlib.contextmanager
def _killed_on_sigterm() -> Iterator[None]:
    """SIGTERM (a scheduler stopping the night) ends the job through Python, so its run ends KILLED."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def job_run(settings: Settings, job: str, local_id: str | None = None) -> Iterator[JobRun]:
    """One MLflow run per job invocation, started now: params = flattened config, standard source tags.
    `local_id`: the run's own id (the lake claim's holder, every Delta commit's metadata); None: a new one."""
    from jobs.infra.logs import setup_logging
    from jobs.infra.progress import heartbeat

    setup_logging(settings.log.level)
    resolved = settings.model_dump(mode="json")
    run = JobRun(job=job, settings=settings, **({"local_id": local_id} if local_id else {}))
    run.start(
        {
            **(source_tags(job) if settings.mlflow.enabled else {}),
            "spark_master": settings.spark.master,
            "profile": settings.profile,
            "models_profile": settings.models.profile,
            "scoring_hash": settings.scoring_hash(),
            "job": job,
        }
    )
    run.log_params(flatten(resolved))
    run.log_text("config/resolved.yaml", yaml.safe_dump(resolved, sort_keys=False))
    log.info("[%s] profile=%s models=%s master=%s%s", job, settings.profile, settings.models.profile,
             settings.spark.master, f", MLflow run {run.run_id} at {run.uri}" if run.run_id else "")
    failure: BaseException | None = None
    try:
        with _killed_on_sigterm(), heartbeat(job, settings.log.progress_seconds):
            yield run
    except BaseException as err:
        failure = err
        if _ended_as(err) != "FINISHED":
            run.set_tags({"error": traceback.format_exc()[-2000:]})
        raise
    finally:
        from pyspark.sql import SparkSession

        from jobs.infra.tables import release_table_state

        spark = SparkSession.getActiveSession()
        if spark is not None:
            release_table_state(spark)
        run.end(_ended_as(failure))
        if run.run_id and run.online:
            log.info("[%s] MLflow run %s ended %s at %s", job, run.run_id, run.status, run.uri)


def replay(path: str) -> str:
    data = json.loads(Path(path).read_text())
    from jobs.infra.config_layers import load_settings

    settings = load_settings()
    uri = os.environ.get("MLFLOW_TRACKING_URI") or data["uri"]
    run_id = send_bundle(data["bundle"], uri, settings)
    done = Path(path).with_suffix(".sent.json")
    shutil.move(path, done)
    return run_id


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description="MLflow tracking tools")
    sub = parser.add_subparsers(dest="cmd", required=True)
    rp = sub.add_parser("replay", help="send a saved replay bundle to MLflow")
    rp.add_argument("file")
    args = parser.parse_args(argv)
    if args.cmd == "replay":
        print(replay(args.file))


if __name__ == "__main__":
    main()
