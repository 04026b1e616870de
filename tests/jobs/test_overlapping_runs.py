"""Two nights on one lake, as real processes: the lake's claim (jobs.infra.claim) lets one write; the other exits
with the busy code (75) or waits and then finds nothing new; `maintain` started during a night exits busy; a
SIGKILLed night's claim is taken over by the next night. Every outcome is read back from the tables: counts
reconcile and no key is written twice.

The nights run `pipeline.main` with the fake stages (tests/jobs/pipeline_fakes.py run as a script): the claim, the
MLflow run and the exit code are the pipeline's own command line; only the models are stand-ins. Slow: each
process starts its own Spark (~20-30 s here).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import copy_sample, sqlite_store
from pipeline_fakes import Fakes
from pyspark.sql import functions as F
from test_pipeline import _new_chains_file

from jobs.infra import claim, tables
from jobs.infra.config_layers import load_settings
from jobs.infra.config_paths import PROJECT_ROOT
from jobs.receval import pipeline
from schemas import pipeline as P

# Slow: ~300 s on a quiet 2-core host (2026-12-07: the pair on a new lake 104 s with maintain, the pair on a lake
# with tables 105 s, the killed night and its successor 92 s); on a loaded host one pair took 207-929 s.
pytestmark = [pytest.mark.slow]

FAKE_NIGHT = Path(__file__).with_name("pipeline_fakes.py")
STAGES = "[ingest,steps,scores,aggregate,curate]"  # no report: it adds a minute and nothing to the claim


def _argv(lake: Path, lake_input: Path, store: Path, *pairs: str) -> list[str]:
    base = [f"paths.lake={lake}", f"ingest.input={lake_input}", f"mlflow.tracking_uri={sqlite_store(store)}",
            f"mlflow.artifact_location={store.parent}/mlartifacts", "spark.master=local[2]",
            "spark.shuffle_partitions=1", "pipeline.progress=plain", f"pipeline.stages={STAGES}",
            "maintain.every_nights=null", *pairs]
    return [f"--set={pair}" for pair in base]


def _start(args: list[str], log: Path, module: str | None = None) -> subprocess.Popen:
    """A night (or `python -m module`) in its own process group, its output in `log`; the checkout's code."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(PROJECT_ROOT)}
    command = [sys.executable, *(["-m", module] if module else [str(FAKE_NIGHT)]), *args]
    with log.open("w") as out:
        return subprocess.Popen(command, cwd=PROJECT_ROOT, stdout=out, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)


def _wait(proc: subprocess.Popen, timeout: float = 1800) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def _until(log: Path, text: str, proc: subprocess.Popen, timeout: float = 1500) -> None:
    deadline = time.time() + timeout
    while text not in log.read_text():
        assert proc.poll() is None, f"ended ({proc.returncode}) before {text!r}:\n{log.read_text()[-4000:]}"
        assert time.time() < deadline, f"no {text!r} in {timeout} s:\n{log.read_text()[-4000:]}"
        time.sleep(0.5)


def _assert_whole(spark, lake: Path, chains: int) -> None:
    """`chains` chains, each scored or given up exactly once under the one config hash, curated once; no key of
    any table written twice."""
    settings = load_settings(overrides=[f"paths.lake={lake}", f"pipeline.stages={STAGES}"], environ={})

    def read(name: str):
        return tables.read(spark, settings.table(name))

    keys = {"chains": ["chain_id"], "input_files": list(P.INPUT_FILES_KEYS),
            "steps": ["chain_id", "config_hash", "step_idx"], "step_scores": ["chain_id", "config_hash", "step_idx"]}
    for name in pipeline.ALL_TABLES:
        if name == "quarantine" or not tables.exists(spark, settings.table(name)):
            continue
        key = keys.get(name, ["chain_id", "config_hash"])
        twice = read(name).groupBy(*key).count().where(F.col("count") > 1).count()
        assert twice == 0, f"{name}: {twice} keys {key} written more than once"
    assert read("chains").count() == chains
    assert read("quarantine").groupBy("stage", "reason", "chain_id", "raw", "source").count().where(
        F.col("count") > 1).count() == 0
    hashes = [r[0] for r in read("chain_scores").select("config_hash").distinct().collect()]
    assert len(hashes) == 1
    unscored = read("unscored").count() if tables.exists(spark, settings.table("unscored")) else 0
    assert read("chain_scores").count() + unscored == chains
    assert read("curation").count() == read("chain_scores").count()
    rejected = read("rejected").count() if tables.exists(spark, settings.table("rejected")) else 0
    assert read("curated").count() + rejected == read("curation").count()


def _writers(spark, lake: Path, name: str) -> set[str]:
    """The run ids of every commit to a table (jobs.infra.maintain.RUN_METADATA)."""
    history = spark.sql(f"DESCRIBE HISTORY delta.`{lake / name}`").select("userMetadata").collect()
    return {r[0] for r in history if r[0]}


def _busy_line(output: str) -> str:
    lines = [line for line in output.splitlines() if " is busy: claimed by run " in line]
    assert len(lines) == 1, output[-4000:]
    return lines[0]


def _runs(store: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(sqlite_store(store))
    experiment = client.get_experiment_by_name("receval")
    return client.search_runs([experiment.experiment_id]) if experiment else []


@dataclass(frozen=True)
class Pair:
    root: Path
    input: Path
    lake: Path
    logs: tuple[Path, Path]
    stores: tuple[Path, Path]
    codes: tuple[int, int]
    maintain_code: int
    maintain_output: str
    seconds: float


@pytest.fixture(scope="module")
def pair_on_new_lake(tmp_path_factory) -> Pair:
    """Two nights started together on a new lake (on_busy=exit), each with its own MLflow store; `maintain` started
    as soon as the loser left, while the winner still writes."""
    root = tmp_path_factory.mktemp("pair-new")
    lake_input = copy_sample(root / "input")
    lake = root / "lake"
    stores = (root / "a" / "mlruns.db", root / "b" / "mlruns.db")
    logs = (root / "a.log", root / "b.log")
    started = time.monotonic()
    # One batch per stage: the claim is taken before the first and held to the end, whatever the batches.
    procs = [_start(_argv(lake, lake_input, store, "pipeline.batch_chains=24"), log)
             for store, log in zip(stores, logs, strict=True)]
    loser = None
    while loser is None:  # the loser leaves before its Spark starts: a few seconds
        loser = next((p for p in procs if p.poll() is not None), None)
        assert time.monotonic() - started < 300, [log.read_text()[-2000:] for log in logs]
        time.sleep(0.2)
    winner = procs[1 - procs.index(loser)]
    assert winner.poll() is None, "the winner ended before maintain could meet it"
    result = subprocess.run([sys.executable, "-m", "jobs.infra.maintain",
                             *_argv(lake, lake_input, root / "maintain" / "mlruns.db")],
                            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    maintain_still_met_night = winner.poll() is None
    codes = tuple(_wait(p) for p in procs)
    assert maintain_still_met_night
    return Pair(root, lake_input, lake, logs, stores, codes, result.returncode, result.stdout + result.stderr,
                time.monotonic() - started)


def test_two_nights_on_a_new_lake_one_scores_the_other_exits_busy(spark, pair_on_new_lake):
    pair = pair_on_new_lake
    print(f"\n[overlap] two nights on a new lake + maintain: {pair.seconds:.0f} s")
    assert sorted(pair.codes) == [0, claim.EXIT_BUSY], pair.codes
    won, lost = (0, 1) if pair.codes[0] == 0 else (1, 0)
    winner_claim = claim.read(pair.lake / claim.FOLDER, 0)
    assert claim.generations(pair.lake / claim.FOLDER) == [0] and winner_claim.released
    out = pair.logs[lost].read_text()
    line = _busy_line(out)
    assert f"lake {pair.lake} is busy: claimed by run {winner_claim.run_id} (pipeline) on host " in line
    assert "pipeline.on_busy=exit: nothing written (exit 75" in line
    assert "Traceback" not in out and "Exception" not in out
    # The loser's MLflow run is there, tagged as skipped, naming the winner.
    [skipped] = _runs(pair.stores[lost])
    assert skipped.data.tags["receval.skipped"] == "lake busy"
    assert skipped.data.tags["lake_claim.holder_run"] == winner_claim.run_id
    [night] = [r for r in _runs(pair.stores[won]) if r.data.tags.get("mlflow.runName") == "pipeline"]
    assert night.info.status == "FINISHED" and night.data.tags["lake_claim.generation"] == "0"
    # Only the winner wrote: every commit of every table carries its run id.
    for name in ("chains", "steps", "step_scores", "chain_scores", "curation"):
        assert _writers(spark, pair.lake, name) == {winner_claim.run_id}, name
    _assert_whole(spark, pair.lake, 24)


def test_maintain_during_a_night_exits_busy_and_the_night_is_unharmed(spark, pair_on_new_lake):
    pair = pair_on_new_lake
    assert pair.maintain_code == claim.EXIT_BUSY, pair.maintain_output[-4000:]
    winner_claim = claim.read(pair.lake / claim.FOLDER, 0)
    line = _busy_line(pair.maintain_output)
    assert line.startswith(f"maintain: lake {pair.lake} is busy: claimed by run {winner_claim.run_id} (pipeline)")
    assert "Traceback" not in pair.maintain_output
    [skipped] = _runs(pair.root / "maintain" / "mlruns.db")
    assert skipped.data.tags["mlflow.runName"] == "maintain_optimize"
    assert skipped.data.tags["receval.skipped"] == "lake busy"
    # maintain wrote nothing: no OPTIMIZE in any table's history.
    history = spark.sql(f"DESCRIBE HISTORY delta.`{pair.lake / 'chains'}`").select("operation").collect()
    assert "OPTIMIZE" not in {r[0] for r in history}


def test_two_nights_on_a_lake_with_tables_one_scores_the_other_waits_then_finds_nothing(
    spark, pair_on_new_lake, tmp_path
):
    """A lake with tables gets a new input file; two nights (on_busy=wait) start together: one ingests and scores
    its 12 chains, the other waits for the claim and then finds no new input and nothing to score."""
    lake = tmp_path / "lake"
    shutil.copytree(pair_on_new_lake.lake, lake)
    lake_input = tmp_path / "input"
    shutil.copytree(pair_on_new_lake.input, lake_input)
    _new_chains_file(lake_input, [f"night2-{i}" for i in range(12)])
    stores = (tmp_path / "a" / "mlruns.db", tmp_path / "b" / "mlruns.db")
    logs = (tmp_path / "a.log", tmp_path / "b.log")
    started = time.monotonic()
    procs = [_start(_argv(lake, lake_input, store, "pipeline.on_busy=wait", "pipeline.claim_heartbeat_s=2",
                          "pipeline.claim_ttl=30"), log) for store, log in zip(stores, logs, strict=True)]
    codes = [_wait(p) for p in procs]
    print(f"\n[overlap] two nights (wait) on a lake with tables: {time.monotonic() - started:.0f} s")
    assert codes == [0, 0], [log.read_text()[-3000:] for log in logs]
    outs = [log.read_text() for log in logs]
    waited = [i for i, out in enumerate(outs) if "[claim] lake busy: claimed by run " in out]
    assert len(waited) == 1, "exactly one night waited"
    waiter, scorer = waited[0], 1 - waited[0]
    first, second = claim.read(lake / claim.FOLDER, 1), claim.read(lake / claim.FOLDER, 2)
    assert f"lake busy: claimed by run {first.run_id} (pipeline)" in outs[waiter]
    assert "pipeline.on_busy=wait" in outs[waiter]
    assert f"run {first.run_id}" in outs[scorer] and f"run {second.run_id}" in outs[waiter]
    # The waiter found nothing new: ingest skipped, no chain for any stage, no table written.
    assert "ingest: no new or changed input files" in outs[waiter]
    for name in ("chains", "steps", "step_scores", "chain_scores", "curation", "input_files"):
        assert second.run_id not in _writers(spark, lake, name), name
        assert first.run_id in _writers(spark, lake, name), name
    for out in outs:
        assert "Traceback" not in out
    _assert_whole(spark, lake, 24 + 12)


def test_killed_nights_claim_is_taken_over_by_the_next_night(spark, tmp_path):
    """A night SIGKILLed (driver and JVM) after its first committed batch leaves its claim; the next night on the
    same host sees the holder's pid gone, takes over at once, says so, and finishes the lake."""
    lake_input = copy_sample(tmp_path / "input")
    lake = tmp_path / "lake"
    log = tmp_path / "killed.log"
    started = time.monotonic()
    # Two batches per stage: killed after the first, the lake holds part of the night.
    night = _start(_argv(lake, lake_input, tmp_path / "killed" / "mlruns.db", "pipeline.batch_chains=12"), log)
    try:
        _until(log, "[pipeline] steps: batch 1/2 committed", night)
    finally:
        os.killpg(night.pid, signal.SIGKILL)  # no cleanup of any kind: the claim stays as it was
        night.wait()
    killed = claim.latest(lake / claim.FOLDER)
    assert (killed.generation, killed.pid, killed.released) == (0, night.pid, False)
    assert 0 < tables.read(spark, str(lake / "contexts")).count() < 24

    out = io.StringIO()
    argv = _argv(lake, lake_input, tmp_path / "next" / "mlruns.db", "pipeline.batch_chains=12")
    with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out), Fakes().installed():
        summary = pipeline.main(argv)
    print(f"\n[overlap] killed night + the night that took over: {time.monotonic() - started:.0f} s")
    text = out.getvalue()
    reason = f"its process (pid {night.pid}) is gone on this host"
    assert (f"took over the lake's claim from run {killed.run_id} (pipeline) on host {socket.gethostname()}, "
            f"pid {night.pid}") in text and reason in text
    taker = claim.read(lake / claim.FOLDER, 1)
    assert taker.run_id == summary.run_id and taker.released and taker.took_over.endswith(reason)
    [run] = [r for r in _runs(tmp_path / "next" / "mlruns.db") if r.data.tags.get("mlflow.runName") == "pipeline"]
    assert run.data.tags["lake_claim.took_over"].endswith(reason)
    _assert_whole(spark, lake, 24)
    assert json.loads((lake / claim.FOLDER / f"{1:020d}.beat.json").read_text())["released"] is True
