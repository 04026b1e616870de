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
# Given RCUs, one per step, parallel to `steps`: the producer's own units, used by the steps job as they are
# (extractor "given"); null: the steps job extracts them. Input rows give them as step objects (ingest.mapping
# step_text / step_premises / step_conclusion); the EntailmentBank adapter from the trees (perturb.gold_rcus).
STEP_RCUS = "step_rcus"
RCU_PREMISES = "premises"
RCU_CONCLUSION = "conclusion"
# Nullable as JSON-parsed and Delta-stored structs come back; ingest and the steps job check the contents.
STEP_RCU = StructType([StructField(RCU_PREMISES, ArrayType(StringType())), StructField(RCU_CONCLUSION, StringType())])

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
        StructField(STEP_RCUS, ArrayType(STEP_RCU), True),  # last: tables made before it gain it at the end
    ]
)
KEYS = [CHAIN_ID]  # one row per chain, whatever the config hash: ingest's and score_chains' insert-only MERGE key


def content_hash(record: Mapping[str, Any]) -> str:
    """sha256 over what defines a chain; the id of chains that come without one (part of the contract)."""
    keyed = {k: record.get(k) for k in (CONTEXT, QUESTION, STEPS, CHAIN_TEXT, ANSWER)}
    if record.get(STEP_RCUS) is not None:  # only when given: the hash of every other chain stays what it was
        keyed[STEP_RCUS] = record[STEP_RCUS]
    return hashlib.sha256(json.dumps(keyed, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
