"""Steps job throughput: steps per second on local[2] over the 340 EB task_1 test chains and the 1,319
GSM-8K chains, against the same extraction in one plain Python process (one core, no Spark).

    .venv/bin/python bench/steps_bench.py [--no-record]

Appends a section to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from jobs.infra.config_layers import load_settings  # noqa: E402
from jobs.infra.config_paths import resolve_path  # noqa: E402
from jobs.metaeval import entailment_bank as eb  # noqa: E402
from jobs.metaeval.settings import HumanLabelSettings  # noqa: E402
from jobs.receval import steps as J  # noqa: E402
from schemas import chains as C  # noqa: E402

GSM8K = resolve_path(HumanLabelSettings().generated)  # python -m jobs.infra.data fetch roscoe_gsm8k


def gsm8k_chains() -> list[dict]:
    rows = []
    for line in GSM8K.read_text().splitlines():
        item = json.loads(line)
        chain = item["gpt-3"].strip()
        rows.append(
            {
                C.CHAIN_ID: item["key"],
                C.DATASET: "gsm8k",
                C.CONTEXT: item["premise"],
                # "A: 18" is the answer line, not a step (as tests/data/make_sample_lake.py does)
                C.CHAIN_TEXT: re.sub(r"\n?A:\s*[^\n]*$", "", chain).strip(),
                C.ANSWER: chain.rsplit("A:", 1)[-1].strip() if "A:" in chain else None,
                C.CONTENT_HASH: item["key"],
            }
        )
    return rows


def eb_chains(settings) -> list[dict]:
    return eb.to_chains(eb.load_jsonl(resolve_path(settings.perturb.eb_task1_test)))


def frame(spark, records):
    return spark.createDataFrame([{c: r.get(c) for c in C.SCHEMA.fieldNames()} for r in records], C.SCHEMA)


def spark_rate(spark, settings, records) -> tuple[int, float]:
    df = frame(spark, records).repartition(2).cache()
    df.count()
    start = time.perf_counter()
    steps, contexts, quarantined = J.transform(df, settings.steps, settings.models, settings.runtime,
                                               settings.scoring_hash())
    n = steps.count()
    elapsed = time.perf_counter() - start
    assert contexts.count() + quarantined.count() == len(records)
    df.unpersist()
    return n, elapsed


def plain_rate(settings, records) -> tuple[int, float]:
    opts = J.Options.from_settings(settings)
    J.explode_records(records[:4], opts)  # spaCy loaded before the clock starts
    start = time.perf_counter()
    out = []
    for i in range(0, len(records), 1000):  # Arrow batches are up to 10,000 rows; 1,000 keeps memory flat
        out += J.explode_records(records[i : i + 1000], opts)
    elapsed = time.perf_counter() - start
    return sum(len(r.get("steps") or []) for r in out), elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args(argv)

    from jobs.infra.config import SparkSettings
    from jobs.infra.session import build_session

    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(overrides=[f"paths.lake={tmp}/lake", "mlflow.enabled=false"], environ={})
        spark = build_session(
            SparkSettings(master="local[2]", shuffle_partitions=2, app_name="steps-bench"),
            extra={"spark.driver.memory": "2g"},
        )
        data = {"EB task_1 test (340)": eb_chains(settings), "GSM-8K (1,319)": gsm8k_chains()}
        # warm-up: both Python workers load spaCy before any clock starts (worker reuse keeps it)
        spark_rate(spark, settings, data["GSM-8K (1,319)"][:8])
        results = []
        for name, records in data.items():
            n_spark, t_spark = spark_rate(spark, settings, records)
            n_plain, t_plain = plain_rate(settings, records)
            assert n_spark == n_plain, (n_spark, n_plain)
            results.append((name, len(records), n_spark, t_spark, t_plain))
            print(
                f"{name}: {n_spark} steps; local[2] {n_spark / t_spark:.1f} steps/s ({t_spark:.1f} s); "
                f"plain Python 1 core {n_plain / t_plain:.1f} steps/s ({t_plain:.1f} s); "
                f"ratio {t_plain / t_spark:.2f}x"
            )
        spark.stop()
    if not args.no_record:
        record(results, settings)


def record(results, settings) -> None:
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout
    cpu = cpu.split(":", 1)[-1].strip()
    lines = [
        "",
        "## Steps job (chains -> steps + RCUs), steps per second",
        "",
        f"Machine: {cpu or 'unknown CPU'}, 2 cores, shared with other jobs (load average {os.getloadavg()[0]:.0f} "
        f"at the end of the run); {dt.date.today().isoformat()}. "
        f"spaCy `{settings.models.spacy}`, boundary `{settings.steps.boundary}`, roles `{settings.steps.roles}`, "
        f"nlp.pipe batch {settings.steps.batch_size}. `bench/steps_bench.py`.",
        "Timed: the whole transform to a counted `steps` frame (spaCy already loaded in the 2 Python workers);",
        "baseline: `jobs.receval.steps.explode_records` in one Python process (1 core), same chains, same step count.",
        "",
        "| chains | n | steps | local[2] steps/s | local[2] s | plain 1-core steps/s | speed-up |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, n, steps, t_spark, t_plain in results:
        lines.append(
            f"| {name} | {n} | {steps} | {steps / t_spark:.1f} | {t_spark:.1f} | {steps / t_plain:.1f} | "
            f"{t_plain / t_spark:.2f}x |"
        )
    path = ROOT / "bench" / "RESULTS.md"
    if not path.exists():
        path.write_text("# Benchmark results\n")
    with path.open("a") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
