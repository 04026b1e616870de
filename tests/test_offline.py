"""A session start after setup needs no network: Delta jars come from the local .jars/ cache."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from jobs.infra.config_paths import PROJECT_ROOT

SCRIPT = """
import sys
from jobs.infra.config import SparkSettings
from jobs.infra.session import build_session
spark = build_session(SparkSettings(master="local[1]", shuffle_partitions=1))
path = sys.argv[1]
spark.range(3).write.format("delta").save(path)
from delta.tables import DeltaTable
print("VERSION", DeltaTable.forPath(spark, path).history(1).first()["version"], spark.read.format("delta").load(path).count())
spark.stop()
"""


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs `unshare -n` (root) to cut the network")
def test_session_starts_and_writes_delta_without_network(tmp_path):
    # A new network namespace has only a loopback device: Maven Central is unreachable inside it.
    cmd = [
        "unshare", "-n", "sh", "-c",
        f"ip link set lo up && exec {sys.executable} -c '{SCRIPT}' {tmp_path / 't'}",
    ]
    out = subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert "VERSION 0 3" in out.stdout, out.stderr[-3000:]
