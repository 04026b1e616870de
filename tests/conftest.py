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
