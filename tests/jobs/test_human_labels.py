from __future__ import annotations

import json
from collections import Counter

import pandas as pd
import pytest
from conftest import require_datasets

from jobs.infra import tables
from jobs.metaeval import human_labels as H
from jobs.metaeval import localise
from jobs.metaeval.settings import HumanLabelSettings
from schemas import chains as C
from schemas import step_labels as SL

ROSCOE = HumanLabelSettings()


@pytest.fixture(scope="module")
def gsm8k() -> list[dict]:
    require_datasets("roscoe_gsm8k")
    return H.load(ROSCOE)


def test_load_error_counts_match_roscoe_readme(gsm8k):
    # Chains with >= 1 "yes", as counted independently by the ROSCOE mirror's README (see conf/datasets.yaml).
    errors = Counter(k for r in gsm8k for k, v in r[C.LABELS].items() if k not in ("QUAL", "COH") and v == 0.0)
    assert dict(errors) == {"FACT": 56, "LOGIC": 57, "HALL": 8, "RED": 13, "REP": 2, "COM": 58, "MATH": 7}
    assert len(gsm8k) == 200 and len({r[C.CHAIN_ID] for r in gsm8k}) == 200


def test_load_first_chain(gsm8k):
    first = gsm8k[0]
    assert first[C.CHAIN_ID] == "gsm8k_roscoe:gsm8k_0"
    assert first[C.STEPS] == [
        "Janet eats 3 duck eggs for breakfast and bakes 4 into muffins so 3 + 4 = 7 duck eggs are used",
        "Each day Janet's ducks lay 16 eggs and she uses 7, 16 - 7 = 9 duck eggs are for sale",
        "She sells her eggs for $2 per egg and has 9 available for sale so 2 * 9 = $18 per day",
        "A: 18",
    ]
    assert (first[C.ANSWER], first[C.GOLD_ANSWER]) == ("18", "18")
    assert first[C.GOLD_STEPS][0] == "Janet sells 16 - 3 - 4 = 9 duck eggs a day."
    assert first[C.LABELS]["QUAL"] == 5.0 and first[C.LABELS]["COH"] == 5.0
    assert first[C.CONTEXT].startswith("Janet\u2019s ducks lay 16 eggs per day.")


def _synthetic(tmp_path) -> tuple[HumanLabelSettings, pd.DataFrame, list[dict]]:
    """Another annotated set in the same shape but with its own column and question names."""
    annotated = pd.DataFrame(
        [
            {"ex": 1, "s1_text": "Step 1 - Tom has 2 <<1+1=2>>2 cats.", "s1_q_Bad": "no", "s1_q_Dup": "no",
             "s2_text": "Step 2 - So the answer is 2.", "s2_q_Bad": "yes", "s2_q_Dup": "no",
             "chain_Rating": 3, "chain_Miss": "yes"},
            {"ex": 0, "s1_text": "Step 1 - Ann has 3 dogs.", "s1_q_Bad": "no", "s1_q_Dup": None,
             "s2_text": None, "s2_q_Bad": None, "s2_q_Dup": None, "chain_Rating": 5, "chain_Miss": "no"},
        ]
    )
    generated = [
        {"id": "q0", "text": "Ann has 3 dogs. How many?", "ref": "Ann has 3 dogs.\nSo the answer is 3"},
        {"id": "q1", "text": "Tom has 2 cats. How many?", "ref": None},
    ]
    cfg = HumanLabelSettings(
        annotated=str(tmp_path / "a.csv"), generated=str(tmp_path / "g.json"), dataset="toy",
        example_idx="ex", generated_key="id", generated_context="text", generated_gold="ref", gold_prefix="",
        answer_marker="the answer is", step_text="s{n}_text", step_result="s{n}_q_{q}", chain_result="chain_{q}",
        step_labels={"BAD": "Bad", "DUP": "Dup"}, chain_flags={"MISS": "Miss"}, ordinal_labels={"QUAL": "Rating"},
    )
    return cfg, annotated, generated


def test_adapt_generic_mapping(tmp_path):
    cfg, annotated, generated = _synthetic(tmp_path)
    got = H.adapt(annotated, generated, cfg)
    assert [r[C.CHAIN_ID] for r in got] == ["toy:q1", "toy:q0"]
    tom, ann = got
    assert tom[C.STEPS] == ["Tom has 2 2 cats.", "So the answer is 2."]
    assert tom[C.ANSWER] == "2."
    # BAD: step 2 says yes -> 0; DUP: no on both -> 1; chain flag yes -> 0; rating kept ordinal.
    assert tom[C.LABELS] == {"BAD": 0.0, "DUP": 1.0, "MISS": 0.0, "QUAL": 3.0}
    assert (tom[C.GOLD_STEPS], tom[C.GOLD_ANSWER]) == (None, None)
    # DUP never answered for ann: no label rather than a clean one.
    assert ann[C.LABELS] == {"BAD": 1.0, "MISS": 1.0, "QUAL": 5.0}
    assert ann[C.GOLD_STEPS] == ["Ann has 3 dogs.", "So the answer is 3"]
    assert ann[C.GOLD_ANSWER] == "3"


def test_adapt_rejects_unknown_answer(tmp_path):
    cfg, annotated, generated = _synthetic(tmp_path)
    annotated.loc[0, "s1_q_Bad"] = "maybe"
    with pytest.raises(ValueError, match="maybe"):
        H.adapt(annotated, generated, cfg)


def test_load_names_the_dataset_to_fetch_when_its_files_are_missing(tmp_path):
    cfg = HumanLabelSettings(annotated=str(tmp_path / "absent.csv"), generated=str(tmp_path / "absent.jsonl"))
    with pytest.raises(FileNotFoundError, match=r"human_labels.annotated: .*absent.csv is missing.*fetch roscoe_gsm8k"):
        H.load(cfg)


def test_run_inserts_once(spark, make_settings, tmp_path):
    cfg, annotated, generated = _synthetic(tmp_path)
    annotated.to_csv(cfg.annotated, index=False)
    with open(cfg.generated, "w") as f:
        f.writelines(json.dumps(g) + "\n" for g in generated)
    overrides = [f"human_labels.{k}={json.dumps(v)}" for k, v in cfg.model_dump().items()]
    settings = make_settings(*overrides)
    assert H.run(spark, settings) == {"read": 2, "inserted": 2, "errors_BAD": 1, "errors_DUP": 0, "errors_MISS": 1}
    assert H.run(spark, settings)["inserted"] == 0
    table = tables.read(spark, settings.table("chains"))
    assert table.count() == 2
    row = table.where("chain_id = 'toy:q1'").first()
    assert row[C.LABELS] == {"BAD": 0.0, "DUP": 1.0, "MISS": 0.0, "QUAL": 3.0}


def _with_gold_and_unjudged(tmp_path) -> tuple[HumanLabelSettings, pd.DataFrame, list[dict]]:
    """The synthetic set, with a gold answer for Tom and a second annotation of his chain whose step 1 nobody
    judged."""
    cfg, annotated, generated = _synthetic(tmp_path)
    generated[1]["ref"] = "Tom has 2 cats.\nSo the answer is 2"
    unjudged = {"ex": 1, "s1_text": "Step 1 - Tom has 2 cats.", "s1_q_Bad": None, "s1_q_Dup": None,
                "s2_text": "Step 2 - So the answer is 3.", "s2_q_Bad": "yes", "s2_q_Dup": None,
                "chain_Rating": 1, "chain_Miss": "no"}
    return cfg, pd.concat([annotated, pd.DataFrame([unjudged])], ignore_index=True), generated


def _rows(*rows: tuple) -> list[dict]:
    return [{SL.CHAIN_ID: c, SL.STEP_IDX: i, SL.LABEL: label, SL.VALUE: v, SL.DATASET: "toy"} for c, i, label, v in rows]


def test_adapt_step_labels_by_hand(tmp_path):
    cfg, annotated, generated = _with_gold_and_unjudged(tmp_path)
    records, rows = H.adapt_with_step_labels(annotated, generated, cfg)
    assert records == H.adapt(annotated, generated, cfg)  # the chains as without step labels
    assert rows == _rows(
        # Tom: step 1 no/no, step 2 yes/no -> the earliest error is step 1 (0-based).
        ("toy:q1", 0, "BAD", 1.0), ("toy:q1", 0, "DUP", 1.0), ("toy:q1", 1, "BAD", 0.0), ("toy:q1", 1, "DUP", 1.0),
        ("toy:q1", 0, SL.FIRST_ERROR, 1.0), ("toy:q1", 1, SL.FIRST_ERROR, 0.0),
        # Ann: one step, BAD no, DUP unanswered (no row) -> judged right: every step 1.0.
        ("toy:q0", 0, "BAD", 1.0), ("toy:q0", 0, SL.FIRST_ERROR, 1.0),
        # Tom again: step 1 not judged, so step 2's "yes" may not be the earliest error: no first_error rows.
        ("toy:q1#2", 1, "BAD", 0.0),
    )
    assert [r[C.LABELS] for r in records] == [
        {"BAD": 0.0, "DUP": 1.0, "MISS": 0.0, "QUAL": 3.0}, {"BAD": 1.0, "MISS": 1.0, "QUAL": 5.0},
        {"BAD": 0.0, "MISS": 1.0, "QUAL": 1.0}]


def test_companion_labels_put_the_earliest_error_and_answer_check_into_chain_labels(tmp_path):
    cfg, annotated, generated = _with_gold_and_unjudged(tmp_path)
    records = H.adapt(annotated, generated, cfg.model_copy(update={"companion_labels": True}))
    assert [r[C.LABELS] for r in records] == [
        # Tom's "2." equals the gold "2"; Ann's chain states no answer; the second Tom's earliest error is unknown.
        {"BAD": 0.0, "DUP": 1.0, "MISS": 0.0, "QUAL": 3.0, SL.FIRST_ERROR_INDEX: 1.0, SL.FINAL_ANSWER_CORRECT: 1.0},
        {"BAD": 1.0, "MISS": 1.0, "QUAL": 5.0, SL.FIRST_ERROR_INDEX: -1.0},
        {"BAD": 0.0, "MISS": 1.0, "QUAL": 1.0, SL.FINAL_ANSWER_CORRECT: 0.0}]
    assert [r[C.CONTENT_HASH] for r in records] == [r[C.CONTENT_HASH] for r in H.adapt(annotated, generated, cfg)]


@pytest.mark.parametrize("answer, gold, correct", [
    ("18", "18", 1.0), ("$1,000.", "1000", 1.0), ("18.0", "18", 1.0), ("17", "18", 0.0),
    ("18 eggs", "18", None), (None, "18", None), ("18", None, None), ("nan", "nan", None),
])
def test_final_answer_correct_only_between_numbers(answer, gold, correct):
    assert H.final_answer_correct(answer, gold) == correct


def test_run_writes_step_labels_once_and_they_label_chains_for_localise(spark, make_settings, tmp_path):
    cfg, annotated, generated = _with_gold_and_unjudged(tmp_path)
    annotated.to_csv(cfg.annotated, index=False)
    with open(cfg.generated, "w") as f:
        f.writelines(json.dumps(g) + "\n" for g in generated)
    settings = make_settings(*[f"human_labels.{k}={json.dumps(v)}" for k, v in cfg.model_dump().items()])
    counts, step_counts = H.run_with_step_labels(spark, settings)
    assert step_counts == {"step_labels": 9, "step_labels_inserted": 9, "chains_first_error_known": 2,
                           "chains_first_error_step": 1}
    assert H.run_with_step_labels(spark, settings)[1]["step_labels_inserted"] == 0
    rows = [r.asDict() for r in tables.read(spark, settings.table("step_labels")).collect()]
    key = lambda r: (r[SL.CHAIN_ID], r[SL.LABEL], r[SL.STEP_IDX])  # noqa: E731
    assert sorted(rows, key=key) == sorted(H.adapt_with_step_labels(annotated, generated, cfg)[1], key=key)
    # The chains carry no first_error_index: localise takes it from the step labels, and skips the unknown one.
    chains = tables.read(spark, settings.table("chains"))
    labelled = localise.labelled_chains(chains, tables.read(spark, settings.table("step_labels")), None)
    assert sorted(tuple(r) for r in labelled.collect()) == [
        ("toy:q0", "toy", 1, -1.0, -1.0, None), ("toy:q1", "toy", 2, 1.0, 1.0, None)]


def test_load_step_labels_of_the_roscoe_annotations(gsm8k):
    records, rows = H.load_with_step_labels(ROSCOE)
    assert records == gsm8k
    steps = sum(len(r[C.STEPS]) for r in records)
    # Every step of the 200 chains answers all seven questions (881 steps).
    assert Counter(r[SL.LABEL] for r in rows if r[SL.LABEL] != SL.FIRST_ERROR) == {
        name: steps for name in ROSCOE.step_labels}
    first = {}
    for r in rows:
        if r[SL.LABEL] == SL.FIRST_ERROR and r[SL.VALUE] == 0.0:
            first[r[SL.CHAIN_ID]] = r[SL.STEP_IDX]
    # A chain has an earliest error exactly when one of its step labels is an error, at the first step with a "yes".
    erroneous = {r[C.CHAIN_ID] for r in records if min(r[C.LABELS][n] for n in ROSCOE.step_labels) == 0.0}
    assert set(first) == erroneous and len(erroneous) == 93
    for cid, idx in first.items():
        yes = {x[SL.STEP_IDX] for x in rows if x[SL.CHAIN_ID] == cid and x[SL.LABEL] != SL.FIRST_ERROR
               and x[SL.VALUE] == 0.0}
        assert idx == min(yes)
