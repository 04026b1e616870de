"""Ingest's row validator: one raw row (JSON text) -> its candidate `chains` records, or a RowError each.

Plain Python (`validate`, `validate_chains`; pandas for the batch form, `validate_series`), run over a frame of raw
rows (RAW, CTX, VALID_UTF8: what jobs/receval/ingest_readers.py reads) in a pandas UDF by `check`: the mapping
(`ingest.mapping`, `udfs.paths` sources) reads the row, a fan-out (`outputs[*].text`) makes one candidate per
element, every text is checked (type, size, U+FFFD per `ingest.replacement_char`, lone surrogates) and the record
gets its content hash and chain id. The producer presets' reserved keys (`_file`, `_input`, `_chat`,
jobs/receval/ingest_presets.py) are merged into the row before the mapping reads it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, IntegerType, StringType, StructField, StructType

from jobs.receval.ingest_presets import (
    METADATA_PREFIX,
    STEP_KEYS,
    batch_failure,
    chat_fields,
    split_reasoning,
)
from jobs.receval.settings import IngestSettings
from schemas import chains as C
from udfs.paths import PathError, Source, compile_source

# The raw rows' columns (ingest_readers.read_raw makes them, api.raw_rows too): the row's JSON text, the per-row
# context and the UTF-8 flag; `check` adds POS.
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


# Plain dicts, not functools.lru_cache: cloudpickle ships the functions of a module run as __main__ by value,
# which an lru_cache wrapper cannot be (these lived in jobs.receval.ingest, run as `python -m`; kept safe either way).
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
