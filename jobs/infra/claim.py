"""The lake's claim: one writing run at a time (a night, `maintain`, any stage that writes the lake's tables).

A run that writes tables takes the claim before it starts Spark, keeps it alive with a heartbeat thread on the
driver and gives it back when it ends. A second run finds it and, by `on_busy` (the `pipeline` section): `exit`
(default) leaves at once with a one-line message naming the holder and exit code EXIT_BUSY (75, sysexits'
EX_TEMPFAIL: "try again later"), having written nothing; `wait` polls until the claim is free, printing who
holds it, and leaves the same way after `wait_timeout_s`. A claim whose holder died expires: on the same host
a dead pid is taken over at once; elsewhere (another driver host, whose pids this host cannot see) once its
last heartbeat is older than `claim_ttl`. `--force` takes it from a live holder (an operator's choice, logged).
`receval claim` (`python -m jobs.infra.claim`) shows who holds it; `receval claim release --force` takes a live
holder's claim the same way and gives it back at once (`give_back`).

## Where the claim lives, and why this way

It must hold between drivers on different hosts, so it lives in the lake itself (`<lake>/_claims/`), never in a
local lock file or a flock (flock is per host, and on NFS only as good as its lock manager). What makes it safe
is one primitive: *create a file under a name only if the name is free, such that of two writers exactly one
succeeds*. Delta's own commits rest on the same primitive (its LogStore's put-if-absent for
`_delta_log/<version>.json`), and a Delta `_claims` table was considered and not taken:

- On a `file:` path (a local disk or an NFS mount, what `paths.lake` is here: Settings.table joins it as a
  POSIX path) Delta's LocalLogStore checks that the commit file is absent and then renames a temp file onto it.
  rename(2) replaces an existing file, and the check-then-rename is serialised only inside one JVM (Delta
  documents that LogStore as not meant for concurrent writers in several processes). Two drivers can both
  "win" version N; a claim table would inherit that window.
- A heartbeat as a Delta commit is a Spark job every interval and a log that grows by thousands of versions a
  night; a stale claim would need a reader with Spark to see it. Here a busy run leaves before its JVM starts.

So the claim is a Delta-log-style folder of numbered files written with a primitive that *is* atomic there:
`link(2)` of a fully written temp file onto `<generation>.json`. link never replaces an existing name (EEXIST),
is atomic on local file systems and is the classic lock on NFS (where O_EXCL create was unreliable before
NFSv3): the server decides. A reply lost and retransmitted can report EEXIST for a link that was made, so on
EEXIST the temp file's link count says whether this writer's link is the one that exists. Readers see a claim
file whole or not at all (it is complete before it gets its name). On an object store the same protocol needs
a conditional put (S3 `If-None-Match: *`, GCS `ifGenerationMatch=0`, ADLS `If-None-Match: *`), exactly what
Delta's multi-writer LogStores there need; a lake on an object store is not supported by this project's paths.

## The protocol

- Generation n is `_claims/<n:020d>.json` (who: run id, job, host, pid and its start time, user; when). It is
  never rewritten or removed by anyone else, so generations only grow.
- Its holder alone rewrites `_claims/<n:020d>.beat.json` (temp + rename: readers see the old or the new beat)
  every `claim_heartbeat_s` with the time, and with `released: true` when it ends.
- Taking: read the newest generation n; if there is none, or it is released, or its holder is dead (same host
  and its pid gone, or a pid reused by another process) or stale (last heartbeat older than `claim_ttl`), or
  `--force`: create generation n+1. Of two runs doing this at once one creates it and the other, its link
  refused, reads again and finds the winner's live claim. Staleness compares the holder's clock with the
  reader's: hosts must agree to well within `claim_ttl` (NTP), which is why the TTL is several heartbeats.
- Losing: a holder whose heartbeat finds a newer generation than its own (taken over after a pause longer than
  the TTL, or by --force) has lost the claim: it logs an error and `check_held` fails the run before its next
  stage or batch writes.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import logging
import os
import re
import socket
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from jobs.infra.args import add_settings_arguments
from jobs.infra.config import Section, Settings
from jobs.infra.config_layers import load_settings
from jobs.infra.config_paths import resolve_path
from jobs.infra.logs import setup_logging

log = logging.getLogger(__spec__.name)

EXIT_BUSY = 75  # sysexits.h EX_TEMPFAIL: a cron wrapper tests for it (docs/OPERATIONS.md, Overlapping runs)
FOLDER = "_claims"  # under the lake, beside the tables (no table is named with a leading underscore)
_CLAIM = re.compile(r"^(\d{20})\.json$")
KEEP_GENERATIONS = 20  # older generations are removed by the run that takes the claim (history for operators)


class ClaimSettings(Section):
    """The claim's settings. The room whose section holds the nightly job declares them by inheriting this class
    (`pipeline`: jobs/receval/settings.py); `claim_settings` finds that section, so the platform names no room."""

    # A run that finds the lake claimed: `exit` at once (exit code 75, nothing written) or `wait` for it.
    on_busy: Literal["exit", "wait"] = "exit"
    # on_busy=wait: leave (exit code 75) when the claim is still held after this long.
    wait_timeout_s: float = Field(7200.0, gt=0)
    # A claim whose last heartbeat is older than this is dead (its driver killed, its host gone) and is taken
    # over. Several heartbeats, and well above the clock skew between driver hosts.
    claim_ttl: float = Field(120.0, gt=0)
    # The holder's driver rewrites its heartbeat this often.
    claim_heartbeat_s: float = Field(30.0, gt=0)
    # The host name a claim records and compares (None: this machine's). Two drivers must not share one name:
    # a dead pid is taken over at once only on the claim's own host.
    claim_host: str | None = None

    @model_validator(mode="after")
    def _ttl_spans_heartbeats(self) -> ClaimSettings:
        if self.claim_ttl < 2 * self.claim_heartbeat_s:
            raise ValueError(f"claim_ttl ({self.claim_ttl} s) must be at least two heartbeats "
                             f"(claim_heartbeat_s={self.claim_heartbeat_s} s): one late beat would expire a live claim")
        return self


def claim_settings(settings: Settings) -> tuple[str, ClaimSettings]:
    """(section name, settings) of the claim: the one section that is a ClaimSettings, else the defaults."""
    found = [(name, value) for name in type(settings).model_fields
             if isinstance(value := getattr(settings, name), ClaimSettings)]
    if len(found) > 1:
        raise TypeError(f"several sections declare the lake claim's settings: {[n for n, _ in found]}")
    return found[0] if found else ("claim", ClaimSettings())


def folder(settings: Settings) -> Path:
    return resolve_path(settings.paths.lake) / FOLDER


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min" if seconds < 7200 else f"{seconds // 3600} h"


def _proc_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22; None off Linux): with the
    pid it names one process, so a pid the kernel reused is not mistaken for the holder."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _proc_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def pid_alive(pid: int, started: int | None) -> bool:
    """Is process `pid` (started at `started` ticks, when known) still running on this host?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    if _proc_zombie(pid):  # killed, not yet reaped by its parent: it will never write again
        return False
    now = _proc_start(pid)
    return not (started is not None and now is not None and now != started)


@dataclass(frozen=True)
class Holder:
    """One generation of the claim as a reader finds it."""

    generation: int
    run_id: str
    job: str
    host: str
    pid: int
    user: str
    started: float
    pid_started: int | None = None
    heartbeat: float | None = None  # the holder's last beat (None: none yet; its start counts)
    released: bool = False
    forced: bool = False
    took_over: str | None = None  # how it got the claim from the generation before (a dead or stale holder)

    @property
    def last_beat(self) -> float:
        return self.heartbeat if self.heartbeat is not None else self.started

    def describe(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        return (f"run {self.run_id} ({self.job}) on host {self.host}, pid {self.pid}, user {self.user}, "
                f"started {_when(self.started)}, last heartbeat {_ago(now - self.last_beat)} ago")


def _claim_file(where: Path, generation: int) -> Path:
    return where / f"{generation:020d}.json"


def _beat_file(where: Path, generation: int) -> Path:
    return where / f"{generation:020d}.beat.json"


def generations(where: Path) -> list[int]:
    try:
        names = os.listdir(where)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for name in names if (m := _CLAIM.match(name)))


def read(where: Path, generation: int) -> Holder:
    record = json.loads(_claim_file(where, generation).read_text())
    beat: dict[str, Any] = {}
    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
        beat = json.loads(_beat_file(where, generation).read_text())
    return Holder(generation=generation, heartbeat=beat.get("at"), released=bool(beat.get("released")),
                  **{k: record.get(k) for k in ("run_id", "job", "host", "pid", "user", "started", "pid_started",
                                                "forced", "took_over")})


def latest(where: Path) -> Holder | None:
    found = generations(where)
    return read(where, found[-1]) if found else None


def expired(holder: Holder, host: str, ttl: float, now: float, ttl_name: str = "claim_ttl") -> str | None:
    """Why `holder`'s claim may be taken (released, its process gone, its heartbeat stale), or None: it is live."""
    if holder.released:
        return "released"
    if holder.host == host and not pid_alive(holder.pid, holder.pid_started):
        return f"its process (pid {holder.pid}) is gone on this host"
    age = now - holder.last_beat
    if age > ttl:
        return f"its last heartbeat was {age:.0f} s ago ({ttl_name}={ttl:g} s)"
    return None


def _link_new(target: Path, text: str) -> bool:
    """Create `target` with `text` if no file has its name; True when this call made it (see the docstring)."""
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(text)
    try:
        os.link(tmp, target)
        return True
    except FileExistsError:
        # NFS: a retransmitted link whose first reply was lost answers EEXIST although it made the link.
        return os.stat(tmp).st_nlink == 2
    finally:
        tmp.unlink()


def _write_replace(target: Path, text: str) -> None:
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(text)
    os.replace(tmp, target)


class LakeBusy(Exception):
    """The lake is claimed by a live run; the message is the one line an operator reads."""

    def __init__(self, lake: Path, holder: Holder, section: str, waited: float | None = None) -> None:
        self.lake, self.holder, self.waited = lake, holder, waited
        how = (f"still held after waiting {waited:.0f} s ({section}.wait_timeout_s)" if waited is not None
               else f"{section}.on_busy=exit")
        super().__init__(f"lake {lake} is busy: claimed by {holder.describe()}; {how}: nothing written "
                         f"(exit {EXIT_BUSY}; see docs/OPERATIONS.md, Overlapping runs)")


class ClaimLost(RuntimeError):
    """This run's claim was taken over (its heartbeat stopped for longer than the TTL, or --force)."""


@dataclass
class Claim:
    """A claim this process holds: its heartbeat thread runs until `release`."""

    where: Path
    holder: Holder
    heartbeat_s: float
    lost: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    depth: int = 1  # nested holds of one lake in one process (a stage inside another)

    def start(self) -> Claim:
        self.beat()
        self._thread = threading.Thread(target=self._beating, name=f"claim-heartbeat-{self.holder.run_id}",
                                        daemon=True)
        self._thread.start()
        return self

    def _beating(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.beat()
            except OSError as err:  # the lake's file system hiccuped: the next beat tries again
                log.warning("[claim] heartbeat to %s failed: %s", self.where, err)

    def still_ours(self) -> bool:
        newest = generations(self.where)
        if newest and newest[-1] != self.holder.generation and self.lost is None:
            taker = read(self.where, newest[-1])
            self.lost = (f"the lake's claim was taken over by {taker.describe()}"
                         f"{' (--force)' if taker.forced else f': {taker.took_over}' if taker.took_over else ''}")
            log.error("[claim] %s; this run stops before its next write", self.lost)
        return self.lost is None

    def beat(self, released: bool = False) -> None:
        if not self.still_ours():
            return
        _write_replace(_beat_file(self.where, self.holder.generation),
                       json.dumps({"at": time.time(), "released": released}))

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            self.beat(released=True)
        except OSError as err:
            log.warning("[claim] could not release the claim in %s (%s): it expires after its TTL", self.where, err)

    def check(self) -> None:
        if self.lost is not None:
            raise ClaimLost(f"{self.lost}; nothing more is written by this run")


_held: dict[Path, Claim] = {}  # lakes this process holds, by their claim folder
_held_lock = threading.Lock()


def _record(where: Path, generation: int, run_id: str, job: str, host: str, forced: bool,
            took_over: str | None) -> Holder:
    pid = os.getpid()
    return Holder(generation=generation, run_id=run_id, job=job, host=host, pid=pid, user=getpass.getuser(),
                  started=time.time(), pid_started=_proc_start(pid), forced=forced, took_over=took_over)


def take(settings: Settings, job: str, run_id: str, force: bool = False, poll_s: float | None = None) -> Claim:
    """Take the lake's claim for this run (heartbeat started), wait for it, or raise LakeBusy (see the module)."""
    where = folder(settings)
    with _held_lock:
        mine = _held.get(where)
        if mine is not None:  # a stage run inside another of this process: the outer run's claim covers it
            mine.depth += 1
            return mine
    section, cs = claim_settings(settings)
    host = cs.claim_host or socket.gethostname()
    where.mkdir(parents=True, exist_ok=True)
    poll = poll_s if poll_s is not None else max(0.5, min(5.0, cs.claim_heartbeat_s / 2))
    first_wait: float | None = None
    told = 0.0
    while True:
        now = time.time()
        current = latest(where)
        reason = None if current is None else expired(current, host, cs.claim_ttl, now, f"{section}.claim_ttl")
        if current is None or reason is not None or force:
            generation = 0 if current is None else current.generation + 1
            live = current is not None and reason is None
            took_over = None if current is None or reason == "released" else (
                f"--force from {current.describe(now)}" if live else f"from {current.describe(now)}: {reason}")
            holder = _record(where, generation, run_id, job, host, force and live, took_over)
            record = {k: v for k, v in asdict(holder).items() if k not in ("generation", "heartbeat", "released")}
            if _link_new(_claim_file(where, generation), json.dumps(record)):
                if took_over and live:
                    log.warning("[claim] --force: took the lake's claim from %s (an operator's choice: a run still "
                                "writing beside this one can make commits conflict)", current.describe(now))
                elif took_over:
                    log.warning("[claim] took over the lake's claim from %s: %s", current.describe(now), reason)
                log.info("[claim] %s holds the lake %s (generation %d)", run_id, where.parent, generation)
                _prune(where, generation)
                claim = Claim(where, holder, cs.claim_heartbeat_s).start()
                with _held_lock:
                    _held[where] = claim
                return claim
            continue  # another run made that generation first: read it
        if cs.on_busy == "exit":
            raise LakeBusy(where.parent, current, section)
        first_wait = now if first_wait is None else first_wait
        if now - first_wait > cs.wait_timeout_s:
            raise LakeBusy(where.parent, current, section, waited=now - first_wait)
        if now - told >= settings.log.progress_seconds or told == 0.0:  # as often as a long stage's progress
            told = now
            log.info("[claim] lake busy: claimed by %s; waiting (%s.on_busy=wait, %.0f of %g s)",
                     current.describe(now), section, now - first_wait, cs.wait_timeout_s)
        time.sleep(poll)


def release(claim: Claim) -> None:
    with _held_lock:
        claim.depth -= 1
        if claim.depth > 0:
            return
        _held.pop(claim.where, None)
    claim.release()
    log.info("[claim] %s released the lake %s", claim.holder.run_id, claim.where.parent)


def check_held(settings: Settings) -> None:
    """Raise ClaimLost when this process's claim on the lake was taken over; no-op without a claim (a test or
    notebook calling a job's functions directly)."""
    claim = _held.get(folder(settings))
    if claim is not None:
        claim.check()


def _prune(where: Path, generation: int) -> None:
    for old in generations(where):
        if old <= generation - KEEP_GENERATIONS:
            for path in (_claim_file(where, old), _beat_file(where, old)):
                path.unlink(missing_ok=True)


def describe(settings: Settings) -> str:
    """A line on the lake's claim (`python -m jobs.infra.claim`)."""
    where = folder(settings)
    current = latest(where)
    if current is None:
        return f"lake {where.parent}: never claimed"
    section, cs = claim_settings(settings)
    now = time.time()
    reason = expired(current, cs.claim_host or socket.gethostname(), cs.claim_ttl, now, f"{section}.claim_ttl")
    state = "free (released)" if reason == "released" else (f"free: {reason}" if reason else "held")
    return f"lake {where.parent}: {state}; generation {current.generation}: {current.describe(now)}"


def give_back(settings: Settings, force: bool = False) -> tuple[int, str]:
    """(exit status, the line to print) of `release`: an operator gives the lake's claim back. A claim nobody holds
    (never taken, released, its holder dead or stale) is left as it is; a live holder's is taken from it only with
    `force`, as a job's --force would (a new generation, logged; the holder stops before its next write), and then
    released: generations only grow and each is written by its own holder, so nothing is rewritten or removed."""
    where = folder(settings)
    current = latest(where)
    if current is None:
        return 0, f"lake {where.parent}: never claimed; nothing to release"
    section, cs = claim_settings(settings)
    now = time.time()
    reason = expired(current, cs.claim_host or socket.gethostname(), cs.claim_ttl, now, f"{section}.claim_ttl")
    if reason is not None:
        return 0, f"lake {where.parent}: already free ({reason}); nothing to release"
    if not force:
        return EXIT_BUSY, (f"lake {where.parent}: held by {current.describe(now)}; a live run holds it: `release "
                           "--force` takes it from that run (it stops before its next write) and releases it")
    held = take(settings, "claim release", uuid.uuid4().hex, force=True)
    release(held)
    return 0, (f"lake {where.parent}: released (generation {held.holder.generation} took the claim from run "
               f"{current.run_id} with --force and gave it back)")


def parser(prog: str | None = None) -> argparse.ArgumentParser:
    """`python -m jobs.infra.claim [show | release [--force]] [--config F] [--set K=V]`; `prog` names the command
    in --help (`receval claim`)."""
    commands = argparse.ArgumentParser(
        prog=prog, description="The lake's claim: one writing run at a time (docs/OPERATIONS.md, Overlapping runs)")
    commands.add_argument("action", nargs="?", choices=("show", "release"), default="show",
                          help="show (the default): who holds the claim, and whether it is live; release: give back "
                               "a claim, a live run's only with --force")
    commands.add_argument("--force", action="store_true",
                          help="release: take the claim from a live run (it stops before its next write), then "
                               "free it")
    add_settings_arguments(commands)
    return commands


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Who holds the lake's claim and whether it is live, or an operator's release: the exit status."""
    commands = parser(prog)
    args = commands.parse_args(argv)
    if args.force and args.action != "release":
        commands.error("--force goes with release")
    settings = load_settings(args.config, args.overrides)
    if args.action == "show":
        print(describe(settings))
        return 0
    setup_logging(settings.log.level)  # the forced takeover's warning, in the jobs' format
    status, line = give_back(settings, args.force)
    print(line, file=sys.stderr if status else sys.stdout)
    return status


if __name__ == "__main__":
    sys.exit(main())
