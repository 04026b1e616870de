"""jobs/metaeval/processbench_items.py and jobs/metaeval/step_labels.py on hand-written ProcessBench items: whole
chains and step labels as expected, and every kind of bad item quarantined with its reason."""

from __future__ import annotations

import json

import pytest

from jobs.metaeval import processbench_items as P
from jobs.metaeval import step_labels as S
from schemas import chains as C
from schemas import step_labels as SL
from schemas.chains import content_hash

PROBLEM = "Tom has 18 apples and gives 6 away. How many are left?"
LATEX_STEP = r"He keeps \(18 - 6 = 12\) apples, that is \(\frac{a}{b}\) of them with \(a = 12\), \(b = 18\)."
LAST_STEP = r"The answer is \(\boxed{12}\)."
SOURCE = "data/processbench/gsm8k.json"


def _item(**fields) -> dict:
    item = {"id": "gsm8k-7", "generator": "Qwen2-7B-Instruct", "problem": PROBLEM,
            "steps": ["To find how many are left, subtract.", LATEX_STEP, LAST_STEP],
            "final_answer_correct": True, "label": -1}
    return {k: v for k, v in (item | fields).items() if v is not ...}  # `...` drops a field


def _expected(label: int, correct: float, steps: list[str], answer: str | None, values: list[float]) -> P.Adapted:
    chain = {
        C.CHAIN_ID: "processbench_gsm8k:gsm8k-7", C.DATASET: "processbench_gsm8k", C.QUESTION_ID: "gsm8k-7",
        C.CONTEXT: PROBLEM, C.QUESTION: None, C.STEPS: steps, C.CHAIN_TEXT: None, C.ANSWER: answer,
        C.GOLD_ANSWER: None, C.GOLD_STEPS: None,
        C.LABELS: {SL.FIRST_ERROR_INDEX: float(label), SL.FINAL_ANSWER_CORRECT: correct},
        C.METADATA: {"subset": "gsm8k", "item_id": "gsm8k-7", "annotation": "processbench",
                     "generator": "Qwen2-7B-Instruct"},
        C.STEP_RCUS: None,
    }
    chain[C.CONTENT_HASH] = content_hash(chain)
    chain[C.SOURCE] = SOURCE
    rows = [{SL.CHAIN_ID: "processbench_gsm8k:gsm8k-7", SL.STEP_IDX: i, SL.LABEL: SL.FIRST_ERROR, SL.VALUE: v,
             SL.DATASET: "processbench_gsm8k"} for i, v in enumerate(values)]
    return P.Adapted(chain, rows)


def test_all_correct_item_labels_every_step_right_and_keeps_latex_verbatim():
    got = P.adapt_item(_item(), "gsm8k", SOURCE)
    steps = ["To find how many are left, subtract.", LATEX_STEP, LAST_STEP]
    assert got == _expected(-1, 1.0, steps, "12", [1.0, 1.0, 1.0])
    assert got.chain[C.STEPS][1] == (r"He keeps \(18 - 6 = 12\) apples, that is \(\frac{a}{b}\) of them with "
                                     r"\(a = 12\), \(b = 18\).")


def test_error_at_step_0_gives_one_row_and_nothing_after_it():
    got = P.adapt_item(_item(label=0, final_answer_correct=False), "gsm8k", SOURCE)
    assert got == _expected(0, 0.0, _item()["steps"], "12", [0.0])


def test_error_at_the_last_step():
    got = P.adapt_item(_item(label=2, final_answer_correct=False), "gsm8k", SOURCE)
    assert got == _expected(2, 0.0, _item()["steps"], "12", [1.0, 1.0, 0.0])


def test_a_last_step_without_a_box_gives_no_answer_and_no_final_answer_flag_gives_no_label():
    steps = ["Subtract: 18 - 6 = 12.", "So 12 apples are left."]
    got = P.adapt_item(_item(steps=steps, label=1, final_answer_correct=...), "gsm8k", SOURCE)
    assert got.chain[C.ANSWER] is None
    assert got.chain[C.LABELS] == {SL.FIRST_ERROR_INDEX: 1.0}
    # An answer boxed in an earlier step is not the final answer the last step states.
    got = P.adapt_item(_item(steps=[r"\(\boxed{12}\)", "So we are done."]), "gsm8k", SOURCE)
    assert got.chain[C.ANSWER] is None


@pytest.mark.parametrize("text, answer", [
    (LAST_STEP, "12"),
    (r"Therefore \(\boxed{\frac{3}{2}}\).", r"\frac{3}{2}"),
    (r"\boxed{6} first, then \boxed{ 7 }.", "7"),  # the last box, stripped
    (r"Put it in \boxed{} brackets: \boxed{14.33}.", "14.33"),
    (r"\boxed{}\). Nothing inside", None),  # an empty box states nothing
    (r"\boxed{180^\circ - 90^\circ = \boxed{90^\circ}}.", r"90^\circ"),  # nested: the inner, last one
    (r"\boxed{\{1, 2\}} is the set", r"\{1, 2\}"),  # escaped braces are text
    (r"\boxed {3, -5}", "3, -5"),
    (r"\[ \boxed{4\sqrt{3} \]", None),  # never closed
    ("The answer is 12.", None),
])
def test_boxed_answer(text, answer):
    assert P.boxed_answer(text) == answer


@pytest.mark.parametrize("item, reason, detail", [
    (["not", "an", "object"], "malformed_item", "the item is a JSON list, not an object"),
    (_item(steps="one step"), "malformed_item", "steps must be a list of strings, got str"),
    (_item(steps=...), "malformed_item", "steps must be a list of strings, got NoneType"),
    (_item(steps=["ok", 3]), "malformed_item", "step 1 must be text, got int"),
    (_item(final_answer_correct="yes"), "malformed_item", "final_answer_correct must be a boolean, got 'yes'"),
    (_item(problem=12), "malformed_item", "problem must be text, got int"),
    (_item(generator=["x"]), "malformed_item", "generator must be text, got list"),
    (_item(steps=[]), "empty_steps", "steps is an empty list"),
    (_item(steps=["ok", " \n"]), "empty_step", "step 1 is empty or only whitespace"),
    (_item(problem=...), "missing_problem", "problem is None"),
    (_item(problem=" "), "missing_problem", "problem is ' '"),
    (_item(label=...), "missing_label", "the item has no label"),
    (_item(label="2"), "label_not_integer", "label is '2' (str), not an integer"),
    (_item(label=1.5), "label_not_integer", "label is 1.5 (float), not an integer"),
    (_item(label=2.0), "label_not_integer", "label is 2.0 (float), not an integer"),
    (_item(label=True), "label_not_integer", "label is True (bool), not an integer"),
    (_item(label=None), "label_not_integer", "label is None (NoneType), not an integer"),
    (_item(label=3), "label_out_of_range", "label 3 for 3 steps (valid: -1 to 2)"),
    (_item(label=-2), "label_out_of_range", "label -2 for 3 steps (valid: -1 to 2)"),
])
def test_bad_items_are_rejected_with_reason_and_detail(item, reason, detail):
    chain_id = None if reason == "malformed_item" and isinstance(item, list) else "processbench_gsm8k:gsm8k-7"
    assert P.adapt_item(item, "gsm8k", SOURCE) == P.Rejected(reason, detail, chain_id)
    assert reason in P.REASONS


@pytest.mark.parametrize("value", [..., None, "", True, ["gsm8k-7"]])
def test_an_item_without_a_usable_id_is_rejected(value):
    got = P.adapt_item(_item(id=value), "gsm8k", SOURCE)
    assert (got.reason, got.chain_id) == ("missing_id", None)


def test_integer_ids_name_the_chain():
    got = P.adapt_item(_item(id=42), "math", SOURCE, prefix="pb")
    assert (got.chain[C.CHAIN_ID], got.chain[C.DATASET], got.step_labels[0][SL.DATASET]) == ("pb_math:42", "pb_math",
                                                                                               "pb_math")


def _file(*items: bytes) -> bytes:
    return b"[\n" + b",\n".join(items) + b"\n]"


def test_non_utf8_bytes_quarantine_only_the_item_that_holds_them():
    good = json.dumps(_item(id="a")).encode()
    bad_problem = json.dumps(_item(id="b")).encode().replace(b"Tom has", b"Tom\xff has")
    bad_id = json.dumps(_item(id="c")).encode().replace(b'"c"', b'"c\xc3"')  # a cut two-byte sequence
    items = P.parse_file(_file(good, bad_problem, bad_id))
    got = P.adapt_items(items, "gsm8k", SOURCE)
    assert isinstance(got[0], P.Adapted) and got[0].chain[C.CHAIN_ID] == "processbench_gsm8k:a"
    assert got[1:] == [
        P.Rejected("undecodable_text", "item 1: item.problem holds bytes that are not valid UTF-8",
                   "processbench_gsm8k:b"),
        P.Rejected("undecodable_text", "item 2: item.id holds bytes that are not valid UTF-8", None),
    ]
    # An escaped lone surrogate cannot be written as UTF-8 either.
    assert P.adapt_item(_item(steps=["ok", "\udc80"]), "gsm8k", SOURCE).reason == "undecodable_text"


def test_parse_file_rejects_what_holds_no_items():
    with pytest.raises(P.FileRejected) as err:
        P.parse_file(b'[{"id": 1},')
    assert err.value.reason == "not_json"
    with pytest.raises(P.FileRejected) as err:
        P.parse_file(b"[\xff]")  # an undecodable byte outside any string breaks the JSON itself
    assert err.value.reason == "not_json"
    with pytest.raises(P.FileRejected) as err:
        P.parse_file(b'{"id": 1}')
    assert (err.value.reason, err.value.detail) == ("not_a_list", "the file holds a JSON dict, not a list of items")
    assert P.parse_file(b"\xef\xbb\xbf[1]") == [1]  # a UTF-8 byte order mark is no content


def test_adapt_items_keeps_the_first_of_a_duplicated_id_and_numbers_details():
    got = P.adapt_items([_item(), _item(label=0), _item(id="x", label="1")], "gsm8k", SOURCE)
    assert got[0] == _expected(-1, 1.0, _item()["steps"], "12", [1.0, 1.0, 1.0])
    assert got[1:] == [
        P.Rejected("duplicate_id", "item 1: id 'gsm8k-7' was already given to an earlier item",
                   "processbench_gsm8k:gsm8k-7"),
        P.Rejected("label_not_integer", "item 2: label is '1' (str), not an integer", "processbench_gsm8k:x"),
    ]


def test_first_error_rows():
    rows = lambda first, n: [(r[SL.STEP_IDX], r[SL.VALUE]) for r in S.first_error_rows("c", first, n, "d")]  # noqa: E731
    assert rows(-1, 3) == [(0, 1.0), (1, 1.0), (2, 1.0)]
    assert rows(0, 3) == [(0, 0.0)]
    assert rows(1, 3) == [(0, 1.0), (1, 0.0)]
    assert rows(2, 3) == [(0, 1.0), (1, 1.0), (2, 0.0)]
    assert S.first_error_rows("c", 0, 1, None) == [
        {SL.CHAIN_ID: "c", SL.STEP_IDX: 0, SL.LABEL: SL.FIRST_ERROR, SL.VALUE: 0.0, SL.DATASET: None}]
    for bad in (3, -2):
        with pytest.raises(ValueError, match="outside a chain of 3 steps"):
            S.first_error_rows("c", bad, 3, "d")


def test_earliest_error_needs_every_step_up_to_it_judged():
    assert S.earliest_error([1.0, 0.0, None, 0.0]) == 1  # what follows the first error does not matter
    assert S.earliest_error([1.0, 1.0]) == -1
    assert S.earliest_error([1.0, None, 0.0]) is None  # step 1 may be the earliest error
    assert S.earliest_error([1.0, None]) is None  # step 1 may be wrong
    assert S.earliest_error([]) == -1
