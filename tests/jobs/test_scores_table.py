"""`step_scores` has one write (jobs.receval.scores_table.write): whole rows insert-only, a job's column group
upserted onto its keys."""

from __future__ import annotations

from typing import Any

from jobs.infra import tables
from jobs.receval import nli_scores, pvi_scores, scores_table
from schemas import step_scores as SS

NLI_GROUP = [*nli_scores.NLI_COLUMNS, SS.NLI_MODEL, SS.NLI_REVISION]


def _rows(spark, h: str, *rows: dict[str, Any]):
    """step_scores rows (contract schema, unset columns null) for chain `c`, keyed by step."""
    values = [{SS.CHAIN_ID: "c", SS.CONFIG_HASH: h, **r} for r in rows]
    return spark.createDataFrame([tuple(v.get(f.name) for f in SS.SCHEMA.fields) for v in values], SS.SCHEMA)


def _table(spark, settings) -> dict[int, dict[str, Any]]:
    return {r[SS.STEP_IDX]: r.asDict() for r in tables.read(spark, settings.table("step_scores")).collect()}


def test_column_groups_fill_a_row_and_whole_rows_never_rewrite_one(spark, settings):
    h = settings.scoring_hash()
    # The PVI job scores step 0; the NLI job then steps 0 and 1: step 0 gets the NLI group and keeps its PVI.
    pvi = _rows(spark, h, {SS.STEP_IDX: 0, SS.INTRA_PVI: -0.5, SS.PVI_MODEL: "g"})
    assert scores_table.write(spark, settings, pvi, pvi_scores.OUTPUT_COLUMNS) == 1
    nli = _rows(spark, h, {SS.STEP_IDX: 0, SS.INTER: 0.9, SS.NLI_MODEL: "n"},
                {SS.STEP_IDX: 1, SS.INTER: 0.8, SS.NLI_MODEL: "n"})
    assert scores_table.write(spark, settings, nli, NLI_GROUP) == 1
    got = _table(spark, settings)
    assert (got[0][SS.INTRA_PVI], got[0][SS.PVI_MODEL], got[0][SS.INTER], got[0][SS.NLI_MODEL]) == (-0.5, "g", 0.9, "n")
    assert (got[1][SS.INTRA_PVI], got[1][SS.INTER]) == (None, 0.8)
    # A rerun of a group writes its own values again (a rescore replaces them); the other group stays.
    assert scores_table.write(spark, settings, _rows(spark, h, {SS.STEP_IDX: 0, SS.INTER: 0.7}), NLI_GROUP) == 0
    got = _table(spark, settings)
    assert (got[0][SS.INTER], got[0][SS.NLI_MODEL], got[0][SS.INTRA_PVI]) == (0.7, None, -0.5)
    # Whole rows (the scores stage): insert-only, so a key already there keeps its row; a new key is inserted.
    whole = _rows(spark, h, {SS.STEP_IDX: 0, SS.INTER: 0.1, SS.INTRA_PVI: 0.1}, {SS.STEP_IDX: 2, SS.INTER: 0.6})
    assert scores_table.write(spark, settings, whole) == 1
    got = _table(spark, settings)
    assert sorted(got) == [0, 1, 2]
    assert (got[0][SS.INTER], got[0][SS.INTRA_PVI], got[2][SS.INTER]) == (0.7, -0.5, 0.6)
