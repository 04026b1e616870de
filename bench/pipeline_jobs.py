"""Spark jobs and wall time per part of a nightly pipeline run, with the stages' models replaced by fakes.

On a small lake a run's time is its Spark jobs' fixed costs (planning, scheduling, Delta log replay), not its
data: the count of jobs is the measure that does not move with the machine's load. Counts come from Spark's
own job id counter around each function of the pipeline's bookkeeping (tables.*, the pipeline's stages), on
the bundled sample lake (24 chains), in one process: a first night, then an unchanged rerun.

    .venv/bin/python bench/pipeline_jobs.py                       # batches of 12 chains: two per stage
    .venv/bin/python bench/pipeline_jobs.py --set pipeline.batch_chains=24   # one batch per stage
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "jobs")]  # the fake stages the pipeline tests use

# Functions timed and counted: (module, name); nested calls count in both (e.g. insert_new and _inserted).
WATCHED = {
    "jobs.infra.tables": ["insert_new", "_inserted", "ensure", "append_quarantine", "version", "exists"],
    "jobs.infra.lineage": ["table_state"],
    "jobs.receval.pipeline": ["_ingest", "_run_chain_stage", "_curate", "_record_unscored", "_quarantine"],
    "jobs.receval.score": ["run"],
    "jobs.receval.ingest": ["run"],
    "jobs.receval.curate": ["run"],
}


def _watch(stats: dict, job_id: Callable[[], int]) -> None:
    import importlib

    for module_name, names in WATCHED.items():
        module = importlib.import_module(module_name)
        for name in names:
            real = getattr(module, name)
            label = f"{module_name.rsplit('.', 1)[-1]}.{name}"

            @functools.wraps(real)
            def watched(*args, _real=real, _label=label, **kwargs):
                jobs, started = job_id(), time.perf_counter()
                try:
                    return _real(*args, **kwargs)
                finally:
                    entry = stats[_label]
                    entry[0] += 1
                    entry[1] += time.perf_counter() - started
                    entry[2] += job_id() - jobs

            setattr(module, name, watched)


def main(argv: list[str] | None = None) -> str:
    from jobs.infra.args import add_settings_arguments

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_settings_arguments(parser)
    parser.add_argument("--results", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args(argv)

    from pipeline_fakes import Fakes

    from jobs.infra.config import SparkSettings
    from jobs.infra.config_layers import load_settings
    from jobs.infra.session import build_session
    from jobs.infra.tracking import JobRun

    # The test session's settings (tests/conftest.py): the pipeline tests' cost is what this bench explains.
    spark = build_session(
        SparkSettings(master="local[2]", shuffle_partitions=2, app_name="pipeline-jobs"),
        extra={"spark.driver.memory": "1g", "spark.sql.adaptive.enabled": "false"},
    )
    scheduler = spark.sparkContext._jsc.sc().dagScheduler()
    stats: dict[str, list] = collections.defaultdict(lambda: [0, 0.0, 0])
    _watch(stats, scheduler.nextJobId)
    from jobs.receval import pipeline  # after _watch: its module-level names are the watched ones

    tmp = Path(tempfile.mkdtemp(prefix="pipeline-jobs-"))
    # The sample lake's GSM-8K chains and bad rows, as the pipeline tests ingest them (not its EB part).
    (tmp / "input").mkdir()
    for name in ("gsm8k_sample.jsonl", "bad_rows.jsonl"):
        shutil.copyfile(ROOT / "tests" / "data" / "sample_lake" / name, tmp / "input" / name)
    overrides = [
        f"paths.lake={tmp / 'lake'}", f"mlflow.tracking_uri=sqlite:///{tmp}/mlruns.db",
        f"mlflow.artifact_location={tmp}/mlartifacts", f"ingest.input={tmp / 'input'}",
        "spark.master=local[2]", "spark.shuffle_partitions=2", "pipeline.batch_chains=12", "pipeline.progress=plain",
        "pipeline.stages=[ingest,steps,scores,aggregate,curate]", "curation.thresholds={intra_entail: 0.3}",
        "curation.quantiles={inter: 0.25}", *args.overrides,
    ]
    settings = load_settings(args.config, overrides, environ={})
    lines = [
        "## Spark jobs per nightly pipeline run, fake stages (bench/pipeline_jobs.py)\n",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f}; sample lake (24 chains), overrides: {' '.join(args.overrides) or 'none'}"
        f"{f', config {args.config}' if args.config else ''}\n",
    ]
    try:
        for night in ("first night", "unchanged rerun"):
            stats.clear()
            jobs, started = scheduler.nextJobId(), time.perf_counter()
            with Fakes().installed():
                pipeline.run(spark, settings, JobRun("pipeline", settings))
            total_jobs, seconds = scheduler.nextJobId() - jobs, time.perf_counter() - started
            lines += [f"\n**{night}**: {total_jobs} Spark jobs, {seconds:.1f} s\n",
                      "\n| function | calls | Spark jobs | seconds |\n|---|---|---|---|\n"]
            for label, (calls, secs, n_jobs) in sorted(stats.items(), key=lambda kv: -kv[1][2]):
                lines.append(f"| `{label}` | {calls} | {n_jobs} | {secs:.1f} |\n")
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    text = "".join(lines)
    print(text)
    with open(args.results, "a") as out:
        out.write("\n" + text)
    return text


if __name__ == "__main__":
    main()
