"""jobs/receval/arith_scores.py: the pandas side of the scores stage's arithmetic UDF, without Spark (the Spark path
is followed end to end in tests/test_metrics_registry.py)."""

from __future__ import annotations

import pandas as pd
from pandas.testing import assert_frame_equal

from jobs.receval import arith_scores


def test_check_texts_gives_one_row_of_scores_per_step_text():
    texts = pd.Series(["So 18 - 6 = 13 and 3 * 4 = 12.", "No equation.", None, "\\(\\frac{1}{2 = 3\\)", "2 + 2 = 4"],
                      index=[10, 11, 12, 13, 14])
    want = pd.DataFrame(
        {"valid": [0.5, None, None, None, 1.0], "errors": [1, 0, 0, 0, 0], "checked": [2, 0, 0, 0, 1],
         "failed": ["18 - 6 = 13 (is 12)", None, None, None, None]},
        index=[10, 11, 12, 13, 14],
    ).astype({"valid": "float64", "errors": "int32", "checked": "int32", "failed": "object"})
    assert_frame_equal(arith_scores.check_texts(texts), want)
