"""`step_labels`: labels of single steps, long format, keyed by chain, step and label name.

Chain-level labels stay in `chains.labels`; a step-labelled set (ProcessBench, ROSCOE's per-step annotations)
also writes one row here per step and label it knows. `value` follows `chains.labels`: 1.0 = this step is correct
(no error of this kind), 0.0 = this step is wrong. A step the annotators did not judge has no row: ProcessBench
labels only the earliest error, so its steps after that one are absent (unknown), not correct.

`step_idx` is the step's 0-based position in `chains.steps`, the same index as `step_scores.step_idx` for chains
whose steps are given (the steps job keeps given steps as they are).

Label names: `FIRST_ERROR` marks the earliest erroneous step (ProcessBench's `label`; for ROSCOE the earliest step
with any error answer), every other name is a set's own question (ROSCOE: COM, FACT, ... as in
`human_labels.step_labels`).
"""

from __future__ import annotations

from pyspark.sql.types import DoubleType, IntegerType, StringType, StructField, StructType

CHAIN_ID = "chain_id"
STEP_IDX = "step_idx"
LABEL = "label"
VALUE = "value"
DATASET = "dataset"

# The label every step-labelled set writes: steps before the earliest error 1.0, that step 0.0, later steps none.
FIRST_ERROR = "first_error"
# Chain-level companions in `chains.labels`: the earliest error's index (-1 = every step correct) and whether
# the chain's final answer is right (1.0 / 0.0), where the set says so.
FIRST_ERROR_INDEX = "first_error_index"
FINAL_ANSWER_CORRECT = "final_answer_correct"

SCHEMA = StructType(
    [
        StructField(CHAIN_ID, StringType(), False),
        StructField(STEP_IDX, IntegerType(), False),
        StructField(LABEL, StringType(), False),
        StructField(VALUE, DoubleType(), False),
        StructField(DATASET, StringType(), True),
    ]
)
KEY = [CHAIN_ID, STEP_IDX, LABEL]
