"""Which Delta tables each job reads and writes: logged to its MLflow run as datasets, printed by --dry-run."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.tracking import JobRun

# job -> (tables read, tables written). `ingest` also reads the files named by ingest.input.
JOB_TABLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "ingest": ((), ("chains", "quarantine")),
    "steps": (("chains",), ("steps", "contexts", "quarantine")),
    "nli_scores": (("steps", "contexts"), ("step_scores", "quarantine")),
    "pvi_scores": (("steps", "contexts"), ("step_scores", "quarantine")),
    "aggregate": (("step_scores",), ("chain_scores",)),
    "curate": (("chain_scores", "step_scores", "chains"), ("curation", "curated", "rejected")),  # step_scores: step_thresholds
    "select_chains": (("chains", "chain_scores"), ()),
    "sample_chains": ((), ("quarantine",)),  # also writes JSONL chains for ingest (sample.output)
    "human_labels": ((), ("chains", "step_labels")),
    "processbench": ((), ("chains", "step_labels", "quarantine")),
    "perturb": ((), ("chains",)),
    "baselines": (("chains",), ("baseline_scores", "step_baseline_scores")),  # the second with baselines.per_step
    "meta_eval": (("chain_scores", "chains", "baseline_scores"), ("meta_eval",)),
    "localise": (("step_scores", "chains", "step_labels"), ("localisation", "localisation_predictions", "quarantine")),
    "cot_eval": ((), ("cot_predictions", "cot_metrics")),
    "export": (("curated", "rejected", "chains"), ()),
    "maintain": ((), ()),
}


def log_tables(spark: SparkSession, settings: Settings, tracked: JobRun, job: str, context: str) -> None:
    """The job's input (before it runs) or output tables (after) with their Delta versions, on its run."""
    reads, writes = JOB_TABLES.get(job, ((), ()))
    for name in reads if context == "input" else writes:
        path = settings.table(name)
        tracked.log_table(name, path, tables.version(spark, path), context)


def table_line(spark: SparkSession, settings: Settings, name: str) -> str:
    """`name: version v, n rows (m under this config hash)` or `name: absent` (reads the Delta log and counts)."""
    path = settings.table(name)
    version = tables.version(spark, path)
    if version is None:
        return f"{name}: absent (would be created) at {path}"
    df = tables.read(spark, path)
    rows = df.count()
    hashed = (
        f", {df.where(F.col('config_hash') == settings.scoring_hash()).count()} under config hash "
        f"{settings.scoring_hash()}"
        if "config_hash" in df.columns else ""
    )
    return f"{name}: version {version}, {rows} rows{hashed} at {path}"


def dry_run(spark: SparkSession, settings: Settings, job: str) -> str:
    """What a job would read and write; reads only the Delta logs and counts rows, writes nothing."""
    reads, writes = JOB_TABLES.get(job, ((), ()))
    lines = [f"[dry-run] {job}: nothing is written; no MLflow run is created"]
    if job == "ingest":
        from jobs.receval.ingest import ingest_files

        files = ingest_files(settings.ingest)
        lines.append(f"  reads {len(files)} input files matching {settings.ingest.input}")
    lines += [f"  reads  {table_line(spark, settings, n)}" for n in reads]
    lines += [f"  writes {table_line(spark, settings, n)}" for n in writes]
    return "\n".join(lines)
