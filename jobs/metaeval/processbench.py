"""ProcessBench subset files (the `processbench` dataset) -> `chains` and `step_labels`; bad items -> `quarantine`.

Each item of `<processbench.path>/<subset>.json` becomes the chain `processbench_<subset>:<id>`
(jobs/metaeval/processbench_items.py: steps as given, the problem as context, the last step's `\\boxed` answer,
labels `first_error_index` and `final_answer_correct`) with its `first_error` step labels, or one `quarantine` row
(stage `processbench`) with the reason; a file that is not a JSON list is one quarantined row. Insert-only: chains
by chain_id, step labels by (chain_id, step_idx, label), so a rerun adds nothing; an id already in `chains` with
other content is quarantined (`chain_id_conflict`), never overwritten. Counts reconcile: read = inserted +
already_present + quarantined, where read counts the items and each file that gave none.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.config_paths import resolve_path
from jobs.infra.stage import Job, Stage
from jobs.metaeval import processbench_items as P
from jobs.metaeval.settings import ProcessBenchSettings
from schemas import chains as C
from schemas import quarantine as Q
from schemas import step_labels as SL
from udfs.home import command

log = logging.getLogger(__spec__.name)

QUARANTINE_STAGE = "processbench"
RAW_FILE_CHARS = 2000  # a file that gives no items is quarantined with its beginning, not all of it


@dataclass
class Loaded:
    """What the subset files gave: chain records, their step labels, and quarantine rows (no run id yet)."""

    chains: list[dict[str, Any]] = field(default_factory=list)
    step_labels: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    read: int = 0


def subset_file(cfg: ProcessBenchSettings, subset: str) -> Path:
    return resolve_path(cfg.path) / f"{subset}.json"


def _raw(item: Any) -> str:
    text = json.dumps(item, ensure_ascii=False)
    # An undecodable byte is a lone surrogate here, which UTF-8 cannot carry: its \udcXX escape names the byte.
    return json.dumps(item) if P.undecodable(text) else text


def quarantine_row(reason: str, detail: str, chain_id: str | None, raw: str | None, source: str) -> dict[str, Any]:
    return {Q.STAGE: QUARANTINE_STAGE, Q.REASON: reason, Q.DETAIL: detail, Q.CHAIN_ID: chain_id, Q.RAW: raw, Q.SOURCE: source,
            Q.RUN_ID: None, Q.QUARANTINED_AT: None}


def adapt_file(data: bytes, subset: str, source: str, cfg: ProcessBenchSettings, into: Loaded) -> None:
    """One subset file's bytes -> chains, step labels and quarantine rows added to `into`. No Spark."""
    try:
        items = P.parse_file(data)
    except P.FileRejected as err:
        into.read += 1
        raw = data[:RAW_FILE_CHARS].decode("utf-8", errors="replace")
        into.rejected.append(quarantine_row(err.reason, err.detail, None, raw, source))
        return
    items = items[: cfg.max_items] if cfg.max_items is not None else items
    into.read += len(items)
    for item, got in zip(items, P.adapt_items(items, subset, source, cfg.dataset_prefix), strict=True):
        if isinstance(got, P.Adapted):
            into.chains.append(got.chain)
            into.step_labels += got.step_labels
        else:
            into.rejected.append(quarantine_row(got.reason, got.detail, got.chain_id, _raw(item), source))


def load(cfg: ProcessBenchSettings) -> Loaded:
    """Every configured subset's file, adapted. A subset without its file stops the job: that is a setup
    problem (the optional subsets come only from upstream), not a bad item."""
    out = Loaded()
    for subset in cfg.subsets:
        path = subset_file(cfg, subset)
        if not path.is_file():
            raise FileNotFoundError(
                f"processbench.subsets names {subset!r} but {path} is absent: "
                f"`{command('jobs.infra.data fetch processbench', 'data fetch processbench')}` (OlympiadBench and Omni-MATH come only from upstream, not from a mirror), or leave "
                f"the subset out")
        adapt_file(path.read_bytes(), subset, str(path), cfg, out)
    return out


def run(spark: SparkSession, settings: Settings, run_id: str | None = None) -> tuple[dict[str, int], dict[str, int]]:
    """Write the adapted subsets; returns the reconciled counts and the quarantined items by reason."""
    loaded = load(settings.processbench)
    path = settings.table("chains")
    ids = spark.createDataFrame([(r[C.CHAIN_ID],) for r in loaded.chains], f"{C.CHAIN_ID} string")
    existing = dict(tables.read(spark, path, C.SCHEMA).select(C.CHAIN_ID, C.CONTENT_HASH)
                    .join(ids, C.CHAIN_ID, "left_semi").collect())
    fresh, present, conflicts = [], [], []
    for record in loaded.chains:
        old = existing.get(record[C.CHAIN_ID])
        (fresh if old is None else present if old == record[C.CONTENT_HASH] else conflicts).append(record)
    rejected = loaded.rejected + [
        quarantine_row("chain_id_conflict", f"chain_id {r[C.CHAIN_ID]} is already in `chains` with other content",
                       r[C.CHAIN_ID], _raw({k: v for k, v in r.items() if k != C.INGESTED_AT}), r[C.SOURCE])
        for r in conflicts
    ]
    chains = spark.createDataFrame([{f.name: r.get(f.name) for f in C.SCHEMA.fields} for r in fresh], C.SCHEMA)
    inserted = tables.insert_new(spark, chains.withColumn(C.INGESTED_AT, tables.now()), path, C.SCHEMA,
                                 [C.CHAIN_ID])
    # Step labels of the chains present too: a run stopped between the two writes is completed by the next one.
    kept = {r[C.CHAIN_ID] for r in fresh + present}
    labels = spark.createDataFrame([r for r in loaded.step_labels if r[SL.CHAIN_ID] in kept], SL.SCHEMA)
    labels_inserted = tables.insert_new(spark, labels, settings.table("step_labels"), SL.SCHEMA, SL.KEY)
    if rejected:
        rows = spark.createDataFrame([r | {Q.RUN_ID: run_id} for r in rejected], Q.SCHEMA)
        tables.append_quarantine(spark, settings, rows.withColumn(Q.QUARANTINED_AT, tables.now()))
    by_reason = dict(Counter(r[Q.REASON] for r in rejected))
    counts = {"read": loaded.read, "inserted": inserted, "already_present": len(present),
              "quarantined": len(rejected), "step_labels_inserted": labels_inserted}
    counts["reconciled"] = int(counts["read"] == inserted + len(present) + len(rejected))
    for dataset, n in sorted(Counter(r[C.DATASET] for r in fresh + present).items()):
        counts[f"chains.{dataset}"] = n
        counts[f"erroneous.{dataset}"] = sum(1 for r in fresh + present if r[C.DATASET] == dataset
                                             and r[C.LABELS][SL.FIRST_ERROR_INDEX] != -1)
    return counts, by_reason


def _body(job: Job) -> dict[str, int]:
    spark, settings, tracked = job.spark, job.settings, job.tracked
    counts, by_reason = run(spark, settings, tracked.local_id)
    tracked.log_metrics({f"rows_{k}": v for k, v in counts.items()})
    tracked.log_metrics({f"quarantined_{k}": v for k, v in by_reason.items()})
    log.info(f"[processbench] read={counts['read']} inserted={counts['inserted']} "
             f"already_present={counts['already_present']} quarantined={counts['quarantined']} {by_reason} "
             f"step_labels_inserted={counts['step_labels_inserted']} -> {settings.table('chains')}")
    if not counts["reconciled"]:  # inside the run: it ends FAILED, with the counts above logged
        raise RuntimeError(f"processbench counts do not reconcile: {counts}")
    return counts


STAGE = Stage("processbench", __doc__, _body, writes=("chains", "step_labels", "quarantine"), section="processbench")


def main(argv: list[str] | None = None) -> dict[str, int]:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
