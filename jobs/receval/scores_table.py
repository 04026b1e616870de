"""The one write into `step_scores`: every stage that scores steps writes its rows through `write`.

Writers: the pipeline's scores stage (jobs/receval/score.py: whole rows, NLI + PVI + arithmetic), `score_chains(...,
write=True)` (jobs/receval/api.py: the same rows), and the standalone `nli_scores` and `pvi_scores` jobs (each
its own group of columns). A row is keyed by (chain, step, config hash) whoever writes it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession

from jobs.infra import tables
from jobs.infra.config import Settings
from schemas import step_scores as SS

KEYS = [SS.CHAIN_ID, SS.STEP_IDX, SS.CONFIG_HASH]


def write(spark: SparkSession, settings: Settings, rows: DataFrame, columns: Sequence[str] | None = None) -> int:
    """Write `rows` into `step_scores` by KEYS; returns the rows inserted (keys the table did not hold).

    `columns` None: whole rows (the contract's columns), insert-only: a key already in the table keeps its row,
    so a rerun, or a retry after a concurrent commit, inserts only what is missing and rewrites nothing.
    `columns` given: the group a standalone job owns (its scores and model ids); a new key is inserted with only
    that group, a key already there gets the group set and keeps the others, so a row another job scored
    partially gets the missing group, and a rerun (or `pipeline.rescore`) writes its own group again.
    """
    path = settings.table("step_scores")
    if columns is None:
        return tables.insert_new(spark, rows, path, SS.SCHEMA, KEYS)
    return tables.merge_columns(spark, rows, path, SS.SCHEMA, KEYS, columns)
