"""Given RCUs (issue #15 item 4): steps that arrive as objects (text, premise units, conclusion unit) through
`ingest.mapping`, used as given by the steps job (extractor "given"), scored as the same units extracted; and
the EntailmentBank adapter's gold units (`perturb.gold_rcus`)."""

from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual
from tolerance import EXACT_FRAME

from jobs.infra.config import Settings
from jobs.infra.config_paths import PROJECT_ROOT
from jobs.metaeval import entailment_bank as eb
from jobs.receval import ingest_rows, nli_scores
from jobs.receval import steps as J
from jobs.receval.settings import IngestSettings
from schemas import chains as C
from schemas import step_scores as SS
from schemas import steps as S

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the fake NLI runs in Spark's Python workers

NATALIA = "Natalia sold 24 clips in May, so she sold 72 clips altogether."
NATALIA_UNITS = {"premises": ["Natalia sold 24 clips in May"], "conclusion": "she sold 72 clips altogether"}
EB_HEAD = PROJECT_ROOT / "tests" / "data" / "entailment_bank" / "task_1_test_head.jsonl"


def _row(**fields) -> str:
    return json.dumps({"chain_id": "c1", "context": "Natalia sold clips.", **fields})


# ------------------------------------------------------------------------------------------ ingest
def test_ingest_steps_as_objects_give_texts_and_units():
    rec = ingest_rows.validate(_row(steps=[{"text": NATALIA, **NATALIA_UNITS}, {"text": "So 72.", "conclusion": "72"}]),
                          IngestSettings())
    assert rec[C.STEPS] == [NATALIA, "So 72."]
    assert rec[C.STEP_RCUS] == [NATALIA_UNITS, {"premises": [], "conclusion": "72"}]  # no premises: none


def test_ingest_step_objects_follow_the_mapping():
    cfg = IngestSettings(mapping={**IngestSettings().mapping, "steps": "proof", "step_text": "s",
                                  "step_premises": "given.p", "step_conclusion": "given.c"})
    rec = ingest_rows.validate(_row(proof=[{"s": NATALIA, "given": {"p": ["Natalia sold 24 clips in May"],
                                                                "c": "she sold 72 clips altogether"}}]), cfg)
    assert rec[C.STEPS] == [NATALIA] and rec[C.STEP_RCUS] == [NATALIA_UNITS]


def test_ingest_text_steps_have_no_units_and_keep_their_hash():
    rec = ingest_rows.validate(_row(steps=[NATALIA]), IngestSettings())
    assert rec[C.STEP_RCUS] is None
    # the content hash of a chain without given units is what it was before the field existed
    assert rec[C.CONTENT_HASH] == C.content_hash({k: v for k, v in rec.items() if k != C.STEP_RCUS})
    given = ingest_rows.validate(_row(steps=[{"text": NATALIA, **NATALIA_UNITS}]), IngestSettings())
    assert given[C.CONTENT_HASH] != rec[C.CONTENT_HASH]  # given units are part of what defines the chain


@pytest.mark.parametrize(
    "steps,reason",
    [
        ([NATALIA, {"text": NATALIA, "conclusion": "x"}], "wrong_type"),  # texts and objects mixed
        ([{"text": NATALIA}], "missing_step_conclusion"),
        ([{"text": NATALIA, "conclusion": "  "}], "missing_step_conclusion"),
        ([{"conclusion": "x"}], "empty_step"),
        ([{"text": NATALIA, "premises": "one premise", "conclusion": "x"}], "wrong_type"),
        ([{"text": NATALIA, "premises": ["a", ""], "conclusion": "x"}], "empty_step"),
        ([{"text": NATALIA, "premises": [{"a": 1}], "conclusion": "x"}], "wrong_type"),
    ],
)
def test_ingest_bad_step_objects_are_quarantined_with_a_reason(steps, reason):
    with pytest.raises(ingest_rows.RowError) as err:
        ingest_rows.validate(_row(steps=steps), IngestSettings())
    assert err.value.reason == reason


# ------------------------------------------------------------------------------------------ steps job
def _chain(chain_id: str, **fields) -> dict:
    return {c: None for c in J._INPUT} | {C.CHAIN_ID: chain_id, C.CONTEXT: "Natalia sold clips in April."} | fields


@pytest.fixture(scope="module")
def opts() -> J.Options:
    return J.Options.from_settings(Settings())


def test_given_units_are_used_as_given(opts):
    odd = {"premises": ["whatever the producer says"], "conclusion": "she sold clips"}  # not what extraction gives
    [out] = J.explode_records([_chain("g", steps=[NATALIA, "So 72."], step_rcus=[odd, {"premises": [], "conclusion": "72"}])], opts)
    assert out["steps"] == [
        {S.STEP_TEXT: NATALIA, S.PREMISE_RCUS: odd["premises"], S.CONCLUSION_RCU: odd["conclusion"],
         S.BOUNDARY: "given", J.STEP_EXTRACTOR: "given"},
        {S.STEP_TEXT: "So 72.", S.PREMISE_RCUS: [], S.CONCLUSION_RCU: "72", S.BOUNDARY: "given", J.STEP_EXTRACTOR: "given"},
    ]
    # a_hat from the last given conclusion when the chain has no answer
    assert (out[S.ANSWER], out[S.ANSWER_RULE]) == ("72", "last_conclusion")


def test_given_units_equal_to_extracted_give_equal_rows_but_the_extractor(opts):
    [extracted] = J.explode_records([_chain("e", steps=[NATALIA])], opts)
    [given] = J.explode_records([_chain("e", steps=[NATALIA], step_rcus=[NATALIA_UNITS])], opts)
    assert extracted["steps"][0][J.STEP_EXTRACTOR] == opts.extractor_name
    assert given["steps"][0][J.STEP_EXTRACTOR] == "given"
    strip = lambda rows: [{k: v for k, v in r.items() if k != J.STEP_EXTRACTOR} for r in rows]  # noqa: E731
    assert strip(given["steps"]) == strip(extracted["steps"])


def test_given_units_must_match_the_steps(opts):
    [out] = J.explode_records([_chain("bad", steps=[NATALIA, "So 72."], step_rcus=[NATALIA_UNITS])], opts)
    assert out["error"] == "bad_step_rcus"
    # boundary=whole joins the texts: units given per step no longer apply and are extracted instead
    whole = dataclasses.replace(opts, boundary="whole")
    [out] = J.explode_records([_chain("w", steps=[NATALIA], step_rcus=[{"premises": [], "conclusion": "x"}])], whole)
    assert out["steps"][0][S.CONCLUSION_RCU] == "she sold 72 clips altogether"
    assert out["steps"][0][J.STEP_EXTRACTOR] == opts.extractor_name


# -- scores: a deterministic fake NLI (probabilities a known function of the pair) --------------------------
def _fake_factory():
    def predict(premises: list[str], hypotheses: list[str]) -> np.ndarray:
        return np.array([(len(p), len(h), 10) for p, h in zip(premises, hypotheses, strict=True)], dtype=float) / (
            np.array([len(p) + len(h) + 10 for p, h in zip(premises, hypotheses, strict=True)], dtype=float)[:, None]
        )

    return predict


def test_given_units_score_as_the_same_units_extracted(spark, settings):
    text = [NATALIA, "So the answer is 72."]
    extracted_units = [NATALIA_UNITS, {"premises": [], "conclusion": "the answer is 72"}]
    recs = [
        _chain("x", steps=text, answer="72") | {C.CONTENT_HASH: "x"},
        _chain("x", steps=text, answer="72", step_rcus=extracted_units) | {C.CONTENT_HASH: "x"},
    ]
    results = []
    for rec in recs:
        df = spark.createDataFrame([{c: rec.get(c) for c in C.SCHEMA.fieldNames()}], C.SCHEMA)
        steps, contexts, quarantined = J.transform(df, settings.steps, settings.models, settings.runtime,
                                                   settings.scoring_hash())
        assert quarantined.count() == 0
        scores = nli_scores.transform(steps, contexts, settings.nli, settings.models.nli, settings.runtime,
                                      predict=_fake_factory)
        results.append((steps, scores))
    (steps_e, scores_e), (steps_g, scores_g) = results
    assert {r[S.EXTRACTOR] for r in steps_e.collect()} == {f"clauses:{settings.models.spacy}"}
    assert {r[S.EXTRACTOR] for r in steps_g.collect()} == {"given"}
    cols = [c for c in S.SCHEMA.fieldNames() if c != S.EXTRACTOR]
    assertDataFrameEqual(steps_g.select(cols), steps_e.select(cols), **EXACT_FRAME)
    assertDataFrameEqual(scores_g, scores_e, **EXACT_FRAME)
    assert scores_g.where(F.col(SS.INTRA_ENTAIL).isNull()).count() == 0


# ------------------------------------------------------------------------------------------ EB adapter
def test_eb_adapter_gold_units_are_the_trees_fresh_parents_and_child():
    row = eb.load_jsonl(EB_HEAD)[0]
    plain = eb.to_chain(row)
    gold = eb.to_chain(row, gold_rcus=True)
    assert plain[C.STEP_RCUS] is None
    assert gold[C.STEPS] == plain[C.STEPS]
    fresh = eb.fresh_steps(eb.parse_proof(row["proof"]), eb.node_texts(row))
    assert gold[C.STEP_RCUS] == [{"premises": p, "conclusion": c} for p, c in fresh]
    assert gold[C.STEP_RCUS][-1]["conclusion"] == row["hypothesis"]
    assert gold[C.CONTENT_HASH] != plain[C.CONTENT_HASH]


def test_perturb_gold_rcus_switch(make_settings):
    assert Settings().perturb.gold_rcus is False
    assert make_settings("perturb.gold_rcus=true").perturb.gold_rcus is True


def test_chains_table_made_before_step_rcus_gains_the_column(spark, settings):
    from pyspark.sql.types import StructType

    from jobs.infra import tables

    path = settings.table("chains")
    old = StructType([f for f in C.SCHEMA.fields if f.name != C.STEP_RCUS])
    tables.ensure(spark, path, old)
    rec = _chain("x", steps=[NATALIA], step_rcus=[NATALIA_UNITS]) | {C.CONTENT_HASH: "x"}
    df = spark.createDataFrame([{c: rec.get(c) for c in C.SCHEMA.fieldNames()}], C.SCHEMA)
    assert tables.insert_new(spark, df, path, C.SCHEMA, [C.CHAIN_ID]) == 1
    [row] = tables.read(spark, path).collect()
    assert [r.asDict(recursive=True) for r in row[C.STEP_RCUS]] == [NATALIA_UNITS]


@pytest.mark.dataset("entailment_bank")
@pytest.mark.parametrize("kind", ["HALL", "SWAP", "REP", "REMOVE"])
def test_perturbed_chains_carry_the_units_of_their_own_rendering(kind):
    from jobs.metaeval import perturb as P
    from jobs.metaeval.settings import PerturbSettings

    cfg = PerturbSettings(gold_rcus=True)
    rows, task2, ids = (part[:12] for part in P.kept_rows(cfg))
    res = P.Resources(negate=lambda t: f"not {t}", paraphrase=lambda ss: {s: [f"in other words {s}"] for s in ss})
    records = P.build(kind, rows, task2, ids, cfg, res)
    assert any(r[C.METADATA]["perturbed"] == "true" for r in records)
    for rec in records:
        # each given unit set re-renders, the official way, into the very step text the chain carries
        rendered = [f"{' and '.join(u['premises'])}, so {u['conclusion']}." if u["premises"] else f"so {u['conclusion']}."
                    for u in rec[C.STEP_RCUS]]
        assert rendered == rec[C.STEPS]
    plain = P.build(kind, rows, task2, ids, PerturbSettings(), res)
    assert all(r[C.STEP_RCUS] is None for r in plain)
    assert [r[C.STEPS] for r in plain] == [r[C.STEPS] for r in records]
