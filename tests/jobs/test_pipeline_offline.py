"""Nightly pipeline with its real stages (spaCy steps, tiny NLI / T5 / GPT-2 models): end to end, killed driver.

Slow (minutes per run on 2 cores); one clean run of the sample lake is shared by the file's tests. Kept apart
from test_pipeline.py so pytest-xdist (`--dist loadfile`) runs these beside the fake-stage recovery cases.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import copy_sample, sqlite_store
from test_pipeline import _assert_lakes_equal

from jobs.infra import tables
from jobs.infra.config_layers import load_settings
from jobs.infra.config_paths import PROJECT_ROOT
from jobs.receval import night_summary, pipeline

pytestmark = pytest.mark.slow


def _real_argv(lake: Path, tmp_path: Path, lake_input: Path, *extra: str) -> list[str]:
    return [
        f"--set=paths.lake={lake}",
        f"--set=ingest.input={lake_input}",
        f"--set=mlflow.tracking_uri={sqlite_store(tmp_path / 'mlruns.db')}",
        f"--set=mlflow.artifact_location={tmp_path}/mlartifacts",
        "--set=spark.master=local[2]",
        "--set=spark.shuffle_partitions=1",
        "--set=models.profile=offline",
        # Two batches per stage: enough for a driver killed after the first to leave work undone.
        "--set=pipeline.batch_chains=12",
        "--set=pipeline.progress=plain",
        *extra,
    ]


@dataclass(frozen=True)
class OfflineRun:
    tmp: Path
    input: Path
    lake: Path
    summary: night_summary.Summary
    out: str


@pytest.fixture(scope="module")
def offline_run(spark, tiny_models, tmp_path_factory) -> OfflineRun:
    """`python -m jobs.receval.pipeline` (its main) once on the sample lake, offline profile; read-only."""
    tmp = tmp_path_factory.mktemp("offline")
    copy_sample(tmp / "input")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):  # the summary and the log lines
        summary = pipeline.main(_real_argv(tmp / "clean", tmp, tmp / "input"))
    return OfflineRun(tmp, tmp / "input", tmp / "clean", summary, out.getvalue())


def test_main_sample_lake_offline_profile_end_to_end(offline_run):
    summary = offline_run.summary
    assert summary.rows_after["chains"] == 24
    assert summary.rows_after["chain_scores"] + summary.rows_after["unscored"] == 24
    assert summary.rows_after["chain_scores"] > 0
    assert "Nightly pipeline summary" in offline_run.out and "MLflow: run " in offline_run.out
    assert summary.report_html and "<html" in summary.report_html


def test_scores_progress_counts_the_model_inputs_with_a_rate(offline_run):
    """The scores stage's line counts the NLI pairs and LM passes the models finished (issue 55: a night of a few
    long chains showed 0 chains done for minutes), each with a rate."""
    line = [x for x in offline_run.out.splitlines() if "[pipeline scores] 24/24 chains (100%)" in x][-1]  # closing
    for what in ("NLI pairs", "LM passes"):
        found = re.search(rf"; {what} ([\d,]+) \(([\d.e+-]+)/s\)", line)
        assert found and int(found[1].replace(",", "")) > 24 and float(found[2]) > 0, line


# Manual: 236-304 s of the slow set's CI time. What it combines is checked in CI by three tests: a SIGKILLed
# night (driver and JVM) leaves a lake the next night finishes whole (test_overlapping_runs.py::
# test_killed_nights_claim_is_taken_over_by_the_next_night), a night that dies mid-scoring and is rerun equals a
# clean run (test_pipeline.py::test_run_raising_mid_scoring_then_rerun_equals_clean_run), and the real models'
# scores do not depend on the batches a night cut them into (test_api_score_chains_equals_the_pipelines_tables
# below: two batches against one) nor on a lost executor (test_cluster.py's worker kill).
@pytest.mark.manual
def test_main_killed_driver_then_rerun_equals_clean_run(spark, offline_run, tmp_path):
    killed_lake = tmp_path / "killed"
    argv = _real_argv(killed_lake, tmp_path, offline_run.input)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "jobs.receval.pipeline", *argv], cwd=PROJECT_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    marker = "[pipeline] scores: batch 1/"
    lines, deadline = [], time.time() + 600
    try:
        for line in proc.stdout:
            lines.append(line)
            if marker in line and "committed" in line:
                break
            assert time.time() < deadline, "".join(lines)
        else:
            pytest.fail("the pipeline ended before the marker:\n" + "".join(lines))
    finally:
        # The driver and the JVM it started (same session group) die without any cleanup.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    scored = tables.read(spark, str(killed_lake / "step_scores")).select("chain_id").distinct().count()
    assert 0 < scored < 24
    summary = pipeline.main(argv)
    assert summary.rows_after["chain_scores"] > 0
    _assert_lakes_equal(spark, load_settings(overrides=[f"paths.lake={killed_lake}"], environ={}),
                        load_settings(overrides=[f"paths.lake={offline_run.lake}"], environ={}))


def test_api_score_chains_equals_the_pipelines_tables(spark, offline_run, tmp_path):
    """jobs.receval.api.score_chains on the sample lake's chains, read as a notebook reads them (spark.read.json):
    the step and chain scores the pipeline wrote, frame for frame (floats within fp32 noise: the pipeline scored
    in two batches, the API in one), with nothing written."""
    from cluster import STEP_SCORE_KEYS
    from pyspark.testing import assertDataFrameEqual
    from tolerance import assert_scores_close, scores_tol

    from jobs.receval.api import score_chains

    chains = spark.read.json(str(offline_run.input / "gsm8k_sample.jsonl"))
    lake = tmp_path / "lake"
    with score_chains(chains, [f"paths.lake={lake}", "models.profile=offline"]) as scores:
        assert scores.config_hash == offline_run.summary.config_hash
        want_steps = tables.read(spark, str(offline_run.lake / "step_scores")).drop("scored_at")
        want_chains = tables.read(spark, str(offline_run.lake / "chain_scores")).drop("scored_at")
        assert want_chains.count() == 24
        assert_scores_close(scores.step_scores.drop("scored_at"), want_steps, keys=STEP_SCORE_KEYS)
        assertDataFrameEqual(scores.chain_scores.drop("scored_at"), want_chains, rtol=0.0,
                             atol=scores_tol(want_steps))
        # The same chains: ids and content hashes (the `source` column names the frame, not the file).
        assertDataFrameEqual(scores.chains.select("chain_id", "content_hash"),
                             tables.read(spark, str(offline_run.lake / "chains")).select("chain_id", "content_hash"))
    assert not lake.exists()
