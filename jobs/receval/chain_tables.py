"""The tables a chain's rows go into on their way through the night, and the one insert that writes them.

Used by the nightly pipeline's stages and by score_chains(write=True) (jobs.receval.api), so both write a chain's
rows the same way: insert-only MERGEs keyed by chain and config hash, in the order a chain reaches the tables.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.receval import aggregate, scores_table
from schemas import chains as C
from schemas import steps as ST

# The tables in the order a chain reaches them (a stage's rows mark the chain done for it, so they are written
# after what they stand on). `insert` writes them: by the schema and MERGE keys here (declared beside the
# schemas), `step_scores`, `chain_scores` and `quarantine` through their own one writer each. Ingest writes
# `chains` by C.KEYS itself.
CHAIN_TABLES = ("chains", "steps", "contexts", "step_scores", "chain_scores", "quarantine")
KEYED: dict[str, tuple[StructType, list[str]]] = {
    "chains": (C.SCHEMA, C.KEYS),
    "steps": (ST.SCHEMA, ST.KEYS),
    "contexts": (ST.CONTEXTS_SCHEMA, ST.CONTEXTS_KEYS),
}


def insert(spark: SparkSession, settings: Settings, name: str, rows: DataFrame) -> int:
    """Insert `rows` into the chain table `name` (CHAIN_TABLES) as the night does: insert-only, so a key the table
    holds keeps its row and a rerun adds nothing. Returns the rows inserted."""
    if name == "step_scores":
        return scores_table.write(spark, settings, rows)
    if name == "chain_scores":
        return aggregate.write(spark, settings, rows)
    if name == "quarantine":
        return tables.append_quarantine(spark, settings, rows)
    schema, keys = KEYED[name]
    return tables.insert_new(spark, rows, settings.table(name), schema, keys)
