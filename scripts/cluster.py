"""A Spark standalone cluster on 127.0.0.1 from the pip pyspark, and the process-tree helpers it needs.

    with StandaloneCluster(work_dir, workers=2) as cluster:   # master + 2 workers, 1 core and 1500m each
        result = cluster.submit("jobs.receval.pipeline", ["--set", "paths.lake=/tmp/lake"])

`submit` runs scripts/submit.sh (the project's code shipped with --py-files, Delta jars with --jars), exactly
what an operator runs. Every process the cluster starts (and what those start: executors, Python workers) is
stopped by its PID. Used by the cluster tests (tests/cluster.py) and the cluster benchmark (bench/run.py
--cluster).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# The checkout this script sits in (scripts/submit.sh beside it), from its own path rather than udfs.home.CODE_ROOT:
# in a spark-submit'd helper (tests/cluster.py) udfs is imported from the shipped zip, which holds no scripts/.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
SUBMIT = PROJECT_ROOT / "scripts" / "submit.sh"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    """All descendants of `pid` (executor JVMs, Python daemons and workers), read from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses; fields after the last ")" are fixed.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and all its descendants (a Spark driver's JVM and Python workers included)."""
    total = 0
    for p in [pid, *children(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> list[int]:
    """Signal `pid` and every descendant, each by its PID (descendants first, so none is re-parented)."""
    pids = [*reversed(children(pid)), pid]
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass
    return pids


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen
    log: Path
    port: int | None = None
    killed: bool = False  # by a fault test: its exit is expected


@dataclass
class StandaloneCluster:
    """Master plus `workers` workers on 127.0.0.1; `start()` waits until all of them are ALIVE."""

    root: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1500m"
    daemon_memory: str = "256m"
    # JVM options for every JVM of the cluster and its jobs (daemons, drivers, executors); "" = the JVM's own.
    # Tests pass the C1-only JIT, which starts and warms up faster on their short jobs (docs/TESTING.md).
    java_options: str = ""
    start_timeout_s: float = 180.0
    master_port: int = field(default_factory=free_port)
    webui_port: int = field(default_factory=free_port)
    daemons: list[Daemon] = field(default_factory=list)
    worker_daemons: list[Daemon] = field(default_factory=list)
    started_pids: set[int] = field(default_factory=set)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def state_url(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}/json/"

    # -- lifecycle --------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "SPARK_HOME": str(spark_home()),
                "SPARK_DAEMON_MEMORY": self.daemon_memory,
                "SPARK_LOCAL_IP": "127.0.0.1",
                "SPARK_LOCAL_DIRS": str(self.root / "local"),
                "SPARK_LOG_DIR": str(self.root / "logs"),
                "PYSPARK_PYTHON": sys.executable,
            }
        )
        if self.java_options:
            env["SPARK_DAEMON_JAVA_OPTS"] = self.java_options
        env.pop("PYSPARK_GATEWAY_PORT", None)
        env.pop("PYSPARK_GATEWAY_SECRET", None)
        return env

    def _spawn(self, name: str, args: Sequence[str], port: int | None = None) -> Daemon:
        log = self.root / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            # spark-class ends in `exec java`, so this PID is the daemon's JVM itself.
            proc = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env(),
                cwd=self.root,
            )
        self.started_pids.add(proc.pid)
        daemon = Daemon(name, proc, log, port)
        self.daemons.append(daemon)
        return daemon

    def start(self) -> StandaloneCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self._spawn(
                "master",
                [
                    "org.apache.spark.deploy.master.Master",
                    "--host", "127.0.0.1",
                    "--port", str(self.master_port),
                    "--webui-port", str(self.webui_port),
                ],
            )
            for _ in range(self.workers):
                self.add_worker(wait=False)
            self.wait_for_workers(self.workers)
        except BaseException:
            self.stop()
            raise
        return self

    def add_worker(self, wait: bool = True) -> Daemon:
        i = len(self.worker_daemons) + 1
        port = free_port()
        daemon = self._spawn(
            f"worker{i}",
            [
                "org.apache.spark.deploy.worker.Worker",
                self.master_url,
                "--host", "127.0.0.1",
                "--port", str(port),
                "--cores", str(self.cores),
                "--memory", self.memory,
                "--webui-port", str(free_port()),
                "--work-dir", str(self.root / f"work{i}"),
            ],
            port,
        )
        self.worker_daemons.append(daemon)
        if wait:
            self.wait_for_workers(len(self.live_workers()))
        return daemon

    def state(self) -> dict:
        with urllib.request.urlopen(self.state_url, timeout=5) as resp:
            return json.load(resp)

    def alive_worker_count(self) -> int:
        """Workers of ours the master lists as ALIVE (a killed one stays listed until its timeout)."""
        ours = {d.port for d in self.live_workers()}
        try:
            return sum(w["state"] == "ALIVE" and w["port"] in ours for w in self.state()["workers"])
        except (OSError, ValueError, KeyError):
            return 0

    def completed_apps(self, at_least: int = 0, timeout_s: float = 60) -> list[dict]:
        """The master's finished applications; waits (a driver's exit reaches the master a moment later)."""
        deadline = time.monotonic() + timeout_s
        while True:
            apps = self.state()["completedapps"]
            if len(apps) >= at_least or time.monotonic() > deadline:
                return apps
            time.sleep(0.5)

    def wait_for_workers(self, n: int) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            dead = [d for d in self.daemons if d.proc.poll() is not None and not d.killed]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited early:\n{self.log_tail(dead[0])}")
            if self.alive_worker_count() >= n:
                return
            time.sleep(0.5)
        raise TimeoutError(
            f"{n} workers did not register with {self.master_url} within {self.start_timeout_s}s; master log:\n"
            + self.log_tail(self.daemons[0])
        )

    def live_daemons(self) -> list[Daemon]:
        return [d for d in self.daemons if d.proc.poll() is None]

    def live_workers(self) -> list[Daemon]:
        return [d for d in self.worker_daemons if d.proc.poll() is None and not d.killed]

    def ensure_workers(self, n: int | None = None) -> None:
        """Replace workers a fault test killed, so every test starts on a full cluster."""
        n = self.workers if n is None else n
        while len(self.live_workers()) < n:
            self.add_worker(wait=False)
        self.wait_for_workers(n)

    def kill_worker(self, daemon: Daemon) -> list[int]:
        """SIGKILL a worker and everything under it (its executor and Python workers): a lost node."""
        daemon.killed = True
        pids = kill_tree(daemon.proc.pid, signal.SIGKILL)
        daemon.proc.wait(timeout=30)
        return pids

    def worker_of(self, pid: int) -> Daemon | None:
        """The worker whose process tree holds `pid` (e.g. the Python worker running a task)."""
        for daemon in self.live_workers():
            if pid in children(daemon.proc.pid):
                return daemon
        return None

    def stop(self) -> None:
        """TERM then KILL every daemon this cluster started and all their descendants, by PID."""
        for daemon in reversed(self.daemons):
            if daemon.proc.poll() is None:
                kill_tree(daemon.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for daemon in self.daemons:
            try:
                daemon.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill_tree(daemon.proc.pid, signal.SIGKILL)
                daemon.proc.wait(timeout=15)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @staticmethod
    def log_tail(daemon: Daemon, chars: int = 4000) -> str:
        try:
            return daemon.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # -- jobs -------------------------------------------------------------------------------------
    def submit_command(self, module: str, args: Sequence[str] = ()) -> list[str]:
        jvm = ["--conf", f"spark.executor.extraJavaOptions={self.java_options}"] if self.java_options else []
        return [str(SUBMIT), "--master", self.master_url, *jvm, module, *args]

    def submit_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
        env.update({"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1", **(extra or {})})
        if self.java_options:  # the driver: spark-submit's own JVM in client mode
            env["SPARK_SUBMIT_OPTS"] = f"{env.get('SPARK_SUBMIT_OPTS', '')} {self.java_options}".strip()
        return env

    def wheel_submit_command(
        self, wheel: Path, jars: Sequence[Path], script: str, args: Sequence[str] = ()
    ) -> list[str]:
        """Plain spark-submit of `script` with the project as a wheel (--py-files) and the Delta jars (--jars), as
        README "Install as a package" shows it: no checkout, no scripts/submit.sh."""
        python = sys.executable
        jvm = ["--conf", f"spark.executor.extraJavaOptions={self.java_options}"] if self.java_options else []
        return [
            str(spark_home() / "bin" / "spark-submit"), "--master", self.master_url, "--name", f"receval:{script}",
            "--jars", ",".join(str(j) for j in jars), "--py-files", str(wheel),
            "--conf", "spark.task.maxFailures=4",
            "--conf", f"spark.pyspark.python={python}", "--conf", f"spark.pyspark.driver.python={python}",
            "--conf", f"spark.executorEnv.PYSPARK_PYTHON={python}",
            *jvm, script, *args,
        ]

    def start_job(
        self, module: str, args: Sequence[str] = (), log: Path | None = None, env: dict[str, str] | None = None,
        command: Sequence[str] | None = None, cwd: Path | None = None,
    ) -> subprocess.Popen:
        """spark-submit in the background (the driver is a child of this process, not of the cluster): through
        scripts/submit.sh from the checkout, or `command` (e.g. wheel_submit_command) run in `cwd`."""
        log = log or self.root / "logs" / f"submit-{time.time_ns()}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                list(command) if command is not None else self.submit_command(module, args),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.submit_env(env),
                cwd=cwd or PROJECT_ROOT,
            )
        proc.log = log  # type: ignore[attr-defined]
        return proc

    def finish_job(self, proc: subprocess.Popen, timeout_s: float = 1800) -> subprocess.CompletedProcess:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        output = Path(proc.log).read_text(errors="replace")  # type: ignore[attr-defined]
        return subprocess.CompletedProcess(proc.args, proc.returncode, output, "")

    def submit(
        self, module: str, args: Sequence[str] = (), timeout_s: float = 1800, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        return self.finish_job(self.start_job(module, args, env=env), timeout_s)
