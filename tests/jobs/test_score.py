"""NLI and PVI outputs joined into step_scores; a chain with a failed or missing step is quarantined whole."""

from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual
from tolerance import EXACT_FRAME

from jobs.receval import score
from schemas import step_scores as SS
from schemas import steps as ST


def _steps(spark, h: str):
    # Step 1 has two equations, one wrong: the arithmetic check needs no model and scores it from the text.
    rows = [(cid, h, i, n, f"{cid} step {i}" + (": 3 * 4 = 12 and 18 - 6 = 13." if i == 1 else ""), [], f"c{i}",
             "newline", "position", "fake")
            for cid, n in (("ok", 2), ("nli-err", 2), ("pvi-gap", 1)) for i in range(n)]
    return spark.createDataFrame(rows, ST.SCHEMA)


def _contexts(spark, h: str):
    return spark.createDataFrame([(c, h, ["X."], "7", "given") for c in ("ok", "nli-err", "pvi-gap")],
                                 ST.CONTEXTS_SCHEMA)


def _nli(steps, contexts, settings):
    return steps.select(
        ST.CHAIN_ID, ST.STEP_IDX,
        (F.col(ST.STEP_IDX) * 0.25 + 0.5).alias(SS.INTRA_ENTAIL), F.lit("p").alias(SS.INTRA_PREMISE),
        F.lit(0.9).alias(SS.INTER), F.lit(0.1).alias(SS.INTER_MAX_CONTRADICTION),
        F.lit("X.").alias(SS.INTER_WORST_PREMISE), F.lit("context").alias(SS.INTER_WORST_SOURCE),
        F.when((F.col(ST.CHAIN_ID) == "nli-err") & (F.col(ST.STEP_IDX) == 1), "CUDA out of memory").alias("error"),
    )


def _pvi(steps, contexts, settings):
    # No row at all for the pvi-gap chain: a step the PVI transform lost. Step 1's passes were cut to fit a model.
    return steps.where(F.col(ST.CHAIN_ID) != "pvi-gap").select(
        ST.CHAIN_ID, ST.STEP_IDX, F.lit(-0.5).alias(SS.INTRA_PVI), F.lit(-1.0).alias(SS.PVI_G),
        F.lit(-0.5).alias(SS.PVI_NULL), (F.col(ST.STEP_IDX) * 1.0).alias(SS.INFO_GAIN),
        F.lit(-2.0).alias(SS.IG_L_PREV), (F.col(ST.STEP_IDX) - 2.0).alias(SS.IG_L),
        (F.col(ST.STEP_IDX) == 1).alias(SS.PVI_TRUNCATED),
    )


def test_transform_joins_scores_and_quarantines_whole_chains(spark, settings):
    h = settings.scoring_hash()
    good, bad = score.transform(_steps(spark, h), _contexts(spark, h), settings, nli=_nli, pvi=_pvi)
    m = settings.models
    expected = spark.createDataFrame(
        [("ok", i, h, 0.5 + 0.25 * i, "p", 0.9, 0.1, "X.", "context", -0.5, -1.0, -0.5, float(i), -2.0, i - 2.0,
          m.nli.path, None, m.pvi_g.path, m.pvi_null.path, m.info_gain.path, None, i == 1,
          *((0.5, 1, 2, "18 - 6 = 13 (is 12)") if i == 1 else (None, 0, 0, None))) for i in range(2)],
        SS.SCHEMA,
    )
    assertDataFrameEqual(good.drop(SS.SCORED_AT), expected.drop(SS.SCORED_AT), **EXACT_FRAME)
    assert good.where(F.col(SS.SCORED_AT).isNull()).count() == 0
    got = sorted((r["chain_id"], r["reason"], r["detail"], r["source"]) for r in bad.collect())
    assert got == [
        ("nli-err", "chain_has_failed_step", "another step of this chain failed to score", f"config_hash:{h}"),
        ("nli-err", "nli_error", "nli: CUDA out of memory", f"config_hash:{h}"),
        ("pvi-gap", "missing_score", "pvi: no score for the step", f"config_hash:{h}"),
    ]
    assert {r["stage"] for r in bad.collect()} == {"score"}


def test_score_steps_pvi_truncated_is_null_when_the_pvi_transform_does_not_report_it(spark, settings):
    h = settings.scoring_hash()

    def silent(steps, contexts, s):
        return _pvi(steps, contexts, s).drop(SS.PVI_TRUNCATED)

    rows = score.score_steps(_steps(spark, h), _contexts(spark, h), settings, nli=_nli, pvi=silent).collect()
    assert {r[SS.PVI_TRUNCATED] for r in rows} == {None}  # unknown, not "scored whole"


def test_run_writes_once_and_reruns_add_nothing(spark, settings):
    from jobs.infra import tables
    h = settings.scoring_hash()
    args = (spark, settings, _steps(spark, h), _contexts(spark, h), "run-1")
    first = score.run(*args, nli=_nli, pvi=_pvi)
    # "truncated": written steps scored on a cut input (the run summary's count)
    assert first == {"steps": 5, "written": 2, "quarantined": 3, "truncated": 1}
    version = tables.version(spark, settings.table("step_scores"))
    again = score.run(*args, nli=_nli, pvi=_pvi)
    assert again["written"] == 0
    assert tables.version(spark, settings.table("step_scores")) in (version, version + 1)
    assert tables.read(spark, settings.table("step_scores")).count() == 2
    flags = tables.read(spark, settings.table("step_scores")).orderBy(SS.STEP_IDX).select(SS.PVI_TRUNCATED).collect()
    assert [r[0] for r in flags] == [False, True]
    assert tables.read(spark, settings.table("quarantine")).count() == 3


def test_run_computes_each_steps_scores_once(spark, settings):
    # The models' work is the NLI and PVI frames: a Python UDF counts the rows each computes. score.run holds the
    # scored rows, and its MERGE into step_scores, quarantine and the counts must all read them from the cache;
    # a second pass doubles a night's model time (a MERGE source with F.current_timestamp() misses the cache).
    h = settings.scoring_hash()
    seen = spark.sparkContext.accumulator(0)

    @F.udf("double")
    def once(x):
        seen.add(1)
        return x

    def nli(steps, contexts, s):
        return _nli(steps, contexts, s).withColumn(SS.INTRA_ENTAIL, once(SS.INTRA_ENTAIL))

    def pvi(steps, contexts, s):
        return _pvi(steps, contexts, s).withColumn(SS.INTRA_PVI, once(SS.INTRA_PVI))

    counts = score.run(spark, settings, _steps(spark, h), _contexts(spark, h), "run-1", nli=nli, pvi=pvi)
    assert counts == {"steps": 5, "written": 2, "quarantined": 3, "truncated": 1}
    assert seen.value == 5 + 4  # NLI scores every step; PVI every step but pvi-gap's one
