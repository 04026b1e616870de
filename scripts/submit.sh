#!/usr/bin/env bash
# Submit a job module of this project to a Spark cluster with spark-submit.
#
#   scripts/submit.sh --master spark://host:7077 jobs.receval.ingest --set paths.lake=/shared/lake
#   scripts/submit.sh spark://host:7077 jobs.receval.pipeline --set profile=cluster
#   scripts/submit.sh --master spark://host:7077 --conf spark.executor.memory=8g jobs.receval.pipeline --config my.yaml
#
# Before the job module: --master URL (default $SPARK_MASTER, else local[*]), any spark-submit option
# (--conf k=v, --executor-memory ...). The module (jobs.x) or a .py file comes next; what follows goes to
# the job (its --config/--set). What this does:
#   * ships jobs/, udfs/ and schemas/ to the executors as one zip (--py-files), built fresh each time;
#   * ships the Delta jars from the jar cache (.jars/, `python -m jobs.infra.jars`) with --jars; none where the
#     cluster provides Delta Lake: RECEVAL__SPARK__DELTA_JARS=false (the job's spark.delta_jars setting);
#   * runs driver and Python workers with this project's interpreter (PYSPARK_PYTHON, default .venv/bin/python);
#   * sets the job's spark.master setting to the same URL, so tracking tags name the real cluster;
#   * points RECEVAL_HOME (udfs/home.py: where relative paths resolve) at this checkout for the driver and the
#     executors, unless it is set already.
# Executors must see the same interpreter path and model folders (a shared or identical install).
# Without a checkout, submit the wheel itself: README "Install as a package" (spark-submit --py-files the .whl).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYSPARK_PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
MASTER="${SPARK_MASTER:-local[*]}"
JARS_DIR="${RECEVAL_JARS_DIR:-$ROOT/.jars}"

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit "${1:-2}"; }

SUBMIT_OPTS=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage 0 ;;
    --master) MASTER="$2"; shift 2 ;;
    --master=*) MASTER="${1#--master=}"; shift ;;
    --*=*) SUBMIT_OPTS+=("$1"); shift ;;
    --verbose|--supervise) SUBMIT_OPTS+=("$1"); shift ;;
    --*) SUBMIT_OPTS+=("$1" "$2"); shift 2 ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || usage
# A master URL may also come first without --master: scripts/submit.sh spark://host:7077 jobs.receval.pipeline
case "$1" in
  spark://*|k8s://*|mesos://*|local|local\[*|yarn) MASTER="$1"; shift; [ $# -ge 1 ] || usage ;;
esac
TARGET="$1"; shift

SPARK_HOME="${SPARK_HOME:-$("$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')}"
export SPARK_HOME
JAR_OPTS=()
case "${RECEVAL__SPARK__DELTA_JARS:-true}" in
  false|False|FALSE) ;;  # the cluster provides Delta Lake
  *)
    JARS="$(ls "$JARS_DIR"/*.jar 2>/dev/null | paste -sd, - || true)"  # no folder: the message below
    if ! printf '%s' "$JARS" | grep -q 'delta-spark_'; then
      echo "submit.sh: no Delta jars in $JARS_DIR; run '$PY -m jobs.infra.jars' once (needs Maven Central)," \
        "or set RECEVAL__SPARK__DELTA_JARS=false where the cluster provides Delta Lake" >&2
      exit 2
    fi
    JAR_OPTS=(--jars "$JARS") ;;
esac

WORK="$(mktemp -d "${TMPDIR:-/tmp}/receval-submit.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
# The code executors import: jobs/, udfs/, schemas/ as they are now in this checkout.
(cd "$ROOT" && "$PY" - "$WORK/receval.zip" <<'PYZIP'
import sys, zipfile
from pathlib import Path
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as zf:
    for package in ("jobs", "udfs", "schemas"):
        for path in sorted(Path(package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix in {".py", ".yaml", ".json"}:
                zf.write(path, str(path))
PYZIP
)
# spark-submit runs a file, not a module: this launcher runs the module as __main__. The driver imports
# the checkout (conf/ lives there; spark-submit would put the zip first on its path).
cat > "$WORK/launch.py" <<PYLAUNCH
import runpy, sys
sys.path.insert(0, "$ROOT")
target = sys.argv.pop(1)
if target.endswith(".py"):
    runpy.run_path(target, run_name="__main__")
else:
    runpy.run_module(target, run_name="__main__", alter_sys=True)
PYLAUNCH

# A RECEVAL_HOME of the caller's wins, as it does in a job started without this script.
export PYSPARK_PYTHON="$PY" PYSPARK_DRIVER_PYTHON="$PY" RECEVAL_HOME="${RECEVAL_HOME:-$ROOT}"
export RECEVAL__SPARK__MASTER="$MASTER"
cd "$ROOT"
# Four attempts per task (tasks lost with their executor do not count); an explicit --conf wins.
"$SPARK_HOME/bin/spark-submit" \
  --master "$MASTER" \
  --name "receval:$TARGET" \
  ${JAR_OPTS[@]+"${JAR_OPTS[@]}"} \
  --py-files "$WORK/receval.zip" \
  --conf spark.task.maxFailures=4 \
  --conf "spark.pyspark.python=$PY" \
  --conf "spark.pyspark.driver.python=$PY" \
  --conf "spark.executorEnv.PYSPARK_PYTHON=$PY" \
  --conf "spark.executorEnv.RECEVAL_HOME=$RECEVAL_HOME" \
  ${SUBMIT_OPTS[@]+"${SUBMIT_OPTS[@]}"} \
  "$WORK/launch.py" "$TARGET" "$@"
