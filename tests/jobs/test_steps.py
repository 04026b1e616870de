"""jobs.receval.steps: step boundaries, a_hat, the pandas-UDF transform, reconciliation and idempotent writes."""

from __future__ import annotations

import dataclasses

import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual, assertSchemaEqual
from tolerance import EXACT_FRAME

from jobs.infra.config import Settings
from jobs.infra.config_paths import PROJECT_ROOT
from jobs.metaeval import entailment_bank as eb
from jobs.receval import steps as J
from schemas import chains as C
from schemas import quarantine as Q
from schemas import steps as S
from udfs import rcu

NATALIA = "Natalia sold 24 clips in May, so she sold 72 clips altogether."
GALAXY = "a galaxy is a kind of celestial object, so galaxies can be classified by shape."


def chain(chain_id: str, **fields) -> dict:
    base = {c: None for c in J._INPUT}
    return {**base, C.CHAIN_ID: chain_id, C.CONTEXT: "Natalia sold clips in April. How many?", **fields}


@pytest.fixture(scope="module")
def opts() -> J.Options:
    return J.Options.from_settings(Settings())


def test_explode_records_sentence_boundary_splits_lines_and_sentences(opts):
    text = f"{NATALIA} {GALAXY}\nSo the answer is 72."
    [out] = J.explode_records([chain("a", chain_text=text)], opts)
    assert out["steps"] == [
        {
            S.STEP_TEXT: NATALIA,
            S.PREMISE_RCUS: ["Natalia sold 24 clips in May"],
            S.CONCLUSION_RCU: "she sold 72 clips altogether",
            S.BOUNDARY: "sentence",
            J.STEP_EXTRACTOR: opts.extractor_name,
        },
        {
            S.STEP_TEXT: GALAXY,
            S.PREMISE_RCUS: ["a galaxy is a kind of celestial object"],
            S.CONCLUSION_RCU: "galaxies can be classified by shape",
            S.BOUNDARY: "sentence",
            J.STEP_EXTRACTOR: opts.extractor_name,
        },
        {S.STEP_TEXT: "So the answer is 72.", S.PREMISE_RCUS: [], S.CONCLUSION_RCU: "the answer is 72", S.BOUNDARY: "sentence",
         J.STEP_EXTRACTOR: opts.extractor_name},
    ]
    assert out[S.CONTEXT_SENTENCES] == ["Natalia sold clips in April.", "How many?"]
    assert (out[S.ANSWER], out[S.ANSWER_RULE]) == ("72", "indicator")


def test_explode_records_other_boundaries(opts):
    text = f"{NATALIA} {GALAXY}\nShe is happy"
    newline = dataclasses.replace(opts, boundary="newline")
    whole = dataclasses.replace(opts, boundary="whole")
    given = dataclasses.replace(opts, boundary="given")
    [nl] = J.explode_records([chain("a", chain_text=text)], newline)
    assert [s[S.STEP_TEXT] for s in nl["steps"]] == [f"{NATALIA} {GALAXY}", "She is happy"]
    # a newline step of two sentences: RCUs of both sentences, conclusion the last
    assert nl["steps"][0][S.PREMISE_RCUS] == [
        "Natalia sold 24 clips in May",
        "she sold 72 clips altogether",
        "a galaxy is a kind of celestial object",
    ]
    [wh] = J.explode_records([chain("a", chain_text=text)], whole)
    assert [s[S.STEP_TEXT] for s in wh["steps"]] == [text]
    assert wh["steps"][0][S.CONCLUSION_RCU] == "She is happy"
    [gv] = J.explode_records([chain("a", chain_text=text)], given)
    assert gv["error"] == "missing_steps"


def test_explode_records_paragraph_boundary_keeps_a_paragraphs_lines_together(opts):
    """Reasoning-model text: blocks between blank lines (a line of spaces counts as blank) are the steps; a block's
    own line breaks (a displayed equation, a list) stay inside its step."""
    text = f"<think>\n{NATALIA}\n\n{GALAXY}\n$$24 + 48 = 72$$\n  \t\nShe is happy\r\n\r\n\n"
    paragraph = dataclasses.replace(opts, boundary="paragraph")
    [out] = J.explode_records([chain("a", chain_text=text)], paragraph)
    assert [s[S.STEP_TEXT] for s in out["steps"]] == [f"<think>\n{NATALIA}", f"{GALAXY}\n$$24 + 48 = 72$$",
                                                       "She is happy"]
    assert {s[S.BOUNDARY] for s in out["steps"]} == {"paragraph"}
    assert out["steps"][2][S.CONCLUSION_RCU] == "She is happy"
    assert rcu.paragraphs("a\n\n\n b \n c\n \n") == ["a", "b \n c"] and rcu.paragraphs(" \n ") == []


def test_explode_records_text_over_max_steps_is_a_chain_error(opts):
    """A text that splits into more steps than steps.max_steps is refused with the reason (quarantine, as ingest
    refuses a longer steps array); at the limit it is kept."""
    text = "\n\n".join(f"Step {k} is done." for k in range(4))
    [over] = J.explode_records([chain("a", chain_text=text)], dataclasses.replace(opts, boundary="paragraph",
                                                                                  max_steps=3))
    assert over["error"] == "too_many_steps" and "4 steps by steps.boundary=paragraph" in over["detail"]
    [at] = J.explode_records([chain("a", chain_text=text)], dataclasses.replace(opts, boundary="paragraph",
                                                                                max_steps=4))
    assert at.get("error") is None and len(at["steps"]) == 4


def test_explode_records_given_steps_are_kept(opts):
    given = [NATALIA + " " + GALAXY, "", "Yes"]
    [out] = J.explode_records([chain("a", steps=given, answer="72")], opts)
    assert [s[S.STEP_TEXT] for s in out["steps"]] == given
    assert {s[S.BOUNDARY] for s in out["steps"]} == {"given"}
    assert out["steps"][1] == {S.STEP_TEXT: "", S.PREMISE_RCUS: [], S.CONCLUSION_RCU: "", S.BOUNDARY: "given",
                               J.STEP_EXTRACTOR: opts.extractor_name}
    assert (out[S.ANSWER], out[S.ANSWER_RULE]) == ("72", "given")
    [joined] = J.explode_records([chain("a", steps=given)], dataclasses.replace(opts, boundary="whole"))
    assert [s[S.STEP_TEXT] for s in joined["steps"]] == [NATALIA + " " + GALAXY + " Yes"]
    assert (joined[S.ANSWER], joined[S.ANSWER_RULE]) == ("Yes", "last_conclusion")


def test_explode_records_question_appended_once(opts):
    [out] = J.explode_records([chain("a", chain_text="Yes", context="It rains.", question="Is it wet?")], opts)
    assert out[S.CONTEXT_SENTENCES] == ["It rains.", "Is it wet?"]
    [out] = J.explode_records([chain("a", chain_text="Yes", context="It rains. Is it wet?", question="Is it wet?")], opts)
    assert out[S.CONTEXT_SENTENCES] == ["It rains.", "Is it wet?"]


def test_explode_records_conjunction_roles(opts):
    text = "He also got a 300 * 4 = $1200 bonus because the company performed well in all the weeks of April."
    [out] = J.explode_records([chain("a", chain_text=text)], dataclasses.replace(opts, roles="conjunction"))
    assert out["steps"][0][S.CONCLUSION_RCU] == "He also got a 300 * 4 = $1200 bonus"
    assert out["steps"][0][S.PREMISE_RCUS] == ["the company performed well in all the weeks of April"]


EDGE_STEPS = [
    "",
    "Because.",
    "Yes",
    "a " * 2500,
    "Der Hund läuft schnell, weil er Hunger hat.",
    "😀 🎉 🚀",
    "3 * 4 = 12, so she has 12 apples.",
    'He said "hello and left',
]


def test_explode_records_edge_cases_give_rows(opts):
    rows = J.explode_records(
        [
            chain("given", steps=EDGE_STEPS),
            chain("text", chain_text="\n".join(EDGE_STEPS)),
            chain("blank", chain_text="  \n "),
            chain("nothing"),
        ],
        opts,
    )
    assert [r.get("error") for r in rows] == [None, None, "no_steps", "no_steps"]
    assert len(rows[0]["steps"]) == len(EDGE_STEPS)
    assert rows[0]["steps"][6][S.CONCLUSION_RCU] == "she has 12 apples"
    assert rows[0]["steps"][5][S.CONCLUSION_RCU] == "😀 🎉 🚀"
    assert all(isinstance(s[S.CONCLUSION_RCU], str) for r in rows[:2] for s in r["steps"])
    assert rows[2]["raw"] and '"chain_id": "blank"' in rows[2]["raw"]


# ------------------------------------------------------------------------------------------ Spark
EB_TEST = PROJECT_ROOT / "tests" / "data" / "entailment_bank" / "task_1_test_head.jsonl"  # first 8 trees


def _chains_df(spark, records):
    return spark.createDataFrame([{c: r.get(c) for c in C.SCHEMA.fieldNames()} for r in records], C.SCHEMA)


def _records(n_eb: int = 4) -> list[dict]:
    recs = [
        {**chain("natalia", chain_text=f"{NATALIA}\nSo the answer is 72."), C.CONTENT_HASH: "h1"},
        {**chain("edge", steps=EDGE_STEPS, answer="12"), C.CONTENT_HASH: "h2"},
        {**chain("empty", chain_text="   "), C.CONTENT_HASH: "h3"},
    ]
    recs += eb.to_chains(eb.load_jsonl(EB_TEST)[:n_eb])
    return recs


def _transform(chains, settings):
    return J.transform(chains, settings.steps, settings.models, settings.runtime, settings.scoring_hash())


def test_transform_frames(spark, settings):
    recs = _records()
    steps, contexts, quarantined = _transform(_chains_df(spark, recs), settings)
    assertSchemaEqual(steps.schema, S.SCHEMA)
    assertSchemaEqual(contexts.schema, S.CONTEXTS_SCHEMA)
    h = settings.scoring_hash()
    extractor = f"clauses:{settings.models.spacy}"  # the default extractor and role rule
    expected = [
        ("natalia", h, 0, 2, NATALIA, ["Natalia sold 24 clips in May"], "she sold 72 clips altogether", "sentence"),
        ("natalia", h, 1, 2, "So the answer is 72.", [], "the answer is 72", "sentence"),
    ]
    assertDataFrameEqual(
        steps.where(F.col(S.CHAIN_ID) == "natalia"),
        spark.createDataFrame([(*e, "conjunction", extractor) for e in expected], S.SCHEMA),
        **EXACT_FRAME,
    )
    assertDataFrameEqual(
        contexts.where(F.col(S.CHAIN_ID) == "natalia"),
        spark.createDataFrame(
            [("natalia", h, ["Natalia sold clips in April.", "How many?"], "72", "indicator")], S.CONTEXTS_SCHEMA
        ),
        **EXACT_FRAME,
    )
    # reconciliation: one step row per step of every chain, every chain either exploded or quarantined
    good = [r for r in recs if r[C.CHAIN_ID] != "empty"]
    n_eb_steps = sum(len(r[C.STEPS]) for r in good if r.get(C.DATASET) == "entailment_bank")
    assert steps.count() == 2 + len(EDGE_STEPS) + n_eb_steps
    assert contexts.count() + quarantined.count() == len(recs)
    q = quarantined.collect()
    assert [(r[Q.STAGE], r[Q.REASON], r[Q.CHAIN_ID]) for r in q] == [("steps", "no_steps", "empty")]
    if n_eb_steps:  # EB proof steps are kept as given, the hypothesis is a_hat
        first = eb.to_chains(eb.load_jsonl(EB_TEST)[:1])[0]
        rows = steps.where(F.col(S.CHAIN_ID) == first[C.CHAIN_ID]).orderBy(S.STEP_IDX).collect()
        assert [r[S.STEP_TEXT] for r in rows] == first[C.STEPS]
        assert rows[-1][S.CONCLUSION_RCU] == "northern hemisphere will have the most sunlight in summer"
        ctx = contexts.where(F.col(S.CHAIN_ID) == first[C.CHAIN_ID]).first()
        assert ctx[S.ANSWER_RULE] == "given" and ctx[S.ANSWER] == first[C.ANSWER]


@pytest.mark.slow
def test_transform_invariant_to_partitions_and_batch_size(spark, make_settings):
    recs = _records(n_eb=6)
    base = _transform(_chains_df(spark, recs).coalesce(1), make_settings("steps.batch_size=1"))[0]
    other = _transform(_chains_df(spark, recs).repartition(3), make_settings("steps.batch_size=64"))[0]
    cols = [c for c in S.SCHEMA.fieldNames() if c != S.CONFIG_HASH]  # batch_size is part of the hash
    assertDataFrameEqual(base.select(cols), other.select(cols), **EXACT_FRAME)


@pytest.mark.slow
def test_run_reads_chains_writes_reconciles_and_is_idempotent(spark, settings):
    from delta.tables import DeltaTable

    from jobs.infra import tables
    recs = _records(n_eb=2)
    df = _chains_df(spark, recs)
    tables.insert_new(spark, df, settings.table("chains"), C.SCHEMA, [C.CHAIN_ID])
    first = J.run(spark, settings)  # reads `chains`
    assert first["reconciled"] == 1
    assert first["chains_in"] == len(recs) == first["chains_with_steps"] + first["quarantined"]
    assert first["steps_rows"] == first["expected_steps"] == first["steps_inserted"]
    assert first["contexts_inserted"] == first["chains_with_steps"]
    assert DeltaTable.isDeltaTable(spark, settings.table("steps"))
    again = J.run(spark, settings, df)
    assert (again["already_done"], again["steps_inserted"], again["contexts_inserted"]) == (len(recs) - 1, 0, 0)
    assert again["quarantined"] == 1 and again["quarantine_inserted"] == 0  # the empty chain, not repeated
    assert spark.read.format("delta").load(settings.table("steps")).count() == first["steps_rows"]


def test_explode_records_five_thousand_word_step(opts):
    # one given step of 5,008 words in 313 sentences: units for every sentence, the last one's conclusion
    step = "Tom has 3 apples and Ann has 4 pears, so they have 7 fruits in all. " * 313
    [out] = J.explode_records([chain("long", steps=[step])], opts)
    assert out.get("error") is None
    [row] = out["steps"]
    assert row[S.CONCLUSION_RCU] == "they have 7 fruits in all"
    assert len(row[S.PREMISE_RCUS]) == 3 * 313 - 1
