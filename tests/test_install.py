"""Acceptance (issue 46): the wheel installed with its dependencies into a fresh virtual environment runs the
nightly pipeline from an empty folder, on the sample lake it ships, to the summary `make run` prints.

The fresh environment gets its dependencies the way a cluster image or a cached install provides them, without
downloading ~7.6 GB again (torch with its CUDA libraries is most of this project's .venv): it is made without pip
or setuptools, and a .pth file layers this interpreter's site-packages under it; `pip install --no-index` of the
wheel then resolves every requirement of the wheel's metadata against what is there (it fails on a missing or
mismatched dependency) and `pip check` agrees. The wheel itself, its console script and its package data are
installed for real, and the code runs from the fresh environment's site-packages, never from the checkout.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from cluster import assert_lakes_equal
from conftest import sqlite_store
from test_package import build_wheel

from jobs.infra.config_paths import PROJECT_ROOT
from jobs.infra.stage import declared

# Slow: ~220 s on a quiet 2-core host (2026-12-07: the fresh venv 4 s, `receval --help` 8 s, the installed night
# and the in-process reference night 208 s).
pytestmark = [pytest.mark.slow]


def summary_blocks(out: str) -> tuple[list[str], list[str]]:
    """The deterministic parts of a pipeline summary: the tables' rows and the scores by label (the stages'
    seconds are not)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "Nightly pipeline summary" in line)
    tables = [line for line in lines[start:start + 20] if line.startswith("│")]
    first = next(i for i, line in enumerate(lines) if line.strip() == "Scores by label")  # a centred title
    labels = []
    for line in lines[first + 1:]:
        if line.startswith(("pass rate", "slowest")):
            break
        labels.append(line)
    return tables, labels


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """A fresh venv with the wheel pip-installed; returns its bin folder."""
    root = tmp_path_factory.mktemp("install")
    wheel = build_wheel(root / "wheel")
    venv = root / "venv"
    base = Path(sys.base_prefix) / "bin" / "python3"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "_receval_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_FIND_LINKS")}
    installed = subprocess.run([str(python), "-m", "pip", "install", "--no-index", str(wheel)], env=env,
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    assert "Successfully installed receval-spark-0.1.0" in installed.stdout
    check = subprocess.run([str(python), "-m", "pip", "check"], env=env, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    return venv / "bin"


def run(bin_dir: Path, cwd: Path, *args: str, timeout: int = 3000) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECEVAL", "PYTHONPATH", "MLFLOW_TRACKING"))}
    # No network here: the Delta jars from this machine's cache (`receval setup` then finds them, no download).
    env["RECEVAL__SPARK__JARS_DIR"] = str(PROJECT_ROOT / ".jars")
    return subprocess.run([str(bin_dir / "receval"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_receval_help_lists_every_stage(fresh, tmp_path):
    out = run(fresh, tmp_path, "--help")
    assert out.returncode == 0, out.stderr[-3000:]
    listed = {line.split()[0] for line in out.stdout.splitlines() if line.startswith("  ")}
    assert {name for name, stage in declared().items() if stage.body is not None} <= listed
    where = subprocess.run([str(fresh / "python"), "-c", "import jobs; print(jobs.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(fresh.parent / "lib"))  # the installed copy, not the checkout


def test_receval_pipeline_from_an_empty_folder_prints_the_make_run_summary(fresh, spark, tmp_path):
    from jobs.receval import pipeline

    empty = tmp_path / "empty"
    empty.mkdir()
    setup = run(fresh, empty, "setup")
    assert setup.returncode == 0, setup.stdout[-3000:] + setup.stderr[-3000:]
    assert "Delta jars: " in setup.stdout and "already in" in setup.stdout
    assert sorted(p.name for p in (empty / "models").iterdir()) == ["MANIFEST.json", "tiny-gpt2", "tiny-nli",
                                                                    "tiny-t5"]
    night = run(fresh, empty, "pipeline", "--set", "pipeline.progress=plain")
    assert night.returncode == 0, night.stdout[-5000:] + night.stderr[-5000:]
    # Everything it wrote is under the folder it ran in: the lake, the MLflow store and artifacts.
    assert {"lake", "mlruns.db", "mlartifacts", "models"} <= {p.name for p in empty.iterdir()}
    assert f"Delta tables: {empty / 'lake'}" in night.stdout
    assert "MLflow: run " in night.stdout and f"sqlite:///{empty / 'mlruns.db'}" in night.stdout

    # `make run` (python -m jobs.receval.pipeline in the checkout) on the same sample lake, its own lake and store;
    # in one shuffle partition, as the other tests' sessions run (a third faster on 2 cores): a table's rows do not
    # depend on it (test_cluster: another master, cores and partitioning, the same tables).
    reference = tmp_path / "reference"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        pipeline.main(["--set", f"paths.lake={reference / 'lake'}", "--set",
                       f"paths.checkpoints={reference / 'lake' / '_checkpoints'}", "--set",
                       f"mlflow.tracking_uri={sqlite_store(reference / 'mlruns.db')}", "--set",
                       f"mlflow.artifact_location={reference / 'mlartifacts'}", "--set", "models.profile=offline",
                       "--set", "pipeline.progress=plain", "--set", "spark.shuffle_partitions=1",
                       # Neither the report nor MLflow writes what the two summaries' compared blocks show.
                       "--set", "pipeline.stages=[ingest,steps,scores,aggregate,curate]", "--set", "mlflow.enabled=false"])
    want_tables, want_labels = summary_blocks(out.getvalue())
    got_tables, got_labels = summary_blocks(night.stdout)
    assert got_tables == want_tables
    assert got_labels == want_labels
    assert any(re.match(r"│ chains\s+│\s+48 │", line) for line in got_tables)
    assert len([line for line in got_labels if line.startswith("│")]) == 8  # datasets x labels, as in the README
    # The same input files, read from the installed package's folder and from the checkout's.
    assert_lakes_equal(spark, reference / "lake", empty / "lake", by_file_name=True)
