"""Shared fixtures: one local Spark session with Delta, tiny models built once, per-test lake folders."""

from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest

from jobs.infra.config import Settings
from jobs.infra.config_layers import load_settings
from jobs.infra.config_paths import PROJECT_ROOT

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# Test processes (pytest-xdist workers) share the project's models/ and data/ folders: one builds or fetches
# while the others wait, then every one reads the same files.
SHARED_LOCK = PROJECT_ROOT / ".pytest-shared.lock"

# The test JVM runs short jobs on tiny tables: the C1 compiler alone starts and warms up faster than tiered
# compilation with C2, whose compile threads compete with the work on 2 cores (docs/TESTING.md: ~1.5x on a
# Delta MERGE + pandas UDF loop). Jobs keep the JVM's defaults; this is the test session only.
# C1 alone reserves a 48 MB code cache, which a test process's JVM filled (tests/spark-conf says more): 256 MB.
# Spark applications get it from tests/spark-conf; the standalone cluster's daemons (not applications) from here.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m"
# Spark defaults for every application the tests start, in process or as a subprocess (interpreted expressions,
# C1): see the file's comments. Set before any JVM starts; subprocesses inherit it.
TEST_SPARK_CONF_DIR = PROJECT_ROOT / "tests" / "spark-conf"
os.environ["SPARK_CONF_DIR"] = str(TEST_SPARK_CONF_DIR)


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, Path]:
    """The tiny T5, GPT-2-style LM and NLI classifier under <project>/models (built once, kept)."""
    from filelock import FileLock

    from jobs.infra.tiny_models import build_all

    with FileLock(SHARED_LOCK):
        return build_all(PROJECT_ROOT / "models")


def load_script(path: Path) -> ModuleType:
    """A script outside the packages (bench/, .ci/, a test-data generator) imported from its path, registered
    under its file name (dataclasses and pickling look a module up by name)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def spark():
    from jobs.infra.config import SparkSettings
    from jobs.infra.session import build_session

    session = build_session(
        SparkSettings(master="local[2]", shuffle_partitions=1, app_name="receval-tests"),
        extra={
            "spark.driver.memory": "1g",
            "spark.sql.adaptive.enabled": "false",
        },
    )
    yield session
    session.stop()


SAMPLE_LAKE = PROJECT_ROOT / "tests" / "data" / "sample_lake"
# The tests' nightly input: the sample lake's 24 GSM-8K chains and its bad rows. Its EntailmentBank part (gold and
# perturbed chains, make run's demonstration of what correctness scores catch) is read by test_small_profile only.
TEST_SAMPLE_FILES = ("gsm8k_sample.jsonl", "bad_rows.jsonl")


def copy_sample(folder: Path) -> Path:
    """The tests' part of the sample lake copied into `folder` (made), which tests may add files to."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in TEST_SAMPLE_FILES:
        shutil.copyfile(SAMPLE_LAKE / name, folder / name)
    return folder


@functools.cache
def _mlflow_template() -> Path:
    """An empty MLflow sqlite store made by MLflow itself, once per test process: its schema migrations take 3-5 s
    on 2 cores, which every test that tracks a job would otherwise pay for its own new store."""
    from mlflow.tracking import MlflowClient

    folder = Path(tempfile.mkdtemp(prefix="mlflow-template-"))
    atexit.register(shutil.rmtree, folder, True)
    path = folder / "mlruns.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()  # creates the tables at MLflow's current revision
    return path


def sqlite_store(path: Path) -> str:
    """The tracking URI of an MLflow sqlite store at `path`: a copy of the template (same schema, no runs) when
    the file does not exist yet. The tracking tests (tests/test_tracking*.py) keep making new stores themselves."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_mlflow_template(), path)
    return f"sqlite:///{path}"


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    return tmp_path / "lake"


def folder_settings(folder: Path, *overrides: str) -> Settings:
    """Settings with the lake (`folder/lake`) and a new MLflow store in `folder`, local[2]; extra overrides as
    dotted pairs. For module fixtures that run a job once for several tests (make_settings is per test)."""
    lake = folder / "lake"
    base = [
        f"paths.lake={lake}",
        f"paths.checkpoints={lake}/_checkpoints",
        f"mlflow.tracking_uri={sqlite_store(folder / 'mlruns.db')}",
        f"mlflow.artifact_location={folder}/mlartifacts",
        "spark.master=local[2]",
        "spark.shuffle_partitions=1",
    ]
    return load_settings(overrides=[*base, *overrides], environ={})


@pytest.fixture
def make_settings(lake: Path, tmp_path: Path):
    """Settings with the lake and MLflow store in the test's tmp folder; extra overrides as dotted pairs."""
    assert lake == tmp_path / "lake"
    return lambda *overrides: folder_settings(tmp_path, *overrides)


@pytest.fixture
def settings(make_settings) -> Settings:
    return make_settings()


def job_args(settings: Settings, *pairs: str) -> list[str]:
    """A job's `--set` arguments for `settings`' lake, checkpoints and MLflow store on local[2], then `pairs`:
    end-to-end tests call a job's `main` with the test's own folders."""
    base = [f"paths.lake={settings.paths.lake}", f"paths.checkpoints={settings.paths.checkpoints}",
            f"mlflow.tracking_uri={settings.mlflow.tracking_uri}",
            f"mlflow.artifact_location={settings.mlflow.artifact_location}", "spark.master=local[2]",
            "spark.shuffle_partitions=1"]
    return [arg for pair in (*base, *pairs) for arg in ("--set", pair)]


@pytest.fixture(scope="session")
def spread_nli(tiny_models, tmp_path_factory) -> Path:
    """The tiny NLI model (same config, unusual label2id, tokenizer) re-initialised with larger weights.

    The stock tiny model gives every pair nearly 1/3 per label, so differences in order or padding hide
    under the probability tolerance (tests/tolerance.py); this one spreads probabilities over [0, 1] (used
    by the NLI invariance tests).
    """
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    source = tiny_models["tiny-nli"]
    config = AutoConfig.from_pretrained(source)
    config.initializer_range = 0.2
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config).eval()
    out = tmp_path_factory.mktemp("spread-nli")
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(source).save_pretrained(out)
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on 127.0.0.1 with a sqlite store; yields its URI, stopped by PID at the end. The store
    starts as a copy of the template (`sqlite_store`), so the server does not run the schema migrations first."""
    import subprocess
    import time
    import urllib.request

    folder = tmp_path_factory.mktemp("mlflow_server")
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "mlflow", "server",
            "--backend-store-uri", sqlite_store(folder / "mlflow.db"),
            "--artifacts-destination", str(folder / "artifacts"),
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        ],
        stdout=open(folder / "server.log", "w"),
        stderr=subprocess.STDOUT,
    )
    uri = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2)
            break
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError((folder / "server.log").read_text()[-2000:]) from None
            time.sleep(1)
    else:
        proc.kill()
        raise RuntimeError("mlflow server did not start in 180 s")
    yield uri
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


MIRROR_ENV = "RECEVAL_DATA_MIRROR"  # a local mirror of the datasets (CI sets it); absent: tests that need one skip


def require_datasets(*names: str) -> Path:
    """The data folder, once every named dataset is in it: taken from $RECEVAL_DATA_MIRROR when set, else skip."""
    from filelock import FileLock

    from jobs.infra import data
    from jobs.infra.config import PathSettings
    from jobs.infra.config_paths import resolve_path

    folder = resolve_path(PathSettings().data)
    catalogue = data.load_catalogue()
    missing = [n for n in names if not data.is_present(catalogue[n], folder)]
    if missing and os.environ.get(MIRROR_ENV):
        with FileLock(SHARED_LOCK):  # fetch skips what another test process put in place meanwhile
            data.fetch(missing, folder, mirror=Path(os.environ[MIRROR_ENV]), catalogue=catalogue)
    elif missing:
        pytest.skip(f"needs dataset {', '.join(missing)}: `make data` or set {MIRROR_ENV} to a mirror")
    return folder


def pytest_runtest_setup(item) -> None:
    """`@pytest.mark.dataset("bbh", ...)`: the test runs only where those datasets are (see require_datasets)."""
    names = [n for mark in item.iter_markers("dataset") for n in mark.args]
    if names:
        require_datasets(*names)


def pytest_collection_modifyitems(config, items) -> None:
    """A `full` test (a whole-dataset run) runs only when asked for by name in -m, never by a plain `pytest`.

    Cluster tests first: their file is the slow set's longest, and xdist (`--dist loadfile`) hands files out in
    this order, so started last it would run alone at the end of the set.
    """
    items.sort(key=lambda item: "cluster" not in item.keywords)
    if "full" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="full-dataset run: select it with -m full")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)
