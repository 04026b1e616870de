"""jobs.metaeval.entailment_bank: proof parsing and the official step rendering, on real EB task_1 test rows."""

from __future__ import annotations

import pytest
from conftest import require_datasets

from jobs.infra.config import Settings
from jobs.infra.config_paths import resolve_path
from jobs.metaeval import entailment_bank as eb

EB_TEST = resolve_path(Settings().perturb.eb_task1_test)


@pytest.fixture(scope="module")
def eb_list() -> list[dict]:
    require_datasets("entailment_bank")
    return eb.load_jsonl(EB_TEST)


@pytest.fixture(scope="module")
def eb_rows(eb_list) -> dict[str, dict]:
    return {row["id"]: row for row in eb_list}


def test_load_jsonl_reads_all_test_rows(eb_list):
    assert len(eb_list) == 340


def test_chain_ids_unique_with_the_repeated_eb_id(eb_list):
    ids = eb.chain_ids(eb_list)
    assert len(set(ids)) == 340
    assert ids[297:299] == ["Mercury_SC_405304", "Mercury_SC_405304#2"]
    assert ids[0] == "Mercury_SC_408040"


def test_parse_proof_steps_and_children():
    proof = "sent2 & sent3 -> int1: the northern hemisphere is a kind of place; int1 & sent1 -> hypothesis; "
    assert eb.parse_proof(proof) == [
        eb.ProofStep(("sent2", "sent3"), "int1"),
        eb.ProofStep(("int1", "sent1"), "hypothesis"),
    ]


def test_parse_proof_single_step_without_trailing_separator():
    assert eb.parse_proof("sent1 & sent2 -> hypothesis") == [eb.ProofStep(("sent1", "sent2"), "hypothesis")]


def test_parse_proof_rejects_step_without_arrow():
    with pytest.raises(ValueError, match="->"):
        eb.parse_proof("sent1 & sent2; ")


def test_render_parent_mentioned_as_parent_earlier_is_not_repeated():
    texts = {"sent1": "a", "sent2": "b", "sent3": "c", "int1": "d", "hypothesis": "e"}
    steps = [eb.ProofStep(("sent1", "sent2"), "int1"), eb.ProofStep(("sent1", "int1", "sent3"), "hypothesis")]
    assert eb.render(steps, texts) == ["a and b, so d.", "c, so e."]


def test_render_two_step_tree(eb_rows):
    row = eb_rows["Mercury_SC_408040"]
    assert eb.render(eb.parse_proof(row["proof"]), eb.node_texts(row)) == [
        "the northern hemisphere is a kind of hemisphere of earth and a hemisphere of earth is a kind of place, "
        "so the northern hemisphere is a kind of place.",
        "if a place is in summer, then it will have the most sunlight, "
        "so northern hemisphere will have the most sunlight in summer.",
    ]


def test_render_step_whose_parents_were_all_mentioned(eb_rows):
    row = eb_rows["Mercury_7123480"]
    assert eb.render(eb.parse_proof(row["proof"]), eb.node_texts(row)) == [
        "stars are located light years apart from each other and light years ly are an astronomy unit used for "
        "measuring length / distance generally used for values between 1 and 27000000000, "
        "so light year is used to measure the distance between stars.",
        "the milky way is a kind of galaxy and a galaxy is made of stars, so the milky way is made of stars.",
        "so light year can be used to measure the distance between the stars in milky way.",
    ]


def test_render_four_step_tree(eb_rows):
    row = eb_rows["Mercury_SC_400194"]
    assert eb.render(eb.parse_proof(row["proof"]), eb.node_texts(row)) == [
        "the sun is a kind of star and the earth revolves around the sun, so the earth revolves around a star.",
        "the moon orbits the earth and earth is a kind of planet, so the moon orbits a planet.",
        "revolving around means orbiting, so the moon revolves around a planet.",
        "so the difference between the earth and the moon is that the moon revolves around a planet.",
    ]


def test_context_joins_facts_and_question(eb_rows):
    row = eb_rows["Mercury_SC_408040"]
    assert eb.context(row) == (
        "if a place is in summer, then it will have the most sunlight. "
        "the northern hemisphere is a kind of hemisphere of earth. "
        "a hemisphere of earth is a kind of place. "
        "Melinda learned that days in some seasons have more daylight hours than in other seasons. "
        "Which season receives the most hours of sunlight in the Northern Hemisphere?"
    )


def test_to_chain_fields(eb_rows):
    from schemas import chains as C
    from schemas.chains import content_hash

    row = eb_rows["Mercury_7011270"]
    chain = eb.to_chain(row)
    step = (
        "a complete revolution / orbit of the moon around the earth takes 1 / one month and "
        "1 month is equal to 28-31 days, so a complete revolution of the moon around the earth takes 28 to 31 days."
    )
    assert chain["chain_id"] == "Mercury_7011270"
    assert chain["dataset"] == "entailment_bank"
    assert chain["steps"] == [step]
    assert chain["gold_steps"] == [step]
    assert chain["answer"] == "a complete revolution of the moon around the earth takes 28 to 31 days"
    assert chain["gold_answer"] == "30 days"
    assert chain["question"] == row["question"]
    assert chain["metadata"]["proof"] == row["proof"]
    assert chain["content_hash"] == content_hash(chain)
    assert set(chain) <= set(C.SCHEMA.fieldNames())


def test_to_chain_changed_tree_keeps_gold_steps(eb_rows):
    row = eb_rows["Mercury_SC_408040"]
    texts = {**eb.node_texts(row), "int1": "the sun is a star"}
    chain = eb.to_chain(row, steps=eb.parse_proof(row["proof"]), texts=texts, chain_id="x-hall")
    assert chain["chain_id"] == "x-hall"
    assert chain["steps"][0].endswith(", so the sun is a star.")
    assert chain["gold_steps"][0].endswith(", so the northern hemisphere is a kind of place.")
    assert chain["content_hash"] != eb.to_chain(row)["content_hash"]


def test_to_chains_all_rows_render(eb_list):
    chains = eb.to_chains(eb_list)
    assert len({c["chain_id"] for c in chains}) == 340
    n_steps = sum(len(c["steps"]) for c in chains)
    assert n_steps == sum(row["proof"].count(";") for row in eb_list)
    assert all(s.endswith(".") for c in chains for s in c["steps"])
