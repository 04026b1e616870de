"""The lake's claim (jobs.infra.claim) without a second process: taking, releasing, a busy lake, expiry by a dead
pid or a stale heartbeat, waiting, --force and a lost claim, and Stage.main's busy exit. The same claim between
real processes is tests/jobs/test_overlapping_runs.py (slow) and tests/test_cluster.py (another host)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from conftest import sqlite_store
from delta.exceptions import ConcurrentAppendException

from jobs.infra import claim, tables
from jobs.infra.config import ConfigError
from jobs.infra.config_layers import load_settings
from jobs.infra.logs import setup_logging
from jobs.infra.stage import Stage

HOST = socket.gethostname()


def _settings(tmp_path: Path, *pairs: str):
    # A TTL no loaded machine outlasts between a test's lines, unless the test sets its own.
    return load_settings(overrides=[f"paths.lake={tmp_path / 'lake'}", "pipeline.claim_heartbeat_s=0.2",
                                    "pipeline.claim_ttl=3600", *pairs], environ={})


def _plant(tmp_path: Path, generation: int = 0, *, host: str = "other-host", pid: int | None = None,
           beat_age: float | None = 0.0, started_age: float = 60.0, released: bool = False,
           pid_started: int | None = None) -> dict:
    """A claim file as another run would have written it (generation, holder, heartbeat age in seconds)."""
    where = tmp_path / "lake" / claim.FOLDER
    where.mkdir(parents=True, exist_ok=True)
    now = time.time()
    record = {"run_id": f"run-{generation}", "job": "pipeline", "host": host, "pid": os.getppid() if pid is None
              else pid, "user": "someone", "started": now - started_age, "pid_started": pid_started,
              "forced": False, "took_over": None}
    (where / f"{generation:020d}.json").write_text(json.dumps(record))
    if beat_age is not None or released:
        (where / f"{generation:020d}.beat.json").write_text(
            json.dumps({"at": now - (beat_age or 0.0), "released": released}))
    return record


@pytest.fixture
def logs(capsys):
    """The jobs' log lines as a job prints them (jobs.infra.logs: to the standard error, not through the root
    logger, so caplog would miss them once any job of this test process set logging up): `logs()` reads them."""
    setup_logging("INFO")
    return lambda: capsys.readouterr().err


def _dead_pid() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # above pid_max: no process can have it


def test_take_on_a_new_lake_writes_generation_zero_and_release_marks_it(tmp_path):
    settings = _settings(tmp_path)
    held = claim.take(settings, "pipeline", "run-a")
    try:
        where = tmp_path / "lake" / claim.FOLDER
        found = claim.latest(where)
        assert (found.generation, found.run_id, found.job, found.host, found.pid) == (0, "run-a", "pipeline", HOST,
                                                                                     os.getpid())
        assert found.heartbeat is not None and not found.released and found.took_over is None
        first = found.heartbeat
        deadline = time.monotonic() + 30  # beats every 0.2 s; a loaded machine may delay the thread
        while claim.latest(where).heartbeat == first and time.monotonic() < deadline:
            time.sleep(0.1)
        assert claim.latest(where).heartbeat > first
    finally:
        claim.release(held)
    assert claim.latest(where).released
    again = claim.take(settings, "maintain", "run-b")
    claim.release(again)
    assert [g for g in claim.generations(where)] == [0, 1]
    assert claim.read(where, 1).took_over is None  # a released claim is taken, not taken over


def test_live_claim_on_another_host_is_busy_and_nothing_is_created(tmp_path):
    settings = _settings(tmp_path)
    # Its pid means nothing here (another host): only its heartbeat says whether it lives.
    _plant(tmp_path, 3, pid=_dead_pid())
    with pytest.raises(claim.LakeBusy) as busy:
        claim.take(settings, "pipeline", "run-b")
    message = str(busy.value)
    assert "\n" not in message
    assert "claimed by run run-3 (pipeline) on host other-host" in message
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime(time.time() - 60))
    assert f"started {started}" in message and "pipeline.on_busy=exit" in message and "exit 75" in message
    assert claim.generations(tmp_path / "lake" / claim.FOLDER) == [3]


def test_dead_pid_on_this_host_is_taken_over_at_once(tmp_path, logs):
    settings = _settings(tmp_path, "pipeline.claim_ttl=3600", "pipeline.claim_heartbeat_s=60")
    dead = _dead_pid()
    _plant(tmp_path, 0, host=HOST, pid=dead)  # heartbeat fresh: only the pid shows it died
    held = claim.take(settings, "pipeline", "run-b")
    claim.release(held)
    assert held.holder.generation == 1
    assert held.holder.took_over.endswith(f"its process (pid {dead}) is gone on this host")
    assert f"took over the lake's claim from run run-0 (pipeline) on host {HOST}" in logs()


def test_reused_pid_on_this_host_is_not_the_holder(tmp_path):
    settings = _settings(tmp_path, "pipeline.claim_ttl=3600", "pipeline.claim_heartbeat_s=60")
    parent = os.getppid()  # alive, but started at another tick than the claim says
    _plant(tmp_path, 0, host=HOST, pid=parent, pid_started=claim._proc_start(parent) + 1)
    held = claim.take(settings, "pipeline", "run-b")
    claim.release(held)
    assert held.holder.generation == 1 and "is gone on this host" in held.holder.took_over


def test_live_pid_on_this_host_is_busy(tmp_path):
    settings = _settings(tmp_path)
    parent = os.getppid()
    _plant(tmp_path, 0, host=HOST, pid=parent, pid_started=claim._proc_start(parent))
    with pytest.raises(claim.LakeBusy):
        claim.take(settings, "pipeline", "run-b")


def test_stale_heartbeat_is_taken_over_after_the_ttl(tmp_path):
    settings = _settings(tmp_path, "pipeline.claim_ttl=30", "pipeline.claim_heartbeat_s=5")
    _plant(tmp_path, 0, beat_age=20)
    with pytest.raises(claim.LakeBusy):
        claim.take(settings, "pipeline", "run-b")
    _plant(tmp_path, 0, beat_age=31)
    held = claim.take(settings, "pipeline", "run-b")
    claim.release(held)
    assert held.holder.took_over.endswith("its last heartbeat was 31 s ago (pipeline.claim_ttl=30 s)")


def test_claim_without_a_heartbeat_ages_from_its_start(tmp_path):
    settings = _settings(tmp_path, "pipeline.claim_ttl=30", "pipeline.claim_heartbeat_s=5")
    _plant(tmp_path, 0, beat_age=None, started_age=40)
    held = claim.take(settings, "pipeline", "run-b")
    claim.release(held)
    assert "its last heartbeat was 40 s ago" in held.holder.took_over


def test_wait_takes_the_claim_once_released_and_says_who_held_it(tmp_path, logs):
    settings = _settings(tmp_path, "pipeline.on_busy=wait", "pipeline.claim_ttl=3600", "pipeline.claim_heartbeat_s=60")
    _plant(tmp_path, 0)
    releaser = threading.Timer(1.0, lambda: _plant(tmp_path, 0, released=True))
    releaser.start()
    started = time.monotonic()
    held = claim.take(settings, "pipeline", "run-b", poll_s=0.1)
    claim.release(held)
    assert 0.9 < time.monotonic() - started < 10
    assert held.holder.generation == 1
    printed = logs()
    assert "lake busy: claimed by run run-0 (pipeline) on host other-host" in printed
    assert "pipeline.on_busy=wait" in printed


def test_wait_gives_up_after_the_timeout(tmp_path):
    settings = _settings(tmp_path, "pipeline.on_busy=wait", "pipeline.wait_timeout_s=0.5", "pipeline.claim_ttl=3600",
                         "pipeline.claim_heartbeat_s=60")
    _plant(tmp_path, 0)
    with pytest.raises(claim.LakeBusy) as busy:
        claim.take(settings, "pipeline", "run-b", poll_s=0.1)
    assert "still held after waiting" in str(busy.value) and "pipeline.wait_timeout_s" in str(busy.value)


def test_force_takes_a_live_claim_and_its_holder_loses_it(tmp_path, logs):
    settings = _settings(tmp_path, "pipeline.claim_ttl=3600", "pipeline.claim_heartbeat_s=60")
    mine = claim.take(settings, "pipeline", "run-a")
    try:
        # Another host forces it: a generation after ours appears.
        where = tmp_path / "lake" / claim.FOLDER
        other = load_settings(overrides=[f"paths.lake={tmp_path / 'lake'}", "pipeline.claim_host=driver-b"],
                              environ={})
        claim._held.pop(where)  # as if in another process: this one's registry would lend it its own claim
        forced = claim.take(other, "maintain", "run-b", force=True)
        claim._held[where] = mine
        assert forced.holder.forced and forced.holder.took_over.startswith("--force from run run-a")
        assert "--force: took the lake's claim from run run-a" in logs()
        claim.check_held(settings)  # not noticed before the next heartbeat
        mine.beat()
        with pytest.raises(claim.ClaimLost, match="taken over by run run-b .maintain. on host driver-b"):
            claim.check_held(settings)
        forced._stop.set()
    finally:
        claim.release(mine)
    assert not claim.read(where, 0).released  # a lost claim is not marked as released by its old holder


def test_nested_take_in_one_process_shares_the_claim(tmp_path):
    settings = _settings(tmp_path)
    outer = claim.take(settings, "pipeline", "run-a")
    inner = claim.take(settings, "maintain", "run-b")
    assert inner is outer
    claim.release(inner)
    assert not claim.latest(tmp_path / "lake" / claim.FOLDER).released
    claim.release(outer)
    assert claim.latest(tmp_path / "lake" / claim.FOLDER).released


def test_link_new_has_exactly_one_winner_among_racing_writers(tmp_path):
    target = tmp_path / "00000000000000000000.json"
    barrier = threading.Barrier(16)
    wins: list[int] = []

    def race(i: int) -> None:
        barrier.wait()
        if claim._link_new(target, json.dumps({"writer": i})):
            wins.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert json.loads(target.read_text()) == {"writer": wins[0]}
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no temp file left behind


def test_ttl_must_span_two_heartbeats():
    with pytest.raises(ConfigError, match=r"pipeline: claim_ttl \(50.0 s\) must be at least two heartbeats"):
        load_settings(overrides=["pipeline.claim_ttl=50", "pipeline.claim_heartbeat_s=30"], environ={})


def test_describe_names_the_holder_and_whether_it_lives(tmp_path):
    settings = _settings(tmp_path, "pipeline.claim_ttl=30", "pipeline.claim_heartbeat_s=5")
    assert claim.describe(settings).endswith("never claimed")
    _plant(tmp_path, 2)
    assert ": held; generation 2: run run-2 (pipeline) on host other-host" in claim.describe(settings)
    _plant(tmp_path, 2, beat_age=45)
    assert "free: its last heartbeat was 45 s ago (pipeline.claim_ttl=30 s)" in claim.describe(settings)


# -- Stage.main: the one place every job that writes the lake's tables takes the claim ------------------------
def _stage_args(tmp_path: Path, *pairs: str) -> list[str]:
    base = [f"paths.lake={tmp_path / 'lake'}", f"mlflow.tracking_uri={sqlite_store(tmp_path / 'mlruns.db')}",
            f"mlflow.artifact_location={tmp_path}/mlartifacts", *pairs]
    return [arg for pair in base for arg in ("--set", pair)]


def test_stage_main_busy_lake_exits_75_with_one_line_and_a_skipped_run(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    ran = []
    stage = Stage("writer", "writes chains", lambda job: ran.append(job), writes=("chains",), uses_spark=False)
    _plant(tmp_path, 0)
    with pytest.raises(SystemExit) as ended:
        stage.main(_stage_args(tmp_path))
    assert ended.value.code == claim.EXIT_BUSY and ran == []
    err = capsys.readouterr().err
    # (MLflow's own log lines may come before it when it makes the store.)
    [line] = [line for line in err.splitlines() if not line.startswith("20")]
    assert line.startswith(f"writer: lake {tmp_path / 'lake'} is busy: claimed by run run-0") and "Traceback" not in err
    client = MlflowClient(sqlite_store(tmp_path / "mlruns.db"))
    [run] = client.search_runs([client.get_experiment_by_name("receval").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["receval.skipped"] == "lake busy"
    assert run.data.tags["lake_claim.holder_run"] == "run-0" and "is busy" in run.data.tags["receval.status_note"]
    assert claim.generations(tmp_path / "lake" / claim.FOLDER) == [0]


def test_stage_main_holds_the_claim_under_its_run_id_and_releases_it(tmp_path):
    seen = {}

    def body(job):
        seen["holder"] = claim.latest(tmp_path / "lake" / claim.FOLDER)
        seen["run"] = job.tracked.local_id

    Stage("writer", "writes chains", body, writes=("chains",), uses_spark=False).main(_stage_args(tmp_path))
    assert seen["holder"].run_id == seen["run"] and not seen["holder"].released
    assert claim.latest(tmp_path / "lake" / claim.FOLDER).released


def test_stage_main_without_table_writes_or_in_a_dry_run_takes_no_claim(tmp_path):
    Stage("reader", "reads", lambda job: None, reads=("chains",), uses_spark=False).main(_stage_args(tmp_path))
    _plant(tmp_path, 0)  # a live claim: a reader neither waits nor exits for it
    Stage("reader", "reads", lambda job: None, reads=("chains",), uses_spark=False).main(_stage_args(tmp_path))
    assert claim.generations(tmp_path / "lake" / claim.FOLDER) == [0]


# -- the Delta side: a commit lost to a concurrent writer ------------------------------------------------------
def test_committed_retries_a_conflict_then_returns():
    calls = []

    def write() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise ConcurrentAppendException("a concurrent MERGE added data")
        return 7

    assert tables.committed("lake/chains", write, backoff_s=0.0) == 7 and len(calls) == 3


def test_committed_gives_up_with_a_clear_message():
    def write() -> int:
        raise ConcurrentAppendException("a concurrent MERGE added data")

    with pytest.raises(tables.CommitConflict, match=r"lake/chains: 3 commits in a row lost to concurrent writers "
                       r"\(ConcurrentAppendException\); another run is writing this lake"):
        tables.committed("lake/chains", write, attempts=3, backoff_s=0.0)


def test_committed_does_not_retry_other_errors():
    calls = []

    def write() -> int:
        calls.append(1)
        raise ValueError("a bug, not a conflict")

    with pytest.raises(ValueError):
        tables.committed("lake/chains", write, backoff_s=0.0)
    assert len(calls) == 1
