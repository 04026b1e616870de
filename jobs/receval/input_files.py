"""`input_files`: the fingerprints of the input files the pipeline's ingest has read, so a night over unchanged
input skips ingest (`pipeline.skip_unchanged_input`). A fingerprint is (path, size, mtime_ns, ingest_hash):
a file changed, or read under other ingest settings (a fixed mapping), is read again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.lineage import file_fingerprint
from jobs.receval import ingest_readers
from schemas import pipeline as P

Fingerprint = tuple[str, int, int, str]


def ingest_hash(settings: Settings) -> str:
    """Hash of every ingest setting that shapes the rows read: the whole ingest section but `input` (so a setting
    added to it later is covered too). Part of each input file's fingerprint: a fixed mapping reads a file again."""
    keyed = settings.ingest.model_dump(mode="json", exclude={"input"})
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]


def input_fingerprints(settings: Settings) -> list[Fingerprint]:
    """(path, size, mtime_ns, ingest_hash) of every input file; a Delta input table by its latest log entry, a
    datasets folder by its files' total size and latest change (jobs.infra.lineage.file_fingerprint). The OpenAI
    batch input file counts as an input too: a new one changes the chains of the same output file."""
    paths = ingest_readers.ingest_files(settings.ingest)
    if settings.ingest.batch_input:
        paths += ingest_readers.input_files(settings.ingest.batch_input)
    shaped = ingest_hash(settings)
    return [(str(Path(path)), *file_fingerprint(path), shaped) for path in paths]


def seen_fingerprints(spark: SparkSession, path: str) -> set[tuple[str, int, int, str | None]]:
    """The fingerprints in `input_files`; a table recorded before ingest_hash existed has none (null): its files
    are read once more under the current settings (ingest is idempotent) and recorded with their hash."""
    seen = tables.read(spark, path, P.INPUT_FILES_SCHEMA)
    shaped = F.col(P.INGEST_HASH) if P.INGEST_HASH in seen.columns else F.lit(None).cast("string")
    return {(r[0], r[1], r[2], r[3]) for r in seen.select(P.PATH, P.SIZE, P.MODIFIED_NS, shaped).collect()}


def record(spark: SparkSession, path: str, new: Sequence[Fingerprint], run_id: str) -> int:
    """Insert the fingerprints of files this run has read (insert-only: a rerun adds nothing); the pipeline calls
    it only after ingest committed, so a run killed inside ingest reads the files again."""
    rows = spark.createDataFrame(
        [(p, size, mtime, run_id, shaped) for p, size, mtime, shaped in new],
        "path string, size long, modified_ns long, run_id string, ingest_hash string",
    ).withColumn(P.SEEN_AT, tables.now())
    return tables.insert_new(spark, rows, path, P.INPUT_FILES_SCHEMA, P.INPUT_FILES_KEYS)
