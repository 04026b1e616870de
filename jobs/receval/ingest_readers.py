"""Ingest's readers: the input (`ingest.input`) -> one frame of raw rows (RAW JSON text, VALID_UTF8, source, CTX).

By format (`ingest.format`, or auto by what the path is): JSONL/JSON text lines, Parquet files, a Delta table, a
`datasets` save_to_disk folder (read on the executors, `read_hf_dataset`); a file Spark cannot read becomes one
stand-in row that the validator quarantines (unreadable_file). The producer presets' per-file and per-row context
is attached here: lm_eval's `_file` facts (`lm_eval_file`), openai_batch's `_input` (the joined input line).
"""

from __future__ import annotations

import glob
import json
import logging
import math
import re
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.infra.config_paths import resolve_path
from jobs.receval.ingest_rows import CTX, RAW, UNREADABLE, VALID_UTF8
from jobs.receval.settings import IngestSettings

log = logging.getLogger(__spec__.name)


def input_files(pattern: str) -> list[str]:
    base = resolve_path(pattern)
    if base.is_dir():
        if (base / "_delta_log").is_dir() or _is_hf_dataset(base):
            return [str(base)]
        if (base / "dataset_dict.json").is_file():  # a DatasetDict: one dataset folder per split
            return sorted(str(p) for p in base.iterdir() if _is_hf_dataset(p))
        return sorted(str(p) for p in base.rglob("*") if p.suffix in {".jsonl", ".json", ".parquet"})
    return sorted(glob.glob(str(base)))


def ingest_files(cfg: IngestSettings) -> list[str]:
    """The files ingest reads: `input_files`, and for lm_eval only the samples files (an lm-eval output folder
    also holds its results_*.json, which are no chains)."""
    files = input_files(cfg.input)
    if cfg.preset == "lm_eval":
        files = [f for f in files if Path(f).name.startswith("samples_") and f.endswith(".jsonl")]
    return files


def _is_hf_dataset(path: Path) -> bool:
    """A `datasets` save_to_disk folder: state.json naming its Arrow files."""
    return (path / "state.json").is_file() and (path / "dataset_info.json").is_file()


def _format(path: str, cfg: IngestSettings) -> str:
    if cfg.format != "auto":
        return cfg.format
    if Path(path, "_delta_log").is_dir():
        return "delta"
    if _is_hf_dataset(Path(path)):
        return "hf_datasets"
    return "parquet" if path.endswith(".parquet") else "jsonl"


def read_hf_dataset(spark: SparkSession, folder: str) -> DataFrame:
    """A save_to_disk folder -> (raw JSON text) rows, read on the executors, one task per Arrow file.

    Spark has no reader for Arrow IPC streams (what `datasets` writes), and Dataset.load_from_disk would bring
    every row through the driver; so a frame of the file names is mapped to rows with pyarrow's stream reader,
    one record batch at a time (a memory-mapped file, as `datasets` itself reads it)."""
    state = json.loads(Path(folder, "state.json").read_text())
    files = [str(Path(folder, f["filename"])) for f in state.get("_data_files", [])]
    if not files:
        raise ValueError(f"{folder}: state.json names no Arrow files")

    def rows(batches: Any) -> Any:
        import pyarrow as pa

        for batch in batches:
            for name in batch.column("file").to_pylist():
                with pa.memory_map(name) as source:
                    for records in pa.ipc.open_stream(source):
                        texts = [json.dumps(r, ensure_ascii=False, default=str) for r in records.to_pylist()]
                        yield pa.RecordBatch.from_arrays([pa.array(texts, pa.string())], names=[RAW])

    names = spark.createDataFrame([(f,) for f in files], "file string").repartition(len(files))
    return names.mapInArrow(rows, f"{RAW} string")


_LM_EVAL_SAMPLES = re.compile(r"^samples_(?P<task>.+)_(?P<run>\d{4}-\d{2}-\d{2}T[0-9.\-]+)\.jsonl$")


def lm_eval_file(path: str) -> dict[str, Any]:
    """`_file` of an lm-evaluation-harness samples file: task and run from the name (EvaluationTracker writes
    samples_<task>_<date_id>.jsonl beside results_<date_id>.json), model from that results file's model_name
    (else config.model); another results_*.json of the folder when the run's own is missing."""
    p = Path(path)
    match = _LM_EVAL_SAMPLES.match(p.name)
    if match is None:
        log.warning(f"[ingest] {path}: not named samples_<task>_<date>.jsonl; task and run are unknown")
        return {}
    facts: dict[str, Any] = {"task": match["task"], "run": match["run"]}
    results = p.with_name(f"results_{match['run']}.json")
    if not results.is_file():
        others = sorted(p.parent.glob("results_*.json"))
        results = others[-1] if others else results
    if results.is_file():
        try:
            doc = json.loads(results.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            log.warning(f"[ingest] {results}: unreadable ({err}); the model is unknown")
            doc = {}
        config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
        model = doc.get("model_name") or config.get("model")
        if model is not None:
            facts["model"] = str(model)
    return facts


def _file_context(path: str, cfg: IngestSettings) -> str | None:
    if cfg.preset == "lm_eval" and path.endswith(".jsonl"):
        return json.dumps({"_file": lm_eval_file(path)}, ensure_ascii=False)
    return None


def _join_batch_input(spark: SparkSession, out: DataFrame, cfg: IngestSettings) -> DataFrame:
    """OpenAI batch output rows + `ctx` {"_input": the input line with the same custom_id}; an id that two
    different input lines share gives `_input_count` (quarantined: which request was it?)."""
    files = input_files(cfg.batch_input or "")
    if not files:
        raise FileNotFoundError(f"ingest.batch_input={cfg.batch_input!r} matches no file")
    lines = spark.read.text(files).select(F.make_valid_utf8(F.col("value")).alias("_in"))
    lines = lines.where(F.trim("_in") != "").withColumn("_cid", F.get_json_object("_in", "$.custom_id"))
    by_id = lines.groupBy("_cid").agg(F.min("_in").alias("_in"), F.countDistinct("_in").alias("_n"))
    joined = out.withColumn("_cid", F.get_json_object(RAW, "$.custom_id")).join(by_id, "_cid", "left")
    ctx = F.when(F.col("_n") > 1, F.concat(F.lit('{"_input_count": '), F.col("_n").cast("string"), F.lit("}")))
    ctx = ctx.when(F.col("_in").isNotNull(), F.concat(F.lit('{"_input": '), F.col("_in"), F.lit("}")))
    return joined.select(RAW, VALID_UTF8, "source", ctx.alias(CTX))


def read_raw(spark: SparkSession, cfg: IngestSettings) -> DataFrame:
    """Input -> (raw JSON text, valid UTF-8 flag, source, ctx). Unreadable files become a quarantine row, not a crash.

    Parquet, Delta and datasets rows have no bytes of their own: their JSON text is checked the same way, so a
    U+FFFD in a string column is a character and follows `ingest.replacement_char`."""
    files = ingest_files(cfg)
    if not files:
        kinds = "samples_*.jsonl file" if cfg.preset == "lm_eval" else ".jsonl, .json or .parquet file, no Delta table"
        raise FileNotFoundError(
            f"ingest.input={cfg.input!r} matches no {kinds} and no datasets folder (looked at {resolve_path(cfg.input)})"
        )
    parts: list[DataFrame] = []
    empty = spark.createDataFrame([], f"{RAW} string, {VALID_UTF8} boolean, source string, {CTX} string")
    for path in files:
        fmt = _format(path, cfg)
        try:
            if fmt == "jsonl":
                df = spark.read.text(path).select(F.col("value").alias(RAW))
            elif fmt == "hf_datasets":
                df = read_hf_dataset(spark, path)
            else:
                if fmt == "parquet":
                    # A footer check here spares Spark a job that fails (and is retried) on every executor.
                    import pyarrow.parquet as pq

                    pq.read_metadata(path)
                df = spark.read.format("delta" if fmt == "delta" else "parquet").load(path)
                df = df.select(F.to_json(F.struct(*[F.col(f"`{c}`") for c in df.columns])).alias(RAW))
            df = df.where(F.trim(F.col(RAW)) != "") if fmt == "jsonl" else df
            # Spark keeps invalid UTF-8 bytes as they are and Arrow then fails the whole batch; U+FFFD in their
            # place lets the validator quarantine just that row, and the flag tells those U+FFFD from the
            # character itself (valid text a model wrote).
            df = df.select(F.make_valid_utf8(F.col(RAW)).alias(RAW), F.is_valid_utf8(F.col(RAW)).alias(VALID_UTF8))
            df.schema  # noqa: B018 - forces the footer read so a corrupt file fails here
            context = _file_context(path, cfg)
            parts.append(df.withColumn("source", F.lit(path)).withColumn(CTX, F.lit(context).cast("string")))
        except Exception as err:  # a truncated Parquet file, an unreadable folder
            # The error's class, not its text: the text names task ids, and the quarantine row must be
            # the same on a rerun so it is not added twice.
            condition = getattr(err, "getCondition", None)
            kind = (condition() if callable(condition) else None) or type(err).__name__
            msg = json.dumps({UNREADABLE: path, "error": kind})
            parts.append(spark.createDataFrame([(msg, True, path, None)], empty.schema))
    out = empty
    for part in parts:
        out = out.unionByName(part)
    if cfg.preset == "openai_batch":
        out = _join_batch_input(spark, out, cfg)
    # One partition per small file would make every later stage run a task (and a Python worker
    # round trip) per file; big files keep their splits (about one per 64 MB).
    size = sum(_size(p) for p in files)
    target = max(spark.sparkContext.defaultParallelism, math.ceil(size / (64 << 20)))
    return out.coalesce(target)


def _size(path: str) -> int:
    p = Path(path)
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size
