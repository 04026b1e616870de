"""MLflow tracking for every job run, buffered so a tracking outage never costs the Delta tables.

A `JobRun` collects params, metrics, tags and artifacts while the job works and sends them to MLflow
when the job ends, after its tables are written. If the tracking server cannot be reached, the run is
saved as a replay bundle under `<lake>/_tracking_replay/` and `python -m jobs.tracking replay FILE`
sends it later.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from jobs.config import PROJECT_ROOT, Settings, flatten, resolve_path

MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value


def tracking_uri(settings: Settings) -> str:
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    if settings.mlflow.tracking_uri:
        return settings.mlflow.tracking_uri
    return f"sqlite:///{PROJECT_ROOT / 'mlruns.db'}"


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@dataclass
class JobRun:
    """What a job reports; sent to MLflow by `flush`."""

    job: str
    settings: Settings
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, bytes] = field(default_factory=dict)
    children: list[JobRun] = field(default_factory=list)
    local_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    run_id: str | None = None
    tracking_error: str | None = None
    replay_file: str | None = None
    started: float = field(default_factory=time.time)

    def log_params(self, params: dict[str, Any]) -> None:
        for key, value in params.items():
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            self.params[key] = text[:MAX_PARAM_CHARS]

    def log_metrics(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if value is not None:
                self.metrics[key] = float(value)

    def set_tags(self, tags: dict[str, Any]) -> None:
        self.tags.update({k: str(v) for k, v in tags.items()})

    def log_text(self, name: str, text: str) -> None:
        self.artifacts[name] = text.encode()

    def log_bytes(self, name: str, data: bytes) -> None:
        self.artifacts[name] = data

    def log_file(self, name: str, path: str | os.PathLike[str]) -> None:
        self.artifacts[name] = Path(path).read_bytes()

    def child(self, job: str) -> JobRun:
        run = JobRun(job=job, settings=self.settings)
        self.children.append(run)
        return run

    # -- sending ------------------------------------------------------------------------------------
    def to_bundle(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "params": self.params,
            "metrics": self.metrics,
            "tags": self.tags,
            "artifacts": {k: v.decode("latin-1") for k, v in self.artifacts.items()},
            "children": [c.to_bundle() for c in self.children],
        }

    def flush(self) -> str | None:
        """Send to MLflow; on failure save a replay bundle. Returns the MLflow run id or None."""
        if not self.settings.mlflow.enabled:
            return None
        uri = tracking_uri(self.settings)
        try:
            self.run_id = send_bundle(self.to_bundle(), uri, self.settings)
        except Exception as err:  # any tracking failure must leave the job's results standing
            self.tracking_error = f"{type(err).__name__}: {err}"
            self.replay_file = save_replay(self.to_bundle(), self.settings, uri)
            print(
                f"[tracking] MLflow at {uri} failed ({self.tracking_error}); the Delta tables are written. "
                f"Replay the run later with: python -m jobs.tracking replay {self.replay_file}",
                file=sys.stderr,
            )
        return self.run_id


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
    from mlflow.tracking import MlflowClient

    # A client bound to this URI, never mlflow.set_tracking_uri: that also sets MLFLOW_TRACKING_URI in the
    # environment, which would then override the configured store of every later job in this process.
    client = MlflowClient(uri)
    exp_id = _experiment_id(client, uri, settings)
    tags = dict(bundle["tags"])
    tags["mlflow.runName"] = bundle["job"]
    if parent_id:
        tags["mlflow.parentRunId"] = parent_id
    run = client.create_run(exp_id, tags=tags)
    run_id = run.info.run_id
    from mlflow.entities import Metric, Param

    now = int(time.time() * 1000)
    params = [Param(k, v) for k, v in bundle["params"].items()]
    metrics = [Metric(k, v, now, 0) for k, v in bundle["metrics"].items()]
    for i in range(0, max(len(params), len(metrics)), 100):
        client.log_batch(run_id, metrics=metrics[i : i + 100], params=params[i : i + 100])
    if bundle["artifacts"]:
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in bundle["artifacts"].items():
                path = Path(tmp) / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(text.encode("latin-1"))
            client.log_artifacts(run_id, tmp)
    for child in bundle.get("children", []):
        send_bundle(child, uri, settings, parent_id=run_id)
    client.set_terminated(run_id, "FINISHED")
    return run_id


def save_replay(bundle: dict[str, Any], settings: Settings, uri: str) -> str:
    folder = resolve_path(settings.paths.lake) / "_tracking_replay"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{time.strftime('%Y%m%dT%H%M%S')}_{bundle['job']}_{uuid.uuid4().hex[:8]}.json"
    path.write_text(json.dumps({"uri": uri, "bundle": bundle}))
    return str(path)


@contextlib.contextmanager
def job(name: str, description: str | None, argv: Any = None) -> Iterator[tuple[Any, Settings, JobRun]]:
    """A job's `main`: its command line (--config, --set), its Spark session and its MLflow run."""
    from jobs import tables
    from jobs.session import build_session

    settings, _ = tables.job_args(description or name, argv)
    spark = build_session(settings.spark)
    with job_run(settings, name) as tracked:
        yield spark, settings, tracked


@contextlib.contextmanager
def job_run(settings: Settings, job: str, section: Any = None) -> Iterator[JobRun]:
    """One MLflow run per job invocation: params = flattened config, tags = commit, master, profiles."""
    run = JobRun(job=job, settings=settings)
    resolved = settings.model_dump(mode="json")
    run.log_params(flatten(resolved))
    run.set_tags(
        {
            "git_commit": git_commit(),
            "spark_master": settings.spark.master,
            "profile": settings.profile,
            "models_profile": settings.models.profile,
            "scoring_hash": settings.scoring_hash(),
            "job": job,
        }
    )
    run.log_text("config/resolved.yaml", yaml.safe_dump(resolved, sort_keys=False))
    print(f"[{job}] profile={settings.profile} models={settings.models.profile} master={settings.spark.master}")
    status = "FINISHED"
    try:
        yield run
    except BaseException:
        status = "FAILED"
        run.set_tags({"error": traceback.format_exc()[-2000:]})
        raise
    finally:
        run.log_metrics({"wall_seconds": time.time() - run.started})
        run.set_tags({"status": status})
        run.flush()
        if run.run_id:
            print(f"[{job}] MLflow run {run.run_id} at {tracking_uri(settings)}")


def replay(path: str) -> str:
    data = json.loads(Path(path).read_text())
    from jobs.config import load_settings

    settings = load_settings()
    uri = os.environ.get("MLFLOW_TRACKING_URI") or data["uri"]
    run_id = send_bundle(data["bundle"], uri, settings)
    done = Path(path).with_suffix(".sent.json")
    shutil.move(path, done)
    return run_id


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="MLflow tracking tools")
    sub = parser.add_subparsers(dest="cmd", required=True)
    rp = sub.add_parser("replay", help="send a saved replay bundle to MLflow")
    rp.add_argument("file")
    args = parser.parse_args(argv)
    if args.cmd == "replay":
        print(replay(args.file))


if __name__ == "__main__":
    main()
