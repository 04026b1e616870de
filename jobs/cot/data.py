"""Raw evaluation files (BBH, MGSM, T0/P3 held-out, a user's JSONL) -> rows of the common example schema.

Each row: dataset, task, template, example_id, source, options (None for generation tasks), gold
(`jobs.cot.example_rows`). BBH, MGSM, a user's JSONL and the few-shot exemplars are read here; P3 (its fields
rebuilt, its promptsource templates rendered) in jobs.cot.p3; `load_examples` gathers what the config asks for.
"""

from __future__ import annotations

import csv
import json
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.cot.example_rows import DataError, Example, _example, _need
from jobs.cot.p3 import load_p3
from jobs.cot.settings import CotSettings
from jobs.infra.config_paths import resolve_path
from schemas import cot as S
from udfs import cot_fewshot
from udfs.cot_text import parse_options

BBH_TASKS = (
    "boolean_expressions", "causal_judgement", "date_understanding", "disambiguation_qa", "dyck_languages",
    "formal_fallacies", "geometric_shapes", "hyperbaton", "logical_deduction_five_objects",
    "logical_deduction_seven_objects", "logical_deduction_three_objects", "movie_recommendation",
    "multistep_arithmetic_two", "navigate", "object_counting", "penguins_in_a_table",
    "reasoning_about_colored_objects", "ruin_names", "salient_translation_error_detection", "snarks",
    "sports_understanding", "temporal_sequences", "tracking_shuffled_objects_five_objects",
    "tracking_shuffled_objects_seven_objects", "tracking_shuffled_objects_three_objects", "web_of_lies",
    "word_sorting",
)  # fmt: skip
BBH_GENERATION = frozenset({"dyck_languages", "multistep_arithmetic_two", "word_sorting", "object_counting"})
# Tasks whose inputs carry no option block: the closed label set of their targets.
BBH_LABEL_SETS = {
    "boolean_expressions": ["True", "False"],
    "causal_judgement": ["Yes", "No"],
    "formal_fallacies": ["valid", "invalid"],
    "navigate": ["Yes", "No"],
    "sports_understanding": ["yes", "no"],
    "web_of_lies": ["Yes", "No"],
}
MGSM_LANGUAGES = ("bn", "de", "en", "es", "fr", "ja", "ru", "sw", "te", "th", "zh")


@dataclass(frozen=True)
class Reject:
    """A row that cannot become an example (custom JSONL): it goes to `quarantine`."""

    source: str
    reason: str
    detail: str
    raw: str


# ---- BBH ------------------------------------------------------------------------------------------------
def bbh_options(task: str, text: str, style: str = "letter") -> list[tuple[str, str]] | None:
    """[(option string to score, letter or None)] for a BBH input; None for the four generation tasks."""
    if task in BBH_GENERATION:
        return None
    parsed = parse_options(text)
    if parsed and parsed[0][0] is not None:
        if style == "letter":
            return [(f"({letter})", f"({letter})") for letter, _ in parsed]
        return [(body, f"({letter})") for letter, body in parsed]
    if parsed:  # "- Yes\n- No" blocks: the label set itself
        return [(body, body) for _, body in parsed]
    if task in BBH_LABEL_SETS:
        return [(label, label) for label in BBH_LABEL_SETS[task]]
    raise DataError(f"bbh/{task}: no option block and no fixed label set for input {text[:80]!r}")


def load_bbh(root: Path, tasks: Iterable[str] | None = None, style: str = "letter") -> list[Example]:
    rows: list[Example] = []
    for task in tasks or BBH_TASKS:
        if task not in BBH_TASKS:
            raise DataError(f"unknown BBH task {task!r}; known: {', '.join(BBH_TASKS)}")
        data = json.loads(_need(root / "bbh" / "bbh" / f"{task}.json").read_text())
        for i, ex in enumerate(data["examples"]):
            pairs = bbh_options(task, ex["input"], style)
            gold = ex["target"]
            options = None
            if pairs is not None:
                options = [option for option, _ in pairs]
                # style=text: the gold letter becomes its option text; upstream defects stay as they are.
                gold = next((option for option, key in pairs if key == gold), gold)
            rows.append(_example("bbh", task, None, str(i), ex["input"], options, gold))
    return rows


# ---- MGSM -----------------------------------------------------------------------------------------------
def load_mgsm(root: Path, languages: Iterable[str] | None = None) -> list[Example]:
    rows: list[Example] = []
    for lang in languages or MGSM_LANGUAGES:
        path = _need(root / "mgsm" / f"mgsm_{lang}.tsv")
        with path.open(encoding="utf-8", newline="") as f:
            for i, rec in enumerate(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)):
                if len(rec) != 2:
                    raise DataError(f"{path}:{i + 1}: expected question<TAB>answer, got {len(rec)} fields")
                gold = rec[1].strip().replace(",", "")  # "2,125" -> "2125": integer gold
                if not re.fullmatch(r"-?\d+", gold):
                    raise DataError(f"{path}:{i + 1}: gold {rec[1]!r} is not an integer")
                rows.append(_example("mgsm", lang, None, str(i), rec[0], None, gold))
    return rows


# ---- a user's own JSONL ---------------------------------------------------------------------------------
_REQUIRED = (S.DATASET, S.TASK, S.EXAMPLE_ID, S.SOURCE, S.GOLD)


def load_custom(path: Path) -> tuple[list[Example], list[Reject]]:
    """Rows of the common example schema from JSONL; malformed rows become rejects (never silently dropped)."""
    rows: list[Example] = []
    rejects: list[Reject] = []
    seen: set[tuple[str, str, str | None, str]] = set()
    for n, line in enumerate(_need(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            rejects.append(Reject(where, "invalid_json", str(err), line))
            continue
        problem = _custom_problem(rec)
        if problem:
            rejects.append(Reject(where, "invalid_example", problem, line))
            continue
        key = (str(rec[S.DATASET]), str(rec[S.TASK]), rec.get(S.TEMPLATE), str(rec[S.EXAMPLE_ID]))
        if key in seen:
            rejects.append(Reject(where, "duplicate_example", f"key {key} appears more than once", line))
            continue
        seen.add(key)
        options = rec.get(S.OPTIONS)
        rows.append(_example(*key, rec[S.SOURCE], [str(o) for o in options] if options else None, str(rec[S.GOLD])))
    return rows, rejects


def _custom_problem(rec: Any) -> str | None:
    if not isinstance(rec, dict):
        return "a row must be a JSON object"
    missing = [k for k in _REQUIRED if rec.get(k) in (None, "")]
    if missing:
        return f"missing fields: {', '.join(missing)}"
    if not isinstance(rec[S.SOURCE], str):
        return "source must be a string"
    options = rec.get(S.OPTIONS)
    if options is not None:
        if not isinstance(options, list) or not all(isinstance(o, (str, int, float)) for o in options):
            return "options must be a list of strings or null"
        if not options:  # [] would silently turn a classification example into a generation one
            return "options is an empty list: give at least one option, or null for a generation task"
        if options and str(rec[S.GOLD]) not in [str(o) for o in options]:
            return f"gold {rec[S.GOLD]!r} is not one of the options"
    template = rec.get(S.TEMPLATE)
    if template is not None and not isinstance(template, str):
        return "template must be a string or null"
    return None


# ---- few-shot exemplars (cot.fewshot: an option; the paper is zero-shot) ----------------------------------------
Fewshot = dict[tuple[str, str], tuple[str, str]]  # (dataset, task) -> (prefix, suffix) around the source


def load_bbh_fewshot(root: Path, tasks: Iterable[str], shots: int) -> Fewshot:
    """(prefix, suffix) per BBH task from `bbh/cot-prompts/<task>.txt`; a task without its file is refused by name."""
    out: Fewshot = {}
    for task in tasks:
        path = root / "bbh" / "cot-prompts" / f"{task}.txt"
        if not path.exists():
            raise DataError(f"bbh/{task}: cot.fewshot={shots} needs its 3-shot CoT prompt file {path}, not found")
        try:
            out[("bbh", task)] = cot_fewshot.bbh_fewshot(path.read_text(encoding="utf-8"), shots, str(path))
        except cot_fewshot.FewshotError as err:
            raise DataError(str(err)) from err
    return out


def load_mgsm_fewshot(root: Path, languages: Iterable[str], shots: int, exemplars: str) -> Fewshot:
    """(prefix, suffix) per MGSM language from `mgsm/mgsm_exemplars.json` (upstream exemplars.py, as JSON)."""
    path = _need(root / "mgsm" / "mgsm_exemplars.json")
    table = json.loads(path.read_text(encoding="utf-8"))["MGSM_EXEMPLARS"]
    out: Fewshot = {}
    for lang in languages:
        source = "en" if exemplars == "english" else lang
        if source not in table:
            raise DataError(f"mgsm/{lang}: no exemplars for {source!r} in {path}")
        # exemplars.py numbers them "1".."8": keep that order, not the JSON's.
        shown = [table[source][k] for k in sorted(table[source], key=int)]
        try:
            out[("mgsm", lang)] = cot_fewshot.mgsm_fewshot(shown, shots, f"{path} [{source}]")
        except cot_fewshot.FewshotError as err:
            raise DataError(str(err)) from err
    return out


def load_fewshot(cfg: CotSettings) -> Fewshot:
    """The few-shot (prefix, suffix) of every BBH task and MGSM language the config evaluates; {} when zero-shot.

    P3 and custom examples have no exemplars (lm-eval has no few-shot CoT task for them): they stay zero-shot.
    """
    if not cfg.fewshot:
        return {}
    root = resolve_path(cfg.data_root)
    out: Fewshot = {}
    if "bbh" in cfg.datasets:
        out |= load_bbh_fewshot(root, cfg.bbh_tasks or BBH_TASKS, cfg.fewshot)
    if "mgsm" in cfg.datasets:
        out |= load_mgsm_fewshot(root, cfg.mgsm_languages, cfg.fewshot, cfg.mgsm_exemplars)
    return out


# ---- everything the config asks for ----------------------------------------------------------------------
def _head(rows: list[Example], limit: int | None) -> list[Example]:
    """The first `limit` examples of each (dataset, task, template), in file order."""
    if limit is None:
        return rows
    counts: dict[tuple[Any, ...], int] = {}
    kept = []
    for row in rows:
        key = (row[S.DATASET], row[S.TASK], row[S.TEMPLATE])
        counts[key] = counts.get(key, 0) + 1
        if counts[key] <= limit:
            kept.append(row)
    return kept


def _seeded_choice(rows: list[Example], size: int | None, seed: int) -> list[Example]:
    """A seeded random choice of `size` examples of each (dataset, task, template), kept in file order: a sample
    that stands for the whole task, where `_head`'s first N would follow the file's order (some files are sorted)."""
    if size is None:
        return rows
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault((row[S.DATASET], row[S.TASK], row[S.TEMPLATE]), []).append(i)
    keep: set[int] = set()
    for key, members in groups.items():
        # One generator per group, seeded by the group's name: adding a task does not change another's sample.
        rng = random.Random(f"{seed}\x1f{key}")
        keep.update(members if len(members) <= size else rng.sample(members, size))
    return [row for i, row in enumerate(rows) if i in keep]


def load_examples(cfg: CotSettings) -> tuple[list[Example], list[Reject], dict[str, int]]:
    """(examples, rejects, counts) for every dataset in cfg.datasets plus cfg.custom_path."""
    root = resolve_path(cfg.data_root)
    rows: list[Example] = []
    counts: dict[str, int] = {}
    if "bbh" in cfg.datasets:
        rows += load_bbh(root, cfg.bbh_tasks, cfg.bbh_option_style)
    if "mgsm" in cfg.datasets:
        rows += load_mgsm(root, cfg.mgsm_languages)
    if "p3" in cfg.datasets:
        p3, skipped = load_p3(
            root, resolve_path(cfg.p3_templates_dir), resolve_path(cfg.p3_template_list), cfg.p3_tasks, cfg.seed,
            cfg.p3_templates_per_task,
        )
        rows += p3
        counts.update({f"p3_template_not_applicable_{k}": v for k, v in skipped.items()})
    rejects: list[Reject] = []
    if cfg.custom_path:
        custom, rejects = load_custom(resolve_path(cfg.custom_path))
        rows += custom
    rows = _head(_seeded_choice(rows, cfg.sample_per_task, cfg.seed), cfg.max_examples_per_task)
    counts["examples"] = len(rows)
    counts["rejected"] = len(rejects)
    return rows, rejects, counts
