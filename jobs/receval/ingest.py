"""Model-output lake (JSONL, Parquet or Delta) -> `chains` (Delta), bad rows -> `quarantine`.

Every input row is turned into JSON text first, so one validator (plain Python, run in a pandas UDF)
sees every format the same way and can always keep the raw row for the quarantine table.
Mapping sources are `udfs.paths` paths; a fan-out (`outputs[*].text`) makes one candidate chain per element
(its index in metadata `sample_idx`), so one row read may give several candidates. Counts reconcile:
candidates = inserted + already present + quarantined, and candidates = read + fanned_out (the extra chains
fan-out made; a row that fails as a whole is one quarantined candidate).
Producer presets (`ingest.preset`, jobs/receval/ingest_presets.py) add per-file facts (`_file`), the joined
batch input (`_input`) and chat turns (`_chat`) to each row before the mapping reads it.
The readers are jobs/receval/ingest_readers.py, the row validator (and `check`, the pandas UDF that runs it over
the rows read) jobs/receval/ingest_rows.py; this module is the stage: the valid and the bad rows, the writes, the
counts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.stage import Job, Stage, StageFailed
from jobs.receval.ingest_readers import ingest_files, read_raw
from jobs.receval.ingest_rows import POS, RAW, check
from jobs.receval.settings import IngestSettings
from schemas import chains as C
from schemas import quarantine as Q

log = logging.getLogger(__spec__.name)


def transform(
    raw: DataFrame, cfg: IngestSettings, on_error: str = "quarantine"
) -> tuple[DataFrame, DataFrame]:
    """(raw, source) rows -> (valid chains, rejected rows with reason). Pure: no reads or writes.

    `raw` may come already `check`ed (run caches that, so the validator runs once per row).
    """
    checked = raw if "v" in raw.columns else check(raw, cfg, on_error)
    good = checked.where(F.col("v.error").isNull())
    bad = checked.where(F.col("v.error").isNotNull())
    record_schema = StructType([f for f in C.SCHEMA.fields if f.name not in (C.SOURCE, C.INGESTED_AT)])
    parsed = good.select(
        F.from_json("v.record", record_schema).alias("r"), F.col(RAW), F.col("source")
    ).select("r.*", RAW, "source")
    # Duplicate ids in one input: the first by content hash wins, the rest are quarantined.
    w = Window.partitionBy(C.CHAIN_ID).orderBy(C.CONTENT_HASH, "source", RAW)
    ranked = parsed.withColumn("_rank", F.row_number().over(w)).withColumn(
        "_distinct", F.size(F.collect_set(C.CONTENT_HASH).over(Window.partitionBy(C.CHAIN_ID)))
    )
    chains = ranked.where(F.col("_rank") == 1).select(
        *[c for c in record_schema.fieldNames()],
        F.col("source").alias(C.SOURCE),
        tables.now().alias(C.INGESTED_AT),
    )
    dups = ranked.where(F.col("_rank") > 1)
    dup_rows = tables.quarantine_rows(
        dups,
        "ingest",
        F.when(F.col("_distinct") > 1, "duplicate_chain_id_conflict").otherwise("duplicate_row"),
        F.concat(F.lit("chain_id "), F.col(C.CHAIN_ID), F.lit(" appears more than once in the input")),
        chain_id=F.col(C.CHAIN_ID),
        raw=F.col(RAW),
        source=F.col("source"),
    )
    bad_rows = tables.quarantine_rows(
        bad, "ingest", F.col("v.error"), F.col("v.detail"), raw=F.col(RAW), source=F.col("source")
    )
    return tables.conform(chains, C.SCHEMA), bad_rows.unionByName(dup_rows)


class QuarantineLimitError(StageFailed):
    """Ingest quarantined at least `ingest.max_quarantined_share` of the rows it read (they are in `quarantine`).
    Expected, and logged where raised: a stage's command line ends with one line, no traceback (StageFailed)."""


def run(spark: SparkSession, settings: Settings, run_id: str | None = None) -> dict[str, int]:
    """Ingest into the lake; returns the reconciled counts."""
    return run_with_reasons(spark, settings, run_id)[0]


def run_with_reasons(
    spark: SparkSession, settings: Settings, run_id: str | None = None
) -> tuple[dict[str, int], dict[str, int]]:
    """Ingest into the lake; returns the reconciled counts and this run's quarantined rows by reason (rows a
    rerun finds already in `quarantine` included, so the reasons add up to counts["quarantined"]).

    counts["replacement_char"]: valid rows whose text held a literal U+FFFD (kept or stripped, per
    ingest.replacement_char); under `quarantine` those rows are in the reasons as replacement_char instead.
    """
    # Cached after validation: the good and the bad branch (and every count) reuse one verdict per row.
    with tables.Held() as hold:
        raw = hold(check(read_raw(spark, settings.ingest), settings.ingest, settings.runtime.on_row_error))
        read = raw.agg(
            F.count(F.lit(1)).alias("n"),
            F.sum(F.when(F.col(POS) == 0, 1).otherwise(0)).alias("rows"),
            F.sum(F.when(F.col("v.error").isNull() & (F.col("v.replaced") > 0), 1).otherwise(0)).alias("fffd"),
        ).first()
        n_candidates, n_read = int(read["n"]), int(read["rows"] or 0)
        chains, rejected = transform(raw, settings.ingest, settings.runtime.on_row_error)
        chains = hold(chains)
        path = settings.table("chains")
        existing = tables.read(spark, path, C.SCHEMA).select(C.CHAIN_ID, F.col(C.CONTENT_HASH).alias("_old"))
        # Same id already in the table with other content: never overwrite a scored chain silently.
        joined = chains.join(existing, C.CHAIN_ID, "left")
        conflicts = joined.where(F.col("_old").isNotNull() & (F.col("_old") != F.col(C.CONTENT_HASH)))
        present = joined.where(F.col("_old").isNotNull() & (F.col("_old") == F.col(C.CONTENT_HASH)))
        fresh = joined.where(F.col("_old").isNull()).drop("_old")
        conflict_rows = tables.quarantine_rows(
            conflicts.drop("_old"),
            "ingest",
            "chain_id_conflict",
            F.concat(F.lit("chain_id "), F.col(C.CHAIN_ID), F.lit(" is already in `chains` with other content")),
            chain_id=F.col(C.CHAIN_ID),
            source=F.col(C.SOURCE),
            run_id=run_id,
        )
        rejected = rejected.withColumn(Q.RUN_ID, F.lit(run_id).cast("string")).unionByName(conflict_rows)
        rejected = hold(rejected)
        by_reason = {r[Q.REASON]: int(r["count"]) for r in rejected.groupBy(Q.REASON).count().collect()}
        counts = {
            "read": n_read,
            "candidates": n_candidates,
            "fanned_out": n_candidates - n_read,
            "valid": chains.count(),
            "already_present": present.count(),
            "quarantined": sum(by_reason.values()),
            "replacement_char": int(read["fffd"] or 0),
        }
        counts["inserted"] = tables.insert_new(spark, fresh, path, C.SCHEMA, C.KEYS)
        tables.append_quarantine(spark, settings, rejected)
        counts["reconciled"] = int(
            counts["candidates"] == counts["inserted"] + counts["already_present"] + counts["quarantined"]
        )
    return counts, by_reason


def quarantine_limit_error(counts: Mapping[str, int], by_reason: Mapping[str, int], limit: float) -> str | None:
    """Why the run must fail (quarantined / candidate chains reached `limit`, ingest.max_quarantined_share), else
    None. Candidates are the chains the rows read gave (one per row, several where the mapping fans out).

    A run that read no rows has no share and does not fail here. The message names the top reasons.
    """
    rows = counts.get("read", 0)
    read, quarantined = counts.get("candidates", rows), counts.get("quarantined", 0)
    if read <= 0 or quarantined / read < limit:
        return None
    top = sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    reasons_text = ", ".join(f"{reason}={n}" for reason, n in top)
    what = "rows read" if read == rows else f"chains from {rows} rows read"
    return (
        f"ingest quarantined {quarantined} of {read} {what} ({quarantined / read:.0%}), at or over "
        f"ingest.max_quarantined_share={limit:g}; top reasons: {reasons_text}. The rows are in the quarantine "
        "table (python -m jobs.receval.export --set export.table=quarantine); check ingest.mapping and the input."
    )


def check_limit(counts: Mapping[str, int], by_reason: Mapping[str, int], settings: Settings) -> None:
    """Raise when the counts do not reconcile or the quarantined share reached ingest.max_quarantined_share
    (called after every row was written: nothing is lost)."""
    if not counts["reconciled"]:
        raise RuntimeError(f"ingest counts do not reconcile: {counts}")
    problem = quarantine_limit_error(counts, by_reason, settings.ingest.max_quarantined_share)
    if problem:
        log.error(f"[ingest] {problem}")
        raise QuarantineLimitError(problem)


def reasons(spark: SparkSession, settings: Settings, run_id: str | None = None) -> dict[str, int]:
    q = tables.read(spark, settings.table("quarantine"), Q.SCHEMA).where(F.col(Q.STAGE) == "ingest")
    if run_id:
        q = q.where(F.col(Q.RUN_ID) == run_id)
    return {r[Q.REASON]: r["count"] for r in q.groupBy(Q.REASON).count().collect()}


def _body(job: Job) -> dict[str, int]:
    spark, settings, tracked = job.spark, job.settings, job.tracked
    before = tables.version(spark, settings.table("chains"))
    counts, by_reason = run_with_reasons(spark, settings, tracked.local_id)
    after = tables.version(spark, settings.table("chains"))
    tracked.log_metrics({f"rows_{k}": v for k, v in counts.items()})
    tracked.log_metrics({f"quarantined_{k}": v for k, v in by_reason.items()})
    tracked.set_tags(
        {"input": settings.ingest.input, "chains_version_before": before, "chains_version_after": after}
    )
    log.info(
        f"[ingest] read={counts['read']} candidates={counts['candidates']} inserted={counts['inserted']} "
        f"already_present={counts['already_present']} quarantined={counts['quarantined']} "
        f"replacement_char={counts['replacement_char']} -> {settings.table('chains')} (version {after})"
    )
    check_limit(counts, by_reason, settings)  # inside the run: it ends FAILED, with the counts above logged
    return counts


def _plan(spark: SparkSession | None, settings: Settings, args: Any) -> list[str]:
    return [f"  reads {len(ingest_files(settings.ingest))} input files matching {settings.ingest.input}"]


STAGE = Stage("ingest", __doc__, _body, writes=("chains", "quarantine"), section="ingest", plan=_plan)


def main(argv: list[str] | None = None) -> dict[str, int]:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
