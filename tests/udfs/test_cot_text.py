"""udfs.cot_text: option parsing on real BBH inputs, answer extraction, EM and numeric normalisation."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from jobs.cot.settings import CotSettings
from jobs.infra.config_paths import resolve_path
from udfs import cot_text

BBH = resolve_path(CotSettings().data_root) / "bbh" / "bbh"


def bbh(task: str) -> list[dict]:
    return json.loads((BBH / f"{task}.json").read_text())["examples"]


@pytest.mark.dataset("bbh")
def test_parse_options_date_understanding_first_example():
    parsed = cot_text.parse_options(bbh("date_understanding")[0]["input"])
    assert parsed == [
        ("A", "12/11/1937"),
        ("B", "12/25/1937"),
        ("C", "01/04/1938"),
        ("D", "12/04/1937"),
        ("E", "12/25/2006"),
        ("F", "07/25/1937"),
    ]


@pytest.mark.parametrize(
    ("task", "counts"),
    [
        # Counts from the data README: option numbers vary inside these tasks.
        ("reasoning_about_colored_objects", {2: 27, 7: 48, 17: 57, 18: 118}),
        ("ruin_names", {3: 1, 4: 247, 7: 1, 11: 1}),
        ("snarks", {1: 1, 2: 177}),
        ("disambiguation_qa", {3: 247, 4: 3}),
        ("geometric_shapes", None),
        ("movie_recommendation", None),
    ],
)
@pytest.mark.dataset("bbh")
def test_parse_options_varying_counts_on_real_inputs(task, counts):
    found = Counter(len(cot_text.parse_options(ex["input"])) for ex in bbh(task))
    if counts is not None:
        assert dict(found) == counts
    else:
        assert len(found) == 2  # geometric_shapes 10/11, movie_recommendation 4/5
    # Letters run A, B, C, ... without gaps in every example.
    for ex in bbh(task):
        letters = [letter for letter, _ in cot_text.parse_options(ex["input"])]
        assert letters == [chr(ord("A") + i) for i in range(len(letters))]


@pytest.mark.dataset("bbh")
def test_parse_options_gold_letter_is_an_option_except_known_defects():
    defects = []
    for task in ("date_understanding", "ruin_names", "movie_recommendation", "penguins_in_a_table", "snarks"):
        for ex in bbh(task):
            letters = {f"({letter})" for letter, _ in cot_text.parse_options(ex["input"])}
            if ex["target"] not in letters:
                defects.append(ex["target"])
    assert sorted(defects) == ["Monsters, Inc", "dearth, wind, & fire", "rita, sue and bob poo"]


@pytest.mark.dataset("bbh")
def test_parse_options_dash_lists_and_none():
    navigate = bbh("navigate")[0]["input"]
    assert cot_text.parse_options(navigate) == [(None, "Yes"), (None, "No")]
    fallacy = bbh("formal_fallacies")[0]["input"]  # "- valid " carries a trailing space upstream
    assert cot_text.parse_options(fallacy) == [(None, "valid"), (None, "invalid")]
    assert cot_text.parse_options(bbh("boolean_expressions")[0]["input"]) == []


def test_extract_answer_indicator_present_absent_repeated():
    ind = ["[ANSWER]", "So the answer is"]
    assert cot_text.extract_answer("He has 3 + 4 = 7. [ANSWER] 7", ind) == "7"
    assert cot_text.extract_answer("no indicator here, 12 ", ind) == "no indicator here, 12"
    # Repeated: the LAST indicator wins, also across different indicators.
    assert cot_text.extract_answer("[ANSWER] 5 wait. So the answer is 6.", ind) == "6."
    assert cot_text.extract_answer("So the answer is 6. [ANSWER] (B)", ind) == "(B)"
    assert cot_text.extract_answer("[ANSWER] 1 [ANSWER] 2", ind) == "2"


def test_extract_answer_until_is_opt_in():
    text = "So 3 + 4 = 7. [ANSWER] 7\n\nQ: next question [ANSWER] 9"
    assert cot_text.extract_answer(text, ["[ANSWER]"]) == "9"
    text = "So 3 + 4 = 7. [ANSWER] 7\n\nQ: next question"
    assert cot_text.extract_answer(text, ["[ANSWER]"]) == "7\n\nQ: next question"
    assert cot_text.extract_answer(text, ["[ANSWER]"], until=["\n"]) == "7"


def test_cut_at_indicator_keeps_text_before_first():
    ind = ["[ANSWER]", "So the answer is"]
    assert cot_text.cut_at_indicator("step one. So the answer is (A). [ANSWER] (B)", ind) == ("step one. ", True)
    assert cot_text.cut_at_indicator("no stop", ind) == ("no stop", False)


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("(A)", "(A)", True),
        ("A", "(A)", True),  # parentheses removed
        ("  true ", "True", True),  # strip + lowercase
        ("dearth, wind, & fire", "dearth wind & fire", True),  # commas removed
        ("2,125", "2125", True),
        ("18.", "18", False),  # EM keeps the period: numeric match is the math metric
        ("] ]", "] ]", True),
        ("(B)", "(A)", False),
        (None, "x", False),
    ],
)
def test_exact_match_official_normalisation(prediction, gold, expected):
    assert cot_text.exact_match(prediction, gold) is expected


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("18.", "18", True),
        ("$18", "18", True),
        ("18", "18", True),
        ("2,125", "2125", True),
        ("The total is 2,125 dollars", "2,125", True),
        ("17", "18", False),
        ("eighteen", "18", False),
        ("-50", "-50", True),
        ("50", "-50", False),
        ("She has 3 then 18", "18", True),  # the last number counts
        ("18", "(A)", None),  # gold is not a number: no numeric metric
        ("a b", "word sorting", None),
    ],
)
def test_numeric_match(prediction, gold, expected):
    assert cot_text.numeric_match(prediction, gold) is expected


def test_prompts_are_the_official_ones():
    assert cot_text.direct_prompt("Q?") == "Q?\n[ANSWER] "
    assert cot_text.cot_prompt("Q?") == "Q?\n\nLet's think step by step.\n"


def test_pick_option_ties_go_to_first():
    assert cot_text.pick_option(["a", "b", "c"], [-2.0, -1.0, -1.0]) == 1
    assert cot_text.pick_option(["a"], [-5.0]) == 0


@pytest.mark.parametrize(("text", "prose"), [
    ("no code at all", "no code at all"),
    ("a\n```python\nx = 1\n```\nb", "a\nb"),
    ("a\n```python\nx = 1\n```\n```output\n1\n```\nb 2", "a\nb 2"),
    ("a\n  ```\nindented fence\n  ```  \nb", "a\nb"),
    ("a\n```python\nprint(x", "a\n"),  # cut inside a block: the rest is code
    ("inline ```x``` is not a fence", "inline ```x``` is not a fence"),
])  # fmt: skip
def test_outside_code_drops_fenced_blocks(text, prose):
    assert cot_text.outside_code(text) == prose
