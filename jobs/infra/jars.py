"""Fetch the Delta Lake jars once from Maven Central into the project's jar folder.

Spark's own Ivy resolver (`spark.jars.packages`) downloads delta-spark and its dependencies into
`.ivy/`, asking Maven Central only; the jars are then copied to `spark.jars_dir` (default `.jars/`),
which every later session uses through `spark.jars` without touching the network.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pyspark

from jobs.infra.args import add_settings_arguments
from jobs.infra.config_layers import load_settings
from jobs.infra.config_paths import resolve_path
from jobs.infra.session import DELTA_PACKAGE, JarsMissing, delta_jars
from udfs.home import home

MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"

# Spark's default Ivy chain also asks ~/.m2, ~/.ivy2/local and repos.spark-packages.org; every parent POM
# missing there printed a failed lookup (34 for delta-spark), so Maven Central is the only resolver here.
# The cache folder comes from `spark.jars.ivy`, which Spark applies on top of this file. The properties keep
# what Spark's built-in settings do: no lookup of -sources and -javadoc jars, and no .sha1/.md5 requests (a
# settings file turns checksums on: one more request per file took the resolve from ~16 s to ~30 s, and
# HTTPS already guards the transfer).
IVY_SETTINGS = f"""<ivysettings>
  <property name="ivy.maven.lookup.sources" value="false"/>
  <property name="ivy.maven.lookup.javadoc" value="false"/>
  <property name="ivy.checksums" value=""/>
  <settings defaultResolver="central"/>
  <resolvers>
    <ibiblio name="central" root="{MAVEN_CENTRAL}" m2compatible="true"/>
  </resolvers>
</ivysettings>
"""

# Run in a child interpreter: Ivy prints its resolution report from the JVM straight to the inherited
# stderr, so only a separate process lets that report go to a log file instead of the terminal.
_RESOLVE = """
import sys
from pyspark.sql import SparkSession
package, ivy, settings = sys.argv[1:4]
builder = SparkSession.builder.master("local[1]").appName("receval-fetch-jars")
builder = builder.config("spark.jars.packages", package).config("spark.jars.ivy", ivy)
builder.config("spark.jars.ivySettings", settings).config("spark.ui.enabled", "false").getOrCreate().stop()
"""


class FetchFailed(RuntimeError):
    """Spark's Ivy resolve of the Delta package failed; the message carries Ivy's problems summary."""


def _artifact(jar_name: str) -> str:
    """`hadoop-client-api-3.4.2.jar` -> `hadoop-client-api`."""
    match = re.match(r"^(.*?)-\d[\w.\-]*\.jar$", jar_name)
    return match.group(1) if match else jar_name


def _shown(path: Path) -> str:
    return f"{path.relative_to(home())}/" if path.is_relative_to(home()) else str(path)


def _resolve(ivy: Path) -> None:
    """Spark's Ivy resolve of DELTA_PACKAGE into `ivy`/jars; its full output goes to `ivy`/resolve.log."""
    ivy.mkdir(parents=True, exist_ok=True)
    settings = ivy / "ivysettings.xml"
    settings.write_text(IVY_SETTINGS)
    log = ivy / "resolve.log"
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    cmd = [sys.executable, "-c", _RESOLVE, DELTA_PACKAGE, str(ivy), str(settings)]
    with log.open("w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0:
        raise FetchFailed(
            f"resolving {DELTA_PACKAGE} from Maven Central ({MAVEN_CENTRAL}) failed (exit {done.returncode}); "
            f"full log: {log}\n{_excerpt(log.read_text())}"
        )


def _excerpt(log: str) -> str:
    """Ivy's problems summary (what it tried where, what failed) when it printed one, else the log's end."""
    lines = [line for line in log.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if line.startswith(":: problems summary ::")), None)
    if start is None:
        return "\n".join(lines[-30:])
    end = next((i for i in range(start, len(lines)) if lines[i].startswith(":: USE VERBOSE")), len(lines))
    return "\n".join(lines[start:end][:40])


def fetch(jars_dir: str, ivy_dir: str = ".ivy") -> list[str]:
    target = resolve_path(jars_dir)
    try:
        jars = delta_jars(target)
        print(f"Delta jars: {len(jars)} jars already in {_shown(target)} (no download)")
        return [str(j) for j in jars]
    except JarsMissing:
        pass
    ivy = resolve_path(ivy_dir)
    print(f"Delta jars: resolving {DELTA_PACKAGE} and its dependencies from Maven Central ({MAVEN_CENTRAL})")
    _resolve(ivy)
    target.mkdir(parents=True, exist_ok=True)
    # Ivy also resolves libraries Spark ships (Hadoop, Jackson, Parquet, log4j) at other versions;
    # only the ones Spark lacks go on the classpath, or an older Jackson would shadow Spark's own.
    shipped = {_artifact(j.name) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    resolved = sorted((ivy / "jars").glob("*.jar"))
    for jar in resolved:
        name = jar.name.split("_", 1)[1] if "_" in jar.name else jar.name
        if _artifact(name) not in shipped:
            shutil.copy2(jar, target / jar.name)
    jars = delta_jars(target)
    print(
        f"Delta jars: {len(jars)} jars in {_shown(target)} ({len(resolved)} resolved into {_shown(ivy)}, "
        "the others ship with Spark)"
    )
    return [str(j) for j in jars]


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    add_settings_arguments(parser)
    args = parser.parse_args(argv)
    settings = load_settings(args.config, args.overrides)
    try:
        fetch(settings.spark.jars_dir)
    except FetchFailed as err:
        sys.exit(f"jobs.infra.jars: {err}")


if __name__ == "__main__":
    main()
