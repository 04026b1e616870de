"""The metric registry (schemas/metrics.py): its contents, the contracts derived from it, and a new step score
flowing from one registry entry to chain scores, the meta-evaluation and the nightly report."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys

import pytest
from pyspark.sql import Row
from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from jobs.infra.config_layers import load_settings
from jobs.infra.config_paths import PROJECT_ROOT
from schemas import baseline_scores as B
from schemas import chain_scores as CS
from schemas import cot
from schemas import metrics as MR
from schemas import step_scores as SS

CHAIN = ("min", "worst_step", "mean")
REFERENCE_FREE = [
    "roscoe_sa_faithfulness_step", "roscoe_sa_faithfulness_token", "roscoe_sa_informativeness_step",
    "roscoe_sa_repetition_token", "roscoe_ss_informativeness_chain", "roscoe_ss_repetition_step",
    "roscoe_li_source_consistency", "roscoe_li_self_consistency",
]
REFERENCE_BASED = [
    "roscoe_sa_reasoning_alignment", "roscoe_sa_hallucination", "roscoe_sa_redundancy", "roscoe_sa_common_sense",
    "roscoe_sa_missing_step", "roscoe_sa_semantic_coverage_step", "roscoe_ss_semantic_coverage_chain",
]


def test_registry_holds_every_metric_with_its_table_direction_and_aggregations():
    got = {t: [(m.name, m.aggregations) for m in MR.of_table(t)] for t in MR.TABLES}
    assert got == {
        "step_scores": [("intra_entail", CHAIN), ("intra_pvi", CHAIN), ("inter", CHAIN),
                        ("info_gain", (*CHAIN, "api_k")), ("arith_valid", CHAIN), ("arith_errors", ("total",))],
        "baseline_scores": [(m, ()) for m in [*REFERENCE_FREE, *REFERENCE_BASED, "rouge2"]],
        "step_baseline_scores": [("roscoe_sa_faithfulness_step", ("mean",)), ("roscoe_sa_repetition_token", ("min",)),
                                 ("roscoe_ss_repetition_step", ("min",)), ("roscoe_li_source_consistency", ("min",)),
                                 ("roscoe_li_self_consistency", ("min",))],
        "cot_metrics": [(m, ("template", "task", "median_template", "macro", "micro"))
                        for m in ("accuracy", "numeric_match", "acc_norm_token", "acc_norm_byte", "random_guess")],
    }
    # Every score is higher-is-better but the one count (issue 45), whose chain score is its total.
    assert {(m.name, m.direction, m.direction_text, m.higher_is_better) for m in MR.REGISTRY if m.direction != "higher"
            } == {("arith_errors", "lower", "lower is better", False)}
    assert [m.name for m in MR.REGISTRY if m.sparse] == ["arith_valid"]
    assert {m.name: m.detail for m in MR.REGISTRY if m.detail} == {"arith_valid": "arith_failed",
                                                                   "arith_errors": "arith_failed"}
    assert all(m.definition.strip() and "\n" not in m.definition for m in MR.REGISTRY)
    assert {m.name: m.source for m in MR.of_table("cot_metrics")} == {
        "accuracy": "correct", "numeric_match": "numeric_correct", "acc_norm_token": "correct_per_token",
        "acc_norm_byte": "correct_per_byte", "random_guess": "chance"}
    assert MR.get("step_scores", "inter").definition.startswith("1 - max P_contradiction(r, conclusion)")
    with pytest.raises(KeyError, match="not a step_scores metric"):
        MR.get("step_scores", "rouge2")


def test_chain_scores_contract_equals_the_one_written_out_before_the_registry():
    def per_metric(m: str) -> list[StructField]:
        return [StructField(f"{m}_min", DoubleType(), True), StructField(f"{m}_worst_step", IntegerType(), True),
                StructField(f"{m}_mean", DoubleType(), True)]

    before = StructType([
        StructField("chain_id", StringType(), False),
        StructField("config_hash", StringType(), False),
        StructField("n_steps", IntegerType(), False),
        *per_metric("intra_entail"), *per_metric("intra_pvi"), *per_metric("inter"), *per_metric("info_gain"),
        # issue 45: the arithmetic check's chain scores, from its two registry entries
        *per_metric("arith_valid"), StructField("arith_errors_total", IntegerType(), True),
        StructField("api_1", BooleanType(), True),
        StructField("api_2", BooleanType(), True),
        StructField("api_3", BooleanType(), True),
        StructField("nli_model", StringType(), True),
        StructField("pvi_model", StringType(), True),
        StructField("pvi_null_model", StringType(), True),
        StructField("ig_model", StringType(), True),
        StructField("scored_at", TimestampType(), True),
    ])
    # StructType equality compares names, order, types, nullability and metadata.
    assert CS.SCHEMA == before and CS.schema() == before


def test_lists_derived_from_the_registry_equal_the_ones_written_out_before():
    settings = load_settings(overrides=[], environ={})
    assert settings.meta_eval.metrics == [
        "intra_entail_min", "intra_pvi_min", "inter_min", "info_gain_min", "arith_valid_min", "arith_errors_total",
        "api_1", "api_2", "api_3"]
    paper = ["intra_entail", "inter", "intra_pvi", "info_gain"]
    assert (settings.localise.metrics, settings.localise.combine) == (paper, paper)
    select = settings.select
    assert select.correctness == ["intra_entail_min", "inter_min"]
    assert select.informativeness == ["info_gain_min"]
    assert CS.score_columns() == ["intra_entail_min", "intra_pvi_min", "inter_min", "info_gain_min",
                                  "arith_valid_min"]
    assert (CS.count_names(), MR.lower_is_better_columns()) == (["arith_errors"], {"arith_errors_total"})
    assert (B.REFERENCE_FREE, B.REFERENCE_BASED) == (REFERENCE_FREE, REFERENCE_BASED)
    assert B.GROUPS == {
        "ROSCOE-SA": [m for m in [*REFERENCE_FREE, *REFERENCE_BASED] if m.startswith("roscoe_sa_")],
        "ROSCOE-SS": ["roscoe_ss_informativeness_chain", "roscoe_ss_repetition_step",
                      "roscoe_ss_semantic_coverage_chain"],
        "ROSCOE-LI": ["roscoe_li_source_consistency", "roscoe_li_self_consistency"],
        "ROSCOE-REP": ["roscoe_sa_repetition_token", "roscoe_ss_repetition_step"],
    }
    from udfs import roscoe

    assert roscoe.STEP_AGGREGATION == {
        "roscoe_sa_faithfulness_step": "mean", "roscoe_sa_repetition_token": "min", "roscoe_ss_repetition_step": "min",
        "roscoe_li_source_consistency": "min", "roscoe_li_self_consistency": "min"}
    assert cot.AGGREGATES == ("template", "task", "median_template", "macro", "micro")


def test_settings_defaults_follow_the_registry_at_run_time(monkeypatch):
    # A metric name copied into a settings module would stay put: change the registry, and every default moves.
    from jobs.metaeval.settings import LocaliseSettings
    from jobs.selection.settings import SelectSettings

    monkeypatch.setattr(MR, "PAPER_STEP_SCORES", (MR.INFO_GAIN, MR.ARITH_VALID))
    monkeypatch.setattr(MR, "SELECT_CORRECTNESS", (MR.INTRA_PVI,))
    monkeypatch.setattr(MR, "SELECT_INFORMATIVENESS", (MR.ARITH_ERRORS,))
    monkeypatch.setattr(MR, "MIN", "lowest")  # the chain score's column name comes from the registry too
    localise, select = LocaliseSettings(), SelectSettings()
    assert localise.metrics == localise.combine == ["info_gain", "arith_valid"]
    assert (select.correctness, select.informativeness) == (["intra_pvi_lowest"], ["arith_errors_total"])
    with pytest.raises(KeyError, match="not a step_scores metric"):
        MR.chain_scores_of(["rouge2"])


def test_every_metric_names_a_column_its_table_or_producer_has():
    # A step score is a nullable double column of step_scores (its scoring job writes it there), a count an
    # integer one; a metric's detail column is a string.
    fields = {f.name: f for f in SS.SCHEMA.fields}
    for m in MR.of_table("step_scores"):
        kind = IntegerType() if m.is_count else DoubleType()
        assert (fields[m.name].dataType, fields[m.name].nullable) == (kind, True), m.name
        assert m.detail is None or fields[m.detail].dataType == StringType()
    # A CoT metric is the share of true rows of a boolean predictions column, or (random_guess) the mean of the
    # expected accuracy of a uniform guess, a double in [0, 1].
    predictions = {f.name: f.dataType for f in cot.PREDICTIONS_SCHEMA.fields}
    assert all(predictions[m.source] == (DoubleType() if m.name == "random_guess" else BooleanType())
               for m in MR.of_table("cot_metrics"))


@pytest.mark.parametrize(
    ("metric", "message"),
    [
        (MR.Metric("x", "step_scores", "d", direction="lower", aggregations=("min",)), "higher-is-better"),
        (MR.Metric("x", "nowhere", "d"), "unknown table"),
        (MR.Metric("inter", "step_scores", "d", aggregations=("min",)), "registered twice"),
        (MR.Metric("x", "step_scores", " ", aggregations=("min",)), "one-line definition"),
        (MR.Metric("x", "step_scores", "d", aggregations=("mean",)), "needs 'min'"),
        (MR.Metric("x", "step_scores", "d", aggregations=("min", "max")), r"\['max'\] not allowed"),
        (MR.Metric("x", "step_scores", "d", aggregations=("min", "api_k")), "api_k declared by"),
        (MR.Metric("x", "step_baseline_scores", "d", aggregations=("min", "mean")), "exactly one"),
        (MR.Metric("x", "cot_metrics", "d"), "source column"),
        (MR.Metric("x", "step_scores", "d", aggregations=("total",)), "a count is lower-is-better"),
        (MR.Metric("x", "step_scores", "d", direction="lower", aggregations=("min", "total")), "higher-is-better"),
    ],
)
def test_extended_rejects_what_the_consumers_cannot_take(metric, message):
    with pytest.raises(ValueError, match=message):
        MR.extended(metric)


def test_the_registry_is_pure_python():
    # The settings and udfs/ import it: no Spark (nor torch) behind it.
    code = "import sys, schemas.metrics; print(sorted(m for m in ('pyspark', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------- a new step score
DUMMY = MR.Metric("dummy", MR.STEP_SCORES, "a test-only step score in [0, 1]", aggregations=("min", "worst_step", "mean"))
T0 = dt.datetime(2026, 11, 30, 23, 0)
# chain -> (HALL label, the dummy score of each step). Dyadic values: means and mins are exact in binary.
CHAINS = {"c1": (1.0, [0.75, 0.5]), "c2": (1.0, [0.375, 0.625]), "c3": (0.0, [0.25, 0.125]), "c4": (0.0, [0.0625])}


def _step_scores(spark):
    schema = StructType([*SS.SCHEMA.fields, StructField("dummy", DoubleType(), True)])
    rows = [
        {SS.CHAIN_ID: cid, SS.STEP_IDX: i, SS.CONFIG_HASH: "h1", SS.INTRA_ENTAIL: 0.5, SS.INTER: 0.5,
         SS.INTRA_PVI: 0.5, SS.INFO_GAIN: 0.5, SS.SCORED_AT: T0, "dummy": v}
        for cid, (_, values) in CHAINS.items() for i, v in enumerate(values)
    ]
    return spark.createDataFrame([Row(**{f.name: r.get(f.name) for f in schema.fields}) for r in rows], schema)


def test_a_registered_step_score_flows_to_chain_scores_meta_eval_and_report(spark, make_settings, monkeypatch):
    from jobs.metaeval import meta_eval as ME
    from jobs.receval import aggregate, curate, report
    from schemas import chains as C
    from schemas import meta_eval as M

    monkeypatch.setattr(MR, "REGISTRY", MR.extended(DUMMY))  # the one place a new step score is added
    settings = make_settings("meta_eval.config_hash=h1", "meta_eval.bootstrap_resamples=20")

    # chain_scores: its three columns after the last metric's (arith_errors'), before API_k; min, first worst step,
    # mean.
    columns = CS.schema().fieldNames()
    assert columns[columns.index("arith_errors_total") + 1:columns.index("api_1")] == [
        "dummy_min", "dummy_worst_step", "dummy_mean"]
    rows = aggregate.transform(_step_scores(spark), settings.aggregate).collect()
    assert [r.asDict() for r in rows][0].keys() == set(columns)
    got = {r[CS.CHAIN_ID]: (r["dummy_min"], r["dummy_worst_step"], r["dummy_mean"]) for r in rows}
    assert got == {"c1": (0.5, 1, 0.625), "c2": (0.375, 0, 0.5), "c3": (0.125, 1, 0.1875), "c4": (0.0625, 0, 0.0625)}
    scores = spark.createDataFrame(rows, CS.schema())

    # meta-evaluation: evaluated by default; clean chains (0.5, 0.375) above error chains (0.125, 0.0625): D = 1.
    assert "dummy_min" in settings.meta_eval.metrics
    chains = spark.createDataFrame(
        [Row(**{f.name: {C.CHAIN_ID: cid, C.DATASET: "toy", C.CONTEXT: "x", C.STEPS: ["s."], C.CONTENT_HASH: cid,
                         C.LABELS: {"HALL": label}}.get(f.name) for f in C.SCHEMA.fields})
         for cid, (label, _) in CHAINS.items()], C.SCHEMA)
    evaluated = ME.transform(spark, scores, chains, None, settings.meta_eval, settings.scoring_hash(),
                             settings.log.progress_seconds)
    result = {r[M.METRIC]: r for r in evaluated.collect()}
    dummy = result["dummy_min"]
    assert (dummy[M.DATASET], dummy[M.LABEL], dummy[M.SOMERS_D], dummy[M.N], dummy[M.N_ERRORS]) == (
        "toy", "HALL", 1.0, 4, 2)
    assert "| dummy_min | 1.00 [" in ME.markdown_table([r.asDict() for r in result.values()])

    # curation: a rule keyed by the metric applies to its chain score.
    assert curate.score_column("dummy") == "dummy_min"

    # report: a worst-chains section of its own, and the worst step's value in the "why" table.
    worst = report.worst_chains(scores, 1)
    assert list(worst) == [*CS.metric_names()] and CS.metric_names()[-1] == "dummy"
    assert worst["dummy"][0][CS.CHAIN_ID] == "c4"
    detail = {"chain": {C.CONTEXT: "x"}, "steps": {0: {"step_text": "the only step"}},
              "scores": {0: {"dummy": 0.0625}}}
    html = report.render(title="t", meta=[], table_rows=[], stage_rows=[], curation=None, scope_note="s",
                         worst={"dummy": worst["dummy"]}, details={"c4": detail})
    assert "<h3>dummy</h3>" in html and "<b>c4</b> — dummy = 0.0625 (worst step 0 of 1)" in html
    assert "<tr><td>dummy</td><td>0.0625</td></tr>" in html
    # percentile_approx: the smallest value with at least that share of the values at or below it.
    assert report.night_quantiles(scores)["dummy"] == [("2026-11-30", [0.0625, 0.0625, 0.125, 0.375, 0.5])]


# ------------------------------------------------------------------------------- the arithmetic check (issue 45)
def test_the_arithmetic_scores_reach_every_consumer_through_the_registry(spark, make_settings):
    """Step texts -> score.score_steps (fake NLI/PVI, the real arithmetic UDF) -> aggregate -> meta-evaluation
    (default metrics), curation (reject_arith_errors) and the report: nothing but the two registry entries names
    the new scores to any of them."""
    from pyspark.sql import functions as F

    from jobs.metaeval import meta_eval as ME
    from jobs.receval import aggregate, curate, report, score
    from schemas import chains as C
    from schemas import curation as CU
    from schemas import meta_eval as M
    from schemas import steps as ST

    settings = make_settings("meta_eval.config_hash=h1", "meta_eval.bootstrap_resamples=20",
                             "curation.reject_arith_errors=true")
    texts = {  # chain -> (label: 1 = clean, its steps)
        "ok1": (1.0, ["She buys 3 * 4 = 12 apples.", "Then 12 + 8 = 20 in all."]),
        "ok2": (1.0, ["No equation in this step.", "So 2 x 3 = 6 and 6 / 4 = 1.5."]),
        "bad1": (0.0, ["Then 18 - 6 = 13 flamingos are left.", "And 13 + 1 = 14."]),
        "bad2": (0.0, ["Half of 10 = 5.", "So 5 * 3 = 15 and 15 - 4 = 10.", "Then 10 * 2 = 21."]),
    }
    steps = spark.createDataFrame(
        [(cid, "h1", i, len(ss), t, [], t, "given", "position", "fake")
         for cid, (_, ss) in texts.items() for i, t in enumerate(ss)], ST.SCHEMA)
    contexts = spark.createDataFrame([(cid, "h1", ["X."], None, "given") for cid in texts], ST.CONTEXTS_SCHEMA)

    def nli(st, ctx, s):
        return st.select(ST.CHAIN_ID, ST.STEP_IDX, *[F.lit(v).alias(c) for c, v in (
            (SS.INTRA_ENTAIL, 0.5), (SS.INTRA_PREMISE, "p"), (SS.INTER, 0.5), (SS.INTER_MAX_CONTRADICTION, 0.5),
            (SS.INTER_WORST_PREMISE, "X."), (SS.INTER_WORST_SOURCE, "context"))])

    def pvi(st, ctx, s):
        return st.select(ST.CHAIN_ID, ST.STEP_IDX, *[F.lit(0.5).alias(c) for c in (
            SS.INTRA_PVI, SS.PVI_G, SS.PVI_NULL, SS.INFO_GAIN, SS.IG_L_PREV, SS.IG_L)])

    # step_scores: the arithmetic columns from the text alone.
    step_scores, quarantined = score.transform(steps, contexts, settings, nli=nli, pvi=pvi)
    assert quarantined.count() == 0
    got = {(r[SS.CHAIN_ID], r[SS.STEP_IDX]): (r[SS.ARITH_VALID], r[SS.ARITH_ERRORS], r[SS.ARITH_CHECKED],
                                             r[SS.ARITH_FAILED]) for r in step_scores.collect()}
    assert got == {
        ("ok1", 0): (1.0, 0, 1, None), ("ok1", 1): (1.0, 0, 1, None),
        ("ok2", 0): (None, 0, 0, None), ("ok2", 1): (1.0, 0, 2, None),
        ("bad1", 0): (0.0, 1, 1, "18 - 6 = 13 (is 12)"), ("bad1", 1): (1.0, 0, 1, None),
        ("bad2", 0): (None, 0, 0, None),  # "Half of 10 = 5": a label (no operator), not a claim
        ("bad2", 1): (0.5, 1, 2, "15 - 4 = 10 (is 11)"), ("bad2", 2): (0.0, 1, 1, "10 * 2 = 21 (is 20)"),
    }

    # chain_scores: min over the steps with equations (sparse), its worst step, mean, and the total of errors.
    chain_rows = aggregate.transform(step_scores, settings.aggregate).collect()
    chains_got = {r[CS.CHAIN_ID]: (r["arith_valid_min"], r["arith_valid_worst_step"], r["arith_valid_mean"],
                                   r["arith_errors_total"]) for r in chain_rows}
    assert chains_got == {"ok1": (1.0, 0, 1.0, 0), "ok2": (1.0, 1, 1.0, 0), "bad1": (0.0, 0, 0.5, 1),
                          "bad2": (0.0, 2, 0.25, 2)}
    scores = spark.createDataFrame(chain_rows, CS.schema())

    # meta-evaluation, default metrics: both clean chains above both wrong ones on each score (the count
    # negated): D = 1.
    chains = spark.createDataFrame(
        [Row(**{f.name: {C.CHAIN_ID: cid, C.DATASET: "toy", C.CONTEXT: "x", C.STEPS: ss, C.CONTENT_HASH: cid,
                         C.LABELS: {"MATH": label}}.get(f.name) for f in C.SCHEMA.fields})
         for cid, (label, ss) in texts.items()], C.SCHEMA)
    evaluated = {r[M.METRIC]: r for r in ME.transform(spark, scores, chains, None, settings.meta_eval,
                                                      settings.scoring_hash(), 30.0).collect()}
    for metric in ("arith_valid_min", "arith_errors_total"):
        assert (evaluated[metric][M.SOMERS_D], evaluated[metric][M.N], evaluated[metric][M.N_ERRORS]) == (
            1.0, 4, 2), metric

    # curation: one setting rejects the chains with a wrong equation and names their first such step.
    curated, rejected = curate.transform(scores, settings.curation, step_scores=step_scores)
    assert sorted(r[CU.CHAIN_ID] for r in curated.collect()) == ["ok1", "ok2"]
    assert sorted((r[CU.CHAIN_ID], r[CU.FAILED_RULES], r[CU.FIRST_FLAGGED_STEP], r[CU.FIRST_FLAGGED_METRIC])
                  for r in rejected.collect()) == [
        ("bad1", ["max:arith_errors_total<=0"], 0, "arith_valid"),
        ("bad2", ["max:arith_errors_total<=0"], 1, "arith_valid")]

    # report: a worst-chains section for arith_valid, and the failing equation in "why this step scored low".
    worst = report.worst_chains(scores, 1)
    assert worst["arith_valid"][0][CS.CHAIN_ID] == "bad1"  # 0.0, first by chain id on the tie with bad2
    detail = {"chain": {C.CONTEXT: "x"}, "steps": {i: {"step_text": t} for i, t in enumerate(texts["bad1"][1])},
              "scores": {r[SS.STEP_IDX]: r.asDict() for r in step_scores.where("chain_id = 'bad1'").collect()}}
    html = report.render(title="t", meta=[], table_rows=[], stage_rows=[], curation=None, scope_note="s",
                         worst={"arith_valid": worst["arith_valid"]}, details={"bad1": detail})
    assert "<h3>arith_valid</h3>" in html
    assert "<tr><td>arith_valid</td><td>0.0000 — 18 - 6 = 13 (is 12)</td></tr>" in html
    assert "<tr><td>arith_errors</td><td>1</td></tr>" in html
