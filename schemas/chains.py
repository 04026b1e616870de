"""`chains`: one row per reasoning chain, as ingested from a model-output lake or an adapter."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

CHAIN_ID = "chain_id"  # given by the input, else sha256 of the content (see content_hash below)
DATASET = "dataset"
QUESTION_ID = "question_id"  # groups the k sampled chains of one question (chain selection)
CONTEXT = "context"  # the input context X
QUESTION = "question"
STEPS = "steps"  # given steps s(1..n), or null when the chain is one text
CHAIN_TEXT = "chain_text"  # the chain as one text, split into steps by the steps job
ANSWER = "answer"  # predicted answer a_hat; null: derived by the steps job
GOLD_ANSWER = "gold_answer"
GOLD_STEPS = "gold_steps"  # reference chain for ROUGE baselines
LABELS = "labels"  # name -> value; 1 = clean / no error, 0 = error; ordinal ratings as given
METADATA = "metadata"
CONTENT_HASH = "content_hash"
SOURCE = "source"  # input file or table the row came from
INGESTED_AT = "ingested_at"

SCHEMA = StructType(
    [
        StructField(CHAIN_ID, StringType(), False),
        StructField(DATASET, StringType(), True),
        StructField(QUESTION_ID, StringType(), True),
        StructField(CONTEXT, StringType(), True),
        StructField(QUESTION, StringType(), True),
        StructField(STEPS, ArrayType(StringType()), True),
        StructField(CHAIN_TEXT, StringType(), True),
        StructField(ANSWER, StringType(), True),
        StructField(GOLD_ANSWER, StringType(), True),
        StructField(GOLD_STEPS, ArrayType(StringType()), True),
        StructField(LABELS, MapType(StringType(), DoubleType(), True), True),
        StructField(METADATA, MapType(StringType(), StringType(), True), True),
        StructField(CONTENT_HASH, StringType(), False),
        StructField(SOURCE, StringType(), True),
        StructField(INGESTED_AT, TimestampType(), True),
    ]
)


def content_hash(record: Mapping[str, Any]) -> str:
    """sha256 over what defines a chain; the id of chains that come without one (part of the contract)."""
    keyed = {k: record.get(k) for k in (CONTEXT, QUESTION, STEPS, CHAIN_TEXT, ANSWER)}
    return hashlib.sha256(json.dumps(keyed, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
