"""Export of curated / rejected chains with text, scores and reasons: filters, and JSONL / Parquet / HF round trips."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from pyspark.testing import assertDataFrameEqual

from jobs.infra import tables
from jobs.receval import export
from schemas import chain_scores as CS
from schemas import chains as C
from schemas import curation as CU

WHEN = dt.datetime(2026, 11, 30, 22, 0)


def _chains(spark):
    rows = [
        {**{f.name: None for f in C.SCHEMA.fields}, C.CHAIN_ID: cid, C.DATASET: ds, C.QUESTION: f"Q of {cid}?",
         C.CHAIN_TEXT: f"Step of {cid}.\nSo the answer is 1.", C.STEPS: [f"Step of {cid}.", "So the answer is 1."],
         C.ANSWER: "1", C.CONTENT_HASH: cid, C.LABELS: {"clean": 1.0}}
        for cid, ds in [("g1", "gsm8k"), ("g2", "gsm8k"), ("e1", "eb"), ("e2", "eb")]
    ]
    return spark.createDataFrame(rows, C.SCHEMA)


def _decided(spark, schema, rows):
    """curated/rejected rows: (chain, config hash, run, intra_entail_min, failed rules)."""
    out = []
    for cid, h, run, score, failed in rows:
        row = {f.name: None for f in schema.fields}
        row.update({CU.CHAIN_ID: cid, CU.CONFIG_HASH: h, CU.RULES_HASH: "r1", CS.N_STEPS: 2,
                    CS.min_col("intra_entail"): score, CU.RUN_ID: run, CU.CURATED_AT: WHEN})
        if CU.FAILED_RULES in row:
            row[CU.FAILED_RULES] = failed
        if cid == "g1":  # curated with step thresholds set: inter flagged its step 1
            row.update({CU.FIRST_FLAGGED_STEP: 1, CU.FIRST_FLAGGED_METRIC: "inter"})
        out.append(row)
    return spark.createDataFrame(out, schema)


@pytest.fixture
def lake_with_decisions(spark, make_settings):
    settings = make_settings()
    h = settings.scoring_hash()
    tables.insert_new(spark, _chains(spark), settings.table("chains"), C.SCHEMA, [C.CHAIN_ID])
    curated = _decided(spark, CU.CURATED_SCHEMA, [("g1", h, "night-1", 0.9, None), ("e1", h, "night-2", 0.8, None),
                                                    ("g2", "old-hash", "night-1", 0.7, None)])
    rejected = _decided(spark, CU.REJECTED_SCHEMA, [("g2", h, "night-2", 0.1, ["threshold:intra_entail_min>=0.5"])])
    tables.insert_new(spark, curated, settings.table("curated"), CU.CURATED_SCHEMA, CU.KEYS)
    tables.insert_new(spark, rejected, settings.table("rejected"), CU.REJECTED_SCHEMA, CU.KEYS)
    return settings


def _export(spark, settings, **cfg):
    s = settings.model_copy(update={"export": settings.export.model_copy(update=cfg)})
    schema = CU.CURATED_SCHEMA if s.export.table == "curated" else CU.REJECTED_SCHEMA
    return export.transform(tables.read(spark, s.table(s.export.table), schema),
                            tables.read(spark, s.table("chains"), C.SCHEMA), s.export, s.scoring_hash())


def test_transform_joins_text_scores_reasons_and_filters(spark, lake_with_decisions):
    settings = lake_with_decisions
    got = _export(spark, settings)
    assert got.columns[:10] == [CU.CHAIN_ID, *export.TEXT]
    assert got.columns[-7:-4] == [CU.FAILED_RULES, CU.FIRST_FLAGGED_STEP, CU.FIRST_FLAGGED_METRIC]
    assert {r[CU.CHAIN_ID]: (r[C.DATASET], r[C.QUESTION], r[CS.min_col("intra_entail")], r[CU.FAILED_RULES],
                             r[CU.FIRST_FLAGGED_STEP], r[CU.FIRST_FLAGGED_METRIC]) for r in got.collect()} == {
        "g1": ("gsm8k", "Q of g1?", 0.9, [], 1, "inter"), "e1": ("eb", "Q of e1?", 0.8, [], None, None)}
    only_gsm = _export(spark, settings, datasets=["gsm8k"]).select(CU.CHAIN_ID, CU.RUN_ID)
    assert [tuple(r) for r in only_gsm.collect()] == [("g1", "night-1")]
    assert [r[0] for r in _export(spark, settings, run_id="night-2").select(CU.CHAIN_ID).collect()] == ["e1"]
    rejected = _export(spark, settings, table="rejected").select(CU.CHAIN_ID, C.CHAIN_TEXT, CU.FAILED_RULES)
    assert [tuple(r) for r in rejected.collect()] == [
        ("g2", "Step of g2.\nSo the answer is 1.", ["threshold:intra_entail_min>=0.5"])
    ]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "hf"])
def test_main_round_trips_every_format(spark, lake_with_decisions, tmp_path, fmt):
    settings = lake_with_decisions
    out = tmp_path / f"export_{fmt}"
    result = export.main([
        f"--set=paths.lake={settings.paths.lake}", f"--set=mlflow.tracking_uri={settings.mlflow.tracking_uri}",
        f"--set=mlflow.artifact_location={settings.mlflow.artifact_location}", f"--set=export.format={fmt}",
        f"--set=export.output={out}",
    ])
    expected = _export(spark, settings)
    assert result == {"rows": 2, "output": str(out)}
    if fmt == "jsonl":
        back = spark.read.schema(expected.schema).json(str(out))
        assertDataFrameEqual(back, expected)
    elif fmt == "parquet":
        assertDataFrameEqual(spark.read.parquet(str(out)), expected)
    else:
        import datasets

        back = datasets.load_from_disk(str(out))
        assert back.column_names == expected.columns
        rows = sorted(back.to_list(), key=lambda r: r[CU.CHAIN_ID])
        want = sorted((r.asDict(recursive=True) for r in expected.collect()), key=lambda r: r[CU.CHAIN_ID])
        for row in rows:  # no map type in `datasets`: labels come back as JSON text
            row[C.LABELS] = json.loads(row[C.LABELS])
            # Arrow keeps Spark's UTC timestamps zone-aware; Spark's collect gives them naive (session zone UTC).
            row[CU.CURATED_AT] = row[CU.CURATED_AT].astimezone(dt.timezone.utc).replace(tzinfo=None)
        assert [sorted(r.items()) for r in rows] == [sorted(r.items()) for r in want]
