"""Model-output lake -> `chains` -> `steps` -> `step_scores` -> `chain_scores` -> `curated`/`rejected`: the nightly job.

Incremental: each stage works only on the chains that reached the stage before it and have no output of
their own under the current config hash (Settings.scoring_hash()); chains a stage could not process are
recorded in `unscored` (their reasons are in `quarantine`) and not retried until `pipeline.rescore` or a
new hash. Idempotent: every write is an insert-only Delta MERGE keyed by chain and config hash, committed
per batch of `pipeline.batch_chains` chains, so a run killed anywhere and started again does only the
missing work and ends with the rows a clean run writes. One MLflow parent run, one child run per stage.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.infra import claim, lineage, maintain, tables
from jobs.infra.config import Settings
from jobs.infra.config_paths import resolve_path
from jobs.infra.maintain import RUN_METADATA
from jobs.infra.progress import Progress, bar_wanted
from jobs.infra.session import session_confs
from jobs.infra.stage import Job, Stage, table_lines
from jobs.infra.tracking import JobRun
from jobs.receval import (
    aggregate,
    chain_tables,
    curate,
    ingest,
    ingest_readers,
    ingest_rows,
    input_files,
    score,
)
from jobs.receval import steps as steps_job
from jobs.receval.night_summary import StageReport, Summary, label_scores, log_summary, print_summary
from schemas import chains as C
from schemas import pipeline as P
from schemas import quarantine as Q
from schemas import step_scores as SS
from schemas import steps as ST

log = logging.getLogger(__spec__.name)

# Tables that hold rows per config hash: what `pipeline.rescore` clears for the current hash.
HASHED_TABLES = ["steps", "contexts", "step_scores", "chain_scores", "unscored", "curation", "curated", "rejected"]
ALL_TABLES = ["chains", "quarantine", "input_files", *HASHED_TABLES]


# -- the stage functions: looked up when a stage runs, so tests patch them (tests/jobs/pipeline_fakes.py) ---
def _steps(chains: DataFrame, settings: Settings, hold: tables.Held) -> tuple[DataFrame, DataFrame, DataFrame]:
    # The three outputs share one spaCy pass, which `hold` keeps until the batch is written.
    s = settings
    return steps_job.transform(chains, s.steps, s.models, s.runtime, s.scoring_hash(), hold)


def _aggregate(step_scores: DataFrame, settings: Settings) -> DataFrame:
    return aggregate.transform(step_scores, settings.aggregate)


@dataclass
class Context:
    spark: SparkSession
    settings: Settings
    run_id: str
    config_hash: str = ""

    def __post_init__(self) -> None:
        self.config_hash = self.settings.scoring_hash()

    def table(self, name: str) -> str:
        return self.settings.table(name)

    def read(self, name: str, schema: Any = None) -> DataFrame:
        return tables.read(self.spark, self.table(name), schema)

    def hashed(self, name: str, schema: Any) -> DataFrame:
        return self.read(name, schema).where(F.col("config_hash") == self.config_hash)


# -- chain stages --------------------------------------------------------------------------------------
def _steps_stage(ctx: Context, ids: DataFrame) -> dict[str, int]:
    chains = ctx.read("chains", C.SCHEMA).join(ids, C.CHAIN_ID, "left_semi")
    # The batch's frames are released when it is committed (or fails): nothing piles up over a night.
    with tables.Held() as hold:
        steps, contexts, bad = _steps(chains, ctx.settings, hold)
        return _write_steps(ctx, steps, contexts, bad)


def _write_steps(ctx: Context, steps: DataFrame, contexts: DataFrame, bad: DataFrame) -> dict[str, int]:
    return {
        "steps": chain_tables.insert(ctx.spark, ctx.settings, "steps", steps),
        "quarantined": _quarantine(ctx, bad),
        # Written last: a context row marks the chain as done with this stage.
        "contexts": chain_tables.insert(ctx.spark, ctx.settings, "contexts", contexts),
    }


def _quarantine(ctx: Context, rows: DataFrame) -> int:
    # An empty MERGE still costs several Spark jobs per batch; most batches quarantine nothing.
    if rows.limit(1).count() == 0:
        return 0
    return chain_tables.insert(ctx.spark, ctx.settings, "quarantine", rows.withColumn(Q.RUN_ID, F.lit(ctx.run_id)))


def _scores_stage(ctx: Context, ids: DataFrame) -> dict[str, int]:
    steps = ctx.hashed("steps", ST.SCHEMA).join(ids, ST.CHAIN_ID, "left_semi")
    contexts = ctx.hashed("contexts", ST.CONTEXTS_SCHEMA).join(ids, ST.CHAIN_ID, "left_semi")
    return score.run(ctx.spark, ctx.settings, steps, contexts, ctx.run_id)


def _aggregate_stage(ctx: Context, ids: DataFrame) -> dict[str, int]:
    step_scores = ctx.hashed("step_scores", SS.SCHEMA).join(ids, SS.CHAIN_ID, "left_semi")
    chain_scores = _aggregate(step_scores, ctx.settings)
    return {"chain_scores": chain_tables.insert(ctx.spark, ctx.settings, "chain_scores", chain_scores)}


@dataclass(frozen=True)
class ChainStage:
    """A stage over chains: ready = chains in `previous`; done = chains in `marker` (both under the hash).
    Its name and tables are those the stage declares (`declared`)."""

    declared: Stage
    previous: str
    marker: str
    process: Callable[[Context, DataFrame], dict[str, int]]
    # Rows the executors count (jobs.infra.progress.counted) for a batch of chain ids; None: one per chain.
    rows: Callable[[Context, DataFrame], int] | None = None
    # The count `process` returns of marker rows it inserted, where the marker has one row per chain: when it
    # equals the batch's chains, none is missing and looking for unscored chains (three Spark jobs) is skipped.
    marked: str | None = None

    @property
    def name(self) -> str:
        return self.declared.name


CHAIN_STAGES = [
    ChainStage(steps_job.STAGE, "chains", "contexts", _steps_stage, marked="contexts"),
    ChainStage(
        score.STAGE, "contexts", "step_scores", _scores_stage,
        # Scoring counts finished steps: a batch's share done is its steps scored over its steps.
        lambda ctx, ids: ctx.hashed("steps", ST.SCHEMA).join(ids, ST.CHAIN_ID, "left_semi").count(),
    ),
    ChainStage(aggregate.STAGE, "step_scores", "chain_scores", _aggregate_stage, marked="chain_scores"),
]
# The ingest stage as the night runs it: it also keeps `input_files`, the fingerprints of the files it has read
# (pipeline._ingest; the standalone ingest job reads every file and keeps none).
INGEST = replace(
    ingest.STAGE, reads=(*ingest.STAGE.reads, "input_files"), writes=(*ingest.STAGE.writes, "input_files")
)
# The night's stages in order; each child run records the tables its stage declares.
PARTS = (INGEST, *(s.declared for s in CHAIN_STAGES), curate.STAGE)


def _chain_ids(ctx: Context, name: str) -> DataFrame:
    df = ctx.read(name)
    if "config_hash" in df.columns:
        df = df.where(F.col("config_hash") == ctx.config_hash)
    return df.select(C.CHAIN_ID).distinct()


def todo(ctx: Context, stage: ChainStage) -> DataFrame:
    """Chain ids ready for the stage and not yet done (nor given up) under the config hash."""
    if not all(tables.exists(ctx.spark, ctx.table(t)) for t in (stage.previous,)):
        return ctx.spark.createDataFrame([], "chain_id string")
    ready = _chain_ids(ctx, stage.previous)
    for name in (stage.marker, "unscored"):
        if tables.exists(ctx.spark, ctx.table(name)):
            ready = ready.join(_chain_ids(ctx, name), C.CHAIN_ID, "left_anti")
    return ready


def _record_unscored(ctx: Context, stage: ChainStage, ids: DataFrame) -> int:
    """Chains of a committed batch with no output: give them up under this hash (reasons: `quarantine`)."""
    done = _chain_ids(ctx, stage.marker) if tables.exists(ctx.spark, ctx.table(stage.marker)) else None
    missing = ids if done is None else ids.join(done, C.CHAIN_ID, "left_anti")
    if missing.limit(1).count() == 0:
        return 0
    rows = missing.select(
        C.CHAIN_ID,
        F.lit(ctx.config_hash).alias(P.CONFIG_HASH),
        F.lit(stage.name).alias(P.STAGE),
        F.lit(ctx.run_id).alias(P.RUN_ID),
        tables.now().alias(P.RECORDED_AT),
    )
    return tables.insert_new(ctx.spark, rows, ctx.table("unscored"), P.UNSCORED_SCHEMA, P.UNSCORED_KEYS)


# -- ingest with input-file bookkeeping ----------------------------------------------------------------
def _ingest(ctx: Context, report: StageReport, tracked: JobRun | None = None) -> None:
    files = input_files.input_fingerprints(ctx.settings)
    seen_path = ctx.table("input_files")
    seen = input_files.seen_fingerprints(ctx.spark, seen_path)
    new = [f for f in files if f not in seen]
    report.counts["input_files"] = len(files)
    report.counts["new_input_files"] = len(new)
    if ctx.settings.pipeline.skip_unchanged_input and not new and tables.exists(ctx.spark, ctx.table("chains")):
        report.skipped = True
        log.info(f"[pipeline] ingest: no new or changed input files in {ctx.settings.ingest.input} "
                 "(under these ingest settings), skipped")
        return
    log.info(f"[pipeline] ingest: {len(new)} new or changed of {len(files)} input files")
    counts, by_reason = ingest.run_with_reasons(ctx.spark, ctx.settings, ctx.run_id)
    report.counts.update({f"rows_{k}": v for k, v in counts.items()})
    report.chains = counts.get("read", 0)
    try:
        # Fails the night (not recorded below, so a rerun reads the files again) past the quarantine limit.
        ingest.check_limit(counts, by_reason, ctx.settings)
    except ingest.QuarantineLimitError:
        if tracked is not None:  # the stage's run ends FAILED with its counts and reasons
            tracked.log_metrics({**report.counts, **{f"quarantined_{k}": v for k, v in by_reason.items()}})
        raise
    # Recorded only after ingest committed: a run killed inside ingest reads the files again.
    input_files.record(ctx.spark, seen_path, new, ctx.run_id)
    log.info(
        f"[pipeline] ingest: read={counts.get('read')} new chains={counts.get('inserted')} "
        f"already present={counts.get('already_present')} quarantined={counts.get('quarantined')}"
    )


def _run_chain_stage(ctx: Context, stage: ChainStage, report: StageReport, tracked: JobRun | None = None) -> None:
    batch = ctx.settings.pipeline.batch_chains
    pending = todo(ctx, stage)
    total = pending.count()
    batches = max(1, math.ceil(total / batch))
    # A chain's batch is a hash of its id, so recomputing `pending` after some batches committed (a cache
    # eviction, a rerun) puts every remaining chain in the same batch as before.
    pending = pending.withColumn("_batch", F.pmod(F.xxhash64(C.CHAIN_ID), F.lit(batches))).persist()
    sizes = dict(pending.groupBy("_batch").count().collect()) if total else {}
    bar = bar_wanted(ctx.settings.pipeline.progress)
    try:
        with Progress(f"pipeline {stage.name}", total, "chains", ctx.settings.log.progress_seconds, ctx.spark,
                      bar, log) as progress:
            for b in range(batches):
                n = int(sizes.get(b, 0))
                if n == 0:
                    continue
                claim.check_held(ctx.settings)  # a run whose claim was taken over writes no further batch
                ids = pending.where(F.col("_batch") == b).select(C.CHAIN_ID)
                progress.expect(n, stage.rows(ctx, ids) if stage.rows is not None else n)
                counts = stage.process(ctx, ids)
                complete = stage.marked is not None and counts.get(stage.marked) == n
                counts["unscored"] = 0 if complete else _record_unscored(ctx, stage, ids)
                for key, value in counts.items():
                    report.counts[key] = report.counts.get(key, 0) + value
                progress.commit(n)
                log.info("[pipeline] %s: batch %d/%d committed, %d/%d chains (%.0f%%), %.3g chains/s", stage.name,
                         b + 1, batches, progress.committed, total, 100.0 * progress.committed / total, progress.rate)
                if tracked is not None:
                    # One step per committed batch: the run shows the night's progress while it runs.
                    tracked.log_metrics({"chains_done": progress.committed, "chains_per_s": progress.rate,
                                         **{f"total.{k}": v for k, v in report.counts.items()}}, step=b + 1)
    finally:
        pending.unpersist()
    report.chains = total


def rescore(ctx: Context) -> dict[str, int]:
    """Delete the current hash's rows from every per-hash table (explicit: `pipeline.rescore=true`)."""
    deleted = {}
    for name in HASHED_TABLES:
        path = ctx.table(name)
        if tables.exists(ctx.spark, path):
            before = tables.read(ctx.spark, path).where(F.col("config_hash") == ctx.config_hash).count()
            if before:
                DeltaTable.forPath(ctx.spark, path).delete(F.col("config_hash") == ctx.config_hash)
            deleted[name] = before
    log.info(f"[pipeline] rescore: deleted rows of config hash {ctx.config_hash}: {deleted}")
    return deleted


def run(spark: SparkSession, settings: Settings, tracked: JobRun) -> Summary:
    """Run the configured stages on what is new; returns the summary (also logged to `tracked`)."""
    from jobs.infra.logs import setup_logging

    setup_logging(settings.log.level)
    ctx = Context(spark, settings, tracked.local_id)
    # Every Delta commit of this run carries its id: `python -m jobs.infra.maintain restore --run ID` finds the
    # versions before a bad night from the tables' own history.
    with session_confs(spark, {RUN_METADATA: ctx.run_id}):
        try:
            return _run(ctx, tracked)
        finally:
            tables.release_table_state(spark)


def _run(ctx: Context, tracked: JobRun) -> Summary:
    spark, settings = ctx.spark, ctx.settings
    run_started = time.time()
    summary = Summary(run_id=ctx.run_id, config_hash=ctx.config_hash)
    summary.rows_before, summary.versions_before = lineage.table_state(spark, settings, ALL_TABLES)
    wanted = settings.pipeline.stages
    log.info(f"[pipeline] config hash {ctx.config_hash}, run {ctx.run_id}, lake {resolve_path(settings.paths.lake)}")
    if settings.pipeline.rescore:
        tracked.log_metrics({f"rescore_deleted.{k}": v for k, v in rescore(ctx).items()})
    bodies: dict[str, Callable[[StageReport, JobRun], None]] = {
        "ingest": lambda r, t: _ingest(ctx, r, t),
        **{s.name: lambda r, t, s=s: _run_chain_stage(ctx, s, r, t) for s in CHAIN_STAGES},
        "curate": lambda r, t: _curate(ctx, r, summary),
    }
    plan = [(stage.name, stage.inputs(settings), stage.outputs(settings), bodies[stage.name])
            for stage in PARTS if stage.name in wanted]

    lineage.log_versions(settings, tracked, summary.versions_before, "input")
    for name, inputs, outputs, body in plan:
        claim.check_held(settings)
        report = StageReport(name)
        child = tracked.child(name)
        child.set_tags({"config_hash": ctx.config_hash, "pipeline_run": ctx.run_id})
        with lineage.recorded(spark, settings, child, inputs, outputs):
            started = time.time()
            body(report, child)
            report.seconds = time.time() - started
        summary.stages.append(report)
        child.log_metrics({**report.counts, "chains": report.chains, "seconds": report.seconds, "chains_per_s": report.rate})
        child.set_tags({"skipped": report.skipped})
        if name == "curate" and summary.curation is not None:
            curate.log_curation(summary.curation, child)
        child.end("FINISHED")
        log.info(f"[pipeline] {name}: done in {report.seconds:.1f} s")

    summary.rows_after, summary.versions_after = lineage.table_state(
        spark, settings, ALL_TABLES, (summary.rows_before, summary.versions_before))
    if "aggregate" in wanted:
        summary.label_scores = label_scores(spark, settings, ctx.config_hash, run_started)
        tracked.log_text("summary/scores_by_label.json", json.dumps(summary.label_scores, indent=1))
    lineage.log_versions(settings, tracked, summary.versions_after, "output", since=summary.versions_before)
    if "report" in wanted:
        from jobs.receval import report as report_mod
        started = time.time()
        summary.report_html = report_mod.build(spark, settings, summary)
        tracked.log_text("report/pipeline_report.html", summary.report_html)
        # Also next to the lake: the report is there when MLflow is off or unreachable.
        summary.report_file = report_mod.save(settings, ctx.run_id, summary.report_html)
        log.info(f"[pipeline] report: {summary.report_file}")
        summary.stages.append(StageReport("report", seconds=time.time() - started))
    log_summary(summary, tracked)
    maintained = maintain.night_done(spark, settings)
    if maintained:
        tracked.log_metrics({f"maintain.files_after.{k}": v["files_after"] for k, v in maintained.items()})
    return summary


def _curate(ctx: Context, report: StageReport, summary: Summary) -> None:
    result = curate.run(ctx.spark, ctx.settings, ctx.run_id)
    summary.curation = result
    report.chains = result.counts["batch"]
    report.counts.update({k: float(v) for k, v in result.counts.items()})
    if not result.counts["reconciled"]:
        raise RuntimeError(f"curation counts do not reconcile: {result.counts}")
    log.info(
        f"[pipeline] curate: {result.counts['batch']} chains, passed {result.counts['run_passed']}, "
        f"failed {result.counts['run_failed']}"
    )


def _body(job: Job) -> Summary:
    summary = run(job.spark, job.settings, job.tracked)
    summary.mlflow_run_id = job.tracked.run_id
    print_summary(summary, job.settings)
    return summary


STAGE = Stage(
    "pipeline", __doc__, _body, section="pipeline", parts=PARTS,
    check=lambda settings, args: prepare(settings),
    plan=lambda spark, settings, args: plan_lines(spark, settings),
)


def main(argv: list[str] | None = None) -> Summary:
    """The nightly job."""
    return STAGE.main(argv)


def _new_chains(spark: SparkSession, settings: Settings) -> int:
    """Chains ingest would add: the input validated and compared with `chains`, nothing written."""
    raw = ingest_rows.check(ingest_readers.read_raw(spark, settings.ingest), settings.ingest, settings.runtime.on_row_error)
    chains, _ = ingest.transform(raw, settings.ingest, settings.runtime.on_row_error)
    existing = tables.read(spark, settings.table("chains"), C.SCHEMA).select(C.CHAIN_ID)
    return chains.join(existing, C.CHAIN_ID, "left_anti").count()


def plan_lines(spark: SparkSession, settings: Settings) -> list[str]:
    """Per stage: what it would read (tables, versions), how many chains it would do, what it would write.

    Reads Delta logs, counts rows and validates the input files; writes nothing and starts no MLflow run.
    A stage's count is what waits for it now plus what the stages before it would hand on tonight.
    """
    ctx = Context(spark, settings, "dry-run")
    wanted = settings.pipeline.stages
    lines = []
    if settings.pipeline.rescore:
        lines.append(f"rescore: would delete every row of config hash {ctx.config_hash} from {', '.join(HASHED_TABLES)}")
    handed_on = 0
    if "ingest" in wanted:
        files = input_files.input_fingerprints(settings)
        seen = input_files.seen_fingerprints(spark, ctx.table("input_files"))
        new = [f for f in files if f not in seen]
        lines.append(f"ingest: reads {len(files)} input files ({len(new)} new or changed) matching {settings.ingest.input}")
        if settings.pipeline.skip_unchanged_input and not new and tables.exists(spark, ctx.table("chains")):
            lines.append("  would skip: no new or changed input files")
        else:
            handed_on = _new_chains(spark, settings)
            lines.append(f"  would add {handed_on} chains")
        lines += table_lines(spark, settings, INGEST)
    for stage in CHAIN_STAGES:
        if stage.name not in wanted:
            continue
        waiting = todo(ctx, stage).count()
        lines.append(f"{stage.name}: would do {waiting + handed_on} chains ({waiting} waiting now, up to "
                     f"{handed_on} from the stages before)")
        lines += table_lines(spark, settings, stage.declared)
        handed_on += waiting
    if "curate" in wanted:
        lines.append(f"curate: would decide up to {handed_on} newly scored chains plus any the current rules "
                     "have not decided")
        lines += table_lines(spark, settings, curate.STAGE)
    if "report" in wanted:
        lines.append("report: would write the nightly report (MLflow artifact and <lake>/_reports/)")
    return lines


def prepare(settings: Settings) -> None:
    """Before the session starts: the tokenizers' own threads off (the executors' worker processes inherit
    the variable), and a configured model that is missing fails with a clear message before any table is
    touched (the fakes of tests/jobs/pipeline_fakes.py patch these checks away with the models)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from jobs.receval import nli_scores, pvi_scores

    # The PVI job's own check first: an untrained g / g' under the paper profile is named before anything else.
    pvi_scores.check_models(settings)
    nli_scores.check_models(settings)


if __name__ == "__main__":
    main()
