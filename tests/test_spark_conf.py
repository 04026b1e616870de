"""The tests' Spark defaults (tests/spark-conf) reach the in-process session and a job started as a subprocess."""

from __future__ import annotations

import subprocess
import sys

from conftest import TEST_JVM_OPTIONS, TEST_SPARK_CONF_DIR

from jobs.infra.config_paths import PROJECT_ROOT


def test_session_runs_interpreted_expressions_with_c1(spark):
    conf = spark.sparkContext.getConf()
    assert spark.conf.get("spark.sql.codegen.factoryMode") == "NO_CODEGEN"
    assert spark.conf.get("spark.sql.codegen.wholeStage") == "false"
    assert conf.get("spark.executor.extraJavaOptions").endswith(TEST_JVM_OPTIONS)
    # The driver JVM itself runs with it (the session fixture no longer names it: the defaults file does).
    jvm = spark.sparkContext._jvm
    runtime = jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    assert set(TEST_JVM_OPTIONS.split()) <= set(runtime.getInputArguments())
    # The code cache C1 alone would reserve (48 MB) filled up in a test process's JVM: 256 MB are reserved.
    hotspot = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
    assert hotspot.getVMOption("ReservedCodeCacheSize").getValue() == str(256 << 20)
    # Interpreted and generated projections agree: a wide projection of mixed types, as Delta's encoders build.
    df = spark.range(5).selectExpr("id", "id * 2.5 AS x", "CAST(id AS STRING) AS s", "named_struct('a', id) AS t")
    assert [tuple(r) for r in df.orderBy("id").collect()] == [(i, i * 2.5, str(i), (i,)) for i in range(5)]


def test_subprocess_spark_sees_the_test_defaults():
    code = (
        "from pyspark.sql import SparkSession\n"
        "s = SparkSession.builder.master('local[1]').getOrCreate()\n"
        "print(s.conf.get('spark.sql.codegen.factoryMode'))\n"
        "s.stop()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "NO_CODEGEN"
    assert (TEST_SPARK_CONF_DIR / "spark-defaults.conf").is_file()
