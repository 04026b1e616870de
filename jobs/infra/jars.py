"""Fetch the Delta Lake jars once from Maven Central into the project's jar folder.

Spark's own Ivy resolver (`spark.jars.packages`) downloads delta-spark and its dependencies into
`.ivy/`; the jars are then copied to `spark.jars_dir` (default `.jars/`), which every later session
uses through `spark.jars` without touching the network.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path

import pyspark

from jobs.config import load_settings, resolve_path
from jobs.session import DELTA_PACKAGE, JarsMissing, delta_jars


def _artifact(jar_name: str) -> str:
    """`hadoop-client-api-3.4.2.jar` -> `hadoop-client-api`."""
    match = re.match(r"^(.*?)-\d[\w.\-]*\.jar$", jar_name)
    return match.group(1) if match else jar_name


def fetch(jars_dir: str, ivy_dir: str = ".ivy") -> list[str]:
    target = resolve_path(jars_dir)
    try:
        return [str(j) for j in delta_jars(target)]
    except JarsMissing:
        pass
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    ivy = resolve_path(ivy_dir)
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("receval-fetch-jars")
        .config("spark.jars.packages", DELTA_PACKAGE)
        .config("spark.jars.ivy", str(ivy))
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.stop()
    target.mkdir(parents=True, exist_ok=True)
    # Ivy also resolves libraries Spark ships (Hadoop, Jackson, Parquet, log4j) at other versions;
    # only the ones Spark lacks go on the classpath, or an older Jackson would shadow Spark's own.
    shipped = {_artifact(j.name) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    for jar in (ivy / "jars").glob("*.jar"):
        name = jar.name.split("_", 1)[1] if "_" in jar.name else jar.name
        if _artifact(name) not in shipped:
            shutil.copy2(jar, target / jar.name)
    return [str(j) for j in delta_jars(target)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args(argv)
    settings = load_settings(args.config, args.overrides)
    for jar in fetch(settings.spark.jars_dir):
        print(jar)


if __name__ == "__main__":
    main()
