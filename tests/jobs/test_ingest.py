"""Ingest: lake -> chains, bad rows -> quarantine with the right reason, idempotent re-ingest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import folder_settings
from delta.tables import DeltaTable
from pyspark.sql import functions as F
from pyspark.testing import assertSchemaEqual

from jobs.infra import tables
from jobs.receval import ingest
from jobs.receval.ingest_rows import RowError, validate
from jobs.receval.settings import IngestSettings
from schemas import chains as C
from schemas import quarantine as Q
from schemas.chains import content_hash

CFG = IngestSettings(max_field_chars=200, max_steps=5)
GOOD = {"chain_id": "c1", "context": "Ann has 3 apples.", "steps": ["She buys 2.", "So she has 5."], "answer": "5"}


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("", "empty_row"),
        ("{not json", "not_json"),
        ("[1, 2]", "not_object"),
        ('"just a string"', "not_object"),
        (json.dumps({"chain": "x"}), "missing_context"),
        (json.dumps({"context": None, "chain": "x"}), "missing_context"),
        (json.dumps({"context": "   ", "chain": "x"}), "empty_context"),
        (json.dumps({"context": "X"}), "missing_chain"),
        (json.dumps({"context": "X", "steps": []}), "empty_chain"),
        (json.dumps({"context": "X", "chain": "  \n "}), "empty_chain"),
        (json.dumps({"context": "X", "steps": "one step"}), "wrong_type"),
        (json.dumps({"context": ["X"], "chain": "a"}), "wrong_type"),
        (json.dumps({"context": "X", "steps": ["a", "  "]}), "empty_step"),
        (json.dumps({"context": "X", "steps": ["a", None]}), "empty_step"),
        (json.dumps({"context": "X" * 201, "chain": "a"}), "oversized"),
        (json.dumps({"context": "X", "steps": ["a"] * 6}), "too_many_steps"),
        (json.dumps({"context": "X", "chain": "a", "labels": {"HALL": "yes"}}), "invalid_label"),
        ('{"context": "X", "chain": "a", "labels": {"HALL": NaN}}', "invalid_label"),
        ('{"context": "X", "chain": "a", "labels": {"HALL": Infinity}}', "invalid_label"),
        (json.dumps({"context": "X", "chain": "a", "labels": [1]}), "wrong_type"),
        (json.dumps({"context": "X", "chain": "a", "chain_id": {"id": 1}}), "wrong_type"),
    ],
)
def test_validate_rejects_bad_rows_with_reason(raw: str, reason: str):
    with pytest.raises(RowError) as err:
        validate(raw, CFG)
    assert err.value.reason == reason


def test_validate_maps_fields_and_keeps_given_id():
    rec = validate(json.dumps({**GOOD, "labels": {"HALL": 1, "ok": True}, "metadata": {"n": 3}}), CFG)
    assert rec[C.CHAIN_ID] == "c1"
    assert rec[C.STEPS] == ["She buys 2.", "So she has 5."]
    assert rec[C.LABELS] == {"HALL": 1.0, "ok": 1.0}
    assert rec[C.METADATA] == {"n": "3"}
    assert rec[C.DATASET] == "default"


def test_validate_content_hash_is_the_id_when_none_is_given():
    row = {k: v for k, v in GOOD.items() if k != "chain_id"}
    rec = validate(json.dumps(row), CFG)
    assert rec[C.CHAIN_ID] == rec[C.CONTENT_HASH] == content_hash(rec)
    # Same content in another key order: same id.
    assert validate(json.dumps(dict(reversed(list(row.items())))), CFG)[C.CHAIN_ID] == rec[C.CHAIN_ID]


def test_validate_custom_mapping_reads_dotted_paths():
    cfg = IngestSettings(mapping={"context": "input.text", "chain_text": "output", "chain_id": "uid"})
    rec = validate(json.dumps({"input": {"text": "Q?"}, "output": "A. So B.", "uid": 7}), cfg)
    assert (rec[C.CONTEXT], rec[C.CHAIN_TEXT], rec[C.CHAIN_ID]) == ("Q?", "A. So B.", "7")


def _write_lake(folder: Path, rows: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "part1.jsonl").write_text("\n".join(rows) + "\n")
    return folder


def test_run_ingests_good_rows_quarantines_bad_and_reconciles(spark, make_settings, tmp_path: Path):
    rows = [
        json.dumps(GOOD),
        json.dumps({"chain_id": "c2", "context": "Y", "chain": "A. So B."}),
        json.dumps({"context": "Z", "chain": "No id here."}),
        "{broken",
        json.dumps({"chain_id": "c3", "chain": "no context"}),
        json.dumps({"chain_id": "c2", "context": "Y", "chain": "other content"}),  # same id, other content
        json.dumps(GOOD),  # exact duplicate
    ]
    lake_in = _write_lake(tmp_path / "in", rows)
    settings = make_settings(f"ingest.input={lake_in}")
    counts = ingest.run(spark, settings, run_id="r1")
    assert counts == {
        "read": 7,
        "candidates": 7,  # no fan-out: one candidate chain per row
        "fanned_out": 0,
        "valid": 3,
        "already_present": 0,
        "quarantined": 4,
        "inserted": 3,
        "replacement_char": 0,
        "reconciled": 1,
    }
    chains = tables.read(spark, settings.table("chains"))
    assertSchemaEqual(chains.schema, C.SCHEMA)
    assert DeltaTable.forPath(spark, settings.table("chains")).history().count() >= 1
    ids = sorted(r[C.CHAIN_ID] for r in chains.collect())
    assert len(ids) == 3 and "c1" in ids and "c2" in ids
    q = tables.read(spark, settings.table("quarantine"))
    assertSchemaEqual(q.schema, Q.SCHEMA)
    reasons = sorted(r[Q.REASON] for r in q.collect())
    assert reasons == ["duplicate_chain_id_conflict", "duplicate_row", "missing_context", "not_json"]
    assert q.where(F.col(Q.REASON) == "not_json").first()[Q.RAW] == "{broken"


@pytest.fixture(scope="module")
def one_good(spark, tmp_path_factory) -> tuple[Path, dict[str, int]]:
    """(folder, counts) of one ingest run of a file with the one GOOD row; tests go on from copies of its folder."""
    folder = tmp_path_factory.mktemp("one_good")
    _write_lake(folder / "in", [json.dumps(GOOD)])
    counts = ingest.run(spark, folder_settings(folder, f"ingest.input={folder / 'in'}"))
    return folder, counts


def _after_one_good(one_good, tmp_path: Path, make_settings):
    """Settings over a copy of one_good's lake and input folder (a Delta table is its folder)."""
    folder, counts = one_good
    assert counts["inserted"] == 1
    shutil.copytree(folder / "lake", tmp_path / "lake")
    shutil.copytree(folder / "in", tmp_path / "in")
    return tmp_path / "in", make_settings(f"ingest.input={tmp_path / 'in'}")


def test_run_reingest_adds_nothing_and_new_file_adds_only_new(spark, make_settings, tmp_path: Path, one_good):
    lake_in, settings = _after_one_good(one_good, tmp_path, make_settings)
    v1 = tables.version(spark, settings.table("chains"))
    again = ingest.run(spark, settings)
    assert again["inserted"] == 0 and again["already_present"] == 1
    assert tables.version(spark, settings.table("chains")) == v1
    (lake_in / "part2.jsonl").write_text(json.dumps({**GOOD, "chain_id": "c9"}) + "\n")
    third = ingest.run(spark, settings)
    assert (third["inserted"], third["already_present"]) == (1, 1)
    assert tables.read(spark, settings.table("chains")).count() == 2


def test_run_conflicting_content_for_known_id_is_quarantined(spark, make_settings, tmp_path: Path, one_good):
    lake_in, settings = _after_one_good(one_good, tmp_path, make_settings)
    (lake_in / "part1.jsonl").write_text(json.dumps({**GOOD, "answer": "6"}) + "\n")
    counts = ingest.run(spark, settings)
    assert (counts["inserted"], counts["quarantined"], counts["reconciled"]) == (0, 1, 1)
    assert tables.read(spark, settings.table("chains")).first()[C.ANSWER] == "5"
    assert ingest.reasons(spark, settings) == {"chain_id_conflict": 1}


def test_run_reads_parquet_and_delta_inputs(spark, make_settings, tmp_path: Path):
    df = spark.createDataFrame(
        [("p1", "Ctx one.", "A. So B."), ("p2", "Ctx two.", "C. So D.")], "chain_id string, context string, chain string"
    )
    df.write.parquet(str(tmp_path / "pq"))
    df.write.format("delta").save(str(tmp_path / "dl"))
    for folder, fmt in ((tmp_path / "pq", "parquet"), (tmp_path / "dl", "delta")):
        settings = make_settings(f"ingest.input={folder}", f"ingest.format={fmt}", f"paths.lake={tmp_path}/lake_{fmt}")
        counts = ingest.run(spark, settings)
        assert (counts["read"], counts["inserted"]) == (2, 2), fmt
