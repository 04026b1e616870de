"""jobs.receval.nli_scores with nli.inter_history / intra_history = relevant: short chains score exactly as `all`
without the encoder; long chains keep the hand-derived candidates, embedded once per chain."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest
from pyspark import cloudpickle
from pyspark.sql import Row
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual
from test_nli_scores import _fake_factory, _write_inputs, fake_probs, frames
from tolerance import EXACT_ABS, EXACT_REL

from jobs.infra import tables
from jobs.receval import nli_scores
from schemas import step_scores as SS
from schemas import steps as S

# The fake encoders below run in Spark's Python workers, which cannot import this test module by name.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _refusing_factory():
    def embed(texts: list[str]) -> np.ndarray:
        raise AssertionError(f"the encoder was called on a chain that needs none: {texts}")

    return embed


VOCAB = ["apple", "red", "sky", "blue", "green", "grey", "tea", "cloud", "cup", "cake", "shop", "moon", "dust"]


def _bag_factory(log: str | None = None):
    """Bag-of-words vectors over VOCAB (binary): cosine = shared words / sqrt(words x words)."""

    def embed(texts: list[str]) -> np.ndarray:
        if log:
            with open(log, "a", encoding="utf-8") as f:
                f.write(f"{len(texts)}\n")
        return np.array([[float(word in text.split()) for word in VOCAB] for text in texts])

    return embed


def bag_embedder(log: Path):
    return functools.partial(_bag_factory, str(log))


def _transform(steps, contexts, settings, embed):
    return nli_scores.transform(steps, contexts, settings.nli, settings.models.nli, settings.runtime,
                                predict=_fake_factory, embed=embed)


def _sorted(df) -> list:
    return sorted(df.collect(), key=lambda r: (r[S.CHAIN_ID], r[S.STEP_IDX]))


# Every step has at most 8 inter candidates (context sentences + earlier conclusions) and 4 earlier conclusions.
SHORT = [
    ("one", ["ab", "  "], [(["p"], "q")]),
    ("none", None, [(["a0", "b0"], "k0"), (["a11"], "k11"), ([], "k222"), (["a3333", ""], "k3"), (["a4"], "k44")]),
    # The last step has exactly 8 candidates (4 sentences, 4 non-blank conclusions) and 4 earlier conclusions.
    ("eight", ["s one", "the s two", "s3", "s four"], [(["r"], "x0"), ([], "x11"), (["r", "t"], "x2"), ([], ""),
                                                       (["u"], "x4"), (["v"], "x555")]),
]


def test_short_chains_relevant_equals_all_and_never_embed(spark, make_settings):
    steps, contexts = frames(spark, SHORT, "h")
    official = make_settings("nli.inter_history=all", "nli.intra_history=all")
    defaults = make_settings().nli
    assert (defaults.inter_history, defaults.intra_history) == ("relevant", "relevant")
    assert (defaults.inter_top_k, defaults.inter_recent, defaults.intra_top_k) == (16, 2, 8)
    relevant = make_settings("nli.inter_top_k=8", "nli.intra_top_k=4")  # the chains sit exactly at these sizes
    want = _transform(steps, contexts, official, None)
    got = _transform(steps, contexts, relevant, _refusing_factory)
    assertDataFrameEqual(got, want, checkRowOrder=False)
    # The same pairs, not only the same scores.
    pairs = {name: nli_scores.plan(steps, contexts, s.nli, s.models.nli, s.runtime, _fake_factory,
                                   embed=_refusing_factory).pairs for name, s in (("all", official),
                                                                                  ("relevant", relevant))}
    assertDataFrameEqual(pairs["relevant"], pairs["all"], checkRowOrder=False)
    # (intra + inter rows) per chain: one 1 + 1; none 5 + (0+1+2+3+4); eight 6 + (4+5+6+7+7+8)
    assert pairs["all"].count() == 2 + 15 + 43


# A 12-step chain on two context sentences; every text has two words, so a cosine is 0, .5 or 1.
LONG_CONTEXT = ["apple red", "sky blue"]
LONG = ["apple green", "sky grey", "green tea", "grey cloud", "tea cup", "red apple", "blue cloud", "cup cake",
        "cake shop", "sky blue", "moon dust", "apple tea"]
# Per step, with inter_top_k=2, inter_recent=1: the 2 closest (ties to the earliest: context first), plus the
# previous conclusion; listed in the official order (context, then earlier steps).
LONG_KEPT = [
    ["apple red", "sky blue"],  # 2 candidates: all
    ["apple red", "sky blue", "apple green"],  # sky blue .5; ties at 0 -> apple red; + apple green
    ["apple red", "apple green", "sky grey"],  # apple green .5, apple red (0, earliest); + sky grey
    ["apple red", "sky grey", "green tea"],
    ["apple red", "green tea", "grey cloud"],
    ["apple red", "apple green", "tea cup"],  # apple red 1, apple green .5; + tea cup
    ["sky blue", "grey cloud", "red apple"],  # sky blue .5, grey cloud .5; + red apple
    ["apple red", "tea cup", "blue cloud"],
    ["apple red", "cup cake"],  # cup cake .5, apple red; the previous conclusion is cup cake already
    ["sky blue", "sky grey", "cake shop"],  # sky blue 1, then sky grey .5 (ties blue cloud: earlier); + cake shop
    ["apple red", "sky blue", "sky blue"],  # nothing shared: the two earliest; + the previous conclusion sky blue
    ["apple red", "apple green", "moon dust"],  # five at .5: the two earliest; + moon dust
]
# No context row: the candidates are the earlier conclusions only.
NO_CONTEXT = ["apple green", "sky grey", "green tea", "apple tea"]
NO_CONTEXT_KEPT = [[], ["apple green"], ["apple green", "sky grey"], ["apple green", "green tea"]]


def _chain(conclusions: list[str]) -> list[tuple[list[str], str]]:
    return [([f"r{i}"], c) for i, c in enumerate(conclusions)]


@pytest.mark.slow  # Spark jobs with the encoder: the default set is at its budget (docs/TESTING.md)
def test_long_chain_keeps_hand_derived_candidates_embedding_each_chain_once(spark, make_settings, tmp_path):
    chains = [("long", LONG_CONTEXT, _chain(LONG)), ("bare", None, _chain(NO_CONTEXT)), SHORT[0]]
    steps, contexts = frames(spark, chains, "h")
    settings = make_settings("nli.inter_top_k=2", "nli.inter_recent=1", "nli.intra_history=all")
    log = tmp_path / "embed.log"
    p = nli_scores.plan(steps, contexts, settings.nli, settings.models.nli, settings.runtime, _fake_factory,
                        embed=bag_embedder(log))
    premises = {(r[S.CHAIN_ID], r[S.STEP_IDX]): r for r in p.premises.collect()}
    # One encoder call per chain that needs one, on all its texts (context sentences and conclusions); "one"
    # (a single candidate) needs none.
    assert sorted(log.read_text(encoding="utf-8").split()) == ["14", "4"]
    kept = {key: [c[nli_scores.PREMISE] for c in r["_inter"]] for key, r in premises.items()}
    assert [kept[("long", i)] for i in range(12)] == LONG_KEPT
    assert [kept[("bare", i)] for i in range(4)] == NO_CONTEXT_KEPT
    assert kept[("one", 0)] == ["ab"]
    # Sources and ORDs are the official ones: a kept candidate is the same struct as under `all`.
    assert [(c[nli_scores.SOURCE], c[nli_scores.ORD]) for c in premises[("long", 11)]["_inter"]] == [
        ("context", 0), ("step:0", 2), ("step:10", 12)
    ]
    inter_pairs = p.pairs.where(F.col(nli_scores.KIND) == "inter").count()
    assert inter_pairs == (2 + 3 * 7 + 2 + 3 * 3) + (0 + 1 + 2 + 2) + 1  # `all`: 90 + 6 + 1

    # The scores are ReCEval's over the kept candidates (fake NLI: exact rationals).
    rows = _sorted(p.result)
    conclusions = {chain_id: [c for _, c in chain_steps] for chain_id, _, chain_steps in chains}
    for r in rows:
        conclusion = conclusions[r[S.CHAIN_ID]][r[S.STEP_IDX]]
        candidates = kept[(r[S.CHAIN_ID], r[S.STEP_IDX])]
        contra = [fake_probs(text, conclusion)[2] for text in candidates]
        worst = max(contra) if contra else None
        assert r[SS.INTER] == (1.0 if worst is None else 1.0 - worst)
        if worst is not None:  # ties go to the earliest candidate, as under `all`
            assert r[SS.INTER_WORST_PREMISE] == candidates[contra.index(worst)]
    assert len(rows) == 12 + 4 + 1


# intra_top_k=2: each step's own premise RCUs, then its 2 earlier conclusions closest to its conclusion.
INTRA_CHAIN = [
    (["r0"], "apple green"),
    (["r1"], "sky grey"),
    (["r2"], "green tea"),
    (["r3a", "r3b"], "grey cloud"),
    ([], "tea cup"),
    (["r5"], "grey cloud tea"),
]
INTRA_PREMISES = [
    "r0",
    "r1 and apple green",
    "r2 and apple green and sky grey",  # 2 earlier: all
    "r3a and r3b and apple green and sky grey",  # sky grey .5, then apple green (0, earliest): chain order
    "apple green and green tea",  # no premise RCUs; green tea .5, then apple green
    "r5 and sky grey and grey cloud",  # grey cloud .82, then sky grey .41 (ties green tea, tea cup: earliest)
]


@pytest.mark.slow  # Spark jobs with the encoder: the default set is at its budget (docs/TESTING.md)
def test_intra_relevant_keeps_own_premises_and_closest_conclusions_in_chain_order(spark, make_settings, tmp_path):
    steps, contexts = frames(spark, [("intra", ["ctx"], INTRA_CHAIN)], "h")
    settings = make_settings("nli.intra_top_k=2", "nli.inter_history=all")
    log = tmp_path / "embed.log"
    result = _transform(steps, contexts, settings, bag_embedder(log))
    rows = _sorted(result)
    assert [r[SS.INTRA_PREMISE] for r in rows] == INTRA_PREMISES
    want = [fake_probs(premise, conclusion)[0] for premise, (_, conclusion) in zip(INTRA_PREMISES, INTRA_CHAIN,
                                                                                      strict=True)]
    assertDataFrameEqual([Row(v=r[SS.INTRA_ENTAIL]) for r in rows], [Row(v=v) for v in want], rtol=EXACT_REL,
                         atol=EXACT_ABS)
    # inter stays `all`: step 5 is checked against the context sentence and all 5 earlier conclusions.
    official = _sorted(_transform(steps, contexts, make_settings("nli.intra_history=all", "nli.inter_history=all"),
                                  None))
    assert [r[SS.INTER] for r in rows] == [r[SS.INTER] for r in official]
    # Each call embeds the chain whole (the sentence and the 6 conclusions) in one batch. The result's plan reads
    # the premises twice (the pairs, and the steps they join back to), each a call here; `run` holds them.
    assert set(log.read_text(encoding="utf-8").split()) == {"7"}


@pytest.mark.slow  # Spark jobs with the encoder: the default set is at its budget (docs/TESTING.md)
def test_run_embeds_each_long_chain_once_and_writes_the_kept_scores(spark, make_settings, tmp_path):
    settings = make_settings("nli.inter_top_k=2", "nli.inter_recent=1", "nli.intra_history=all")
    _write_inputs(spark, settings, [("long", LONG_CONTEXT, _chain(LONG)), SHORT[0]])
    log = tmp_path / "embed.log"
    counts = nli_scores.run(spark, settings, predict=_fake_factory, embed=bag_embedder(log))
    # run holds the premises: one encoder call for the long chain, though pairs, scores and counts all read them.
    assert log.read_text(encoding="utf-8").split() == ["14"]
    assert counts["pairs"] == (12 + 34) + (1 + 1)  # intra + kept inter pairs; "one": 1 + 1
    assert counts["steps"] == counts["steps_scored"] == 13 and counts["reconciled"] == 1
    row = tables.read(spark, settings.table("step_scores")).where(
        (F.col(SS.CHAIN_ID) == "long") & (F.col(SS.STEP_IDX) == 11)).first()
    # Kept: apple red, apple green, moon dust -> the fake's contradiction 10 / (len p + len h + 10) is highest for
    # the shortest premise, "apple red" (9 characters; "moon dust" ties it and comes later).
    assert (row[SS.INTER_WORST_PREMISE], row[SS.INTER]) == ("apple red", 1.0 - fake_probs("apple red", "apple tea")[2])


@pytest.mark.slow  # Spark jobs with the encoder: the default set is at its budget (docs/TESTING.md)
def test_pvi_g_source_keeps_the_same_relevant_conclusions(spark, make_settings, tmp_path):
    """pvi.intra_history=relevant: g's source joins the step's own premise RCUs and the same earlier conclusions
    the NLI intra premise keeps (udfs.candidates.intra_relevant), with " & "; g' and L(k) are unchanged."""
    from jobs.receval import pvi_scores
    from udfs import pvi_prompts as P

    steps, contexts = frames(spark, [("intra", ["ctx"], INTRA_CHAIN)], "h")
    settings = make_settings("pvi.intra_top_k=2")
    log = tmp_path / "embed.log"
    reqs = pvi_scores.requests(steps, contexts, settings.pvi, settings.models, settings.runtime, bag_embedder(log))
    g = {r[S.STEP_IDX]: r["source"] for r in reqs.where(F.col("kind") == P.G).collect()}
    assert [g[i] for i in range(len(INTRA_CHAIN))] == [P.G_PREFIX + p.replace(" and ", " & ") + " ->"
                                                       for p in INTRA_PREMISES]
    assert log.read_text(encoding="utf-8").split() == ["6"]  # the chain's 6 conclusions, one call
    official = make_settings("pvi.intra_history=all")
    every = pvi_scores.requests(steps, contexts, official.pvi, official.models, official.runtime, _refusing_factory)
    others = F.col("kind") != P.G
    assertDataFrameEqual(reqs.where(others), every.where(others), checkRowOrder=False)
    # A chain with no more earlier conclusions than intra_top_k is never embedded and equals `all`.
    short, short_ctx = frames(spark, [("short", ["ctx"], INTRA_CHAIN[:3])], "h")
    assertDataFrameEqual(
        pvi_scores.requests(short, short_ctx, settings.pvi, settings.models, settings.runtime, _refusing_factory),
        pvi_scores.requests(short, short_ctx, official.pvi, official.models, official.runtime, _refusing_factory),
        checkRowOrder=False,
    )
