"""Raw evaluation files (BBH, MGSM, T0/P3 held-out, a user's JSONL) -> rows of the common example schema.

Each row: dataset, task, template, example_id, source, options (None for generation tasks), gold.
P3 prompts are rendered with the promptsource templates T0 evaluated; templates are read only from the
template files under `cot.p3_templates_dir` (never from the data) and rendered in a Jinja sandbox.
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

from jobs.cot.settings import CotSettings
from jobs.infra.config_paths import resolve_path
from schemas import cot as S
from udfs import cot_fewshot
from udfs.cot_text import parse_options

Example = dict[str, Any]

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
# P3 task -> key in the template list (t0_eval.yaml).
P3_TEMPLATE_KEY = {
    "anli_r1": "anli", "anli_r2": "anli", "anli_r3": "anli", "cb": "cb", "copa": "copa", "rte": "rte",
    "wic": "wic", "wsc": "wsc", "winogrande": "winogrande", "story_cloze": "story_cloze", "hellaswag": "hellaswag",
}  # fmt: skip


class DataError(ValueError):
    """An evaluation file is missing or malformed; the message names the file."""


@dataclass(frozen=True)
class Reject:
    """A row that cannot become an example (custom JSONL): it goes to `quarantine`."""

    source: str
    reason: str
    detail: str
    raw: str


def _need(path: Path) -> Path:
    if not path.exists():
        raise DataError(f"evaluation file not found: {path} (cot.data_root points at the data folder)")
    return path


def _example(dataset: str, task: str, template: str | None, example_id: str, source: str,
             options: list[str] | None, gold: str) -> Example:  # fmt: skip
    return {
        S.DATASET: dataset,
        S.TASK: task,
        S.TEMPLATE: template,
        S.EXAMPLE_ID: example_id,
        S.SOURCE: source,
        S.OPTIONS: options,
        S.GOLD: gold,
    }


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
