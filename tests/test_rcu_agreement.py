"""bench/rcu_agreement.py: normalisation, premise-set and token P/R/F1, edge defects, per-step agreement
(hand-computed)."""

from __future__ import annotations

import sys

import pytest

from jobs.infra.config_paths import PROJECT_ROOT

# A benchmark's module (bench/ is no package): bench/rcu_bench.py scores the steps job's RCUs with it.
sys.path.append(str(PROJECT_ROOT / "bench"))
import rcu_agreement as A  # noqa: E402


def test_normalise_lowercases_drops_punctuation_and_collapses_space():
    assert A.normalise("Light and dark are kinds of color.") == "light and dark are kinds of color"
    assert A.normalise("the earth 's oceans , so") == "the earth s oceans so"
    assert A.normalise("30 – 7 = 23 Sean’s") == "30 7 23 sean s"


def test_set_prf_exact_units_as_multisets():
    # 1 of 2 predicted units is gold; 1 of 3 gold units is found
    assert A.set_prf(["A is B.", "C"], ["a is b", "d", "e"]) == pytest.approx((0.5, 1 / 3, 0.4))
    assert A.set_prf([], []) == (1.0, 1.0, 1.0)  # nothing to find, nothing claimed
    assert A.set_prf(["x"], []) == (0.0, 0.0, 0.0)
    assert A.set_prf(["x", "x"], ["x"]) == pytest.approx((0.5, 1.0, 2 / 3))  # a unit counts as often as stated


def test_token_prf_pools_the_tokens_of_all_units():
    # predicted tokens {a, b, c}, gold {a, b, d, e}: overlap 2 -> P 2/3, R 1/2, F1 4/7
    assert A.token_prf(["a b", "c"], ["a", "b d e"]) == pytest.approx((2 / 3, 0.5, 4 / 7))


@pytest.mark.parametrize(
    "unit,defect",
    [
        ("is a kind of color, so", True),
        ("dark is a kind of color and light", False),  # a wrong cut, but no connective at its edge
        ("and he has 3", True),
        ("So he has 3", True),
        ("he has 3 as a result", True),
        (", he has 3", True),
        ("he has 3,", True),
        ("if a place is in summer, then it will have sunlight", False),  # "then" inside, not at an edge
        ("Sophia", False),  # "so" as a prefix is not the word
        ("", False),
    ],
)
def test_edge_defect(unit, defect):
    assert A.edge_defect(unit) is defect


def test_agree_and_summarise():
    good = A.agree(["dark is a kind of color", "light is a kind of color"], "light and dark are kinds of color",
                   ["dark is a kind of color", "light is a kind of color"], "light and dark are kinds of color.")
    bad = A.agree(["dark is a kind of color and light", "is a kind of color, so"], "light and dark are kinds of color",
                  ["dark is a kind of color", "light is a kind of color"], "light and dark are kinds of color")
    assert good == A.StepAgreement(True, 1.0, 1.0, 1.0, 1.0, 1.0, True, 3, 0)
    assert bad.conclusion_exact and bad.premise_f1 == 0.0 and bad.edge_defects == 1 and bad.same_count
    # tokens: predicted {dark is a kind of color and light is a kind of color so} (14), gold 12 of them
    assert bad.premise_token_f1 == pytest.approx(2 * (12 / 14) * 1.0 / (12 / 14 + 1.0))
    summary = A.summarise([good, bad])
    assert summary["steps"] == 2 and summary["conclusion_exact"] == 1.0
    assert summary["premise_f1"] == 0.5 and summary["edge_defects"] == 1 and summary["units"] == 6
