"""jobs.cot.data: BBH, MGSM and P3 loaders to the common example schema; custom JSONL; template sandbox."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from jinja2.exceptions import SecurityError

from jobs.cot import data as D
from jobs.cot import p3 as P3
from jobs.cot.settings import CotSettings
from jobs.infra.config_paths import PROJECT_ROOT, resolve_path
from schemas import cot as S

ROOT = resolve_path(CotSettings().data_root)
TEMPLATES = PROJECT_ROOT / "conf" / "p3_templates"
LISTING = TEMPLATES / "t0_eval.yaml"


@pytest.fixture(scope="module")
def bbh():
    return D.load_bbh(ROOT)


@pytest.fixture(scope="module")
def p3():
    rows, skipped = P3.load_p3(ROOT, TEMPLATES, LISTING, list(P3.P3_RECORDS))
    return rows, skipped


@pytest.mark.dataset("bbh")
def test_load_bbh_all_27_tasks(bbh):
    counts = Counter(r[S.TASK] for r in bbh)
    assert len(counts) == 27 and sum(counts.values()) == 6511
    assert counts["causal_judgement"] == 187 and counts["penguins_in_a_table"] == 146 and counts["snarks"] == 178
    assert set(bbh[0]) == set(S.EXAMPLE_SCHEMA.fieldNames())
    generation = {r[S.TASK] for r in bbh if r[S.OPTIONS] is None}
    assert generation == {"dyck_languages", "multistep_arithmetic_two", "word_sorting", "object_counting"}


@pytest.mark.dataset("bbh")
def test_load_bbh_options_and_label_sets(bbh):
    by_task = {}
    for r in bbh:
        by_task.setdefault(r[S.TASK], []).append(r)
    assert by_task["date_understanding"][0][S.OPTIONS] == ["(A)", "(B)", "(C)", "(D)", "(E)", "(F)"]
    assert by_task["boolean_expressions"][0][S.OPTIONS] == ["True", "False"]
    assert by_task["sports_understanding"][0][S.OPTIONS] == ["yes", "no"]
    assert by_task["formal_fallacies"][0][S.OPTIONS] == ["valid", "invalid"]
    assert by_task["navigate"][0][S.OPTIONS] == ["Yes", "No"]
    assert Counter(len(r[S.OPTIONS]) for r in by_task["ruin_names"]) == {4: 247, 3: 1, 7: 1, 11: 1}
    missing = sorted(r[S.GOLD] for r in bbh if r[S.OPTIONS] is not None and r[S.GOLD] not in r[S.OPTIONS])
    assert missing == ["Monsters, Inc", "dearth, wind, & fire", "rita, sue and bob poo"]  # upstream defects


@pytest.mark.dataset("bbh")
def test_load_bbh_text_style_maps_gold_to_option_text():
    rows = D.load_bbh(ROOT, ["date_understanding", "hyperbaton"], style="text")
    first = rows[0]
    assert first[S.OPTIONS][1] == "12/25/1937" and first[S.GOLD] == "12/25/1937"  # gold was "(B)"
    assert all(r[S.GOLD] in r[S.OPTIONS] for r in rows)


@pytest.mark.dataset("mgsm")
def test_load_mgsm_eleven_languages_integer_gold():
    rows = D.load_mgsm(ROOT)
    assert Counter(r[S.TASK] for r in rows) == {lang: 250 for lang in D.MGSM_LANGUAGES}
    assert all(r[S.OPTIONS] is None and r[S.GOLD].lstrip("-").isdigit() for r in rows)
    en = [r for r in rows if r[S.TASK] == "en"]
    zh = [r for r in rows if r[S.TASK] == "zh"]
    assert [r[S.GOLD] for r in en] == [r[S.GOLD] for r in zh]  # same problems, same order
    assert en[0][S.GOLD] == "18" and en[0][S.SOURCE].startswith("Janet’s ducks lay 16 eggs")
    assert {"2125", "114200", "276000", "5600"} <= {r[S.GOLD] for r in en}  # thousands separators removed


@pytest.mark.dataset("p3_heldout")
def test_load_p3_counts_per_task_and_template(p3):
    rows, skipped = p3
    per_task = Counter(r[S.TASK] for r in rows)
    templates = Counter((r[S.TASK], r[S.TEMPLATE]) for r in rows)
    n_templates = Counter(task for task, _ in templates)
    assert n_templates == {"anli_r1": 15, "anli_r2": 15, "anli_r3": 15, "cb": 15, "copa": 12, "rte": 10, "wic": 10,
                           "wsc": 10, "winogrande": 5, "story_cloze": 5}  # fmt: skip
    assert per_task["rte"] == 277 * 10 and per_task["cb"] == 56 * 15 and per_task["wic"] == 638 * 10
    assert per_task["anli_r3"] == 1198 * 15 and per_task["story_cloze"] == 1871 * 5
    assert per_task["winogrande"] == 1267 * 5 and per_task["wsc"] == 104 * 10
    # COPA: 8 templates fit both question kinds, 2 only effects (48 rows), 2 only causes (52 rows).
    assert per_task["copa"] == 8 * 100 + 2 * 48 + 2 * 52 and skipped == {"copa": 200}
    assert all(r[S.GOLD] in r[S.OPTIONS] and r[S.SOURCE] for r in rows)


def _find(rows, task, template, example_id):
    return next(r for r in rows if (r[S.TASK], r[S.TEMPLATE], r[S.EXAMPLE_ID]) == (task, template, example_id))


@pytest.mark.dataset("p3_heldout")
def test_load_p3_renders_promptsource_templates(p3):
    rows, _ = p3
    rte = _find(rows, "rte", "GPT-3 style", "0")
    assert rte[S.SOURCE] == (
        "Dana Reeve, the widow of the actor Christopher Reeve, has died of lung cancer at age 44, according to the "
        "Christopher Reeve Foundation.\nQuestion: Christopher Reeve had an accident. True or False?"
    )
    assert (rte[S.OPTIONS], rte[S.GOLD]) == (["True", "False"], "False")
    copa = _find(rows, "copa", "choose", "0")  # rebuilt from MosaicML's "query, therefore" form
    assert copa[S.SOURCE] == (
        "The man turned on the faucet.  so... \nChoose between:\n- The toilet filled with water.\n"
        "- Water flowed from the spout."
    )
    assert copa[S.GOLD] == "Water flowed from the spout."
    wino = _find(rows, "winogrande", "stand for", "0")
    assert wino[S.SOURCE] == (
        "In the sentence below, does the _ stand for Sarah or Maria?\n"
        "Sarah was a much better surgeon than Maria so _ always got the easier cases."
    )
    assert (wino[S.OPTIONS], wino[S.GOLD]) == (["Sarah", "Maria"], "Maria")
    wic = _find(rows, "wic", "similar-sense", "0")  # detokenised like SuperGLUE
    assert wic[S.SOURCE] == "Room and board.\nHe nailed boards across the windows.\nSimilar sense of board?"
    anli = _find(rows, "anli_r1", "GPT-3 style", "0")
    assert anli[S.OPTIONS] == ["True", "Neither", "False"] and anli[S.GOLD] == "False"  # gold_label c
    cb = _find(rows, "cb", "always/sometimes/never", "0")
    assert cb[S.GOLD] == "Never"  # contradiction -> index 1 of Always/Never/Sometimes


@pytest.mark.dataset("p3_heldout")
def test_records_rebuild_hf_fields():
    copa = P3.copa_records(ROOT)
    assert copa[0] == {"idx": 0, "premise": "The man turned on the faucet.", "question": "effect",
                       "choice1": "The toilet filled with water.", "choice2": "Water flowed from the spout.",
                       "label": 1}  # fmt: skip
    assert Counter(r["question"] for r in copa) == {"effect": 48, "cause": 52}
    wino = P3.winogrande_records(ROOT)
    assert wino[2]["sentence"] == "They were worried the wine would ruin the bed and the blanket, but the _ was't ruined."
    assert (wino[2]["option1"], wino[2]["option2"]) == ("blanket", "bed")
    wsc = P3.wsc_records(ROOT)
    fixed = next(r for r in wsc if r["idx"] == 42)  # upstream span2_index 30 points at "use", "it" is at 31
    assert fixed["span2_index"] == 31 and fixed["text"].split(" ")[31] == "it"


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("Room and board .", "Room and board."),
        ("He did n't go , did he ?", "He didn't go, did he?"),
        ("The boy 's toy ( red ) .", "The boy's toy (red)."),
    ],
)
def test_detokenize(raw, clean):
    assert P3.detokenize(raw) == clean


def test_render_is_sandboxed():
    env = P3._environment(0)
    evil = P3.PromptTemplate("evil", "{{ ''.__class__.__mro__[1].__subclasses__() }}", None)
    with pytest.raises(SecurityError):
        P3.render(env, evil, {})


def test_load_custom_keeps_valid_rows_and_rejects_the_rest(tmp_path):
    path = tmp_path / "mine.jsonl"
    good = {"dataset": "d", "task": "t", "example_id": "1", "source": "Q?", "options": ["a", "b"], "gold": "a"}
    lines = [
        json.dumps(good),
        json.dumps({**good, "example_id": "2", "options": None, "gold": 7}),  # generation, numeric gold
        "{not json",
        json.dumps({**good, "example_id": "3", "source": None}),
        json.dumps({**good, "example_id": "4", "gold": "c"}),
        json.dumps(good),
        "",
    ]
    path.write_text("\n".join(lines))
    rows, rejects = D.load_custom(path)
    assert [(r[S.EXAMPLE_ID], r[S.OPTIONS], r[S.GOLD], r[S.TEMPLATE]) for r in rows] == [
        ("1", ["a", "b"], "a", None),
        ("2", None, "7", None),
    ]
    assert [r.reason for r in rejects] == ["invalid_json", "invalid_example", "invalid_example", "duplicate_example"]
    assert rejects[1].detail == "missing fields: source" and rejects[0].source.endswith("mine.jsonl:3")


def test_load_examples_custom_only_and_head():
    cfg = CotSettings(datasets=[], custom_path="tests/data/cot_custom.jsonl", max_examples_per_task=1)
    rows, rejects, counts = D.load_examples(cfg)
    assert [(r[S.TASK], r[S.EXAMPLE_ID]) for r in rows] == [("capitals", "1"), ("sums", "1"), ("yesno", "1")]
    assert [r.reason for r in rejects] == ["invalid_example"]  # gold "maybe" is not an option
    assert counts["examples"] == 3 and counts["rejected"] == 1


def test_load_examples_unknown_task_names_the_problem():
    with pytest.raises(D.DataError, match="unknown BBH task"):
        D.load_examples(CotSettings(datasets=["bbh"], bbh_tasks=["nope"]))


@pytest.mark.dataset("p3_heldout")
def test_load_p3_template_that_does_not_render_is_refused_by_name(tmp_path):
    (tmp_path / "rte.yaml").write_text(
        "dataset: super_glue\nsubset: rte\ntemplates:\n"
        "  x1: !Template\n    answer_choices: Yes ||| No\n    id: x1\n"
        "    jinja: '{{premise}} {{no_such_field}} ||| {{ answer_choices[label] }}'\n    name: broken one\n"
    )
    (tmp_path / "list.yaml").write_text("rte:\n  file: rte.yaml\n  templates:\n  - broken one\n")
    with pytest.raises(D.DataError, match=r"p3/rte/broken one example 0: the template does not render: .*no_such_field"):
        P3.load_p3(ROOT, tmp_path, tmp_path / "list.yaml", ["rte"])


def test_load_custom_rejects_an_example_with_an_empty_option_list(tmp_path):
    path = tmp_path / "mine.jsonl"
    row = {"dataset": "d", "task": "t", "example_id": "1", "source": "Q?", "options": [], "gold": "a"}
    path.write_text(json.dumps(row) + "\n")
    rows, rejects = D.load_custom(path)
    assert rows == [] and [r.reason for r in rejects] == ["invalid_example"]
    assert rejects[0].detail.startswith("options is an empty list") and rejects[0].source.endswith("mine.jsonl:1")


def test_seeded_choice_per_task_is_seeded_and_in_file_order():
    from jobs.cot.data import _seeded_choice

    rows = [{S.DATASET: "bbh", S.TASK: t, S.TEMPLATE: None, "i": i} for t in ("a", "b") for i in range(10)]
    rows += [{S.DATASET: "bbh", S.TASK: "c", S.TEMPLATE: None, "i": 0}]
    first = _seeded_choice(rows, 3, seed=0)
    assert [r["i"] for r in first if r[S.TASK] == "a"] == sorted(r["i"] for r in first if r[S.TASK] == "a")
    assert [sum(r[S.TASK] == t for r in first) for t in "abc"] == [3, 3, 1]  # a small task is kept whole
    assert _seeded_choice(rows, 3, seed=0) == first
    assert _seeded_choice(rows, 3, seed=1) != first
    # A task's sample does not depend on the other tasks present.
    assert [r for r in _seeded_choice(rows[:10], 3, seed=0)] == [r for r in first if r[S.TASK] == "a"]
    assert _seeded_choice(rows, None, seed=0) == rows


@pytest.mark.dataset("p3_heldout")
def test_load_p3_first_templates_per_task():
    rows, _ = P3.load_p3(ROOT, TEMPLATES, LISTING, ["rte", "cb"], templates_per_task=2)
    names = {(r[S.TASK], r[S.TEMPLATE]) for r in rows}
    listing = {t: [x.name for x in P3.load_templates(TEMPLATES, LISTING, P3.P3_TEMPLATE_KEY[t])][:2] for t in ("rte", "cb")}
    assert names == {(t, n) for t, ns in listing.items() for n in ns}
    assert len(rows) == 277 * 2 + 56 * 2
