"""Shared fixtures: one local Spark session with Delta, tiny models built once, per-test lake folders."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from jobs.config import PROJECT_ROOT, Settings, load_settings

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, Path]:
    """The tiny T5, GPT-2-style LM and NLI classifier under <project>/models (built once, kept)."""
    from jobs.tiny_models import build_all

    return build_all(PROJECT_ROOT / "models")


@pytest.fixture(scope="session")
def spark():
    from jobs.config import SparkSettings
    from jobs.session import build_session

    session = build_session(
        SparkSettings(master="local[2]", shuffle_partitions=2, app_name="receval-tests"),
        extra={"spark.driver.memory": "1g", "spark.sql.adaptive.enabled": "false"},
    )
    yield session
    session.stop()


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    return tmp_path / "lake"


@pytest.fixture
def make_settings(lake: Path, tmp_path: Path):
    """Settings with the lake and MLflow store in the test's tmp folder; extra overrides as dotted pairs."""

    def make(*overrides: str) -> Settings:
        base = [
            f"paths.lake={lake}",
            f"paths.checkpoints={lake}/_checkpoints",
            f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlruns.db",
            f"mlflow.artifact_location={tmp_path}/mlartifacts",
            "spark.master=local[2]",
            "spark.shuffle_partitions=2",
        ]
        return load_settings(overrides=[*base, *overrides], environ={})

    return make


@pytest.fixture
def settings(make_settings) -> Settings:
    return make_settings()


@pytest.fixture(scope="session")
def spread_nli(tiny_models, tmp_path_factory) -> Path:
    """The tiny NLI model (same config, unusual label2id, tokenizer) re-initialised with larger weights.

    The stock tiny model gives every pair nearly 1/3 per label, so differences in order or padding hide
    under 1e-5; this one spreads probabilities over [0, 1] (used by the NLI invariance tests).
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
    """A real `mlflow server` on 127.0.0.1 with a sqlite store; yields its URI, stopped by PID at the end."""
    import subprocess
    import time
    import urllib.request

    folder = tmp_path_factory.mktemp("mlflow_server")
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "mlflow", "server",
            "--backend-store-uri", f"sqlite:///{folder}/mlflow.db",
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


def pytest_collection_modifyitems(config, items) -> None:
    """A `full` test (a whole-dataset run) runs only when asked for by name in -m, never by a plain `pytest`."""
    if "full" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="full-dataset run: select it with -m full")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)
