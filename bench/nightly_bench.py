"""Nightly pipeline wall time: a first night of N new chains, then a night with 10% new, then an unchanged night.

    .venv/bin/python bench/nightly_bench.py --sizes 1000 10000 50000 --stages fake
    .venv/bin/python bench/nightly_bench.py --sizes 1000 --stages real

`real` runs the project's stages (spaCy steps, tiny NLI / T5 / GPT-2 models from the offline profile);
`fake` swaps the model stages for the deterministic Spark-only fakes of the tests, so the figure is the
pipeline's own cost (ingest, bookkeeping, MERGEs, aggregation, curation). Appends a section to
bench/RESULTS.md with --record.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "jobs"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

NAMES = ["Janet", "Tom", "Aisha", "Marco", "Lena", "Ravi"]
ITEMS = ["apples", "eggs", "books", "marbles", "cookies", "pencils"]


def chain(i: int, rng: random.Random) -> dict:
    """A GSM-8K-like chain: 2-4 context sentences, 2-5 arithmetic steps."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c = rng.randint(2, 60), rng.randint(2, 30), rng.randint(2, 9)
    context = [f"{name} has {a} {item}.", f"{name} buys {b} more {item} at the market.",
               f"Each box holds {c} {item}.", f"{name} wants to fill boxes with all the {item}."]
    steps = [f"{name} starts with {a} {item} and buys {b} more, so {a} + {b} = {a + b} {item}."]
    total = a + b
    for _ in range(rng.randint(1, 4)):
        d = rng.randint(1, 9)
        steps.append(f"After giving away {d} {item}, {name} has {total} - {d} = {total - d} {item}.")
        total -= d
    steps.append(f"So {name} fills {total} / {c} = {total // c} boxes.")
    return {"chain_id": f"syn-{i}", "dataset": "synthetic", "context": " ".join(context[: rng.randint(2, 4)]),
            "chain": "\n".join(steps), "answer": str(total // c)}


def write_night(folder: Path, name: str, start: int, count: int, seed: int) -> None:
    rng = random.Random(seed)
    with (folder / f"{name}.jsonl").open("w") as f:
        for i in range(start, start + count):
            f.write(json.dumps(chain(i, rng)) + "\n")


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except Exception:
        return platform.processor() or "unknown"


def run_nights(spark, size: int, stages: str, batch: int, new_fraction: float, work: Path) -> list[dict]:
    from pipeline_fakes import Fakes

    from jobs.infra.config_layers import load_settings
    from jobs.infra.tracking import JobRun
    from jobs.receval import pipeline

    inp, lake = work / f"input-{size}", work / f"lake-{size}"
    shutil.rmtree(inp, ignore_errors=True)
    shutil.rmtree(lake, ignore_errors=True)
    inp.mkdir(parents=True)
    settings = load_settings(
        overrides=[
            f"paths.lake={lake}", f"ingest.input={inp}", "mlflow.enabled=false", "spark.master=local[2]",
            "spark.shuffle_partitions=2", f"pipeline.batch_chains={batch}", "pipeline.progress=plain",
            "pipeline.stages=[ingest,steps,scores,aggregate,curate]",
            "curation.thresholds={intra_entail: 0.3}", "curation.quantiles={inter: 0.25}",
        ],
        environ={},
    )
    fakes = Fakes() if stages == "fake" else None
    extra = int(size * new_fraction)
    nights = [("first night", 0, size), (f"{new_fraction:.0%} new", size, extra), ("unchanged", 0, 0)]
    out = []
    for label, start, count in nights:
        if count:
            write_night(inp, f"night-{start}", start, count, seed=start + 1)
        t0 = time.time()
        with fakes.installed() if fakes else contextlib.nullcontext():
            summary = pipeline.run(spark, settings, JobRun("pipeline", settings))
        seconds = time.time() - t0
        stage_s = {s.name: round(s.seconds, 1) for s in summary.stages}
        out.append({"size": size, "night": label, "new_chains": count, "seconds": seconds, "stages": stage_s,
                    "chain_scores": summary.rows_after["chain_scores"]})
        print(f"[bench] size={size} {label}: {count} new chains, {seconds:.1f} s, stages {stage_s}", flush=True)
    return out


def record(results: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"\n## Nightly pipeline: incremental cost ({args.stages} stages)\n",
        f"Machine: {machine()}, 2 cores (local[2]), {time.strftime('%Y-%m-%d')}, "
        f"batch_chains={args.batch}, Python {platform.python_version()}. "
        + ("Model stages are the deterministic Spark-only fakes of the tests: the figure is the pipeline's own "
           "cost (ingest, bookkeeping, MERGEs, aggregation, curation)." if args.stages == "fake" else
           "Real stages: spaCy steps, tiny NLI / T5 / GPT-2 models (offline profile).")
        + f" Load average (1/5/15 min) at the end: {'/'.join(f'{x:.1f}' for x in os.getloadavg())} (2 cores: "
          "above 2 means other jobs shared them); ratios within one size are measured back to back.\n",
        "| chains in lake | night | new chains | wall s | s per new chain | vs first night | stages (s) |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for size in sorted({r["size"] for r in results}):
        rows = [r for r in results if r["size"] == size]
        first = rows[0]["seconds"]
        for r in rows:
            per = f"{r['seconds'] / r['new_chains'] * 1000:.1f} ms" if r["new_chains"] else "-"
            stages = ", ".join(f"{k} {v}" for k, v in r["stages"].items())
            lines.append(f"| {size} | {r['night']} | {r['new_chains']} | {r['seconds']:.1f} | {per} | "
                         f"{r['seconds'] / first:.2f} | {stages} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 50000])
    parser.add_argument("--stages", choices=["fake", "real"], default="fake")
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--new-fraction", type=float, default=0.1)
    parser.add_argument("--record", action="store_true", help="append the table to bench/RESULTS.md")
    args = parser.parse_args()

    from jobs.infra.config import SparkSettings
    from jobs.infra.session import build_session

    spark = build_session(SparkSettings(master="local[2]", shuffle_partitions=2, app_name="nightly-bench"),
                          extra={"spark.driver.memory": "3g"})
    results = []
    with tempfile.TemporaryDirectory(prefix="nightly-bench-") as tmp:
        for size in args.sizes:
            results += run_nights(spark, size, args.stages, args.batch, args.new_fraction, Path(tmp))
    text = record(results, args)
    print(text)
    if args.record:
        with (ROOT / "bench" / "RESULTS.md").open("a") as f:
            f.write(text)
    spark.stop()


if __name__ == "__main__":
    main()
