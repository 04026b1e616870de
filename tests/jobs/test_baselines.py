from __future__ import annotations

import hashlib
import sys

import numpy as np
import pandas as pd
from pyspark import cloudpickle
from pyspark.sql import Row
from tolerance import exact

from jobs.infra import tables
from jobs.metaeval import baselines as BL
from schemas import baseline_scores as B
from schemas import chains as C
from schemas import metrics as MR

# The fakes travel to the Python workers by value: the workers cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class FakeEmbedder:
    """Deterministic vectors from the text: proves plumbing, not semantics (the real MiniLM is in tests/udfs)."""

    def __call__(self, texts):
        vecs = [np.frombuffer(hashlib.sha256(t.encode()).digest()[:16], dtype=np.uint8).astype(float) - 127 for t in texts]
        return np.array(vecs).reshape(len(texts), 16), [np.array([v, v[::-1]]) for v in vecs]


def fake_contradict(premises, hypotheses):
    return np.array([0.8 if "not" in h and "not" not in p else 0.05 for p, h in zip(premises, hypotheses, strict=True)])


CHAINS = [
    {C.CHAIN_ID: "c1", C.CONTEXT: "Tom has 2 cats. Ann has 3 dogs.", C.STEPS: ["Tom has 2 cats.", "So Tom does not have cats."],
     C.GOLD_STEPS: ["Tom has 2 cats.", "So Tom has cats."]},
    {C.CHAIN_ID: "c2", C.CONTEXT: "The sky is blue.", C.CHAIN_TEXT: "The sky is blue. So it is day.", C.GOLD_STEPS: None},
    {C.CHAIN_ID: "c3", C.CONTEXT: "", C.STEPS: ["Nothing to align to."]},
]


def test_score_batch_metrics_and_steps_from_text():
    pdf = pd.DataFrame([{k: c.get(k) for k in (C.CHAIN_ID, C.CONTEXT, C.STEPS, C.CHAIN_TEXT, C.GOLD_STEPS)}
                        for c in CHAINS])
    out = BL.score_batch(pdf, ["sa", "ss", "li", "rouge"], False, BL._sentencizer(), FakeEmbedder(),
                         fake_contradict, {"embedding": "emb", "nli": "nli"})
    metrics = out.groupby("chain_id")["metric"].apply(set).to_dict()
    free = set(B.REFERENCE_FREE)
    assert metrics["c1"] == free | {"rouge2"}
    assert metrics["c2"] == free  # steps split from chain_text; no gold -> no ROUGE
    # No context sentence: embedding scores are skipped, NLI self-consistency still defined.
    assert metrics["c3"] == {"roscoe_li_source_consistency", "roscoe_li_self_consistency"}
    c1 = out[out.chain_id == "c1"].set_index("metric")["score"]
    assert c1["roscoe_li_self_consistency"] == exact(0.2)  # "not" contradicts the earlier step
    # Stemmed tokens: hyp "tom ha 2 cat so tom doe not have cat" (9 bigrams), ref "tom ha 2 cat so tom ha cat"
    # (7 bigrams); shared: tom-ha, ha-2, 2-cat, cat-so, so-tom = 5 -> F1 = 2 * 5 / (9 + 7).
    assert c1["rouge2"] == exact(10 / 16)
    assert set(out.model) == {"emb", "nli", "rouge-score"}
    assert out.step_idx.isna().all()  # per-step forms only when asked


def test_score_batch_per_step_rows_for_chains_given_as_steps():
    pdf = pd.DataFrame([{k: c.get(k) for k in (C.CHAIN_ID, C.CONTEXT, C.STEPS, C.CHAIN_TEXT, C.GOLD_STEPS)}
                        for c in CHAINS])
    args = (["sa", "ss", "li", "rouge"], False, BL._sentencizer(), FakeEmbedder(), fake_contradict,
            {"embedding": "emb", "nli": "nli"})
    out = BL.score_batch(pdf, *args, per_step=True)
    chain_rows = out[out.step_idx.isna()].reset_index(drop=True)
    pd.testing.assert_frame_equal(chain_rows, BL.score_batch(pdf, *args))  # chain scores unchanged
    steps = out[out.step_idx.notna()]
    by_chain = steps.groupby("chain_id")["metric"].apply(set).to_dict()
    # c2 was split from its text here: no step index the lake shares. c3 has no context: LI only.
    assert by_chain == {"c1": set(MR.names(MR.STEP_BASELINE_SCORES)), "c3": {"roscoe_li_source_consistency", "roscoe_li_self_consistency"}}
    c1 = steps[steps.chain_id == "c1"].set_index(["metric", "step_idx"])["score"]
    # Step 1 "So Tom does not have cats." is contradicted (0.8) by the context and by step 0; step 0 by nothing (0.05).
    assert [c1[("roscoe_li_source_consistency", t)] for t in (0, 1)] == exact([0.95, 0.2])
    assert [c1[("roscoe_li_self_consistency", t)] for t in (0, 1)] == exact([1.0, 0.2])
    assert c1[("roscoe_ss_repetition_step", 0)] == exact(0.5)


def test_contradict_factory_sizes_the_nli_calls_from_the_nli_section(make_settings, monkeypatch):
    from udfs import nli

    called = {}
    monkeypatch.setattr(nli, "model_predictor", lambda *args, **kwargs: called.update(kwargs))
    settings = make_settings("nli.batch_size=7", "nli.max_length=99", "runtime.batch_size=3")
    BL.contradict_factory(settings.nli, settings.models, settings.runtime)
    assert (called["batch_size"], called["max_length"]) == (7, 99)
    settings = make_settings("runtime.batch_size=3", "runtime.max_length=64")  # nli section unset: runtime's
    BL.contradict_factory(settings.nli, settings.models, settings.runtime)
    assert (called["batch_size"], called["max_length"]) == (3, 64)


def test_transform_matches_score_batch(spark, make_settings):
    settings = make_settings("baselines.reference_based=true", "baselines.per_step=true")
    rows = [Row(**{f.name: c.get(f.name) for f in C.SCHEMA.fields} | {C.CONTENT_HASH: c[C.CHAIN_ID]})
            for c in CHAINS]
    chains = spark.createDataFrame(rows, C.SCHEMA).repartition(2)
    scored = BL.split(BL.transform(chains, settings.baselines, settings.models, settings.runtime,
                                   settings.nli, embed=FakeEmbedder, contradict=lambda: fake_contradict))
    got, got_steps = scored.chains, scored.steps
    pdf = pd.DataFrame([{k: c.get(k) for k in (C.CHAIN_ID, C.CONTEXT, C.STEPS, C.CHAIN_TEXT, C.GOLD_STEPS)}
                        for c in CHAINS])
    want = BL.score_batch(pdf, ["sa", "ss", "li", "rouge"], True, BL._sentencizer(), FakeEmbedder(),
                          fake_contradict, {"embedding": settings.models.embedding.path, "nli": settings.models.nli.path},
                          per_step=True)
    got_map = {(r[B.CHAIN_ID], r[B.METRIC]): r[B.SCORE] for r in got.collect()}
    # The same fakes and float64 arithmetic on both paths: exact.
    chain_want, step_want = want[want.step_idx.isna()], want[want.step_idx.notna()]
    assert got_map == exact({(r.chain_id, r.metric): r.score for r in chain_want.itertuples()})
    step_map = {(r[B.CHAIN_ID], r[B.STEP_IDX], r[B.METRIC]): r[B.SCORE] for r in got_steps.collect()}
    assert step_map == exact({(r.chain_id, r.step_idx, r.metric): r.score for r in step_want.itertuples()})
    assert ("c1", "roscoe_sa_reasoning_alignment") in got_map  # reference-based on: gold present
    tables.upsert(spark, got, settings.table("baseline_scores"), B.SCHEMA, BL.KEYS)
    tables.upsert(spark, got, settings.table("baseline_scores"), B.SCHEMA, BL.KEYS)
    assert tables.read(spark, settings.table("baseline_scores")).count() == len(got_map)
