"""P3 / T0 held-out evaluation files -> rows of the common example schema: the Hugging Face fields the
promptsource templates expect, rebuilt from each dataset's raw files, and every example rendered under every
template T0 evaluated. Templates are read only from the template files under `cot.p3_templates_dir` (never from
the data) and rendered in a Jinja sandbox.
"""

from __future__ import annotations

import csv
import json
import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from jinja2 import StrictUndefined
from jinja2.sandbox import SandboxedEnvironment

from jobs.cot.example_rows import DataError, Example, _example, _need

# P3 task -> key in the template list (t0_eval.yaml).
P3_TEMPLATE_KEY = {
    "anli_r1": "anli", "anli_r2": "anli", "anli_r3": "anli", "cb": "cb", "copa": "copa", "rte": "rte",
    "wic": "wic", "wsc": "wsc", "winogrande": "winogrande", "story_cloze": "story_cloze", "hellaswag": "hellaswag",
}  # fmt: skip


# ---- P3 / T0 held-out: rebuild the HF fields the templates expect ----------------------------------------
_DETOK = [
    (re.compile(r" ([.,;:!?%)\]}])"), r"\1"),
    (re.compile(r"([(\[{$]) "), r"\1"),
    (re.compile(r" (n't|'s|'re|'ve|'m|'ll|'d)\b", re.I), r"\1"),
    (re.compile(r"`` ?| ?''"), '"'),
    (re.compile(r" ?' ?s\b"), "'s"),
]


def detokenize(text: str) -> str:
    """Undo PTB-style tokenisation of the original WiC files ("Room and board ." -> "Room and board.").

    An approximation of the detokenised SuperGLUE/HF text: spaces before punctuation and clitics go.
    """
    out = text
    for pattern, repl in _DETOK:
        out = pattern.sub(repl, out)
    return out.strip()


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with _need(path).open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in _need(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def anli_records(root: Path, rnd: int) -> list[dict[str, Any]]:
    labels = {"e": 0, "n": 1, "c": 2}  # HF/promptsource order
    return [
        {"uid": r["uid"], "premise": r["context"], "hypothesis": r["statement"], "label": labels[r["gold_label"]],
         "reason": r["reason"]}
        for r in _csv_rows(root / "p3_heldout" / "anli" / f"ANLI_analysis_r{rnd}_dev.csv")
    ]  # fmt: skip


def cb_records(root: Path) -> list[dict[str, Any]]:
    labels = {"entailment": 0, "contradiction": 1, "neutral": 2}
    return [
        {"idx": r["idx"], "premise": r["premise"], "hypothesis": r["hypothesis"], "label": labels[r["label"]]}
        for r in _jsonl(root / "p3_heldout" / "cb" / "val.jsonl")
    ]


def rte_records(root: Path) -> list[dict[str, Any]]:
    labels = {"entailment": 0, "not_entailment": 1}
    return [
        {"idx": r["idx"], "premise": r["premise"], "hypothesis": r["hypothesis"], "label": labels[r["label"]]}
        for r in _jsonl(root / "p3_heldout" / "rte" / "val.jsonl")
    ]


def _capitalise(text: str) -> str:
    return text[:1].upper() + text[1:]


def copa_records(root: Path) -> list[dict[str, Any]]:
    """MosaicML's reformatted COPA back to SuperGLUE fields (premise, question, choice1/2, label)."""
    out = []
    for i, r in enumerate(_jsonl(root / "p3_heldout" / "copa" / "copa_llmfoundry.jsonl")):
        query: str = r["query"]
        for marker, kind in ((", therefore", "effect"), (", because", "cause")):
            if query.endswith(marker):
                premise = _capitalise(query[: -len(marker)].strip()) + "."
                question = kind
                break
        else:
            raise DataError(f"copa row {i}: query ends with neither ', therefore' nor ', because': {query!r}")
        c1, c2 = (_capitalise(c.strip()) for c in r["choices"])
        out.append({"idx": i, "premise": premise, "question": question, "choice1": c1, "choice2": c2,
                    "label": int(r["gold"])})  # fmt: skip
    return out


def wic_records(root: Path) -> list[dict[str, Any]]:
    folder = root / "p3_heldout" / "wic"
    lines = _need(folder / "dev.data.txt").read_text(encoding="utf-8").splitlines()
    golds = _need(folder / "dev.gold.txt").read_text(encoding="utf-8").split()
    if len(lines) != len(golds):
        raise DataError(f"wic: {len(lines)} data lines but {len(golds)} gold labels")
    out = []
    for i, (line, gold) in enumerate(zip(lines, golds, strict=True)):
        word, _pos, _idx, s1, s2 = line.split("\t")
        out.append({"idx": i, "word": word, "sentence1": detokenize(s1), "sentence2": detokenize(s2),
                    "label": 1 if gold == "T" else 0})  # fmt: skip
    return out


def _fix_span_index(words: list[str], span: str, index: int) -> int:
    """Index of the span's first word: the given one if it matches, else the nearest match (wsc.fixed)."""
    target = [w.lower() for w in span.split(" ")]
    lowered = [w.lower() for w in words]

    def at(i: int) -> bool:
        return lowered[i : i + len(target)] == target

    if 0 <= index < len(words) and at(index):
        return index
    hits = [i for i in range(len(words)) if at(i)]
    return min(hits, key=lambda i: abs(i - index)) if hits else index


def wsc_records(root: Path) -> list[dict[str, Any]]:
    out = []
    for r in _jsonl(root / "p3_heldout" / "wsc" / "val.jsonl"):
        t = r["target"]
        words = r["text"].split(" ")
        out.append({
            "idx": r["idx"], "text": r["text"], "span1_text": t["span1_text"], "span2_text": t["span2_text"],
            "span1_index": _fix_span_index(words, t["span1_text"], t["span1_index"]),
            "span2_index": _fix_span_index(words, t["span2_text"], t["span2_index"]),
            "label": int(bool(r["label"])),
        })  # fmt: skip
    return out


def winogrande_records(root: Path) -> list[dict[str, Any]]:
    """Partial-scoring rows back to HF fields: options after the common word prefix, '_' in the sentence."""
    folder = root / "p3_heldout" / "winogrande"
    rows = _jsonl(folder / "winogrande_dev_llmfoundry.jsonl")
    labels = _need(folder / "dev-labels.lst").read_text().split()
    if len(labels) != len(rows):
        raise DataError(f"winogrande: {len(rows)} rows but {len(labels)} labels in dev-labels.lst")
    out = []
    for i, (r, label) in enumerate(zip(rows, labels, strict=True)):
        a, b = (c.split(" ") for c in r["context_options"])
        k = 0
        while k < min(len(a), len(b)) - 1 and a[k] == b[k]:
            k += 1
        prefix = " ".join(a[:k])
        cont: str = r["continuation"]
        blank = "_ " if cont[:1].isalnum() else "_"  # "_'s injury", "in the _."
        sentence = (prefix + " " if prefix else "") + blank + cont
        if str(int(r["gold"]) + 1) != label.strip():
            raise DataError(f"winogrande row {i}: gold {r['gold']} disagrees with dev-labels.lst {label}")
        out.append({"idx": i, "sentence": sentence, "option1": " ".join(a[k:]), "option2": " ".join(b[k:]),
                    "answer": label.strip()})  # fmt: skip
    return out


def story_cloze_records(root: Path) -> list[dict[str, Any]]:
    return [
        {
            "story_id": r["InputStoryid"],
            **{f"input_sentence_{k}": r[f"InputSentence{k}"] for k in range(1, 5)},
            "sentence_quiz1": r["RandomFifthSentenceQuiz1"],
            "sentence_quiz2": r["RandomFifthSentenceQuiz2"],
            "answer_right_ending": int(r["AnswerRightEnding"]),
        }
        for r in _csv_rows(root / "p3_heldout" / "story_cloze" / "cloze_test_val__spring2016.csv")
    ]


P3_RECORDS: dict[str, Callable[[Path], list[dict[str, Any]]]] = {
    "anli_r1": lambda root: anli_records(root, 1),
    "anli_r2": lambda root: anli_records(root, 2),
    "anli_r3": lambda root: anli_records(root, 3),
    "cb": cb_records,
    "copa": copa_records,
    "rte": rte_records,
    "wic": wic_records,
    "wsc": wsc_records,
    "winogrande": winogrande_records,
    "story_cloze": story_cloze_records,
}


# ---- promptsource templates ------------------------------------------------------------------------------
class _TemplateLoader(yaml.SafeLoader):
    """Reads promptsource's `!Template` / `!TemplateMetadata` tags as plain mappings (no object construction)."""


_TemplateLoader.add_multi_constructor("!", lambda loader, _tag, node: loader.construct_mapping(node, deep=True))


@dataclass(frozen=True)
class PromptTemplate:
    name: str
    jinja: str
    answer_choices: str | None


def _environment(seed: int) -> SandboxedEnvironment:
    env = SandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=False)
    rng = random.Random(seed)
    # promptsource's filters; `choice` is seeded so a rerun renders the same prompts.
    env.filters["choice"] = lambda seq: rng.choice(list(seq))
    env.filters["most_frequent"] = lambda seq: max(set(seq), key=list(seq).count)
    env.filters["highlight"] = lambda text: text
    return env


def load_templates(templates_dir: Path, template_list: Path, key: str) -> list[PromptTemplate]:
    """The templates of one dataset named in the template list, in the list's order."""
    listing = yaml.safe_load(_need(template_list).read_text())
    if key not in listing:
        raise DataError(f"{template_list}: no entry for {key!r}")
    entry = listing[key]
    data = yaml.load(_need(templates_dir / entry["file"]).read_text(), Loader=_TemplateLoader)
    by_name = {t["name"]: t for t in data["templates"].values()}
    missing = [n for n in entry["templates"] if n not in by_name]
    if missing:
        raise DataError(f"{templates_dir / entry['file']}: templates {missing} not found")
    return [
        PromptTemplate(n, by_name[n]["jinja"], by_name[n].get("answer_choices")) for n in entry["templates"]
    ]


def render(env: SandboxedEnvironment, template: PromptTemplate, record: dict[str, Any]) -> tuple[str, str, list[str]]:
    """(prompt, target, answer choices) as promptsource's Template.apply: split on '|||', strip each part."""
    return _compiled(env, template)(record)


def _compiled(env: SandboxedEnvironment, template: PromptTemplate) -> Callable[[dict[str, Any]], tuple[str, str, list[str]]]:
    # Compiling once per template, not per example: Jinja compilation dominates rendering time.
    body = env.from_string(template.jinja)
    choices_t = env.from_string(template.answer_choices) if template.answer_choices else None

    def apply(record: dict[str, Any]) -> tuple[str, str, list[str]]:
        choices = [c.strip() for c in choices_t.render(**record).split("|||")] if choices_t else []
        parts = [p.strip() for p in body.render(**record, answer_choices=choices).split("|||")]
        return parts[0], (parts[1] if len(parts) > 1 else ""), choices

    return apply


def load_p3(
    root: Path, templates_dir: Path, template_list: Path, tasks: Iterable[str], seed: int = 0,
    templates_per_task: int | None = None,
) -> tuple[list[Example], dict[str, int]]:
    """Every example under every T0-evaluated template; also the count of (example, template) pairs skipped.

    A template that renders an empty prompt or target for an example does not apply to it (COPA's
    effect-only and cause-only templates), as in P3/T0: those pairs are skipped and counted.
    """
    rows: list[Example] = []
    skipped: dict[str, int] = {}
    for task in tasks:
        if task not in P3_RECORDS:
            raise DataError(f"unknown P3 task {task!r}; available: {', '.join(P3_RECORDS)}")
        records = P3_RECORDS[task](root)
        env = _environment(seed)
        for template in load_templates(templates_dir, template_list, P3_TEMPLATE_KEY[task])[:templates_per_task]:
            apply = _compiled(env, template)
            for i, record in enumerate(records):
                try:
                    prompt, target, choices = apply(record)
                except Exception as err:  # a broken template refuses the run, naming itself, not a bare Jinja error
                    raise DataError(
                        f"p3/{task}/{template.name} example {i}: the template does not render: {type(err).__name__}: {err}"
                    ) from err
                if not prompt or not target:
                    skipped[task] = skipped.get(task, 0) + 1
                    continue
                if target not in choices:
                    raise DataError(f"p3/{task}/{template.name} example {i}: target {target!r} not in {choices}")
                rows.append(_example("p3", task, template.name, str(i), prompt, choices, target))
    return rows, skipped
