"""`steps`: one row per step of a chain, with its Reasoning Content Units; `contexts`: X split into sentences."""

from __future__ import annotations

from pyspark.sql.types import ArrayType, IntegerType, StringType, StructField, StructType

CHAIN_ID = "chain_id"
CONFIG_HASH = "config_hash"  # Settings.scoring_hash(): step splitting is part of what a score depends on
STEP_IDX = "step_idx"  # 0-based position of the step in its chain
N_STEPS = "n_steps"
STEP_TEXT = "step_text"
PREMISE_RCUS = "premise_rcus"  # RCUs of the step other than the conclusion
CONCLUSION_RCU = "conclusion_rcu"
BOUNDARY = "boundary"  # sentence | newline | paragraph | given | whole
ROLE_RULE = "role_rule"  # position | conjunction
EXTRACTOR = "extractor"  # clauses:<pipeline> | spacy:<pipeline> | srl:<model path>

SCHEMA = StructType(
    [
        StructField(CHAIN_ID, StringType(), False),
        StructField(CONFIG_HASH, StringType(), False),
        StructField(STEP_IDX, IntegerType(), False),
        StructField(N_STEPS, IntegerType(), False),
        StructField(STEP_TEXT, StringType(), False),
        StructField(PREMISE_RCUS, ArrayType(StringType()), False),
        StructField(CONCLUSION_RCU, StringType(), False),
        StructField(BOUNDARY, StringType(), False),
        StructField(ROLE_RULE, StringType(), False),
        StructField(EXTRACTOR, StringType(), False),
    ]
)
KEYS = [CHAIN_ID, CONFIG_HASH, STEP_IDX]  # the insert-only MERGE key of `steps`

CONTEXT_SENTENCES = "context_sentences"
ANSWER = "answer"  # a_hat used for information gain
ANSWER_RULE = "answer_rule"  # given | indicator | last_conclusion

CONTEXTS_SCHEMA = StructType(
    [
        StructField(CHAIN_ID, StringType(), False),
        StructField(CONFIG_HASH, StringType(), False),
        StructField(CONTEXT_SENTENCES, ArrayType(StringType()), False),
        StructField(ANSWER, StringType(), True),
        StructField(ANSWER_RULE, StringType(), False),
    ]
)
CONTEXTS_KEYS = [CHAIN_ID, CONFIG_HASH]  # one row per chain and config hash
