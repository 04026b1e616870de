"""ProcessBench items (QwenLM/ProcessBench `dataset/<subset>.json`) -> `chains` records and `step_labels` rows, or
the reason an item cannot be used. Plain Python (no Spark, no files): jobs/metaeval/processbench.py reads the files
and writes the tables.

An item is `{id, generator, problem, steps: [str], final_answer_correct: bool, label: int}`; `label` is the 0-based
index of the earliest erroneous step, -1 when every step is correct. A chain keeps:
- the steps exactly as given (ProcessBench's paragraphs, LaTeX and newlines inside): the steps job keeps given
  steps as they are, so `step_labels.step_idx` and `step_scores.step_idx` name the same paragraph;
- the problem, verbatim, as the context (as ROSCOE GSM-8K's question is);
- as answer the content of the last non-empty `\\boxed{...}` of the last step, where that step states one (else
  null: the steps job derives one);
- labels `first_error_index` (the label, as a float) and `final_answer_correct` (1.0 / 0.0), and `first_error`
  step labels (jobs/metaeval/step_labels.py).

An item is quarantined, with the reason (REASONS) and a detail naming the field, when it cannot give that chain.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from jobs.metaeval.step_labels import NO_ERROR, first_error_rows
from schemas import chains as C
from schemas import step_labels as SL
from schemas.chains import content_hash
from udfs.cot_text import boxed_answer

REASONS = {
    "not_json": "the file is not JSON (its items cannot be told apart: the file is one quarantined row)",
    "not_a_list": "the file's JSON is not a list of items (one quarantined row for the file)",
    "malformed_item": "an item that is not an object, or a field of the wrong type (steps not a list of strings, "
                      "final_answer_correct not a boolean, generator not text)",
    "undecodable_text": "a text field holds bytes that are not UTF-8 (or an escaped lone surrogate)",
    "missing_id": "no `id` (text or integer)",
    "duplicate_id": "an `id` an earlier item of the same file has",
    "missing_problem": "no `problem`, or an empty one",
    "empty_steps": "`steps` is an empty list",
    "empty_step": "a step that is empty or only whitespace",
    "missing_label": "no `label`",
    "label_not_integer": "`label` is not an integer (text, a fraction, a boolean, ...)",
    "label_out_of_range": "`label` is below -1 or not the index of a step",
}

# Bytes that are not UTF-8 decode to these lone surrogates (errors="surrogateescape"): text never holds them.
_SURROGATE = re.compile("[\ud800-\udfff]")


class FileRejected(ValueError):
    """A file that gives no items at all (not JSON, not a list)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class Rejected:
    """An item that cannot be used: the quarantine reason (REASONS), what is wrong, its chain id where known."""

    reason: str
    detail: str
    chain_id: str | None = None


@dataclass(frozen=True)
class Adapted:
    chain: dict[str, Any]  # a `chains` record (schemas.chains names; ingested_at left to the job)
    step_labels: list[dict[str, Any]]  # `step_labels` rows


def dataset_name(subset: str, prefix: str = "processbench") -> str:
    """`processbench_gsm8k`: localise's default calibration subset is named so."""
    return f"{prefix}_{subset}"


def parse_file(data: bytes) -> list[Any]:
    """A subset file's bytes -> its items.

    Bytes that are not UTF-8 do not fail the whole file: they are decoded with `surrogateescape`, so each stays a
    lone surrogate inside the string that held it, and `adapt_item` quarantines that item alone (undecodable_text)
    while the file's other items go on. An undecodable byte outside a string breaks the JSON itself (not_json).
    """
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        items = json.loads(data.decode("utf-8", errors="surrogateescape"))
    except json.JSONDecodeError as err:
        raise FileRejected("not_json", f"not valid JSON: {err}") from None
    if not isinstance(items, list):
        raise FileRejected("not_a_list", f"the file holds a JSON {type(items).__name__}, not a list of items")
    return items


def undecodable(text: str) -> bool:
    """Whether `text` holds a character UTF-8 cannot carry: a byte `parse_file` could not decode, or a lone
    surrogate a JSON escape made."""
    return _SURROGATE.search(text) is not None


def _strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """(field path, text) of every string in a parsed JSON value, keys included."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{where}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield f"{where}.<key>", k
            yield from _strings(v, f"{where}.{k}")


def _item_id(item: dict[str, Any]) -> str | None:
    value = item.get("id")
    if isinstance(value, bool):  # a JSON true is no id
        return None
    if isinstance(value, int):
        return str(value)
    return value.strip() or None if isinstance(value, str) else None


def adapt_item(item: Any, subset: str, source: str | None, prefix: str = "processbench") -> Adapted | Rejected:
    """One parsed item -> its chain and step labels, or why not (Rejected). Pure."""
    dataset = dataset_name(subset, prefix)
    if not isinstance(item, dict):
        return Rejected("malformed_item", f"the item is a JSON {type(item).__name__}, not an object")
    bad_text = next((where for where, text in _strings(item, "item") if undecodable(text)), None)
    item_id = _item_id(item)
    if item_id is not None and undecodable(item_id):
        item_id = None  # an undecodable id cannot name the chain
    chain_id = f"{dataset}:{item_id}" if item_id is not None else None
    if bad_text is not None:
        return Rejected("undecodable_text", f"{bad_text} holds bytes that are not valid UTF-8", chain_id)
    if chain_id is None:
        return Rejected("missing_id", f"id is {item.get('id')!r}: an item needs a text or integer id")
    problem = item.get("problem")
    if problem is None or (isinstance(problem, str) and not problem.strip()):
        return Rejected("missing_problem", f"problem is {problem!r}", chain_id)
    if not isinstance(problem, str):
        return Rejected("malformed_item", f"problem must be text, got {type(problem).__name__}", chain_id)
    steps = item.get("steps")
    if not isinstance(steps, list):
        return Rejected("malformed_item", f"steps must be a list of strings, got {type(steps).__name__}", chain_id)
    if not steps:
        return Rejected("empty_steps", "steps is an empty list", chain_id)
    for i, step in enumerate(steps):
        if not isinstance(step, str):
            return Rejected("malformed_item", f"step {i} must be text, got {type(step).__name__}", chain_id)
        if not step.strip():
            return Rejected("empty_step", f"step {i} is empty or only whitespace", chain_id)
    if "label" not in item:
        return Rejected("missing_label", "the item has no label", chain_id)
    label = item["label"]
    # JSON true is a Python int, and 2.0 or "2" might be meant as 2: the file's format says integer, so none is.
    if isinstance(label, bool) or not isinstance(label, int):
        return Rejected("label_not_integer", f"label is {label!r} ({type(label).__name__}), not an integer",
                        chain_id)
    if not NO_ERROR <= label < len(steps):
        return Rejected("label_out_of_range", f"label {label} for {len(steps)} steps (valid: -1 to "
                                              f"{len(steps) - 1})", chain_id)
    correct = item.get("final_answer_correct")
    if correct is not None and not isinstance(correct, bool):
        return Rejected("malformed_item", f"final_answer_correct must be a boolean, got {correct!r}", chain_id)
    generator = item.get("generator")
    if generator is not None and not isinstance(generator, str):
        return Rejected("malformed_item", f"generator must be text, got {type(generator).__name__}", chain_id)
    labels = {SL.FIRST_ERROR_INDEX: float(label)}
    if correct is not None:  # a set that does not say leaves the label out rather than guess
        labels[SL.FINAL_ANSWER_CORRECT] = 1.0 if correct else 0.0
    record = {
        C.CHAIN_ID: chain_id,
        C.DATASET: dataset,
        # The item, not the problem: a problem's chains come from different generators, not k samples of one
        # model, and chain selection must not choose among them.
        C.QUESTION_ID: item_id,
        C.CONTEXT: problem,
        C.QUESTION: None,
        C.STEPS: list(steps),
        C.CHAIN_TEXT: None,
        C.ANSWER: boxed_answer(steps[-1]),
        C.GOLD_ANSWER: None,
        C.GOLD_STEPS: None,
        C.LABELS: labels,
        C.METADATA: {"subset": subset, "item_id": item_id, "annotation": "processbench"}
        | ({"generator": generator} if generator is not None else {}),
        C.STEP_RCUS: None,
    }
    record[C.CONTENT_HASH] = content_hash(record)
    record[C.SOURCE] = source
    return Adapted(record, first_error_rows(chain_id, label, len(steps), dataset))


def adapt_items(items: list[Any], subset: str, source: str | None,
                prefix: str = "processbench") -> list[Adapted | Rejected]:
    """A file's items -> one outcome each, in order; a detail starts with the item's 0-based position in the
    file. An id seen before in the file is quarantined (duplicate_id): the first item keeps it."""
    out: list[Adapted | Rejected] = []
    seen: set[str] = set()
    for n, item in enumerate(items):
        got = adapt_item(item, subset, source, prefix)
        if isinstance(got, Adapted) and got.chain[C.CHAIN_ID] in seen:
            got = Rejected("duplicate_id", f"id {got.chain[C.QUESTION_ID]!r} was already given to an earlier item",
                           got.chain[C.CHAIN_ID])
        if isinstance(got, Adapted):
            seen.add(got.chain[C.CHAIN_ID])
        else:
            got = Rejected(got.reason, f"item {n}: {got.detail}", got.chain_id)
        out.append(got)
    return out
