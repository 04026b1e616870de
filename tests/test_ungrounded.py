"""bench/ungrounded.py: `ungrounded_numbers`, the measured definition bench/arith_bench.py reports beside the
arithmetic check (not kept in the product; docs/META_EVAL.md). Counts worked out by hand."""

from __future__ import annotations

from fractions import Fraction as Fr

from conftest import load_script

from jobs.infra.config_paths import PROJECT_ROOT

ungrounded = load_script(PROJECT_ROOT / "bench" / "ungrounded.py")


def test_ungrounded_numbers_come_from_nowhere():
    problem = "Sue has 18 flamingos and gives away a third of them."
    steps = ["18 / 3 = 6 flamingos are given away.",  # 18 from the problem, 3 from "third", 6 computed
             "She keeps 18 - 6 = 12 and buys 47 more, 100% pink.",  # 47 from nowhere; 100 a unit constant
             "So she has 12 + 47 = 59."]  # 47 is now an earlier step's number
    assert ungrounded.ungrounded_counts(problem, steps) == [0, 1, 0]
    assert ungrounded.numbers("It costs $1,250.50, or 15%.") == [Fr("1250.50"), Fr(15)]
