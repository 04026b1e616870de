from __future__ import annotations

import datetime as dt

import pytest
from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual, assertSchemaEqual
from tolerance import EXACT_FRAME

from jobs.infra import tables
from jobs.receval import aggregate
from schemas import chain_scores as CS
from schemas import step_scores as SS

T0 = dt.datetime(2024, 1, 1, 12, 0, 0)
T1 = dt.datetime(2024, 1, 1, 12, 5, 0)


def step(chain: str, idx: int, entail: float | None, pvi: float | None, inter: float | None, gain: float | None,
         config: str = "h1", at: dt.datetime = T0, arith: tuple[float | None, int | None] = (None, 0)) -> dict:
    """`arith`: (arith_valid, arith_errors); by default a step without an equation (null share, no error)."""
    return {
        SS.CHAIN_ID: chain, SS.STEP_IDX: idx, SS.CONFIG_HASH: config,
        SS.INTRA_ENTAIL: entail, SS.INTRA_PVI: pvi, SS.INTER: inter, SS.INFO_GAIN: gain,
        SS.ARITH_VALID: arith[0], SS.ARITH_ERRORS: arith[1],
        SS.NLI_MODEL: "nli-m", SS.PVI_MODEL: "g-m", SS.PVI_NULL_MODEL: "g0-m", SS.IG_MODEL: "ig-m",
        SS.SCORED_AT: at,
    }


def frame(spark, rows: list[dict]):
    return spark.createDataFrame([Row(**{f.name: r.get(f.name) for f in SS.SCHEMA.fields}) for r in rows], SS.SCHEMA)


def expected(chain: str, n: int, mins: dict, worst: dict, means: dict, api: tuple, config: str = "h1",
             at: dt.datetime = T0, arith: tuple = (None, None, None, 0)) -> dict:
    """`arith`: arith_valid's min, worst step and mean, and arith_errors_total."""
    row = {CS.CHAIN_ID: chain, CS.CONFIG_HASH: config, CS.N_STEPS: n}
    mins, worst, means = ({**d, SS.ARITH_VALID: v} for d, v in zip((mins, worst, means), arith[:3], strict=True))
    for m in CS.metric_names():  # in schema order: Row(**row) is matched to the schema by position
        row[CS.min_col(m)] = mins[m]
        row[CS.worst_step_col(m)] = worst[m]
        row[CS.mean_col(m)] = means[m]
    row[CS.total_col(SS.ARITH_ERRORS)] = arith[3]
    for k, v in zip(CS.API_KS, api, strict=True):
        row[CS.api_col(k)] = v
    row.update({CS.NLI_MODEL: "nli-m", CS.PVI_MODEL: "g-m", CS.PVI_NULL_MODEL: "g0-m", CS.IG_MODEL: "ig-m",
                CS.SCORED_AT: at})
    return row


E, P, X, G = SS.INTRA_ENTAIL, SS.INTRA_PVI, SS.INTER, SS.INFO_GAIN  # X: inter

# Rows deliberately out of step order: the job must not depend on row order.
STEPS = [
    # a: arith_valid over the two steps with equations only (sparse): min 0.5 at step 2, mean 0.75; 1 error.
    step("a", 2, 0.2, -1.0, 0.5, 0.125, arith=(0.5, 1)),
    step("a", 0, 0.9, 0.5, 1.0, 0.5, arith=(1.0, 0)),
    step("a", 1, 0.2, 2.0, 0.25, -0.25),
    step("b", 0, 0.75, 0.0, 1.0, 0.5),  # one step: shorter than k = 2, 3
    step("c", 1, 0.5, 1.0, 0.5, 0.25),
    step("c", 0, 0.5, 1.0, 0.5, -0.5),  # two steps, all ties
    step("d", 0, 1.0, 1.0, 1.0, 0.125),
    step("d", 1, 1.0, 1.0, 1.0, 0.25),
    step("d", 2, 1.0, 1.0, 1.0, -0.0625),
    step("d", 3, 1.0, 1.0, 0.0, 0.375, at=T1),
    step("e", 0, 0.5, None, 0.5, 0.5),  # PVI failed on step 0: its chain scores are null
    step("e", 1, 0.25, 1.0, 0.5, None, arith=(None, None)),  # a count that is null: its total is null
    step("a", 0, 0.1, 0.1, 0.1, 0.1, config="h2"),  # same chain under another config: its own row
]


def test_transform_hand_computed(spark, settings):
    got = aggregate.transform(frame(spark, STEPS), settings.aggregate)
    want = [
        # a: gains [0.5, -0.25, 0.125]; windows k=2: 0.25, -0.125 -> False; k=3: 0.375 -> True.
        expected("a", 3, {E: 0.2, P: -1.0, X: 0.25, G: -0.25}, {E: 1, P: 2, X: 1, G: 1},
                 {E: 1.3 / 3, P: 1.5 / 3, X: 1.75 / 3, G: 0.375 / 3}, (False, False, True), arith=(0.5, 2, 0.75, 1)),
        # b: one step with gain 0.5: the whole chain is the one window for every k.
        expected("b", 1, {E: 0.75, P: 0.0, X: 1.0, G: 0.5}, {E: 0, P: 0, X: 0, G: 0},
                 {E: 0.75, P: 0.0, X: 1.0, G: 0.5}, (True, True, True)),
        # c: ties -> first step; gains [-0.5, 0.25]: k=2 sum -0.25; k=3 (shorter) sum -0.25.
        expected("c", 2, {E: 0.5, P: 1.0, X: 0.5, G: -0.5}, {E: 0, P: 0, X: 0, G: 0},
                 {E: 0.5, P: 1.0, X: 0.5, G: -0.125}, (False, False, False)),
        # d: gains [0.125, 0.25, -0.0625, 0.375]: k=2 sums 0.375, 0.1875, 0.3125; k=3 sums 0.3125, 0.5625.
        expected("d", 4, {E: 1.0, P: 1.0, X: 0.0, G: -0.0625}, {E: 0, P: 0, X: 3, G: 2},
                 {E: 1.0, P: 1.0, X: 0.75, G: 0.171875}, (False, True, True), at=T1),
        expected("e", 2, {E: 0.25, P: None, X: 0.5, G: None}, {E: 1, P: None, X: 0, G: None},
                 {E: 0.375, P: None, X: 0.5, G: None}, (None, None, None), arith=(None, None, None, None)),
        expected("a", 1, {E: 0.1, P: 0.1, X: 0.1, G: 0.1}, {E: 0, P: 0, X: 0, G: 0},
                 {E: 0.1, P: 0.1, X: 0.1, G: 0.1}, (True, True, True), config="h2"),
    ]
    assertSchemaEqual(got.schema, CS.SCHEMA)
    assertDataFrameEqual(got, spark.createDataFrame([Row(**r) for r in want], CS.SCHEMA), **EXACT_FRAME)


def test_transform_partition_invariant(spark, settings):
    df = frame(spark, STEPS)
    one = aggregate.transform(df.coalesce(1), settings.aggregate)
    many = aggregate.transform(df.repartition(5), settings.aggregate)
    assertDataFrameEqual(one, many, **EXACT_FRAME)


def test_transform_api_k_subset(spark, make_settings):
    got = aggregate.transform(frame(spark, STEPS), make_settings("aggregate.api_k=[2]").aggregate)
    row = got.where("chain_id = 'd'").first()
    assert (row[CS.api_col(1)], row[CS.api_col(2)], row[CS.api_col(3)]) == (None, True, None)
    with pytest.raises(ValueError, match="api_k"):
        aggregate.transform(frame(spark, STEPS), make_settings("aggregate.api_k=[4]").aggregate)


def test_run_idempotent_upsert(spark, settings):
    tables.upsert(spark, frame(spark, STEPS), settings.table("step_scores"), SS.SCHEMA,
                  [SS.CHAIN_ID, SS.STEP_IDX, SS.CONFIG_HASH])
    first = aggregate.run(spark, settings)
    assert first == {"chains": 6, "incomplete": 1}
    aggregate.run(spark, settings)
    table = tables.read(spark, settings.table("chain_scores"))
    assert table.count() == 6
    # A rescored step replaces the chain's row instead of adding one.
    tables.upsert(spark, frame(spark, [step("b", 0, 0.25, 0.0, 1.0, -0.5, at=T1)]),
                  settings.table("step_scores"), SS.SCHEMA, [SS.CHAIN_ID, SS.STEP_IDX, SS.CONFIG_HASH])
    aggregate.run(spark, settings)
    b = tables.read(spark, settings.table("chain_scores")).where("chain_id = 'b'").collect()
    assert len(b) == 1
    assert (b[0][CS.min_col(E)], b[0][CS.api_col(1)], b[0][CS.SCORED_AT]) == (0.25, False, T1)


def test_by_label_means_per_dataset_and_label_value(spark):
    from schemas import chains as C

    cols = aggregate.label_score_cols()  # intra_entail_min, intra_pvi_min, inter_min, info_gain_min, arith_valid_min
    scores = spark.createDataFrame(
        [("c1", 0.5, 1.0, 0.25, 0.5, 1.0), ("c2", 0.25, -1.0, 0.75, None, None), ("c3", 0.0, 0.5, 0.5, -0.5, 0.5),
         ("c4", 1.0, 2.0, 1.0, 1.0, 0.25)],
        f"{CS.CHAIN_ID} string, " + ", ".join(f"{c} double" for c in cols))
    chains = spark.createDataFrame(
        [("c1", "d1", {"ok": 1.0}), ("c2", "d1", {"ok": 0.0}), ("c3", "d1", {"ok": 0.0, "other": 1.0}),
         ("c4", "d2", None), ("c5", "d2", {"ok": 0.0}), ("c6", "d1", {"ok": None})],  # c5, c6: not scored
        f"{C.CHAIN_ID} string, {C.DATASET} string, {C.LABELS} map<string,double>")
    got = aggregate.by_label(scores, chains)
    # Hand-derived: d1 all = c1..c3; ok=1: c1; ok=0: c2, c3 (info_gain of c2 null: the mean of c3's alone);
    # other=1: c3; d2 all = c4 (no labels). Rows: dataset, the "all" row first, then labels, values high to low.
    want = [
        ("d1", "all", None, 3, 0.25, 0.5 / 3, 0.5, 0.0, 0.75),
        ("d1", "ok", 1.0, 1, 0.5, 1.0, 0.25, 0.5, 1.0),
        ("d1", "ok", 0.0, 2, 0.125, -0.25, 0.625, -0.5, 0.5),
        ("d1", "other", 1.0, 1, 0.0, 0.5, 0.5, -0.5, 0.5),
        ("d2", "all", None, 1, 1.0, 2.0, 1.0, 1.0, 0.25),
    ]
    assert got.columns == [C.DATASET, "label", "value", "chains", *cols]
    rows = [tuple(r) for r in got.collect()]
    assert [r[:4] for r in rows] == [w[:4] for w in want]
    for r, w in zip(rows, want, strict=True):
        assert r[4:] == pytest.approx(w[4:], rel=1e-12), r
