"""Hostile-input corpus -> ingest: every row lands in `chains` or in `quarantine` with a reason; none lost."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from conftest import folder_settings, load_script
from pyspark.sql import functions as F

from jobs.infra.config import Settings
from jobs.receval import ingest, ingest_readers, ingest_rows
from schemas import chains as C
from schemas import quarantine as Q

CORPUS_DIR = Path(__file__).resolve().parent / "data" / "bad_input"


corpus_module = load_script(CORPUS_DIR / "make_bad_input.py")


def build_corpus(folder: Path) -> Path:
    """Committed small files plus the big kinds generated now."""
    shutil.copytree(CORPUS_DIR / "files", folder)
    corpus_module.write_large(folder)
    return folder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return build_corpus(tmp_path_factory.mktemp("bad_input") / "lake_in")


def outcome_by_kind(spark, settings) -> dict[str, dict]:
    """Source file -> {ingested: n, quarantined: {reason: n}} from the written tables."""
    chains = spark.read.format("delta").load(settings.table("chains"))
    quarantine = spark.read.format("delta").load(settings.table("quarantine"))
    out: dict[str, dict] = {}
    for r in chains.groupBy(C.SOURCE).count().collect():
        out.setdefault(Path(r[C.SOURCE]).name, {"ingested": 0, "quarantined": {}})["ingested"] = r["count"]
    for r in quarantine.groupBy(Q.SOURCE, Q.REASON).count().collect():
        entry = out.setdefault(Path(r[Q.SOURCE]).name, {"ingested": 0, "quarantined": {}})
        entry["quarantined"][r[Q.REASON]] = r["count"]
    return out


def test_corpus_committed_files_match_generator():
    committed = {p.name: p.read_bytes() for p in (CORPUS_DIR / "files").iterdir()}
    assert committed == corpus_module.small_files()


def test_corpus_has_at_least_25_kinds():
    assert len(corpus_module.EXPECTED) >= 25
    assert set(corpus_module.EXPECTED) == set(corpus_module.small_files()) | set(corpus_module.large_files())


@dataclass
class FirstIngest:
    """One `ingest.run` over the corpus into a new lake, shared read-only by the tests below."""

    settings: Settings
    counts: dict[str, int]
    read_per_file: Counter  # source file name -> rows read_raw gives for it


@pytest.fixture(scope="module")
def first_ingest(spark, corpus, tmp_path_factory) -> FirstIngest:
    settings = folder_settings(tmp_path_factory.mktemp("bad_input_run"), f"ingest.input={corpus}")
    raw = ingest_readers.read_raw(spark, settings.ingest)
    read_per_file = Counter({Path(r["source"]).name: r["count"] for r in raw.groupBy("source").count().collect()})
    counts = ingest.run(spark, settings, run_id="bad-input")
    return FirstIngest(settings, counts, read_per_file)


def test_ingest_run_bad_input_every_kind_ingested_or_quarantined(spark, first_ingest, capsys):
    settings, counts, read_per_file = first_ingest.settings, first_ingest.counts, first_ingest.read_per_file
    got = outcome_by_kind(spark, settings)
    expected = {k: v for k, v in corpus_module.EXPECTED.items() if v["ingested"] or v["quarantined"]}
    report = pd.DataFrame(
        [
            {
                "kind": kind,
                "read": read_per_file.get(kind, 0),
                "ingested": got.get(kind, {}).get("ingested", 0),
                "quarantined": json.dumps(got.get(kind, {}).get("quarantined", {}), sort_keys=True),
            }
            for kind in sorted(corpus_module.EXPECTED)
        ]
    )
    with capsys.disabled():
        print("\n" + report.to_string(index=False))
    # Nothing lost: per file, every row read is in `chains` or in `quarantine`.
    for kind, entry in got.items():
        assert read_per_file[kind] == entry["ingested"] + sum(entry["quarantined"].values()), kind
    assert got == expected
    assert counts["reconciled"] == 1
    assert counts["read"] == sum(read_per_file.values()) == counts["inserted"] + counts["quarantined"]


def test_ingest_run_bad_input_keeps_hostile_text_verbatim(spark, first_ingest):
    chains = spark.read.format("delta").load(first_ingest.settings.table("chains"))
    rows = {r[C.CHAIN_ID]: r for r in chains.collect()}
    injection = corpus_module.INJECTION
    # Injected templates and code are data: stored as given, never rendered or evaluated.
    assert rows["prompt_injection"][C.CONTEXT] == injection
    assert rows["prompt_injection"][C.STEPS] == [injection, "{{ 7*7 }}"]
    assert rows["control_chars"][C.CONTEXT] == "nul\x00 bell\x07 esc\x1b[31m red\x1b[0m del\x7f"
    assert rows["rtl_text"][C.STEPS] == ["\u202eevil\u202c step"]
    assert rows["number_context"][C.CONTEXT] == "12345"
    assert rows["duplicate_keys"][C.CONTEXT] == "second"  # JSON: the last duplicate key wins
    assert rows["bom_first"][C.CONTEXT] == corpus_module.GOOD_CONTEXT
    assert rows["extra_fields"][C.METADATA] == {"model": "m", "params": '{"t": 0.7}'}


def test_ingest_run_bad_input_rerun_adds_nothing(spark, first_ingest, make_settings, lake, corpus):
    # A second run over the same input, on a copy of the first run's lake (a Delta table is its folder).
    shutil.copytree(first_ingest.settings.paths.lake, lake)
    settings = make_settings(f"ingest.input={corpus}")
    quarantined = spark.read.format("delta").load(settings.table("quarantine")).count()
    second = ingest.run(spark, settings)
    assert second["inserted"] == 0
    assert second["already_present"] == first_ingest.counts["inserted"]
    assert spark.read.format("delta").load(settings.table("quarantine")).count() == quarantined
    assert spark.read.format("delta").load(settings.table("chains")).where(F.col(C.CHAIN_ID).isNull()).count() == 0


def test_validate_series_poisoned_row_quarantined_or_fails_per_config(monkeypatch):
    cfg = corpus_module_settings().ingest
    rows = pd.Series([json.dumps(corpus_module.row(f"c{i}")) for i in range(3)])
    real = ingest_rows.validate_chains

    def poisoned(raw, cfg, *rest):
        if '"c1"' in raw:
            raise ZeroDivisionError("poisoned row")
        return real(raw, cfg, *rest)

    monkeypatch.setattr(ingest_rows, "validate_chains", poisoned)
    out = pd.DataFrame([verdicts[0] for verdicts in ingest_rows.validate_series(rows, cfg, "quarantine")])
    assert out["error"].tolist() == [None, "validator_error", None]
    assert out["detail"][1] == "ZeroDivisionError: poisoned row"
    assert out["chain_id"].tolist() == ["c0", None, "c2"]
    with pytest.raises(ZeroDivisionError):
        ingest_rows.validate_series(rows, cfg, "fail")


def corpus_module_settings():
    from jobs.infra.config_layers import load_settings

    return load_settings(environ={})
