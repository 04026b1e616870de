"""Issue 34, the traps a new user met feeding an lm-evaluation-harness samples file through ingest: a partial
mapping override, a silent all-quarantined run, a literal U+FFFD, a skipped rerun, and no quarantine export.

Pure tests first (config, validator, limit); then one module-scoped scenario of a few ingest-only runs.
"""

from __future__ import annotations

import json
import runpy
import sys
import warnings
from dataclasses import dataclass

import pytest
from conftest import SAMPLE_LAKE, folder_settings, job_args
from pyspark.sql import functions as F
from pyspark.sql.types import StructType
from pyspark.testing import assertDataFrameEqual

from jobs.infra import tables
from jobs.infra.config import ConfigError, Settings
from jobs.infra.config_describe import describe
from jobs.infra.config_layers import load_settings, load_settings_with_sources
from jobs.receval import export, ingest, input_files, pipeline
from jobs.receval.ingest_rows import REPLACED, RowError, validate
from jobs.receval.night_summary import StageReport
from jobs.receval.settings import IngestSettings
from schemas import chains as C
from schemas import pipeline as P
from schemas import quarantine as Q

DEFAULTS = IngestSettings().mapping
FFFD = "\ufffd"


# -- trap 1: one mapping key used to replace the whole mapping ------------------------------------------------
def test_mapping_override_of_one_key_keeps_the_others_and_print_config_shows_them(tmp_path):
    settings, sources = load_settings_with_sources(overrides=["ingest.mapping.context=doc.question"], environ={})
    assert settings.ingest.mapping == {**DEFAULTS, "context": "doc.question"}
    printed = describe(settings, sources).splitlines()
    assert any(line.startswith("ingest.mapping.context: doc.question ") and "--set" in line for line in printed)
    assert any(line.startswith("ingest.mapping.chain_text: chain ") for line in printed)
    # A config file merges the same way; null removes a field (it then reads as absent).
    config = tmp_path / "c.yaml"
    config.write_text("ingest:\n  mapping:\n    chain_text: response\n    labels: null\n")
    from_file, _ = load_settings_with_sources(config, overrides=["ingest.mapping.metadata=null"], environ={})
    want = {k: v for k, v in DEFAULTS.items() if k not in ("labels", "metadata")} | {"chain_text": "response"}
    # (Removed, or kept as null: both read as absent.)
    assert {k: v for k, v in from_file.ingest.mapping.items() if v is not None} == want
    # The validator sees the merged mapping: the other fields still read from their default names.
    rec = validate(json.dumps({"chain_id": "x1", "doc": {"question": "Q?"}, "chain": "A. So B.", "answer": "B"}),
                   settings.ingest)
    assert (rec[C.CHAIN_ID], rec[C.CONTEXT], rec[C.CHAIN_TEXT], rec[C.ANSWER]) == ("x1", "Q?", "A. So B.", "B")


# -- trap 2: a run that quarantines every row exited 0 --------------------------------------------------------
def test_max_quarantined_share_is_a_share_in_zero_one():
    assert load_settings(environ={}).ingest.max_quarantined_share == 1.0
    quarter = load_settings(overrides=["ingest.max_quarantined_share=0.25"], environ={})
    assert quarter.ingest.max_quarantined_share == 0.25
    for share, problem in (("0", "greater than 0"), ("-0.1", "greater than 0"), ("1.01", "less than or equal to 1")):
        with pytest.raises(ConfigError, match=f"ingest.max_quarantined_share: Input should be {problem}"):
            load_settings(overrides=[f"ingest.max_quarantined_share={share}"], environ={})


def test_quarantine_limit_is_reached_at_the_share_and_names_the_top_reasons():
    every = {"read": 8, "quarantined": 8}
    reasons = {"missing_context": 5, "not_json": 2, "wrong_type": 1}
    message = ingest.quarantine_limit_error(every, reasons, 1.0)
    assert message is not None and "8 of 8 rows read (100%)" in message
    assert "top reasons: missing_context=5, not_json=2, wrong_type=1" in message
    assert ingest.quarantine_limit_error({"read": 8, "quarantined": 7}, {"missing_context": 7}, 1.0) is None
    half = ingest.quarantine_limit_error({"read": 8, "quarantined": 4}, {"missing_context": 4}, 0.5)
    assert half is not None and "(50%)" in half  # reaching the limit fails
    assert ingest.quarantine_limit_error({"read": 8, "quarantined": 3}, {"missing_context": 3}, 0.5) is None
    assert ingest.quarantine_limit_error({"read": 0, "quarantined": 0}, {}, 1.0) is None  # nothing read: no share


# -- trap 3: a literal U+FFFD was quarantined as undecodable_text ---------------------------------------------
ROW = {"context": "Ann has 3 apples.", "chain": f"She buys 2, so she has 5{FFFD}", "answer": f"5 {FFFD}x"}


@pytest.mark.parametrize(
    ("mode", "chain", "answer"),
    [
        ("strip_end", "She buys 2, so she has 5", f"5 {FFFD}x"),  # the default: a cut at the end goes
        ("keep", f"She buys 2, so she has 5{FFFD}", f"5 {FFFD}x"),
        ("strip", "She buys 2, so she has 5", "5 x"),
    ],
)
def test_literal_replacement_char_follows_the_option_and_is_counted(mode, chain, answer):
    cfg = IngestSettings() if mode == "strip_end" else IngestSettings(replacement_char=mode)  # the default first
    rec = validate(json.dumps(ROW), cfg)
    assert (rec[C.CHAIN_TEXT], rec[C.ANSWER], rec[REPLACED]) == (chain, answer, 2)
    assert IngestSettings().replacement_char == "strip_end"


def test_replacement_char_quarantined_on_request_and_a_real_fault_always():
    with pytest.raises(RowError) as err:
        validate(json.dumps(ROW), IngestSettings(replacement_char="quarantine"))
    assert err.value.reason == "replacement_char"
    # The same text from bytes that were not UTF-8 (read_raw's flag): lost bytes, whatever the option.
    for mode in ("strip_end", "keep", "strip"):
        with pytest.raises(RowError) as err:
            validate(json.dumps(ROW), IngestSettings(replacement_char=mode), valid_utf8=False)
        assert err.value.reason == "undecodable_text"
    # Stripping that leaves a step empty is an empty step, not a chain of nothing.
    with pytest.raises(RowError) as err:
        validate(json.dumps({"context": "X", "steps": ["A.", FFFD]}), IngestSettings())
    assert err.value.reason == "empty_step"


# -- trap 4: the fingerprint of a skipped rerun ignored the ingest settings ---------------------------------
def test_ingest_hash_covers_every_ingest_setting_but_the_input():
    base = Settings()
    same = base.model_copy(update={"ingest": base.ingest.model_copy(update={"input": "elsewhere/*.jsonl"})})
    assert input_files.ingest_hash(same) == input_files.ingest_hash(base)
    for change in ({"mapping": {**DEFAULTS, "context": "doc.question"}}, {"dataset": "gsm8k"},
                   {"replacement_char": "keep"}, {"format": "jsonl"}):
        other = base.model_copy(update={"ingest": base.ingest.model_copy(update=change)})
        assert input_files.ingest_hash(other) != input_files.ingest_hash(base), change


def test_input_files_recorded_before_the_hash_are_read_as_new(spark, make_settings):
    """A night recorded before ingest_hash existed (its table has no such column): read back without a crash,
    with a null hash, so its files count as new once (tables.ensure then adds the column, as for any contract
    column added at the end)."""
    settings = make_settings()
    old = StructType([f for f in P.INPUT_FILES_SCHEMA.fields if f.name != P.INGEST_HASH])
    assert P.INPUT_FILES_SCHEMA.fields[-1].name == P.INGEST_HASH and P.INPUT_FILES_SCHEMA.fields[-1].nullable
    path = settings.table("input_files")
    spark.createDataFrame([("/in/a.jsonl", 10, 5, "night-0", None)], old).write.format("delta").save(path)
    assert input_files.seen_fingerprints(spark, path) == {("/in/a.jsonl", 10, 5, None)}


# -- the scenario: an lm-evaluation-harness samples file, end to end ------------------------------------------
def _samples(n: int = 8) -> list[dict]:
    """Rows shaped like lm-eval's samples_*.jsonl (the generation as a plain `response` text here)."""
    return [
        {"doc_id": i, "doc": {"question": f"Tom has {i} apples and buys 2 more. How many does he have?"},
         "target": str(i + 2), "response": f"Tom has {i} apples.\nHe buys 2 more, so he has {i + 2}."}
        for i in range(n)
    ]


FIXED = ["ingest.mapping.context=doc.question", "ingest.mapping.chain_text=response", "ingest.mapping.answer=target",
         "ingest.mapping.question_id=doc_id"]
INGEST_ONLY = ["pipeline.stages=[ingest]", "pipeline.progress=plain"]


@dataclass
class Scenario:
    exit_code: object  # `python -m jobs.receval.ingest`'s SystemExit code over the all-bad file
    standalone: Settings
    runs: list[tuple[str, str]]  # (run name, status) of every MLflow run in its store
    night: StageReport  # the pipeline's ingest stage, mapping fixed, over files recorded under the default
    night_id: str
    lake: Settings  # the night's


def _mlflow_runs(settings: Settings) -> list[tuple[str, str]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(settings.mlflow.tracking_uri)
    found = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return sorted((r.data.tags.get("mlflow.runName", ""), r.info.status) for r in found)


def _record_as_read(spark, settings: Settings) -> None:
    """`input_files` as a night under `settings` left it (its fingerprints of every input file)."""
    rows = [dict(zip(P.INPUT_FILES_KEYS, fp, strict=True)) | {P.RUN_ID: "night-0"}
            for fp in input_files.input_fingerprints(settings)]
    frame = spark.createDataFrame(rows).withColumn(P.SEEN_AT, F.current_timestamp())
    tables.conform(frame, P.INPUT_FILES_SCHEMA).write.format("delta").save(settings.table("input_files"))
    tables.ensure(spark, settings.table("chains"), C.SCHEMA)


@pytest.fixture(scope="module")
def scenario(spark, tmp_path_factory) -> Scenario:
    """Two ingest runs: `python -m jobs.receval.ingest` over a samples file no row of which fits the default
    mapping; a pipeline night (ingest only) with the mapping fixed over files already read under the default."""
    root = tmp_path_factory.mktemp("traps")
    only = root / "samples_only"
    only.mkdir()
    (only / "samples_gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _samples()))
    standalone = folder_settings(root / "a", f"ingest.input={only}")
    argv = ["jobs.receval.ingest", *job_args(standalone, f"ingest.input={only}")]
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is already imported
        mp.setattr(sys, "argv", argv)
        try:
            runpy.run_module("jobs.receval.ingest", run_name="__main__")
            exit_code: object = 0
        except SystemExit as stop:
            exit_code = stop.code
    mixed = root / "mixed"
    mixed.mkdir()
    (mixed / "samples_gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _samples()))
    # Invalid UTF-8 bytes on one line; a valid literal U+FFFD (a character cut at the end) on the next.
    cut = {"doc_id": 8, "doc": {"question": "Bo has 4 pears and eats 1."}, "target": "3",
           "response": f"He eats 1. So he has 3{FFFD}"}
    (mixed / "bytes.jsonl").write_bytes(
        b'{"doc_id": 9, "doc": {"question": "caf\xe9 \xff"}, "target": "1", "response": "A. So B."}\n'
        + (json.dumps(cut, ensure_ascii=False) + "\n").encode("utf-8") + b"{not json\n"
    )
    # Read before under the default mapping (every row quarantined, before issue 34 that night passed), then
    # the night with the mapping fixed: the same, unchanged files must be read again, not skipped.
    _record_as_read(spark, folder_settings(root / "b", f"ingest.input={mixed}", *INGEST_ONLY))
    settings = folder_settings(root / "b", f"ingest.input={mixed}", *INGEST_ONLY, *FIXED)
    # The pipeline's ingest stage alone (its skip logic and bookkeeping; the whole night adds table counts).
    night = StageReport("ingest")
    pipeline._ingest(pipeline.Context(spark, settings, "night-1"), night)
    return Scenario(exit_code, standalone, _mlflow_runs(standalone), night, "night-1", settings)


def test_all_quarantined_ingest_exits_non_zero_with_a_failed_run_and_keeps_the_rows(spark, scenario):
    code = scenario.exit_code
    assert isinstance(code, str) and code.startswith("error: ingest quarantined 8 of 8 rows read")  # exit status 1
    assert "top reasons: missing_context=8" in code
    assert scenario.runs == [("ingest", "FAILED")]
    q = tables.read(spark, scenario.standalone.table("quarantine"))
    assert [tuple(r) for r in q.groupBy(Q.STAGE, Q.REASON).count().collect()] == [("ingest", "missing_context", 8)]
    assert tables.read(spark, scenario.standalone.table("chains"), C.SCHEMA).count() == 0  # 8 = 0 + 0 + 8


def test_all_quarantined_ingest_fails_the_nightly_pipeline_too(spark, make_settings, monkeypatch):
    """The pipeline's ingest stage over what ingest returned for the file above (its real run is the test above):
    the night fails, both MLflow runs FAILED with the counts, and the files are not recorded as read."""
    from jobs.infra.tracking import job_run

    counts = {"read": 8, "valid": 0, "already_present": 0, "quarantined": 8, "replacement_char": 0, "inserted": 0,
              "reconciled": 1}
    monkeypatch.setattr(ingest, "run_with_reasons", lambda *a: (counts, {"missing_context": 8}))
    settings = make_settings(f"ingest.input={SAMPLE_LAKE}", *INGEST_ONLY)
    with pytest.raises(ingest.QuarantineLimitError, match="8 of 8 rows read.*missing_context=8"):
        with job_run(settings, "pipeline") as tracked:
            pipeline.run(spark, settings, tracked)
    assert _mlflow_runs(settings) == [("ingest", "FAILED"), ("pipeline", "FAILED")]
    assert tracked.children[0].metrics["rows_quarantined"] == 8
    assert tracked.children[0].metrics["quarantined_missing_context"] == 8
    assert not tables.exists(spark, settings.table("input_files"))


def test_night_tells_undecodable_bytes_from_a_literal_replacement_char(spark, scenario):
    counts = scenario.night.counts
    assert (counts["rows_read"], counts["rows_inserted"], counts["rows_quarantined"]) == (11, 9, 2)
    assert counts["rows_replacement_char"] == 1 and counts["rows_reconciled"] == 1
    chains = tables.read(spark, scenario.lake.table("chains"))
    assert chains.where(F.col(C.QUESTION_ID) == "8").first()[C.CHAIN_TEXT] == "He eats 1. So he has 3"
    q = tables.read(spark, scenario.lake.table("quarantine"))
    assert sorted(r[Q.REASON] for r in q.collect()) == ["not_json", "undecodable_text"]


def test_changed_mapping_reads_unchanged_files_again(spark, scenario):
    night = scenario.night
    assert not night.skipped and night.counts["new_input_files"] == 2
    chains = tables.read(spark, scenario.lake.table("chains"))
    assert sorted(int(r[C.QUESTION_ID]) for r in chains.collect()) == list(range(9))
    assert chains.where(F.col(C.QUESTION_ID) == "3").first()[C.CONTEXT] == _samples()[3]["doc"]["question"]
    seen = tables.read(spark, scenario.lake.table("input_files")).groupBy(P.INGEST_HASH).count().collect()
    default = load_settings(overrides=[f"ingest.input={scenario.lake.ingest.input}"], environ={})
    assert {r[0]: r[1] for r in seen} == {input_files.ingest_hash(default): 2, input_files.ingest_hash(scenario.lake): 2}


# -- trap 5: the quarantine table could not be exported ---------------------------------------------------------
def test_export_writes_the_quarantine_table_with_reasons_raw_rows_and_sources(spark, scenario, tmp_path):
    settings = scenario.lake
    out = tmp_path / "quarantine_export"
    result = export.main(job_args(settings, "export.table=quarantine", f"export.output={out}"))
    expected = tables.read(spark, settings.table("quarantine"), Q.SCHEMA)
    assert result == {"rows": 2, "output": str(out)}
    back = spark.read.schema(Q.SCHEMA).json(str(out))
    # JSON keeps timestamps to the millisecond: compared apart from the rest.
    assertDataFrameEqual(back.drop(Q.QUARANTINED_AT), expected.drop(Q.QUARANTINED_AT))
    assert back.where(F.col(Q.QUARANTINED_AT).isNull()).count() == 0
    broken = back.where(F.col(Q.REASON) == "undecodable_text").first()
    assert '"doc_id": 9' in broken[Q.RAW] and broken[Q.SOURCE].endswith("bytes.jsonl")
    assert broken[Q.RUN_ID] == scenario.night_id
    # Filtered by run (the other formats are export.write's, as for curated chains); no dataset filter applies.
    cfg = settings.export.model_copy(update={"table": "quarantine", "run_id": "another-night"})
    assert export.quarantine_transform(expected, cfg).count() == 0
    with pytest.raises(ValueError, match="export.datasets"):
        export.quarantine_transform(expected, cfg.model_copy(update={"datasets": ["gsm8k"]}))
