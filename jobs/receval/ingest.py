"""Model-output lake (JSONL, Parquet or Delta) -> `chains` (Delta), bad rows -> `quarantine`.

Every input row is turned into JSON text first, so one validator (plain Python, run in a pandas UDF)
sees every format the same way and can always keep the raw row for the quarantine table.
Mapping sources are `udfs.paths` paths; a fan-out (`outputs[*].text`) makes one candidate chain per element
(its index in metadata `sample_idx`), so one row read may give several candidates. Counts reconcile:
candidates = inserted + already present + quarantined, and candidates = read + fanned_out (the extra chains
fan-out made; a row that fails as a whole is one quarantined candidate).
Producer presets (`ingest.preset`, jobs/receval/ingest_presets.py) add per-file facts (`_file`), the joined
batch input (`_input`) and chat turns (`_chat`) to each row before the mapping reads it.
"""

from __future__ import annotations

import glob
import json
import logging
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, IntegerType, StringType, StructField, StructType

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.config_paths import resolve_path
from jobs.infra.stage import Job, Stage, StageFailed
from jobs.receval.ingest_presets import (
    METADATA_PREFIX,
    STEP_KEYS,
    batch_failure,
    chat_fields,
    split_reasoning,
)
from jobs.receval.settings import IngestSettings
from schemas import chains as C
from schemas import quarantine as Q
from udfs.paths import PathError, Source, compile_source

log = logging.getLogger(__spec__.name)

RAW = "raw"
CTX = "ctx"  # per-row JSON object merged into the row before the mapping reads it (`_file`, `_input`)
POS = "pos"  # a candidate's index among its row's candidates: 0 marks one row read
# read_raw's flag: false when the row's bytes were not valid UTF-8 (make_valid_utf8 put U+FFFD in their place).
# A frame without it (one a caller built) is taken as valid text: a U+FFFD in it is a character.
VALID_UTF8 = "raw_valid_utf8"
REPLACEMENT_CHAR = "\ufffd"  # what make_valid_utf8 leaves for undecodable bytes; also a character in its own right
# validate's record carries the count of texts that held a literal U+FFFD under this key (popped before writing).
REPLACED = "_replacement_chars"
BOM = "\ufeff"
# read_raw's stand-in row for a file Spark cannot read (truncated Parquet): quarantined as unreadable_file.
UNREADABLE = "_receval_unreadable_file"

_VERDICT = StructType(
    [
        StructField("record", StringType(), True),  # normalised chain as JSON (chains schema fields)
        StructField("error", StringType(), True),  # reason kind, e.g. missing_context
        StructField("detail", StringType(), True),
        StructField("chain_id", StringType(), True),
        StructField("replaced", IntegerType(), True),  # texts of a valid row that held a literal U+FFFD
    ]
)
_VALIDATED = ArrayType(_VERDICT)  # one verdict per candidate chain of a row (several with a fan-out)


class RowError(ValueError):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class ReplacementChars:
    """What a U+FFFD in a row's text means. `fault`: the row's bytes were not UTF-8, so it stands for lost bytes
    (undecodable_text). Otherwise it is a character of the text (byte-level BPE models emit it when a generation
    cuts a character), handled per `ingest.replacement_char`; `seen` counts the texts that held one."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.seen = 0

    def __call__(self, field: str, text: str) -> str:
        if REPLACEMENT_CHAR not in text:
            return text
        if self.mode == "fault":
            raise RowError("undecodable_text", f"field {field!r} holds bytes that are not valid UTF-8")
        self.seen += 1
        if self.mode == "quarantine":
            raise RowError("replacement_char", f"field {field!r} holds U+FFFD (replacement_char=quarantine)")
        if self.mode == "strip":
            return text.replace(REPLACEMENT_CHAR, "")
        if self.mode == "strip_end":
            return text.rstrip(REPLACEMENT_CHAR)
        return text


_FAULT = ReplacementChars("fault")  # callers that pass none: every U+FFFD is a fault (never counts)


# Plain dicts, not functools.lru_cache: run as `python -m jobs.receval.ingest` this module is __main__, and
# cloudpickle ships its functions to the executors by value, which an lru_cache wrapper cannot be.
_COMPILED: dict[tuple[tuple[str, str | None], ...], tuple[dict[str, Source | None], str | None]] = {}
_FILE_FACTS: dict[str, dict[str, Any]] = {}


def _compile(items: tuple[tuple[str, str | None], ...]) -> tuple[dict[str, Source | None], str | None]:
    """Once per process and mapping; the config check proved every source parses."""
    if items not in _COMPILED:
        compiled = {key: compile_source(text) if text is not None else None for key, text in items}
        fan_key = next((k for k, src in compiled.items() if src is not None and src.fans_out), None)
        _COMPILED[items] = compiled, fan_key
    return _COMPILED[items]


def _lookup(row: Any, source: Source | None, sample_idx: int = 0) -> Any:
    """The value a mapping source names in `row`; a path the row's shape cannot follow is a RowError."""
    if source is None:
        return None
    try:
        return source.resolve(row, sample_idx)
    except PathError as err:
        raise RowError(err.reason, err.detail) from None


def _text(
    field: str, value: Any, limit: int, required: bool = False, fffd: ReplacementChars | None = None
) -> str | None:
    if value is None:
        if required:
            raise RowError(f"missing_{field}", f"field {field!r} is missing or null")
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise RowError("wrong_type", f"field {field!r} must be text, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise RowError("wrong_type", f"field {field!r} is {value}")
    text = str(value)
    if REPLACEMENT_CHAR in text:  # rare: the call only then
        text = (fffd or _FAULT)(field, text)
    if not _encodable(text):
        raise RowError("undecodable_text", f"field {field!r} holds bytes that are not valid UTF-8")
    if len(text) > limit:
        raise RowError("oversized", f"field {field!r} has {len(text)} characters (limit {limit})")
    if required and not text.strip():
        raise RowError(f"empty_{field}", f"field {field!r} is empty")
    return text


def _encodable(text: str) -> bool:
    """False for lone surrogates (JSON `"\\ud800"`): Arrow cannot carry them as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text_list(
    field: str, value: Any, limit: int, max_items: int, fffd: ReplacementChars | None = None
) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise RowError("wrong_type", f"field {field!r} must be a list of strings, got {type(value).__name__}")
    if len(value) > max_items:
        raise RowError("too_many_steps", f"field {field!r} has {len(value)} items (limit {max_items})")
    items = [_text(f"{field}[{i}]", v, limit, required=False, fffd=fffd) for i, v in enumerate(value)]
    if any(item is None or not item.strip() for item in items):
        raise RowError("empty_step", f"field {field!r} holds an empty or whitespace-only step")
    return [item for item in items if item is not None]


def _steps(
    value: Any, m: Mapping[str, Source | None], limit: int, max_items: int, fffd: ReplacementChars | None = None
) -> tuple[list[str] | None, list[dict[str, Any]] | None]:
    """(step texts, given RCUs or None): steps are texts, or objects that carry their own units (text, premise
    units, conclusion unit, under the mapping's step_text / step_premises / step_conclusion)."""
    if not isinstance(value, list) or not any(isinstance(v, Mapping) for v in value):
        return _text_list("steps", value, limit, max_items, fffd), None
    if not all(isinstance(v, Mapping) for v in value):
        raise RowError("wrong_type", "field 'steps' mixes texts and objects")
    if len(value) > max_items:
        raise RowError("too_many_steps", f"field 'steps' has {len(value)} items (limit {max_items})")
    texts: list[str] = []
    units: list[dict[str, Any]] = []
    for i, obj in enumerate(value):
        text = _text(f"steps[{i}].text", _lookup(obj, m.get("step_text")), limit, fffd=fffd)
        if text is None or not text.strip():
            raise RowError("empty_step", f"step {i} has no text")
        premises = _lookup(obj, m.get("step_premises"))
        if premises is None:
            premises = []
        if not isinstance(premises, list):
            raise RowError("wrong_type", f"step {i}: premises must be a list of strings, got {type(premises).__name__}")
        premises = [_text(f"steps[{i}].premises[{j}]", p, limit, fffd=fffd) for j, p in enumerate(premises)]
        if any(p is None or not p.strip() for p in premises):
            raise RowError("empty_step", f"step {i} holds an empty premise unit")
        conclusion = _text(f"steps[{i}].conclusion", _lookup(obj, m.get("step_conclusion")), limit, fffd=fffd)
        if conclusion is None or not conclusion.strip():
            raise RowError("missing_step_conclusion", f"step {i} gives units but no conclusion unit")
        texts.append(text)
        units.append({C.RCU_PREMISES: premises, C.RCU_CONCLUSION: conclusion})
    return texts, units


def _labels(value: Any) -> dict[str, float] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise RowError("wrong_type", f"field 'labels' must be an object, got {type(value).__name__}")
    out = {}
    for key, v in value.items():
        if isinstance(v, bool):
            v = float(v)
        if not isinstance(v, (int, float)) or not math.isfinite(float(v)):
            raise RowError("invalid_label", f"label {key!r} must be a finite number, got {v!r}")
        out[str(key)] = float(v)
    return out


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise RowError("wrong_type", f"field 'metadata' must be an object, got {type(value).__name__}")
    return {str(k): v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for k, v in value.items()}


def _file_facts(ctx: str) -> dict[str, Any]:
    """A file's `_file` context, parsed once: every row of the file carries the same text (read only)."""
    if ctx not in _FILE_FACTS:
        if len(_FILE_FACTS) > 64:  # one entry per input file; bounded for a long-lived worker
            _FILE_FACTS.clear()
        _FILE_FACTS[ctx] = json.loads(ctx)
    return _FILE_FACTS[ctx]


def _row(raw: str | None, cfg: IngestSettings, ctx: str | None = None) -> dict[str, Any]:
    """Raw text -> the row object the mapping reads, with the preset's reserved keys added."""
    if raw is None or not raw.strip():
        raise RowError("empty_row", "the input row is empty")
    try:
        # A byte-order mark starts many files written on Windows; it is not part of the row.
        row = json.loads(raw.lstrip(BOM))
    except (json.JSONDecodeError, RecursionError) as err:
        raise RowError("not_json", f"row is not valid JSON: {err}") from None
    if not isinstance(row, dict):
        raise RowError("not_object", f"row is JSON {type(row).__name__}, not an object")
    if UNREADABLE in row:
        raise RowError("unreadable_file", f"{row[UNREADABLE]}: {row.get('error')}")
    if ctx:
        try:
            extra = _file_facts(ctx) if ctx.startswith('{"_file"') else json.loads(ctx)
        except (json.JSONDecodeError, RecursionError) as err:
            raise RowError("bad_batch_input", f"the batch input line for this row is not valid JSON: {err}") from None
        row.update(extra)  # row is this call's own parse: no copy needed
    if cfg.preset == "openai_batch":
        failure = batch_failure(row)
        if failure is not None:
            raise RowError("request_failed", f"custom_id {row.get('custom_id')}: {failure}")
        if row.get("_input_count", 1) > 1:
            raise RowError("batch_input_ambiguous", f"custom_id {row.get('custom_id')} has "
                           f"{row['_input_count']} different lines in ingest.batch_input")
        if not isinstance(row.get("_input"), dict):
            raise RowError("batch_input_missing", f"custom_id {row.get('custom_id')!r} has no line in ingest.batch_input")
        body = row["_input"].get("body")
        row["_chat"] = chat_fields(body.get("messages") if isinstance(body, Mapping) else None)
    elif cfg.preset == "chat":
        row["_chat"] = chat_fields(row.get("messages"))
    return row


def _record(
    row: dict[str, Any],
    cfg: IngestSettings,
    m: Mapping[str, Source | None],
    fan: tuple[str, Any, int] | None,
    valid_utf8: bool = True,
) -> dict[str, Any]:
    """One chains record from a row; `fan` = (the fanned-out field, this candidate's value, its index).

    `valid_utf8`: false when the row's bytes were not UTF-8 (a U+FFFD in it then stands for lost bytes). The
    record also holds REPLACED, the number of texts that held a literal U+FFFD (_verdict drops it)."""
    limit = cfg.max_field_chars
    fffd = ReplacementChars(cfg.replacement_char if valid_utf8 else "fault")
    idx = fan[2] if fan else 0

    def get(key: str) -> Any:
        return fan[1] if fan and fan[0] == key else _lookup(row, m.get(key), idx)

    chain_text = get("chain_text")
    answer = get("answer")
    if cfg.reasoning and isinstance(chain_text, str):
        chain_text, after = split_reasoning(chain_text, cfg.reasoning_tags)
        answer = answer if answer is not None else after
    record: dict[str, Any] = {
        C.DATASET: _text("dataset", get("dataset"), limit, fffd=fffd) or cfg.dataset,
        C.QUESTION_ID: _text("question_id", get("question_id"), limit, fffd=fffd),
        C.CONTEXT: _text("context", get("context"), limit, required=True, fffd=fffd),
        C.QUESTION: _text("question", get("question"), limit, fffd=fffd),
        C.STEPS: None,
        C.CHAIN_TEXT: _text("chain_text", chain_text, limit, fffd=fffd),
        C.ANSWER: _text("answer", answer, limit, fffd=fffd),
        C.GOLD_ANSWER: _text("gold_answer", get("gold_answer"), limit, fffd=fffd),
        C.GOLD_STEPS: _text_list("gold_steps", get("gold_steps"), limit, cfg.max_steps, fffd),
        C.LABELS: _labels(get("labels")),
        C.METADATA: _metadata(get("metadata")),
    }
    extra = {}
    for key in m:
        if key.startswith(METADATA_PREFIX) and (value := get(key)) is not None:
            extra[key[len(METADATA_PREFIX) :]] = value
    if cfg.preset:
        extra["producer"] = cfg.preset
    if fan:
        extra["sample_idx"] = idx
    if extra:
        record[C.METADATA] = {**(record[C.METADATA] or {}), **_metadata(extra)}
    step_sources = {k: m.get(k) for k in STEP_KEYS}
    record[C.STEPS], record[C.STEP_RCUS] = _steps(get("steps"), step_sources, limit, cfg.max_steps, fffd)
    if record[C.STEPS] is None and record[C.CHAIN_TEXT] is None:
        raise RowError("missing_chain", "neither steps nor chain text is present")
    if record[C.STEPS] is not None and not record[C.STEPS]:
        raise RowError("empty_chain", "steps is an empty list")
    if record[C.STEPS] is None and not (record[C.CHAIN_TEXT] or "").strip():
        raise RowError("empty_chain", "chain text is empty")
    total = sum(len(s) for s in record[C.STEPS] or []) + len(record[C.CHAIN_TEXT] or "")
    if total > limit:
        raise RowError("oversized", f"the chain has {total} characters (limit {limit})")
    record[C.CONTENT_HASH] = C.content_hash(record)
    given = get("chain_id")
    if given is not None and (isinstance(given, bool) or not isinstance(given, (str, int))):
        raise RowError("wrong_type", f"field 'chain_id' must be text, got {type(given).__name__}")
    chain_id = str(given).strip() if given is not None else ""
    record[C.CHAIN_ID] = chain_id or record[C.CONTENT_HASH]
    record[REPLACED] = fffd.seen
    return record


def validate_chains(
    raw: str | None,
    cfg: IngestSettings,
    ctx: str | None = None,
    compiled: tuple[dict[str, Source | None], str | None] | None = None,
    valid_utf8: bool = True,
) -> list[dict[str, Any] | RowError]:
    """One raw row -> its candidates: a chains record or a RowError each (one, or one per fanned-out element).

    A row-level problem (not JSON, a failed request, a fan-out over an empty list) is one RowError."""
    row = _row(raw, cfg, ctx)
    m, fan_key = compiled if compiled is not None else _compile(tuple(cfg.mapping.items()))
    if fan_key is None:
        return [_record(row, cfg, m, None, valid_utf8)]
    values = _lookup(row, m[fan_key])
    if values is None:
        return [_record(row, cfg, m, None, valid_utf8)]  # the fanned-out field is missing: as any missing field
    out: list[dict[str, Any] | RowError] = []
    for i, value in enumerate(values):
        try:
            out.append(_record(row, cfg, m, (fan_key, value, i), valid_utf8))
        except RowError as err:
            out.append(RowError(err.reason, f"sample {i}: {err.detail}"))
    return out


def validate(raw: str | None, cfg: IngestSettings, ctx: str | None = None, valid_utf8: bool = True) -> dict[str, Any]:
    """One raw row -> its (first) chains record, or a RowError. Pure Python: the contract of ingest."""
    first = validate_chains(raw, cfg, ctx, valid_utf8=valid_utf8)[0]
    if isinstance(first, RowError):
        raise first
    return first


def _verdict(rec: dict[str, Any] | RowError) -> dict[str, Any]:
    if isinstance(rec, RowError):
        return {"record": None, "error": rec.reason, "detail": _safe(rec.detail), "chain_id": None, "replaced": 0}
    replaced = int(rec.pop(REPLACED, 0))
    record = json.dumps(rec, ensure_ascii=False)
    if not _encodable(record):  # a lone surrogate in a label or metadata key
        return {"record": None, "error": "undecodable_text", "detail": "a key holds text that is not valid UTF-8",
                "chain_id": None, "replaced": 0}
    return {"record": record, "error": None, "detail": None, "chain_id": rec[C.CHAIN_ID], "replaced": replaced}


def validate_series(
    raw: pd.Series,
    cfg: IngestSettings,
    on_error: str = "quarantine",
    ctx: pd.Series | None = None,
    valid_utf8: pd.Series | None = None,
) -> pd.Series:
    """Per row, the list of its candidates' verdicts (record, error, detail, chain_id, replaced).

    `on_error` (runtime.on_row_error): what an unexpected exception on one row does; `fail` re-raises.
    `valid_utf8`: read_raw's flag per row (None: every row was valid UTF-8)."""
    contexts = ctx if ctx is not None else [None] * len(raw)
    flags = [True] * len(raw) if valid_utf8 is None else valid_utf8.fillna(True).tolist()
    compiled = _compile(tuple(cfg.mapping.items()))
    out = []
    for text, extra, ok in zip(raw, contexts, flags, strict=True):
        try:
            out.append([_verdict(rec) for rec in validate_chains(text, cfg, extra, compiled, bool(ok))])
        except RowError as err:
            out.append([_verdict(err)])
        except Exception as err:  # a validator bug must quarantine the row, not fail the night
            if on_error == "fail":
                raise
            out.append([_verdict(RowError("validator_error", f"{type(err).__name__}: {err}"))])
    return pd.Series(out, dtype=object)


def _safe(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")


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


def check(raw: DataFrame, cfg: IngestSettings, on_error: str = "quarantine") -> DataFrame:
    """(raw, source[, ctx]) rows -> one row per candidate chain: + `pos` (0 for a row's first) and `v`, the
    validator's verdict (record, error, detail, chain_id, replaced)."""

    def _validate(batch: pd.Series, ctx: pd.Series, valid_utf8: pd.Series) -> pd.Series:
        return validate_series(batch, cfg, on_error, ctx, valid_utf8)

    ctx = F.col(CTX) if CTX in raw.columns else F.lit(None).cast("string")
    flag = F.col(VALID_UTF8) if VALID_UTF8 in raw.columns else F.lit(True)
    verdicts = F.pandas_udf(_validate, _VALIDATED)(F.col(RAW), ctx, flag)
    keep = [c for c in raw.columns if c != CTX]
    return raw.select(*keep, F.posexplode(verdicts).alias(POS, "v"))


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
