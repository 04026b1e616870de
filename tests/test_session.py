"""jobs.infra.session.session_confs: runtime settings for one block, each put back as it was."""

from __future__ import annotations

import pytest

from jobs.infra.session import session_confs

SET_BEFORE = "spark.sql.session.timeZone"
UNSET_BEFORE = "spark.databricks.delta.commitInfo.userMetadata"


def test_session_confs_apply_inside_and_restore_after_a_raise(spark):
    spark.conf.set(SET_BEFORE, "UTC")
    assert spark.conf.get(UNSET_BEFORE, None) is None
    with pytest.raises(RuntimeError), session_confs(spark, {SET_BEFORE: "Asia/Tokyo", UNSET_BEFORE: "run-1"}):
        assert spark.conf.get(SET_BEFORE) == "Asia/Tokyo"
        assert spark.conf.get(UNSET_BEFORE) == "run-1"
        raise RuntimeError("the block fails")
    assert spark.conf.get(SET_BEFORE) == "UTC"  # the value it had
    assert spark.conf.get(UNSET_BEFORE, None) is None  # unset again, not left at the block's value


# A session of its own in a subprocess (the test process's session already exists, and build_session reuses it).
OWN_SESSION = r"""
import json, sys
from jobs.infra.config import SparkSettings
from jobs.infra.session import JarsMissing, build_session
try:
    build_session(SparkSettings(master="local[1]", jars_dir=sys.argv[1]))
except JarsMissing as err:
    print(json.dumps({"missing": str(err)}))
spark = build_session(SparkSettings(master="local[1]", jars_dir=sys.argv[1], delta_jars=False))
conf = spark.sparkContext.getConf()
# No query runs: this machine's Spark has no Delta of its own, which a cluster that provides Delta would have.
print(json.dumps({"jars": conf.get("spark.jars", ""), "home": conf.get("spark.executorEnv.RECEVAL_HOME"),
                  "delta": "DeltaSparkSessionExtension" in conf.get("spark.sql.extensions", "")}))
"""


def test_delta_jars_false_starts_without_the_jar_cache_and_names_the_setting_when_missing(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from jobs.infra.config_paths import PROJECT_ROOT

    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "RECEVAL_HOME": str(tmp_path)}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    out = subprocess.run([sys.executable, "-c", OWN_SESSION, str(tmp_path / "no-jars")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    missing, started = (json.loads(line) for line in out.stdout.strip().splitlines()[-2:])
    assert missing["missing"].startswith(f"spark.jars_dir: Delta jars not found in {tmp_path / 'no-jars'}. Run "
                                         "`python -m jobs.infra.jars` once")
    assert "set spark.delta_jars=false instead" in missing["missing"]
    # The cluster provides Delta: no jars asked for, none added; executors get the driver's home folder.
    assert started == {"jars": "", "home": str(tmp_path), "delta": True}
