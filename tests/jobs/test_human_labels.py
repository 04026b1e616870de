from __future__ import annotations

import json
from collections import Counter

import pandas as pd
import pytest
from conftest import require_datasets

from jobs.infra import tables
from jobs.metaeval import human_labels as H
from jobs.metaeval.settings import HumanLabelSettings
from schemas import chains as C

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
