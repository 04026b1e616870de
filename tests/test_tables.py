"""jobs.infra.tables' pure helpers (no Spark)."""

from jobs.infra import tables


def test_merge_condition_plain_and_null_safe_keys():
    assert tables.merge_condition(["a", "b"]) == "t.`a` = s.`a` AND t.`b` = s.`b`"
    assert tables.merge_condition(["stage", "raw"], null_safe=["raw"]) == "t.`stage` = s.`stage` AND t.`raw` <=> s.`raw`"
    assert tables.merge_condition(("k",), null_safe=("k",)) == "t.`k` <=> s.`k`"
