"""`steps` -> the arithmetic columns of `step_scores` (arith_valid, arith_errors, arith_checked, arith_failed).

udfs/arith.py checks every `<expression> = <number>` of a step's text exactly; here it runs as one pandas UDF over
the step texts, inside the scores stage (jobs/receval/score.py) beside NLI and PVI. No model, no join: each
step's columns depend on its own text only, and the check never raises (an unreadable claim is skipped), so it
never quarantines a chain.
"""

from __future__ import annotations

import pandas as pd
from pyspark.sql import Column
from pyspark.sql import functions as F

from schemas import step_scores as SS
from udfs import arith

RESULT = "_arith"
RETURN_TYPE = "valid double, errors int, checked int, failed string"


def check_texts(texts: pd.Series) -> pd.DataFrame:
    """Step texts -> one row of (valid, errors, checked, failed) each. Pure pandas: testable without Spark."""
    rows = []
    for text in texts:
        check = arith.check_step(text if isinstance(text, str) else None)
        rows.append((check.valid, check.errors, check.checked, check.detail))
    frame = pd.DataFrame(rows, columns=["valid", "errors", "checked", "failed"], index=texts.index)
    return frame.astype({"valid": "float64", "errors": "int32", "checked": "int32", "failed": "object"})


def columns(step_text: Column) -> list[Column]:
    """The step_scores arithmetic columns of a `steps.step_text` column, in ARITH_SCHEMA order."""

    @F.pandas_udf(RETURN_TYPE)
    def arith_udf(texts: pd.Series) -> pd.DataFrame:
        return check_texts(texts)

    result = arith_udf(step_text)
    return [
        result["valid"].alias(SS.ARITH_VALID),
        result["errors"].alias(SS.ARITH_ERRORS),
        result["checked"].alias(SS.ARITH_CHECKED),
        result["failed"].alias(SS.ARITH_FAILED),
    ]
