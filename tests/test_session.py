"""jobs.infra.session.session_confs: runtime settings for one block, each put back as it was."""

from __future__ import annotations

import pytest

from jobs.infra.session import session_confs

SET_BEFORE = "spark.sql.session.timeZone"
UNSET_BEFORE = "spark.databricks.delta.commitInfo.userMetadata"


def test_session_confs_apply_inside_and_restore_after_a_raise(spark):
    spark.conf.set(SET_BEFORE, "UTC")
    assert spark.conf.get(UNSET_BEFORE, None) is None
    with pytest.raises(RuntimeError), session_confs(spark, {SET_BEFORE: "Asia/Tokyo", UNSET_BEFORE: "run-1"}):
        assert spark.conf.get(SET_BEFORE) == "Asia/Tokyo"
        assert spark.conf.get(UNSET_BEFORE) == "run-1"
        raise RuntimeError("the block fails")
    assert spark.conf.get(SET_BEFORE) == "UTC"  # the value it had
    assert spark.conf.get(UNSET_BEFORE, None) is None  # unset again, not left at the block's value
