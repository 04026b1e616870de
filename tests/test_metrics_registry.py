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

from jobs.infra.config import PROJECT_ROOT, load_settings
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
                        ("info_gain", (*CHAIN, "api_k"))],
        "baseline_scores": [(m, ()) for m in [*REFERENCE_FREE, *REFERENCE_BASED, "rouge2"]],
        "step_baseline_scores": [("roscoe_sa_faithfulness_step", ("mean",)), ("roscoe_sa_repetition_token", ("min",)),
                                 ("roscoe_ss_repetition_step", ("min",)), ("roscoe_li_source_consistency", ("min",)),
                                 ("roscoe_li_self_consistency", ("min",))],
        "cot_metrics": [(m, ("template", "task", "median_template", "macro", "micro"))
                        for m in ("accuracy", "numeric_match", "acc_norm_token", "acc_norm_byte", "random_guess")],
    }
    assert {(m.direction, m.direction_text, m.higher_is_better) for m in MR.REGISTRY} == {
        ("higher", "higher is better", True)}
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
    assert load_settings(overrides=[], environ={}).meta_eval.metrics == [
        "intra_entail_min", "intra_pvi_min", "inter_min", "info_gain_min", "api_1", "api_2", "api_3"]
    assert CS.score_columns() == ["intra_entail_min", "intra_pvi_min", "inter_min", "info_gain_min"]
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


def test_every_metric_names_a_column_its_table_or_producer_has():
    # A step score is a nullable double column of step_scores (its scoring job writes it there).
    fields = {f.name: f for f in SS.SCHEMA.fields}
    for m in MR.of_table("step_scores"):
        assert (fields[m.name].dataType, fields[m.name].nullable) == (DoubleType(), True), m.name
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

    # chain_scores: its three columns after the last metric's, before API_k; min, first worst step, mean.
    columns = CS.schema().fieldNames()
    assert columns[columns.index("info_gain_mean") + 1:columns.index("api_1")] == [
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
