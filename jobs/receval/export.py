"""`curated` (or `rejected`) + `chains` -> the selected chains with their text, scores and reasons, as JSON Lines,
Parquet or a Hugging Face `datasets` folder, filtered by dataset and pipeline run; or the `quarantine` table (the
rows ingest and the stages refused: stage, reason, detail, raw row, source), filtered by run.

    python -m jobs.receval.export --set export.format=hf --set export.output=exports/gsm8k_passed \\
        --set 'export.datasets=[gsm8k]'
    python -m jobs.receval.export --set export.table=rejected --set export.run_id=<pipeline run id>
    python -m jobs.receval.export --set export.table=quarantine --set export.output=exports/quarantine

jsonl and parquet write a folder of part files (Spark's; one per partition, read back as one data set by
`spark.read.json`, `pandas.read_parquet`, `datasets.load_dataset("json", data_files=...)`); hf writes
`Dataset.save_to_disk` (`datasets.load_from_disk`), map columns (`labels`) as JSON text.
"""

from __future__ import annotations

import logging
import shutil

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import MapType

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.config_paths import resolve_path
from jobs.infra.stage import Job, Stage
from jobs.receval.settings import ExportSettings
from schemas import chains as C
from schemas import curation as CU
from schemas import quarantine as Q

log = logging.getLogger(__spec__.name)

# From `chains`: what a reader of the exported chains needs to use them without the lake.
TEXT = [C.DATASET, C.QUESTION_ID, C.QUESTION, C.CONTEXT, C.STEPS, C.CHAIN_TEXT, C.ANSWER, C.GOLD_ANSWER, C.LABELS]


def transform(selected: DataFrame, chains: DataFrame, cfg: ExportSettings, config_hash: str) -> DataFrame:
    """One row per selected chain under `config_hash`: id, text, every chain score, the failed rules (empty for
    curated chains), the first flagged step and its metric (curation.step_thresholds), and which run and rules
    decided it. Filtered by `cfg.datasets` and `cfg.run_id`."""
    chosen = selected.where(F.col(CU.CONFIG_HASH) == config_hash)
    if cfg.run_id:
        chosen = chosen.where(F.col(CU.RUN_ID) == cfg.run_id)
    if CU.FAILED_RULES not in chosen.columns:
        chosen = chosen.withColumn(CU.FAILED_RULES, F.array().cast("array<string>"))
    for name, kind in ((CU.FIRST_FLAGGED_STEP, "int"), (CU.FIRST_FLAGGED_METRIC, "string")):
        if name not in chosen.columns:  # a table curated before the flags existed
            chosen = chosen.withColumn(name, F.lit(None).cast(kind))
    text = chains.select(C.CHAIN_ID, *TEXT)
    if cfg.datasets:
        text = text.where(F.col(C.DATASET).isin(cfg.datasets))
    reasons = [CU.FAILED_RULES, CU.FIRST_FLAGGED_STEP, CU.FIRST_FLAGGED_METRIC]
    scores = [c for c in chosen.columns if c not in (CU.CHAIN_ID, *reasons, CU.RUN_ID, CU.CONFIG_HASH,
                                                      CU.RULES_HASH, CU.CURATED_AT)]
    return chosen.join(text, CU.CHAIN_ID).select(
        CU.CHAIN_ID, *TEXT, *scores, *reasons, CU.RUN_ID, CU.CONFIG_HASH, CU.RULES_HASH, CU.CURATED_AT
    )


def quarantine_transform(quarantine: DataFrame, cfg: ExportSettings) -> DataFrame:
    """The quarantine table's rows (every column: stage, reason, detail, chain id, raw row, source, run,
    time), those of `cfg.run_id` only when set, ordered by stage, reason and source."""
    if cfg.datasets:
        # A quarantined row may never have had a dataset (not JSON, no mapping match): no filter can be honest.
        raise ValueError("export.datasets does not apply to export.table=quarantine (its rows have no dataset)")
    rows = quarantine.where(F.col(Q.RUN_ID) == cfg.run_id) if cfg.run_id else quarantine
    return rows.select(*Q.SCHEMA.fieldNames()).orderBy(Q.STAGE, Q.REASON, Q.SOURCE, Q.RAW)


def hf_compatible(df: DataFrame) -> DataFrame:
    """`datasets` has no map type: map columns (`labels`) become JSON text (json.loads gives the dict back)."""
    return df.select(
        *[F.to_json(f.name).alias(f.name) if isinstance(f.dataType, MapType) else F.col(f.name) for f in df.schema]
    )


def write(df: DataFrame, fmt: str, output: str) -> str:
    """Replace `output` with the frame in `fmt`; returns the folder written."""
    folder = resolve_path(output)
    if fmt == "jsonl":
        df.write.mode("overwrite").json(str(folder))
    elif fmt == "parquet":
        df.write.mode("overwrite").parquet(str(folder))
    else:
        import datasets

        # Dataset.from_spark writes Arrow shards through the executors into a cache folder; save_to_disk then
        # lays out the folder load_from_disk reads. The cache goes with the run.
        cache = folder.parent / f".{folder.name}.cache"
        try:
            dataset = datasets.Dataset.from_spark(hf_compatible(df), cache_dir=str(cache))
            if folder.exists():
                shutil.rmtree(folder)
            dataset.save_to_disk(str(folder))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    return str(folder)


def run(spark: SparkSession, settings: Settings) -> dict[str, int | str]:
    cfg = settings.export
    with tables.Held() as hold:
        if cfg.table == "quarantine":
            out = hold(quarantine_transform(tables.read(spark, settings.table("quarantine"), Q.SCHEMA), cfg))
        else:
            schema = CU.CURATED_SCHEMA if cfg.table == "curated" else CU.REJECTED_SCHEMA
            selected = tables.read(spark, settings.table(cfg.table), schema)
            chains = tables.read(spark, settings.table("chains"), C.SCHEMA)
            out = hold(transform(selected, chains, cfg, cfg.config_hash or settings.scoring_hash()))
        rows = out.count()
        folder = write(out, cfg.format, cfg.output)
    log.info("[export] %d %s rows -> %s (%s)", rows, cfg.table, folder, cfg.format)
    return {"rows": rows, "output": folder}


def _body(job: Job) -> dict[str, int | str]:
    spark, settings, tracked = job.spark, job.settings, job.tracked
    result = run(spark, settings)
    tracked.log_metrics({"rows": result["rows"]})
    tracked.set_tags({"export_output": result["output"], "export_format": settings.export.format,
                      "export_table": settings.export.table})
    return result


STAGE = Stage("export", __doc__, _body, reads=("curated", "rejected", "chains"), writes=(), section="export")


def main(argv: list[str] | None = None) -> dict[str, int | str]:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
