"""CoT evaluation storage: the `cot_predictions` and `cot_metrics` tables' keys, frames, reads and writes.

An example's key (dataset, task, template, example id; template null-safe) as a column (`key_column`) and on
the driver (`example_key`); the protocol fingerprint every prediction carries (`protocol_hash`), by which a
resumed run finds the examples already done (`done_keys`) and the metrics read this run's predictions back
(`stored_predictions`); predictions and metric rows are upserted by PRED_KEYS and METRIC_KEYS.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from jobs.infra import tables
from jobs.infra.config import Settings
from schemas import cot as S

KEY = "_key"
PRED_KEYS = [S.DATASET, S.TASK, S.TEMPLATE, S.EXAMPLE_ID, S.MODE, S.MODEL, S.PROTOCOL_HASH]
METRIC_KEYS = [S.DATASET, S.MODE, S.MODEL, S.AGGREGATE, S.GROUP, S.METRIC_NAME]


def key_column() -> Column:
    # Template is null for BBH and MGSM: a plain equi-join on it would drop those rows.
    return F.concat_ws("\x1f", S.DATASET, S.TASK, F.coalesce(F.col(S.TEMPLATE), F.lit("\x00")), S.EXAMPLE_ID)


def metrics_frame(spark: SparkSession, metrics: pd.DataFrame, run_id: str | None) -> DataFrame:
    schema = StructType([f for f in S.METRICS_SCHEMA.fields if f.name not in (S.RUN_ID, S.COMPUTED_AT)])
    records = [
        tuple(None if isinstance(v, float) and np.isnan(v) else v for v in row)
        for row in metrics[schema.fieldNames()].itertuples(index=False, name=None)
    ]
    df = spark.createDataFrame(records, schema)
    return df.withColumn(S.RUN_ID, F.lit(run_id).cast("string")).withColumn(S.COMPUTED_AT, tables.now())


def examples_frame(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    frame = pd.DataFrame(rows, columns=S.EXAMPLE_SCHEMA.fieldNames())
    return spark.createDataFrame(frame, S.EXAMPLE_SCHEMA)


def protocol_hash(settings: Settings) -> str:
    """Fingerprint of what makes a prediction: the protocol keys, the seed, loader choices and the model."""
    import hashlib
    import json

    from jobs.cot.settings import OFFICIAL_COT

    cfg, ref = settings.cot, settings.models.cot
    keyed = {k: getattr(cfg, k) for k in OFFICIAL_COT}
    keyed |= {"protocol": cfg.protocol, "seed": cfg.seed, "causal_move_space": cfg.causal_move_space,
              "bbh_option_style": cfg.bbh_option_style, "family": ref.family, "revision": ref.revision}  # fmt: skip
    keyed |= cfg.fewshot_keys()  # empty when zero-shot: fingerprints stored before few-shot existed still match
    return hashlib.sha256(json.dumps(keyed, sort_keys=True, default=str).encode()).hexdigest()[:16]


def example_key(row: dict[str, Any]) -> str:
    """The driver-side twin of `key_column()` (same separator and null template)."""
    template = row[S.TEMPLATE] if row[S.TEMPLATE] is not None else "\x00"
    return "\x1f".join([row[S.DATASET], row[S.TASK], template, row[S.EXAMPLE_ID]])


def done_keys(spark: SparkSession, path: str, mode: str, model: str, fingerprint: str) -> set[str]:
    """Keys of the examples this (mode, model, protocol) already has predictions for: a resumed run skips them."""
    if not tables.exists(spark, path):
        return set()
    df = spark.read.format("delta").load(path)
    if S.PROTOCOL_HASH not in df.columns:
        return set()
    mine = df.where((F.col(S.MODE) == mode) & (F.col(S.MODEL) == model) & (F.col(S.PROTOCOL_HASH) == fingerprint))
    return {r[0] for r in mine.select(key_column()).collect()}


def stored_predictions(spark: SparkSession, path: str, model: str, fingerprint: str, modes: Sequence[str],
                       keys: set[str]) -> pd.DataFrame:  # fmt: skip
    """This run's examples' predictions as stored (made now or by the run that was resumed), for the metrics."""
    if not tables.exists(spark, path) or not keys:
        return pd.DataFrame()
    df = spark.read.format("delta").load(path)
    mine = df.where((F.col(S.MODEL) == model) & (F.col(S.PROTOCOL_HASH) == fingerprint) & F.col(S.MODE).isin(list(modes)))
    frame = mine.select(key_column().alias(KEY), S.DATASET, S.TASK, S.TEMPLATE, S.MODE, S.MODEL, S.CORRECT,
                        S.NUMERIC_CORRECT, S.CORRECT_PER_TOKEN, S.CORRECT_PER_BYTE, S.CHANCE).toPandas()  # fmt: skip
    return frame[frame[KEY].isin(keys)].drop(columns=[KEY]).reset_index(drop=True)


def write_predictions(spark: SparkSession, pred: DataFrame, path: str) -> None:
    """Upsert predictions into `cot_predictions` (at `path`) by PRED_KEYS."""
    # Nullable keys (template): `=` never matches a null, so a rerun would add those rows again.
    tables.upsert(spark, pred, path, S.PREDICTIONS_SCHEMA, PRED_KEYS, null_safe=PRED_KEYS)


def write_metrics(spark: SparkSession, settings: Settings, metrics: pd.DataFrame, run_id: str | None) -> None:
    """Upsert metric rows (jobs.cot.metrics.compute_metrics) into `cot_metrics` by METRIC_KEYS."""
    mdf = metrics_frame(spark, metrics, run_id)
    tables.upsert(spark, mdf, settings.table("cot_metrics"), S.METRICS_SCHEMA, METRIC_KEYS)
